#include "server/http/openai_request.h"

#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "server/http/json_body.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

absl::Status WrongType(absl::string_view field, const char* expected, const Json& v) {
  return Invalid(field, absl::StrCat("must be ", expected, ", not ", TypeName(v)));
}

absl::StatusOr<std::string> String(const Json& v, absl::string_view field) {
  if (!v.is_string()) return WrongType(field, "a string", v);
  return v.get<std::string>();
}

absl::StatusOr<bool> Bool(const Json& v, absl::string_view field) {
  if (!v.is_boolean()) return WrongType(field, "a boolean", v);
  return v.get<bool>();
}

absl::StatusOr<int64_t> Int(const Json& v, absl::string_view field, int64_t min, int64_t max) {
  if (!v.is_number_integer()) return WrongType(field, "an integer", v);
  // Unsigned values above int64 come back as kUnsigned: out of range as well.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) {
    return Invalid(field, absl::StrCat("must be in [", min, ", ", max, "]"));
  }
  const int64_t x = v.get<int64_t>();
  if (x < min || x > max) return Invalid(field, absl::StrCat("must be in [", min, ", ", max, "]"));
  return x;
}

// A number; bounds only where the OpenAI API has its own (the sampling values' bounds are
// the engine's, checked once there).
absl::StatusOr<double> Number(const Json& v, absl::string_view field,
                              double min = -std::numeric_limits<double>::max(),
                              double max = std::numeric_limits<double>::max()) {
  if (!v.is_number()) return WrongType(field, "a number", v);
  const double x = v.get<double>();
  if (!(x >= min && x <= max)) {
    return Invalid(field, absl::StrCat("must be in [", min, ", ", max, "]"));
  }
  return x;
}

// Every field of an object must be one of `known`.
absl::Status OnlyKnown(const Json& object, std::initializer_list<const char*> known,
                       absl::string_view where) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (const char* k : known) found |= key == k;
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown field '", key.substr(0, 64), "'", where.empty() ? "" : " in ",
                       where, " (fields: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// "stop": a string, an array of strings, or null.
