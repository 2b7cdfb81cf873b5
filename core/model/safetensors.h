// Reading safetensors checkpoints through mmap, single files or sharded with
// model.safetensors.index.json.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON header
// ({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
// data section; offsets are relative to the start of the data section. Everything in the
// header is checked before any pointer into the data is handed out, so a truncated, corrupt or
// hostile file is an error, never an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/dtype.h"

namespace glmserve {

// A read-only memory mapping of a whole file, unmapped on destruction. Shared ownership
// (shared_ptr) lets weight views outlive the reader that created them.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const char* data_;
  size_t size_;
};

// One tensor of a safetensors file: a view into the file's data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // not necessarily aligned to the element size
  int64_t bytes = 0;           // product(shape) * DTypeSize(dtype)

  int64_t num_elements() const { return bytes / DTypeSize(dtype); }
};

// "[2, 3]" for error messages.
std::string ShapeToString(const std::vector<int64_t>& shape);

// Largest header accepted (the reference implementation's limit): a hostile length cannot make
// us allocate or parse gigabytes.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates a safetensors image held in memory (`data`, `size`); `source` names it
// in errors. The returned tensors point into `data`, in the order of their offsets.
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensors(const char* data, size_t size,
                                                         absl::string_view source);

// model.safetensors.index.json: shard file -> the tensors its weight_map places there, in a
// std::map so that shards open in a stable order. INVALID_ARGUMENT (prefixed by `source`) for
// text that is not an object with a 'weight_map' object of string values, or a shard that is
// not a plain file name in the checkpoint directory (no separators, no "..").
using ShardIndex = std::map<std::string, std::vector<std::string>>;
absl::StatusOr<ShardIndex> ParseShardIndex(absl::string_view text, absl::string_view source);

// A set of named tensors from one safetensors file or a sharded checkpoint. Movable; the
// TensorInfo pointers stay valid as long as any copy of Owners() is alive.
class TensorStore {
 public:
  // `dir`/model.safetensors.index.json when it exists (sharded), else `dir`/model.safetensors.
  static absl::StatusOr<TensorStore> Open(const std::string& dir);
  // One safetensors file.
  static absl::StatusOr<TensorStore> OpenFile(const std::string& path);

  // nullptr when absent.
  const TensorInfo* Find(absl::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  size_t size() const { return tensors_.size(); }
  // The mappings the tensors point into (one per file).
  std::vector<std::shared_ptr<const void>> Owners() const;

 private:
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
};

}  // namespace glmserve
