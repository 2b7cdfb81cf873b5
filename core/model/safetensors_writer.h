// Writing safetensors files (tests, tools exporting presets, SaveCheckpoint).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/base/dtype.h"

namespace glmserve {

// A run of bytes owned by the caller.
struct ByteRange {
  const void* data = nullptr;
  int64_t size = 0;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // The tensor's bytes, concatenated in order (several pieces let a fused tensor be written
  // from separate buffers without a copy). Must total product(shape) * DTypeSize(dtype).
  std::vector<ByteRange> pieces;
};

// Writes a safetensors file readable by the Hugging Face libraries: tensors laid out without
// gaps, widest dtype first (so every tensor stays aligned to its element size), header padded
// with spaces to a multiple of 8. Writes to a temporary name and renames, so a failed write
// never leaves a half file under `path`. Names must be unique and non-empty.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {
                                  {"format", "pt"}});

}  // namespace glmserve
