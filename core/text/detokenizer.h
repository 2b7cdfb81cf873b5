// Streaming detokenization: ids in one at a time, text out in deltas that never split a UTF-8
// character, whose concatenation equals Tokenizer::Decode of all the ids (same U+FFFD
// replacements), whatever the token boundaries.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/text/tokenizer.h"

namespace glmserve {

class StreamDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  StreamDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // The text that id completes (possibly empty: the bytes may end inside a character).
  // INVALID_ARGUMENT for an id the tokenizer does not have (nothing changes then).
  absl::StatusOr<std::string> Push(int32_t id);
  // The end of the stream: the held bytes (an incomplete sequence becomes U+FFFD).
  std::string Finish();
  // Bytes held back, waiting for the rest of a character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace glmserve
