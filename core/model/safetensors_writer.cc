#include "core/model/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace glmserve {

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // Layout order: widest element first, then by name (the order safetensors' own writer uses).
  std::vector<const TensorToWrite*> order;
  std::set<std::string> names;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name '", t.name, "'"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' given twice"));
    }
    int64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': dim < 0"));
      elements *= d;
    }
    int64_t bytes = 0;
    for (const ByteRange& r : t.pieces) bytes += r.size;
    if (bytes != elements * DTypeSize(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", bytes,
                                                     " bytes given, shape needs ",
                                                     elements * DTypeSize(t.dtype)));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    if (DTypeSize(a->dtype) != DTypeSize(b->dtype)) {
      return DTypeSize(a->dtype) > DTypeSize(b->dtype);
    }
    return a->name < b->name;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const TensorToWrite* t : order) {
    int64_t bytes = 0;
    for (const ByteRange& r : t->pieces) bytes += r.size;
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp));
    char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const TensorToWrite* t : order) {
      for (const ByteRange& r : t->pieces) {
        out.write(static_cast<const char*>(r.data), static_cast<std::streamsize>(r.size));
      }
    }
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("error writing ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace glmserve