absl::Status ParseStop(const Json& v, OpenAIRequest* out) {
  if (v.is_null()) return absl::OkStatus();
  if (v.is_string()) {
    out->stop.push_back(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array()) return WrongType("stop", "a string or an array of strings", v);
  if (v.size() > kMaxWireStopStrings) {
    return Invalid("stop", absl::StrCat("has ", v.size(), " strings; at most ", kMaxWireStopStrings,
                                        " are accepted"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    ASSIGN_OR_RETURN(std::string s, String(v[i], absl::StrCat("stop[", i, "]")));
    out->stop.push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& v, absl::string_view field,
                                              size_t max_count) {
  if (!v.is_array()) return WrongType(field, "an array of token ids", v);
  if (v.size() > max_count) {
    return Invalid(field, absl::StrCat("has ", v.size(), " ids; at most ", max_count));
  }
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSIGN_OR_RETURN(int64_t id, Int(v[i], absl::StrCat(field, "[", i, "]"), 0,
                                     std::numeric_limits<int32_t>::max()));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// "prompt": a string or an array of token ids; a batch (an array of several) is refused.
absl::Status ParsePrompt(const Json& v, OpenAIRequest* out) {
  if (v.is_string()) {
    out->prompt_text = v.get<std::string>();
    return absl::OkStatus();
  }
  if (v.is_array() && !v.empty() && (v[0].is_string() || v[0].is_array())) {
    if (v.size() != 1) {
      return Invalid("prompt", absl::StrCat("holds a batch of ", v.size(),
                                            " prompts; send one request per prompt"));
    }
    return ParsePrompt(v[0], out);
  }
  if (!v.is_array()) return WrongType("prompt", "a string or an array of token ids", v);
  if (v.empty()) return Invalid("prompt", "is empty");
  // The prompt's length is bounded by the server's max_prompt_tokens later; this only
  // bounds the copy (the body's size already bounds the array).
  ASSIGN_OR_RETURN(out->prompt_ids, TokenIds(v, "prompt", std::numeric_limits<int32_t>::max()));
  return absl::OkStatus();
}

// Message content: a string, null, or an array of {"type": "text", "text": ...} parts,
// joined without separator (as GLM-4.5's template joins them).
absl::StatusOr<std::string> Content(const Json& v, const std::string& field) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return WrongType(field, "a string, an array of text parts or null", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = absl::StrCat(field, "[", i, "]");
    if (!v[i].is_object()) return WrongType(part, "an object", v[i]);
    RETURN_IF_ERROR(OnlyKnown(v[i], {"type", "text"}, part));
    if (!v[i].contains("type") || v[i]["type"] != "text") {
      return Invalid(part,
                     "must be a text part ({\"type\": \"text\", \"text\": ...}); this "
                     "model takes text only");
    }
    if (!v[i].contains("text")) return Invalid(part, "has no 'text'");
    ASSIGN_OR_RETURN(std::string t, String(v[i]["text"], absl::StrCat(part, ".text")));
    text += t;
  }
  return text;
}

absl::Status ParseMessages(const Json& v, OpenAIRequest* out) {
  if (!v.is_array()) return WrongType("messages", "an array", v);
  if (v.empty()) return Invalid("messages", "is empty");
  if (v.size() > ChatLimits{}.max_messages) {
    return Invalid("messages", absl::StrCat("has ", v.size(), " messages; at most ",
                                            ChatLimits{}.max_messages, " are accepted"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = absl::StrCat("messages[", i, "]");
    const Json& m = v[i];
    if (!m.is_object()) return WrongType(at, "an object", m);
    RETURN_IF_ERROR(OnlyKnown(
        m, {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}, at));
    if (!m.contains("role")) return Invalid(at, "has no 'role'");
    ASSIGN_OR_RETURN(std::string role, String(m["role"], at + ".role"));
    ChatMessage message;
    // OpenAI's newer name for the system role.
    absl::StatusOr<ChatRole> parsed = ParseChatRole(role == "developer" ? "system" : role);
    if (!parsed.ok()) {
      return Invalid(at + ".role", absl::StrCat("'", role.substr(0, 32),
                                                "' is not one of system, developer, user, "
                                                "assistant, tool"));
    }
    message.role = *parsed;
    if (m.contains("content")) {
      ASSIGN_OR_RETURN(message.content, Content(m["content"], at + ".content"));
    } else if (message.role != ChatRole::kAssistant || !m.contains("tool_calls") ||
               m["tool_calls"].is_null()) {
      // Only an assistant message that calls tools may leave its content out (OpenAI's rule).
      return Invalid(at, "has no 'content'");
    }
    if (m.contains("name")) RETURN_IF_ERROR(String(m["name"], at + ".name").status());
    if (m.contains("tool_call_id")) {
      RETURN_IF_ERROR(String(m["tool_call_id"], at + ".tool_call_id").status());
    }
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      ASSIGN_OR_RETURN(message.reasoning_content,
                       String(m["reasoning_content"], at + ".reasoning_content"));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const Json& calls = m["tool_calls"];
      if (!calls.is_array()) return WrongType(at + ".tool_calls", "an array", calls);
      for (size_t j = 0; j < calls.size(); ++j) {
        const std::string cat = absl::StrCat(at, ".tool_calls[", j, "]");
        const Json& c = calls[j];
        if (!c.is_object()) return WrongType(cat, "an object", c);
        RETURN_IF_ERROR(OnlyKnown(c, {"id", "type", "function", "index"}, cat));
        if (!c.contains("function") || !c["function"].is_object()) {
          return Invalid(cat, "needs a 'function' object");
        }
        const Json& f = c["function"];
        RETURN_IF_ERROR(OnlyKnown(f, {"name", "arguments"}, cat + ".function"));
        ChatToolCall call;
        if (!f.contains("name")) return Invalid(cat + ".function", "has no 'name'");
        ASSIGN_OR_RETURN(call.name, String(f["name"], cat + ".function.name"));
        // OpenAI sends arguments as JSON text; an object is accepted as well.
        if (!f.contains("arguments")) {
          call.arguments_json = "{}";
        } else if (f["arguments"].is_object()) {
          call.arguments_json = f["arguments"].dump();
        } else {
          ASSIGN_OR_RETURN(call.arguments_json,
                           String(f["arguments"], cat + ".function.arguments"));
        }
        message.tool_calls.push_back(std::move(call));
      }
    }
    out->messages.push_back(std::move(message));
  }
  return absl::OkStatus();
}

absl::Status ParseTools(const Json& v, OpenAIRequest* out) {
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_array()) return WrongType("tools", "an array", v);
  if (v.size() > ChatLimits{}.max_tools) {
    return Invalid("tools", absl::StrCat("has ", v.size(), " tools; at most ",
                                         ChatLimits{}.max_tools, " are accepted"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = absl::StrCat("tools[", i, "]");
    const Json& t = v[i];
    if (!t.is_object()) return WrongType(at, "an object", t);
    RETURN_IF_ERROR(OnlyKnown(t, {"type", "function"}, at));
    if (!t.contains("type") || t["type"] != "function") {
      return Invalid(at + ".type", "must be \"function\"");
    }
    if (!t.contains("function") || !t["function"].is_object()) {
      return Invalid(at, "needs a 'function' object");
    }
    const Json& f = t["function"];
    RETURN_IF_ERROR(
        OnlyKnown(f, {"name", "description", "parameters", "strict"}, at + ".function"));
    if (!f.contains("name")) return Invalid(at + ".function", "has no 'name'");
    RETURN_IF_ERROR(String(f["name"], at + ".function.name").status());
    if (f.contains("parameters") && !f["parameters"].is_object()) {
      return WrongType(at + ".function.parameters", "an object (a JSON Schema)", f["parameters"]);
    }
    // The template shows the whole tool object, as transformers' apply_chat_template does.
    out->chat_options.tools_json.push_back(t.dump());
  }
  return absl::OkStatus();
}

absl::Status ParseToolChoice(const Json& v, OpenAIRequest* out) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "auto" || s == "none" || s == "required") {
      out->tool_choice.mode = s == "auto"   ? ToolChoiceMode::kAuto
                              : s == "none" ? ToolChoiceMode::kNone
                                            : ToolChoiceMode::kRequired;
      return absl::OkStatus();
    }
    return Invalid("tool_choice", "must be \"auto\", \"none\", \"required\" or a function");
  }
  // {"type": "function", "function": {"name": "f"}}. Whether f is one of the tools is the
  // text rules' check (CheckToolChoice), the same for glmserve.v1.
  if (!v.is_object()) return WrongType("tool_choice", "a string or an object", v);
  RETURN_IF_ERROR(OnlyKnown(v, {"type", "function"}, "tool_choice"));
  if (!v.contains("type") || v["type"] != "function") {
    return Invalid("tool_choice.type", "must be \"function\"");
  }
  if (!v.contains("function") || !v["function"].is_object()) {
    return Invalid("tool_choice", "needs a 'function' object");
  }
  const Json& f = v["function"];
  RETURN_IF_ERROR(OnlyKnown(f, {"name"}, "tool_choice.function"));
  if (!f.contains("name")) return Invalid("tool_choice.function", "has no 'name'");
  ASSIGN_OR_RETURN(out->tool_choice.function, String(f["name"], "tool_choice.function.name"));
  out->tool_choice.mode = ToolChoiceMode::kFunction;
  return absl::OkStatus();
}

// The body's fields: one table of (name, routes, null handling, parser), read by the unknown
// field check, the required field check and the parse loop alike.
using FieldParser = absl::Status (*)(const Json& v, const char* name, OpenAIRequest* out);

constexpr uint8_t kCompletions = 1, kChat = 2, kBoth = kCompletions | kChat;

struct Field {
  const char* name;
  uint8_t routes;
  bool required;
  bool null_is_unset;  // null means "not given"; else null goes to the parser (a type error)
  FieldParser parse;
};

template <bool OpenAIRequest::*kMember>
absl::Status SetBool(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(out->*kMember, Bool(v, name));
  return absl::OkStatus();
}

// A sampling value: any number here; its bounds are the engine's (ValidateSamplingParams).
template <float OpenAIRequest::*kMember>
absl::Status SetFloat(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(double x, Number(v, name));
  out->*kMember = static_cast<float>(x);
  return absl::OkStatus();
}

absl::Status CheckBool(const Json& v, const char* name, OpenAIRequest*) {
  return Bool(v, name).status();
}

absl::Status CheckString(const Json& v, const char* name, OpenAIRequest*) {
  return String(v, name).status();
}

absl::Status Model(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(out->model, String(v, name));
  return absl::OkStatus();
}

absl::Status MaxTokens(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(out->max_tokens, Int(v, name, 1, std::numeric_limits<int32_t>::max()));
  return absl::OkStatus();
}

absl::Status Temperature(const Json& v, const char* name, OpenAIRequest* out) {
  // OpenAI's own range (the engine accepts any finite value >= 0).
  ASSIGN_OR_RETURN(double t, Number(v, name, 0, 2));
  out->temperature = static_cast<float>(t);
  return absl::OkStatus();
}

absl::Status TopK(const Json& v, const char* name, OpenAIRequest* out) {
  // vLLM's convention: -1 (or 0) turns it off.
  ASSIGN_OR_RETURN(int64_t k, Int(v, name, -1, std::numeric_limits<int32_t>::max()));
  out->top_k = k < 0 ? 0 : static_cast<int32_t>(k);
  return absl::OkStatus();
}

absl::Status Seed(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(int64_t s, Int(v, name, std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()));
  out->seed = static_cast<uint64_t>(s);
  return absl::OkStatus();
}

// Its bound is the engine's (kMaxMtpDraftTokens, checked when the engine request is built).
absl::Status MtpDraftTokens(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(int64_t k, Int(v, name, 0, std::numeric_limits<int32_t>::max()));
  out->mtp_draft_tokens = static_cast<int32_t>(k);
  return absl::OkStatus();
}

absl::Status StopTokenIds(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(out->stop_token_ids, TokenIds(v, name, kMaxWireStopTokenIds));
  return absl::OkStatus();
}

// The count of alternatives: completions' `logprobs` (an integer), chat's `top_logprobs`.
// Its bound is the engine's (kMaxTopLogprobs, checked when the engine request is built).
absl::Status TopLogprobs(const Json& v, const char* name, OpenAIRequest* out) {
  ASSIGN_OR_RETURN(int64_t n, Int(v, name, 0, std::numeric_limits<int32_t>::max()));
  out->top_logprobs = static_cast<int32_t>(n);
  if (std::string_view(name) == "logprobs") out->logprobs = true;
  return absl::OkStatus();
}

absl::Status StreamOptions(const Json& o, const char* name, OpenAIRequest* out) {
  if (!o.is_object()) return WrongType(name, "an object", o);
  RETURN_IF_ERROR(OnlyKnown(o, {"include_usage"}, name));
  if (o.contains("include_usage")) {
    ASSIGN_OR_RETURN(out->include_usage, Bool(o["include_usage"], "stream_options.include_usage"));
  }
  return absl::OkStatus();
}

absl::Status OnlyOne(const Json& v, const char* name, OpenAIRequest*) {
  return Int(v, name, 1, 1).status();
}

absl::Status ZeroPenalty(const Json& v, const char* name, OpenAIRequest*) {
  ASSIGN_OR_RETURN(double p, Number(v, name, -2, 2));
  if (p != 0) return Invalid(name, "is not supported (only 0; repetition_penalty is available)");
  return absl::OkStatus();
}

absl::Status LogitBias(const Json& v, const char* name, OpenAIRequest*) {
  if (v.is_object() && v.empty()) return absl::OkStatus();
  return Invalid(name, "is not supported");
}

absl::Status ResponseFormat(const Json& f, const char* name, OpenAIRequest*) {
  if (!f.is_object() || f.size() != 1 || !f.contains("type") || f["type"] != "text") {
    return Invalid(name, "supports {\"type\": \"text\"} only");
  }
  return absl::OkStatus();
}

absl::Status ChatTemplateKwargs(const Json& k, const char* name, OpenAIRequest* out) {
  if (!k.is_object()) return WrongType(name, "an object", k);
  RETURN_IF_ERROR(OnlyKnown(k, {"enable_thinking"}, name));
  if (k.contains("enable_thinking")) {
    ASSIGN_OR_RETURN(out->chat_options.enable_thinking,
                     Bool(k["enable_thinking"], "chat_template_kwargs.enable_thinking"));
  }
  return absl::OkStatus();
}

absl::Status Echo(const Json& v, const char* name, OpenAIRequest*) {
  if (v.is_boolean() && !v.get<bool>()) return absl::OkStatus();
  return Invalid(name, "is not supported (only false)");
}

absl::Status Suffix(const Json&, const char* name, OpenAIRequest*) {
  return Invalid(name, "is not supported (only null)");
}

absl::Status BestOf(const Json& v, const char* name, OpenAIRequest*) {
  if (v.is_number_integer() && v == 1) return absl::OkStatus();
  return Invalid(name, "is not supported (only 1)");
}

const Field kFields[] = {
    {"model", kBoth, true, false, Model},
    {"prompt", kCompletions, true, false,
     [](const Json& v, const char*, OpenAIRequest* out) { return ParsePrompt(v, out); }},
    {"messages", kChat, true, false,
     [](const Json& v, const char*, OpenAIRequest* out) { return ParseMessages(v, out); }},
    {"tools", kChat, false, true,
     [](const Json& v, const char*, OpenAIRequest* out) { return ParseTools(v, out); }},
    {"tool_choice", kChat, false, true,
     [](const Json& v, const char*, OpenAIRequest* out) { return ParseToolChoice(v, out); }},
    {"parallel_tool_calls", kChat, false, false, CheckBool},
    {"max_tokens", kBoth, false, true, MaxTokens},
    {"max_completion_tokens", kChat, false, true, MaxTokens},
    {"temperature", kBoth, false, true, Temperature},
    {"top_p", kBoth, false, true, SetFloat<&OpenAIRequest::top_p>},
    {"top_k", kBoth, false, true, TopK},
    {"min_p", kBoth, false, true, SetFloat<&OpenAIRequest::min_p>},
    {"repetition_penalty", kBoth, false, true, SetFloat<&OpenAIRequest::repetition_penalty>},
    {"seed", kBoth, false, true, Seed},
    {"mtp_draft_tokens", kBoth, false, true, MtpDraftTokens},
    {"stop", kBoth, false, true,
     [](const Json& v, const char*, OpenAIRequest* out) { return ParseStop(v, out); }},
    {"stop_token_ids", kBoth, false, true, StopTokenIds},
    {"ignore_eos", kBoth, false, false, SetBool<&OpenAIRequest::ignore_eos>},
    {"logprobs", kChat, false, true, SetBool<&OpenAIRequest::logprobs>},
    {"logprobs", kCompletions, false, true, TopLogprobs},
    {"top_logprobs", kChat, false, true, TopLogprobs},
    {"stream", kBoth, false, true, SetBool<&OpenAIRequest::stream>},
    {"stream_options", kBoth, false, true, StreamOptions},
    {"n", kBoth, false, true, OnlyOne},
    {"user", kBoth, false, false, CheckString},
    {"presence_penalty", kBoth, false, true, ZeroPenalty},
    {"frequency_penalty", kBoth, false, true, ZeroPenalty},
    {"logit_bias", kBoth, false, true, LogitBias},
    {"response_format", kChat, false, true, ResponseFormat},
    {"chat_template_kwargs", kChat, false, true, ChatTemplateKwargs},
    {"echo", kCompletions, false, false, Echo},
    {"suffix", kCompletions, false, true, Suffix},
    {"best_of", kCompletions, false, false, BestOf},
    {"skip_special_tokens", kBoth, false, false, SetBool<&OpenAIRequest::skip_special_tokens>},
};

// Every field of the body is one of the route's.
absl::Status OnlyRouteFields(const Json& body, uint8_t route) {
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const Field& f : kFields) known |= (f.routes & route) != 0 && key == f.name;
    if (known) continue;
    std::vector<std::string> names;
    for (const Field& f : kFields) {
      if ((f.routes & route) != 0) names.push_back(f.name);
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown field '", key.substr(0, 64),
                                                   "' (fields: ", absl::StrJoin(names, ", "), ")"));
  }
  return absl::OkStatus();
}

