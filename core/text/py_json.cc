#include "core/text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using OJson = nlohmann::ordered_json;

void DumpString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

absl::Status Dump(const OJson& j, int depth, int max_depth, std::string* out) {
  if (depth > max_depth) {
    return absl::InvalidArgumentError(absl::StrCat("JSON nested deeper than ", max_depth));
  }
  switch (j.type()) {
    case OJson::value_t::null:
      out->append("null");
      return absl::OkStatus();
    case OJson::value_t::boolean:
      out->append(j.get<bool>() ? "true" : "false");
      return absl::OkStatus();
    case OJson::value_t::number_integer:
      absl::StrAppend(out, j.get<int64_t>());
      return absl::OkStatus();
    case OJson::value_t::number_unsigned:
      absl::StrAppend(out, j.get<uint64_t>());
      return absl::OkStatus();
    case OJson::value_t::number_float:
      out->append(PythonFloatRepr(j.get<double>()));
      return absl::OkStatus();
    case OJson::value_t::string:
      DumpString(j.get_ref<const std::string&>(), out);
      return absl::OkStatus();
    case OJson::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const OJson& e : j) {
        if (!first) out->append(", ");
        first = false;
        RETURN_IF_ERROR(Dump(e, depth + 1, max_depth, out));
      }
      out->push_back(']');
      return absl::OkStatus();
    }
    case OJson::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out->append(", ");
        first = false;
        DumpString(it.key(), out);
        out->append(": ");
        RETURN_IF_ERROR(Dump(it.value(), depth + 1, max_depth, out));
      }
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("JSON value of an unsupported type");
  }
}

}  // namespace

std::string PythonFloatRepr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  // The shortest digits that round-trip, then Python's layout: positional when the decimal
  // exponent is in [-4, 16), scientific otherwise, always with a '.0' or an exponent.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 >= 0) {
      const size_t int_len = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  absl::StrAppendFormat(&out, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out;
}

bool JsonDepthWithin(std::string_view json, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

absl::StatusOr<std::string> PythonJsonDumps(std::string_view json, int max_depth) {
  if (!JsonDepthWithin(json, max_depth)) {
    return absl::InvalidArgumentError(absl::StrCat("JSON nested deeper than ", max_depth));
  }
  OJson j = OJson::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  std::string out;
  RETURN_IF_ERROR(Dump(j, 0, max_depth, &out));
  return out;
}

}  // namespace glmserve
