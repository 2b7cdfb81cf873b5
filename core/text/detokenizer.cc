#include "core/text/detokenizer.h"

#include "absl/strings/str_cat.h"
#include "core/text/unicode.h"

namespace glmserve {

absl::StatusOr<std::string> StreamDetokenizer::Push(int32_t id) {
  if (!tokenizer_.HasId(id)) {
    return absl::InvalidArgumentError(absl::StrCat("id ", id, " is not a token of this tokenizer"));
  }
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return std::string();
  pending_.append(tokenizer_.TokenBytes(id));
  // Everything but a trailing proper prefix of a well-formed sequence decodes now exactly as
  // it would within the whole: lossy decoding never looks past the end of a complete
  // sequence or of an ill-formed one.
  const size_t hold = Utf8PendingTail(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDetokenizer::Finish() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace glmserve
