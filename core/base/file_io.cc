#include "core/base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace glmserve {

absl::StatusOr<RegularFile> RegularFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string why = std::strerror(err);
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", why));
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", why));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", why));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file (a directory, FIFO, socket or device)"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return RegularFile(fd, static_cast<uint64_t>(st.st_size));
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t limit) {
  ASSIGN_OR_RETURN(RegularFile file, RegularFile::Open(path));
  if (file.size() > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", file.size(), " bytes; the limit is ", limit));
  }
  std::string text(file.size(), '\0');
  uint64_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(file.fd(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<uint64_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace glmserve
