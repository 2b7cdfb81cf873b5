#include "core/text/text_assets.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "core/base/file_io.h"
#include "core/base/status_macros.h"
#include "core/text/chat_format.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using Json = nlohmann::json;
constexpr uint64_t kSmallFileLimit = uint64_t{4} << 20;  // configs and templates

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kSmallFileLimit));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return j;
}

// The tokens GLM-4.5's chat format writes or the parser reads.
constexpr const char* kChatTokens[] = {
    "[gMASK]",   "<sop>",      "<|system|>",  "<|user|>",     "<|assistant|>",   "<|observation|>",
    "<think>",   "</think>",   "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};

}  // namespace

absl::StatusOr<TextAssets> LoadTextAssets(const std::string& dir, const TokenizerLimits& limits) {
  TextAssets a;
  a.source = dir;
  const std::string tok_path = dir + "/tokenizer.json";
  if (!Exists(tok_path)) {
    a.chat_template_problem = "no tokenizer.json";
    return a;
  }
  ASSIGN_OR_RETURN(a.tokenizer, Tokenizer::FromFile(tok_path, limits));

  std::string chat_template;
  Json config;
  if (Exists(dir + "/tokenizer_config.json")) {
    ASSIGN_OR_RETURN(config, ReadJsonFile(dir + "/tokenizer_config.json"));
    if (config.contains("chat_template")) {
      const Json& t = config.at("chat_template");
      if (t.is_string()) {
        chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const Json& e : t) {
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
              e.at("template").is_string()) {
            chat_template = e.at("template").get<std::string>();
          }
        }
      }
    }
  }
  if (chat_template.empty() && Exists(dir + "/chat_template.jinja")) {
    ASSIGN_OR_RETURN(chat_template, ReadRegularFile(dir + "/chat_template.jinja", kSmallFileLimit));
  }
  if (chat_template.empty()) {
    a.chat_template_problem = "no chat_template in tokenizer_config.json or chat_template.jinja";
  } else if (absl::Status s = RecognizeChatTemplate(chat_template); !s.ok()) {
    a.chat_template_problem = std::string(s.message());
  } else {
    a.has_chat_template = true;
    for (const char* t : kChatTokens) {
      if (!a.tokenizer->AddedTokenId(t).has_value()) {
        a.has_chat_template = false;
        a.chat_template_problem = absl::StrCat("the tokenizer lacks the chat token ", t);
        break;
      }
    }
  }

  const auto add_eos = [&](const Json& v) -> absl::Status {
    if (!v.is_number_integer() || !a.tokenizer->HasId(v.get<int32_t>())) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/generation_config.json: eos_token_id ",
                                                     v.dump().substr(0, 64),
                                                     " is not a token id of tokenizer.json"));
    }
    a.eos_token_ids.push_back(v.get<int32_t>());
    return absl::OkStatus();
  };
  if (Exists(dir + "/generation_config.json")) {
    ASSIGN_OR_RETURN(Json gen, ReadJsonFile(dir + "/generation_config.json"));
    if (gen.contains("eos_token_id")) {
      const Json& e = gen.at("eos_token_id");
      if (e.is_array()) {
        if (e.size() > 64) return absl::InvalidArgumentError("more than 64 eos_token_id values");
        for (const Json& v : e) RETURN_IF_ERROR(add_eos(v));
      } else if (!e.is_null()) {
        RETURN_IF_ERROR(add_eos(e));
      }
    }
  }
  if (a.eos_token_ids.empty() && config.is_object() && config.contains("eos_token") &&
      config.at("eos_token").is_string()) {
    if (auto id = a.tokenizer->AddedTokenId(config.at("eos_token").get<std::string>())) {
      a.eos_token_ids.push_back(*id);
    }
  }
  return a;
}

absl::Status MissingTextError(const TextAssets& assets, bool needs_chat, std::string_view what) {
  if (assets.tokenizer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(what), " needs a tokenizer, and the model has none (no tokenizer.json in ",
        assets.source.empty() ? "the checkpoint" : assets.source, "); send token ids instead"));
  }
  if (needs_chat && !assets.has_chat_template) {
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(what), " needs GLM-4.5's chat template, and the model has none usable: ",
        assets.chat_template_problem));
  }
  return absl::OkStatus();
}

}  // namespace glmserve