// The rules between fields, once each has been read.
absl::Status CheckTogether(const Json& body, OpenAIRequest* out) {
  if (out->chat && out->top_logprobs > 0 && !out->logprobs) {
    return Invalid("top_logprobs", "needs \"logprobs\": true");
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null() && !out->stream) {
    return Invalid("stream_options", "needs \"stream\": true");
  }
  // OpenAI's default for completions (null: the server's default).
  if (!out->chat && !body.contains("max_tokens")) out->max_tokens = 16;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAIRequest> ParseOpenAIRequest(const Json& body, bool chat) {
  if (!body.is_object()) return WrongType("body", "a JSON object", body);
  const uint8_t route = chat ? kChat : kCompletions;
  RETURN_IF_ERROR(OnlyRouteFields(body, route));
  for (const Field& f : kFields) {
    if (f.required && (f.routes & route) != 0 && !body.contains(f.name)) {
      return Invalid(f.name, "is required");
    }
  }
  OpenAIRequest out;
  out.chat = chat;
  for (const Field& f : kFields) {
    if ((f.routes & route) == 0) continue;
    const auto it = body.find(f.name);
    if (it == body.end() || (f.null_is_unset && it->is_null())) continue;
    RETURN_IF_ERROR(f.parse(*it, f.name, &out));
  }
  RETURN_IF_ERROR(CheckTogether(body, &out));
  return out;
}

absl::StatusOr<OpenAIRequest> ParseOpenAIBody(std::string_view body, bool chat) {
  ASSIGN_OR_RETURN(Json json, ParseJsonBody(body));
  return ParseOpenAIRequest(json, chat);
}

}  // namespace glmserve
