#include "core/model/fp8.h"

#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxPatternChars = 512;

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field 'quantization_config.", field, "': ", why));
}
absl::Status Unsupported(absl::string_view field, absl::string_view value,
                         absl::string_view accepted) {
  return absl::UnimplementedError(absl::StrCat("config field 'quantization_config.", field, "' is ",
                                               value.substr(0, 80), ": only ", accepted,
                                               " is supported (docs/fp8.md)"));
}

// The value as text for an error message.
std::string Text(const Json& v) { return v.dump().substr(0, 80); }

// An optional string field: "" when absent or null.
absl::StatusOr<std::string> OptString(const Json& j, const char* field, const std::string& path) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Bad(path + field, "expected a string");
  return it->get<std::string>();
}

// [br, bc], each in [1, kMaxFp8BlockSide].
absl::Status ReadBlock(const Json& v, const std::string& field, Fp8Scheme* s) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer()) {
    return Bad(field, absl::StrCat("expected [rows, cols] of two integers, got ", Text(v)));
  }
  const int64_t br = v[0].get<int64_t>(), bc = v[1].get<int64_t>();
  if (br < 1 || bc < 1 || br > kMaxFp8BlockSide || bc > kMaxFp8BlockSide) {
    return Bad(field,
               absl::StrCat("block sides must be in [1, ", kMaxFp8BlockSide, "], got ", Text(v)));
  }
  s->block_rows = br;
  s->block_cols = bc;
  return absl::OkStatus();
}

// A list of module names (and, where `patterns` is set, "re:" expressions).
absl::Status ReadModuleList(const Json& j, const char* field, bool patterns, Fp8Scheme* s) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Bad(field, "expected a list of module names");
  if (it->size() > kMaxFp8IgnoreEntries) {
    return Bad(field,
               absl::StrCat("has ", it->size(), " entries, more than ", kMaxFp8IgnoreEntries));
  }
  for (const Json& e : *it) {
    if (!e.is_string()) return Bad(field, absl::StrCat("entry ", Text(e), " is not a string"));
    std::string name = e.get<std::string>();
    if (patterns && absl::StartsWith(name, "re:")) {
      name = name.substr(3);
      if (name.size() > kMaxPatternChars) {
        return Bad(field, absl::StrCat("a pattern is longer than ", kMaxPatternChars, " chars"));
      }
      try {
        std::regex check(name);
      } catch (const std::regex_error&) {
        return Bad(field, absl::StrCat("'", name.substr(0, 80), "' is not a regular expression"));
      }
      s->keep_patterns.push_back(std::move(name));
    } else {
      s->keep_names.push_back(std::move(name));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCompressedTensors(const Json& q, Fp8Scheme* s) {
  s->kind = Fp8Scheme::Kind::kCompressedTensors;
  ASSIGN_OR_RETURN(const std::string status, OptString(q, "quantization_status", ""));
  if (!status.empty() && status != "compressed") {
    return Unsupported("quantization_status", status, "'compressed'");
  }
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->size() != 1) {
    return Bad("config_groups", "expected an object with exactly one group (FP8 linear layers)");
  }
  const std::string gname = groups->begin().key();
  const Json& g = groups->begin().value();
  const std::string gpath = "config_groups." + gname + ".";
  if (!g.is_object()) return Bad(gpath, "expected an object");
  // format at the top level (older writers) or in the group (newer ones).
  ASSIGN_OR_RETURN(std::string format, OptString(q, "format", ""));
  ASSIGN_OR_RETURN(const std::string gformat, OptString(g, "format", gpath));
  if (!gformat.empty()) format = gformat;
  if (format != "float-quantized") {
    return Unsupported("format", format.empty() ? "absent" : "'" + format + "'",
                       "'float-quantized'");
  }
  auto targets = g.find("targets");
  if (targets == g.end() || *targets != Json::array({"Linear"})) {
    return Unsupported(gpath + "targets", targets == g.end() ? "absent" : Text(*targets),
                       "[\"Linear\"]");
  }
  auto w = g.find("weights");
  if (w == g.end() || !w->is_object()) return Bad(gpath + "weights", "expected an object");
  const std::string wpath = gpath + "weights.";
  if (w->value("num_bits", Json()) != Json(8)) {
    return Unsupported(wpath + "num_bits", Text(w->value("num_bits", Json())), "8");
  }
  if (w->value("type", Json()) != Json("float")) {
    return Unsupported(wpath + "type", Text(w->value("type", Json())), "\"float\" (e4m3)");
  }
  if (w->value("symmetric", Json(true)) != Json(true)) {
    return Unsupported(wpath + "symmetric", Text(w->value("symmetric", Json())), "true");
  }
  if (w->value("dynamic", Json(false)) != Json(false)) {
    return Unsupported(wpath + "dynamic", Text(w->value("dynamic", Json())), "false");
  }
  const Json strategy = w->value("strategy", Json());
  if (strategy == Json("channel")) {
    s->block_rows = 1;
    s->block_cols = 0;
  } else if (strategy == Json("block")) {
    auto bs = w->find("block_structure");
    if (bs == w->end()) return Bad(wpath + "block_structure", "required by strategy 'block'");
    RETURN_IF_ERROR(ReadBlock(*bs, wpath + "block_structure", s));
  } else {
    return Unsupported(wpath + "strategy", Text(strategy), "\"channel\" or \"block\"");
  }
  auto in = g.find("input_activations");
  if (in != g.end() && !in->is_null()) {
    if (!in->is_object()) return Bad(gpath + "input_activations", "expected an object");
    // Static activation scales would come as input_scale tensors, which nothing here applies.
    if (in->value("dynamic", Json()) != Json(true)) {
      return Unsupported(gpath + "input_activations.dynamic", Text(in->value("dynamic", Json())),
                         "true (dynamic per-token activation scales)");
    }
  }
  auto out = g.find("output_activations");
  if (out != g.end() && !out->is_null()) {
    return Unsupported(gpath + "output_activations", Text(*out), "null");
  }
  auto kv = q.find("kv_cache_scheme");
  if (kv != q.end() && !kv->is_null()) return Unsupported("kv_cache_scheme", Text(*kv), "null");
  return ReadModuleList(q, "ignore", /*patterns=*/true, s);
}

absl::Status ParseBlockFp8(const Json& q, Fp8Scheme* s) {
  s->kind = Fp8Scheme::Kind::kBlockFp8;
  ASSIGN_OR_RETURN(const std::string fmt, OptString(q, "fmt", ""));
  if (!fmt.empty() && fmt != "e4m3") return Unsupported("fmt", "'" + fmt + "'", "'e4m3'");
  ASSIGN_OR_RETURN(const std::string act, OptString(q, "activation_scheme", ""));
  if (!act.empty() && act != "dynamic") {
    return Unsupported("activation_scheme", "'" + act + "'", "'dynamic'");
  }
  ASSIGN_OR_RETURN(const std::string scale_fmt, OptString(q, "scale_fmt", ""));
  if (!scale_fmt.empty() && scale_fmt != "ue8m0") {
    return Unsupported("scale_fmt", "'" + scale_fmt + "'", "absent (fp32) or 'ue8m0'");
  }
  s->ue8m0 = scale_fmt == "ue8m0";
  auto bs = q.find("weight_block_size");
  if (bs == q.end() || bs->is_null()) {
    return Unsupported("weight_block_size", "absent (per-tensor fp8)",
                       "a block size (block-scaled fp8)");
  }
  RETURN_IF_ERROR(ReadBlock(*bs, "weight_block_size", s));
  RETURN_IF_ERROR(ReadModuleList(q, "modules_to_not_convert", false, s));
  return ReadModuleList(q, "ignored_layers", false, s);
}

}  // namespace

