#include "core/base/npy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace glmserve {

absl::Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape,
                      const float* data) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + length (2) + header + '\n' padded to a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(len & 0xff));
  out.put(static_cast<char>(len >> 8));
  out << header;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  out.write(reinterpret_cast<const char*>(data), count * static_cast<int64_t>(sizeof(float)));
  if (!out) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  char magic[10];
  if (!in.read(magic, 10) || std::string(magic, 6) != "\x93NUMPY" || magic[6] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a version 1.0 .npy file"));
  }
  const uint16_t len = static_cast<uint8_t>(magic[8]) | (static_cast<uint8_t>(magic[9]) << 8);
  std::string header(len, '\0');
  if (!in.read(header.data(), len)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header"));
  }
  if (header.find("'descr': '<f4'") == std::string::npos ||
      header.find("'fortran_order': False") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": only C-order float32 is supported"));
  }
  const size_t open = header.find("'shape': (");
  const size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no shape"));
  }
  NpyArray array;
  int64_t count = 1;
  const std::string dims = header.substr(open + 10, close - open - 10);
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad shape"));
    }
    array.shape.push_back(v);
    count *= v;
  }
  array.data.resize(count);
  if (!in.read(reinterpret_cast<char*>(array.data.data()), count * sizeof(float))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated data"));
  }
  return array;
}

}  // namespace glmserve
