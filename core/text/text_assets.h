// The text side of a checkpoint directory: tokenizer.json, tokenizer_config.json (its
// chat_template), chat_template.jinja and generation_config.json (eos ids), each optional.
// A checkpoint without tokenizer.json still serves token ids; callers then answer text
// requests with FAILED_PRECONDITION naming what is missing (MissingTextError). A file that is
// present but not GLM-4.5's structure is an error at load (never a wrong tokenization).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/text/tokenizer.h"

namespace glmserve {

struct TextAssets {
  std::unique_ptr<Tokenizer> tokenizer;  // null: no tokenizer.json
  bool has_chat_template = false;        // GLM-4.5's template found (and the tokens it needs)
  std::string chat_template_problem;     // why has_chat_template is false
  std::vector<int32_t>
      eos_token_ids;   // generation_config.json's, else tokenizer_config's eos_token
  std::string source;  // the directory, for messages
};

absl::StatusOr<TextAssets> LoadTextAssets(const std::string& dir,
                                          const TokenizerLimits& limits = {});

// FAILED_PRECONDITION for a text request (`what`: "prompt_text", "messages", ...) the assets
// cannot serve: no tokenizer, or (`needs_chat`) no GLM-4.5 chat template. OK otherwise.
absl::Status MissingTextError(const TextAssets& assets, bool needs_chat, std::string_view what);

}  // namespace glmserve
