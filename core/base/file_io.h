// Opening files a checkpoint directory names, safely: only regular files are opened (a FIFO,
// device or directory is an error, never a read that blocks forever or never ends), and small
// text files (config.json, the shard index) are read with a size bound.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace glmserve {

// An open descriptor of a regular file, closed on destruction.
class RegularFile {
 public:
  // NOT_FOUND when missing, PERMISSION_DENIED when unreadable, INVALID_ARGUMENT when not a
  // regular file. Opening never blocks (O_NONBLOCK, cleared once the file is known regular).
  static absl::StatusOr<RegularFile> Open(const std::string& path);
  RegularFile(RegularFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  RegularFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_;
  uint64_t size_;
};

// The whole content of a regular file of at most `limit` bytes (INVALID_ARGUMENT beyond).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t limit);

}  // namespace glmserve
