#include "core/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/file_io.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using Json = nlohmann::json;

std::string ErrnoText() { return std::strerror(errno); }

absl::Status FormatError(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

absl::StatusOr<DType> ParseDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;  // FP8 checkpoints' weights (docs/fp8.md)
  if (s == "F8_E8M0") return DType::kF8E8M0;  // UE8M0 block scales
  return absl::InvalidArgumentError(s);
}

// A JSON number that must be a non-negative integer representable as int64.
bool ReadNonNegative(const Json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

// Validates one header entry and fills everything of `t` but the data pointer; `begin`/`end`
// are the offsets into the data section.
absl::Status ParseEntry(const std::string& name, const Json& entry, uint64_t data_size,
                        absl::string_view source, TensorInfo* t, int64_t* begin, int64_t* end) {
  auto bad = [&](absl::string_view why) {
    return FormatError(source, absl::StrCat("tensor '", name, "': ", why));
  };
  if (!entry.is_object()) return bad("header entry is not a JSON object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end()) return bad("missing field 'dtype'");
  if (shape_it == entry.end()) return bad("missing field 'shape'");
  if (offsets_it == entry.end()) return bad("missing field 'data_offsets'");

  if (!dtype_it->is_string()) return bad("'dtype' is not a string");
  const std::string dtype_name = dtype_it->get<std::string>();
  absl::StatusOr<DType> dtype = ParseDType(dtype_name);
  if (!dtype.ok()) {
    return bad(
        absl::StrCat("dtype ", dtype_name, " is not supported (F32, BF16, F16, F8_E4M3, F8_E8M0)"));
  }
  t->name = name;
  t->dtype = *dtype;

  if (!shape_it->is_array()) return bad("'shape' is not an array");
  t->shape.clear();
  int64_t elements = 1;
  for (const Json& d : *shape_it) {
    int64_t dim = 0;
    if (!ReadNonNegative(d, &dim)) {
      return bad(absl::StrCat("shape ", d.dump(), " entry is not a non-negative integer"));
    }
    t->shape.push_back(dim);
    if (__builtin_mul_overflow(elements, dim, &elements)) return bad("shape product overflows");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, DTypeSize(t->dtype), &bytes)) {
    return bad("shape product overflows");
  }

  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return bad("'data_offsets' is not a [begin, end] pair");
  }
  if (!ReadNonNegative((*offsets_it)[0], begin) || !ReadNonNegative((*offsets_it)[1], end)) {
    return bad("'data_offsets' entries are not non-negative integers");
  }
  if (*begin > *end) return bad(absl::StrCat("data_offsets begin ", *begin, " > end ", *end));
  if (static_cast<uint64_t>(*end) > data_size) {
    return bad(absl::StrCat("data_offsets end ", *end, " is past the end of the data section (",
                            data_size, " bytes; file truncated?)"));
  }
  if (*end - *begin != bytes) {
    return bad(absl::StrCat("data_offsets cover ", *end - *begin, " bytes but ",
                            std::string(DTypeName(t->dtype)), " ", ShapeToString(t->shape),
                            " needs ", bytes));
  }
  t->bytes = bytes;
  return absl::OkStatus();
}

// A shard named by an index must be a file next to the index: refusing separators and ".."
// keeps a hostile index from pointing the loader at arbitrary files.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find("..") == std::string::npos &&
         name.find('\0') == std::string::npos && name != ".";
}

}  // namespace

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(RegularFile file, RegularFile::Open(path));
  const size_t size = static_cast<size_t>(file.size());
  const char* data = nullptr;
  if (size > 0) {  // mmap refuses empty mappings; an empty file parses as "too small"
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot mmap ", path, ": ", ErrnoText()));
    }
    data = static_cast<const char*>(p);
  }
  // The mapping keeps the file alive once the descriptor closes.
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensors(const char* data, size_t size,
                                                         absl::string_view source) {
  if (size < 8) {
    return FormatError(
        source, absl::StrCat("file is ", size, " bytes, too small for a safetensors header"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<unsigned char>(data[i]);
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return FormatError(source, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                            kMaxSafetensorsHeaderBytes, " bytes (corrupt file?)"));
  }
  if (header_len > size - 8) {
    return FormatError(
        source, absl::StrCat("header length ", header_len, " runs past the end of the file (", size,
                             " bytes; truncated?)"));
  }
  const char* header = data + 8;
  // The reference implementation requires the header to start with '{' (it may end with
  // space padding).
  if (header_len == 0 || header[0] != '{') {
    return FormatError(source, "header does not start with '{'");
  }
  const char* section = header + header_len;
  const uint64_t section_size = size - 8 - header_len;

  // JSON objects may repeat a key and the DOM parser silently keeps one; a tensor named twice
  // is a corrupt header, so top-level keys are collected as they are parsed.
  std::set<std::string> seen;
  std::string duplicate;
  Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && parsed.is_string()) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = std::move(key);
    }
    return true;
  };
  const Json j = Json::parse(header, section, on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) return FormatError(source, "header is not valid JSON");
  if (!j.is_object()) return FormatError(source, "header is not a JSON object");
  if (!duplicate.empty()) {
    return FormatError(source,
                       absl::StrCat("tensor '", duplicate, "' appears twice in the header"));
  }

  struct Range {
    int64_t begin, end;
    size_t index;
  };
  std::vector<TensorInfo> tensors;
  std::vector<Range> ranges;
  tensors.reserve(j.size());
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") continue;  // free-form string map; nothing we need
    TensorInfo t;
    int64_t begin = 0, end = 0;
    RETURN_IF_ERROR(ParseEntry(name, entry, section_size, source, &t, &begin, &end));
    t.data = section + begin;
    ranges.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(t));
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // As the reference implementation requires, the tensors tile the data section exactly:
  // each starts where the previous one ends, from offset 0 to the last byte. A gap, an
  // overlap or trailing bytes mean the header and the data disagree (a header length off by
  // a byte shifts every tensor), so the file is refused rather than read shifted.
  uint64_t covered = 0;
  const Range* previous = nullptr;
  for (const Range& r : ranges) {
    if (static_cast<uint64_t>(r.begin) < covered) {
      return FormatError(
          source,
          absl::StrCat("tensors '", tensors[previous->index].name, "' and '", tensors[r.index].name,
                       "' have overlapping data ranges [", previous->begin, ", ", previous->end,
                       ") and [", r.begin, ", ", r.end, ")"));
    }
    if (static_cast<uint64_t>(r.begin) > covered) {
      return FormatError(source, absl::StrCat("bytes [", covered, ", ", r.begin,
                                              ") of the data section belong to no tensor (before '",
                                              tensors[r.index].name, "')"));
    }
    covered = static_cast<uint64_t>(r.end);
    previous = &r;
  }
  if (covered != section_size) {
    return FormatError(
        source, absl::StrCat("the tensors cover ", covered, " bytes but the data section has ",
                             section_size, " (header length wrong or trailing bytes)"));
  }
  std::vector<TensorInfo> ordered;
  ordered.reserve(tensors.size());
  for (const Range& r : ranges) ordered.push_back(std::move(tensors[r.index]));
  return ordered;
}