const char* Fp8Scheme::scale_suffix() const {
  return kind == Kind::kBlockFp8 ? "weight_scale_inv" : "weight_scale";
}

std::string Fp8Scheme::Describe() const {
  if (kind == Kind::kNone) return "none";
  const std::string method = kind == Kind::kBlockFp8 ? "fp8" : "compressed-tensors";
  if (per_channel()) return method + " e4m3, per-channel scales";
  return absl::StrCat(method, " e4m3, ", block_rows, "x", block_cols, " block scales",
                      ue8m0 ? " (ue8m0)" : "");
}

bool Fp8Scheme::KeepsUnquantized(const std::string& module) const {
  const std::string dotted = "." + module + ".";
  for (const std::string& n : keep_names) {
    // A whole module name, or a dotted run of its components ("lm_head", "mlp.gate").
    if (n == module || (!n.empty() && absl::StrContains(dotted, "." + n + "."))) return true;
  }
  for (const std::string& p : keep_patterns) {
    // compressed-tensors matches with Python's re.match: anchored at the start only.
    if (std::regex_search(module, std::regex(p), std::regex_constants::match_continuous)) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<Fp8Scheme> ParseFp8Scheme(absl::string_view config_json) {
  const Json j = Json::parse(config_json.begin(), config_json.end(), nullptr, false);
  Fp8Scheme s;
  if (!j.is_object()) return s;  // ParseConfigJson reports malformed text
  auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return s;
  if (!q->is_object()) return Bad("", "expected an object");
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string()) {
    return Bad("quant_method", "expected a string");
  }
  const std::string m = method->get<std::string>();
  if (m == "compressed-tensors") {
    RETURN_IF_ERROR(ParseCompressedTensors(*q, &s));
  } else if (m == "fp8") {
    RETURN_IF_ERROR(ParseBlockFp8(*q, &s));
  } else {
    return Unsupported("quant_method", "'" + m + "'", "'compressed-tensors' or 'fp8'");
  }
  return s;
}

}  // namespace glmserve
