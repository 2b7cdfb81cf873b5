#include "core/text/output_parser.h"

#include "absl/strings/ascii.h"
#include "absl/types/span.h"
#include "core/text/py_json.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// The length of the longest suffix of `s` that is a proper prefix of `marker`: text that may
// still turn out to be the marker and so must be held.
size_t PartialSuffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

}  // namespace

ParsedToolCall Glm45OutputParser::ParseToolCall(std::string_view body) {
  ParsedToolCall call;
  const size_t first_key = body.find("<arg_key>");
  call.name = std::string(Trim(body.substr(0, first_key)));
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  size_t pos = first_key;
  while (pos != std::string_view::npos) {
    const size_t k0 = pos + 9;
    const size_t k1 = body.find("</arg_key>", k0);
    if (k1 == std::string_view::npos) break;
    const size_t v_open = body.find("<arg_value>", k1 + 10);
    if (v_open == std::string_view::npos || !Trim(body.substr(k1 + 10, v_open - k1 - 10)).empty()) {
      break;
    }
    const size_t v0 = v_open + 11;
    const size_t v1 = body.find("</arg_value>", v0);
    if (v1 == std::string_view::npos) break;
    std::string key(Trim(body.substr(k0, k1 - k0)));
    std::string value(body.substr(v0, v1 - v0));
    // Generated text may nest without bound: deep values stay strings (parsing and dumping
    // recurse per level).
    auto parsed = JsonDepthWithin(value, 64)
                      ? nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false)
                      : nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
    if (!parsed.is_discarded() && !parsed.is_string()) {
      args[key] = std::move(parsed);
    } else {
      args[key] = value;
    }
    call.arguments.emplace_back(std::move(key), std::move(value));
    pos = body.find("<arg_key>", v1 + 12);
  }
  call.arguments_json = args.dump();
  return call;
}

void Glm45OutputParser::Run(bool final, ParsedDelta* out) {
  while (!buffer_.empty()) {
    std::string_view buf = buffer_;
    if (state_ == State::kToolCall) {
      const size_t close = buf.find(kCallClose);
      if (close == std::string_view::npos) {
        if (final && keep_unterminated_call_) {
          // Up to the last complete argument; without one, the name up to its line break
          // (whatever the model wrote after it is no part of a call).
          const size_t last_value = buf.rfind("</arg_value>");
          std::string_view body = buf;
          if (last_value != std::string_view::npos) {
            body = body.substr(0, last_value + 12);
          } else {
            const size_t start = body.find_first_not_of(" \t\r\n");
            body = start == std::string_view::npos
                       ? std::string_view()
                       : body.substr(0, body.find_first_of("\n<", start));
          }
          out->tool_calls.push_back(ParseToolCall(body));
          buffer_.clear();
        } else if (final) {  // unterminated: give the source text back as content
          out->content.append(kCallOpen);
          out->content.append(buf);
          buffer_.clear();
        }
        return;
      }
      out->tool_calls.push_back(ParseToolCall(buf.substr(0, close)));
      buffer_.erase(0, close + kCallClose.size());
      state_ = State::kContent;
      continue;
    }
    // Content or reasoning: find the next marker that changes state.
    const bool reasoning = state_ == State::kReasoning;
    size_t best = std::string_view::npos;
    std::string_view marker;
    const std::string_view content_markers[] = {kThinkOpen, kCallOpen};
    const std::string_view reasoning_markers[] = {kThinkClose};
    const absl::Span<const std::string_view> markers =
        reasoning ? absl::MakeConstSpan(reasoning_markers) : absl::MakeConstSpan(content_markers);
    for (std::string_view m : markers) {
      const size_t at = buf.find(m);
      if (at < best) {
        best = at;
        marker = m;
      }
    }
    std::string& sink = reasoning ? out->reasoning : out->content;
    if (best == std::string_view::npos) {
      size_t hold = 0;
      if (!final) {
        if (reasoning) {
          hold = PartialSuffix(buf, kThinkClose);
        } else {
          hold = std::max(PartialSuffix(buf, kThinkOpen), PartialSuffix(buf, kCallOpen));
        }
      }
      sink.append(buf.substr(0, buf.size() - hold));
      buffer_.erase(0, buf.size() - hold);
      return;
    }
    sink.append(buf.substr(0, best));
    buffer_.erase(0, best + marker.size());
    if (marker == kThinkOpen) {
      state_ = State::kReasoning;
    } else if (marker == kThinkClose) {
      state_ = State::kContent;
    } else {
      state_ = State::kToolCall;
    }
  }
}

ParsedDelta Glm45OutputParser::Push(std::string_view text) {
  ParsedDelta out;
  buffer_.append(text);
  Run(/*final=*/false, &out);
  return out;
}

ParsedDelta Glm45OutputParser::Finish() {
  ParsedDelta out;
  Run(/*final=*/true, &out);
  return out;
}

}  // namespace glmserve