absl::StatusOr<TensorStore> TensorStore::OpenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(std::vector<TensorInfo> tensors,
                   ParseSafetensors(file->data(), file->size(), path));
  TensorStore store;
  for (TensorInfo& t : tensors) {
    std::string name = t.name;
    store.tensors_.emplace(std::move(name), std::move(t));
  }
  store.files_.push_back(std::move(file));
  return store;
}

absl::StatusOr<ShardIndex> ParseShardIndex(absl::string_view text, absl::string_view source) {
  const Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return FormatError(source, "not a JSON object");
  }
  auto map_it = j.find("weight_map");
  if (map_it == j.end() || !map_it->is_object()) {
    return FormatError(source, "missing object 'weight_map'");
  }
  ShardIndex by_shard;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return FormatError(
          source, absl::StrCat("weight_map entry for '", name, "' is not a file name string"));
    }
    std::string file = shard.get<std::string>();
    if (!IsPlainFileName(file)) {
      return FormatError(source,
                         absl::StrCat("weight_map entry for '", name, "' names shard '", file,
                                      "', which is not a plain file name in the "
                                      "checkpoint directory"));
    }
    by_shard[file].push_back(name);
  }
  return by_shard;
}

absl::StatusOr<TensorStore> TensorStore::Open(const std::string& dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  struct stat st;
  if (::stat(index_path.c_str(), &st) != 0) {
    const std::string single = dir + "/model.safetensors";
    if (::stat(single.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrCat("no model.safetensors or model.safetensors.index.json in ", dir));
    }
    return OpenFile(single);
  }

  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(index_path, kMaxSafetensorsHeaderBytes));
  ASSIGN_OR_RETURN(ShardIndex index, ParseShardIndex(text, index_path));
  const ShardIndex& by_shard = index;

  TensorStore store;
  for (const auto& [file, names] : by_shard) {
    const std::string path = dir + "/" + file;
    absl::StatusOr<std::shared_ptr<const MappedFile>> mapped = MappedFile::Open(path);
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(),
                          absl::StrCat(index_path, ": shard '", file, "' (holding '", names[0],
                                       "'): ", mapped.status().message()));
    }
    ASSIGN_OR_RETURN(std::vector<TensorInfo> tensors,
                     ParseSafetensors((*mapped)->data(), (*mapped)->size(), path));
    std::map<std::string, TensorInfo*, std::less<>> in_shard;
    for (TensorInfo& t : tensors) in_shard.emplace(t.name, &t);
    // Tensors of a shard the index does not list are ignored: the index is the authority.
    for (const std::string& name : names) {
      auto it = in_shard.find(name);
      if (it == in_shard.end()) {
        return absl::NotFoundError(
            absl::StrCat(index_path, ": tensor '", name, "' is not in its shard '", file, "'"));
      }
      store.tensors_.emplace(name, std::move(*it->second));
    }
    store.files_.push_back(*std::move(mapped));
  }
  return store;
}

const TensorInfo* TensorStore::Find(absl::string_view name) const {
  auto it = tensors_.find(std::string_view(name.data(), name.size()));
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> TensorStore::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

std::vector<std::shared_ptr<const void>> TensorStore::Owners() const {
  return std::vector<std::shared_ptr<const void>>(files_.begin(), files_.end());
}

}  // namespace glmserve
