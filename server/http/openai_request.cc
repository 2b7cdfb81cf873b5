#include "server/http/openai_request.h"

#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"

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

absl::StatusOr<double> Number(const Json& v, absl::string_view field, double min, double max) {
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

}  // namespace

absl::StatusOr<OpenAIRequest> ParseOpenAIRequest(const Json& body, bool chat) {
  if (!body.is_object()) return WrongType("body", "a JSON object", body);
  OpenAIRequest out;
  out.chat = chat;
  if (chat) {
    RETURN_IF_ERROR(OnlyKnown(body,
                              {"model",
                               "messages",
                               "tools",
                               "tool_choice",
                               "parallel_tool_calls",
                               "max_tokens",
                               "max_completion_tokens",
                               "temperature",
                               "top_p",
                               "top_k",
                               "min_p",
                               "repetition_penalty",
                               "seed",
                               "stop",
                               "stop_token_ids",
                               "ignore_eos",
                               "logprobs",
                               "top_logprobs",
                               "stream",
                               "stream_options",
                               "n",
                               "user",
                               "presence_penalty",
                               "frequency_penalty",
                               "logit_bias",
                               "response_format",
                               "chat_template_kwargs",
                               "skip_special_tokens"},
                              ""));
  } else {
    RETURN_IF_ERROR(OnlyKnown(body,
                              {"model",
                               "prompt",
                               "max_tokens",
                               "temperature",
                               "top_p",
                               "top_k",
                               "min_p",
                               "repetition_penalty",
                               "seed",
                               "stop",
                               "stop_token_ids",
                               "ignore_eos",
                               "logprobs",
                               "stream",
                               "stream_options",
                               "n",
                               "user",
                               "presence_penalty",
                               "frequency_penalty",
                               "logit_bias",
                               "echo",
                               "suffix",
                               "best_of",
                               "skip_special_tokens"},
                              ""));
  }
  if (!body.contains("model")) return Invalid("model", "is required");
  ASSIGN_OR_RETURN(out.model, String(body["model"], "model"));

  if (chat) {
    if (!body.contains("messages")) return Invalid("messages", "is required");
    RETURN_IF_ERROR(ParseMessages(body["messages"], &out));
    if (body.contains("tools")) RETURN_IF_ERROR(ParseTools(body["tools"], &out));
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
      RETURN_IF_ERROR(ParseToolChoice(body["tool_choice"], &out));
    }
    if (body.contains("parallel_tool_calls")) {
      RETURN_IF_ERROR(Bool(body["parallel_tool_calls"], "parallel_tool_calls").status());
    }
    if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
      const Json& k = body["chat_template_kwargs"];
      if (!k.is_object()) return WrongType("chat_template_kwargs", "an object", k);
      RETURN_IF_ERROR(OnlyKnown(k, {"enable_thinking"}, "chat_template_kwargs"));
      if (k.contains("enable_thinking")) {
        ASSIGN_OR_RETURN(out.chat_options.enable_thinking,
                         Bool(k["enable_thinking"], "chat_template_kwargs.enable_thinking"));
      }
    }
    if (body.contains("response_format") && !body["response_format"].is_null()) {
      const Json& f = body["response_format"];
      if (!f.is_object() || f.size() != 1 || !f.contains("type") || f["type"] != "text") {
        return Invalid("response_format", "supports {\"type\": \"text\"} only");
      }
    }
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      ASSIGN_OR_RETURN(out.logprobs, Bool(body["logprobs"], "logprobs"));
    }
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
      ASSIGN_OR_RETURN(int64_t n, Int(body["top_logprobs"], "top_logprobs", 0, 20));
      if (n > 0 && !out.logprobs) return Invalid("top_logprobs", "needs \"logprobs\": true");
      out.top_logprobs = static_cast<int32_t>(n);
    }
    for (const char* key : {"max_completion_tokens", "max_tokens"}) {
      if (body.contains(key) && !body[key].is_null()) {
        ASSIGN_OR_RETURN(out.max_tokens,
                         Int(body[key], key, 1, std::numeric_limits<int32_t>::max()));
      }
    }
  } else {
    if (!body.contains("prompt")) return Invalid("prompt", "is required");
    RETURN_IF_ERROR(ParsePrompt(body["prompt"], &out));
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      ASSIGN_OR_RETURN(int64_t n, Int(body["logprobs"], "logprobs", 0, 20));
      out.logprobs = true;
      out.top_logprobs = static_cast<int32_t>(n);
    }
    if (body.contains("echo") && !(body["echo"].is_boolean() && !body["echo"].get<bool>())) {
      return Invalid("echo", "is not supported (only false)");
    }
    if (body.contains("suffix") && !body["suffix"].is_null()) {
      return Invalid("suffix", "is not supported (only null)");
    }
    if (body.contains("best_of") &&
        !(body["best_of"].is_number_integer() && body["best_of"] == 1)) {
      return Invalid("best_of", "is not supported (only 1)");
    }
    if (body.contains("max_tokens") && !body["max_tokens"].is_null()) {
      ASSIGN_OR_RETURN(out.max_tokens, Int(body["max_tokens"], "max_tokens", 1,
                                           std::numeric_limits<int32_t>::max()));
    } else if (!body.contains("max_tokens")) {
      out.max_tokens = 16;  // OpenAI's default for completions (null: the server's default)
    }
  }

  if (body.contains("temperature") && !body["temperature"].is_null()) {
    ASSIGN_OR_RETURN(double t, Number(body["temperature"], "temperature", 0, 2));
    out.temperature = static_cast<float>(t);
  }
  if (body.contains("top_p") && !body["top_p"].is_null()) {
    ASSIGN_OR_RETURN(double p, Number(body["top_p"], "top_p", 0, 1));
    out.top_p = static_cast<float>(p);
  }
  if (body.contains("top_k") && !body["top_k"].is_null()) {
    // vLLM's convention: -1 (or 0) turns it off.
    ASSIGN_OR_RETURN(int64_t k,
                     Int(body["top_k"], "top_k", -1, std::numeric_limits<int32_t>::max()));
    out.top_k = k < 0 ? 0 : static_cast<int32_t>(k);
  }
  if (body.contains("min_p") && !body["min_p"].is_null()) {
    ASSIGN_OR_RETURN(double p, Number(body["min_p"], "min_p", 0, 1));
    out.min_p = static_cast<float>(p);
  }
  if (body.contains("repetition_penalty") && !body["repetition_penalty"].is_null()) {
    ASSIGN_OR_RETURN(double r, Number(body["repetition_penalty"], "repetition_penalty", 0, 1e6));
    out.repetition_penalty = static_cast<float>(r);
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    ASSIGN_OR_RETURN(int64_t s, Int(body["seed"], "seed", std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max()));
    out.seed = static_cast<uint64_t>(s);
  }
  if (body.contains("stop")) RETURN_IF_ERROR(ParseStop(body["stop"], &out));
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    ASSIGN_OR_RETURN(out.stop_token_ids,
                     TokenIds(body["stop_token_ids"], "stop_token_ids", kMaxWireStopTokenIds));
  }
  if (body.contains("ignore_eos")) {
    ASSIGN_OR_RETURN(out.ignore_eos, Bool(body["ignore_eos"], "ignore_eos"));
  }
  if (body.contains("skip_special_tokens")) {
    ASSIGN_OR_RETURN(out.skip_special_tokens,
                     Bool(body["skip_special_tokens"], "skip_special_tokens"));
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    ASSIGN_OR_RETURN(out.stream, Bool(body["stream"], "stream"));
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& o = body["stream_options"];
    if (!o.is_object()) return WrongType("stream_options", "an object", o);
    if (!out.stream) return Invalid("stream_options", "needs \"stream\": true");
    RETURN_IF_ERROR(OnlyKnown(o, {"include_usage"}, "stream_options"));
    if (o.contains("include_usage")) {
      ASSIGN_OR_RETURN(out.include_usage, Bool(o["include_usage"], "stream_options.include_usage"));
    }
  }
  if (body.contains("n") && !body["n"].is_null()) {
    ASSIGN_OR_RETURN(int64_t n, Int(body["n"], "n", 1, 1));
    (void)n;
  }
  if (body.contains("user")) RETURN_IF_ERROR(String(body["user"], "user").status());
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (body.contains(key) && !body[key].is_null()) {
      ASSIGN_OR_RETURN(double p, Number(body[key], key, -2, 2));
      if (p != 0) {
        return Invalid(key, "is not supported (only 0; repetition_penalty is available)");
      }
    }
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
      !(body["logit_bias"].is_object() && body["logit_bias"].empty())) {
    return Invalid("logit_bias", "is not supported");
  }
  return out;
}

absl::StatusOr<OpenAIRequest> ParseOpenAIBody(std::string_view body, bool chat) {
  struct TooDeep {};
  Json json;
  try {
    json = Json::parse(body, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: nested deeper than ", kMaxJsonDepth, " levels"));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
  return ParseOpenAIRequest(json, chat);
}

}  // namespace glmserve
