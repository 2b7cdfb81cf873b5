// GLM-4.5's pre-tokenizer, written by hand: splits text into the pieces that the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// matches with Oniguruma (Hugging Face `tokenizers`' Split pre-tokenizer, behavior Isolated).
// Every code point falls in one alternative, so the matches tile the text. Why by hand and
// not a regex library: RE2 has no look-ahead; PCRE2's \s differs from Oniguruma's (it lacks
// U+0085); and a direct scan with a class table is several times faster than either.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace glmserve {

struct ByteSpan {
  size_t begin;
  size_t end;
};

// Appends to `out` the pieces of `text` (valid UTF-8: callers validate first) in order, as
// byte ranges that tile it.
void Glm45PreTokenize(std::string_view text, std::vector<ByteSpan>* out);

}  // namespace glmserve
