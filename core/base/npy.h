// Minimal .npy (NumPy format 1.0) reading and writing for little-endian float32 arrays: the
// golden fixtures and glm-run's logits / hidden-state dumps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace glmserve {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major
};

absl::Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape,
                      const float* data);
// Reads a C-order '<f4' array; anything else is an error.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace glmserve
