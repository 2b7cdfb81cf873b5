#include "core/text/pretokenizer.h"

#include <cstdint>

#include "core/text/unicode.h"

namespace glmserve {
namespace {

// The text decoded once: code points, their byte offsets and classes, so that the
// alternatives below can look ahead and back freely.
struct Decoded {
  std::vector<uint32_t> cp;
  std::vector<uint32_t> offset;  // byte offset of cp[i]; offset[n] = text size
  std::vector<uint8_t> cls;
};

void Decode(std::string_view text, Decoded* d) {
  d->cp.clear();
  d->offset.clear();
  d->cls.clear();
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp;
    int n = Utf8Next(text, i, &cp);
    if (n < 0) {  // unreachable for validated input; keep going as U+FFFD rather than loop
      cp = 0xFFFD;
      n = -n;
    }
    d->cp.push_back(cp);
    d->offset.push_back(static_cast<uint32_t>(i));
    d->cls.push_back(CharClassOf(cp));
    i += static_cast<size_t>(n);
  }
  d->offset.push_back(static_cast<uint32_t>(text.size()));
}

// Case-insensitive match of a contraction letter: (?i) folds 's' with 'S' and U+017F (long s);
// the other letters fold only with their ASCII capitals.
bool FoldEq(uint32_t c, char lower) {
  if (c == static_cast<uint32_t>(lower) || c == static_cast<uint32_t>(lower - 'a' + 'A'))
    return true;
  return lower == 's' && c == 0x17F;
}

bool IsNewline(uint32_t c) { return c == '\r' || c == '\n'; }

}  // namespace

void Glm45PreTokenize(std::string_view text, std::vector<ByteSpan>* out) {
  thread_local Decoded d;
  Decode(text, &d);
  const size_t n = d.cp.size();
  const auto letter = [&](size_t k) { return (d.cls[k] & kCharLetter) != 0; };
  const auto number = [&](size_t k) { return (d.cls[k] & kCharNumber) != 0; };
  const auto space = [&](size_t k) { return (d.cls[k] & kCharSpace) != 0; };
  const auto other = [&](size_t k) { return d.cls[k] == 0; };  // [^\s\p{L}\p{N}]
  const auto emit = [&](size_t a, size_t b) { out->push_back({d.offset[a], d.offset[b]}); };

  size_t i = 0;
  while (i < n) {
    const uint32_t c = d.cp[i];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c == '\'' && i + 1 < n) {
      const uint32_t c1 = d.cp[i + 1];
      if (FoldEq(c1, 's') || FoldEq(c1, 't') || FoldEq(c1, 'm') || FoldEq(c1, 'd')) {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        const uint32_t c2 = d.cp[i + 2];
        if ((FoldEq(c1, 'r') && FoldEq(c2, 'e')) || (FoldEq(c1, 'v') && FoldEq(c2, 'e')) ||
            (FoldEq(c1, 'l') && FoldEq(c2, 'l'))) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = i;
    if (letter(i)) {
      j = i + 1;
    } else if (!IsNewline(c) && !number(i) && i + 1 < n && letter(i + 1)) {
      j = i + 2;
    }
    if (j > i) {
      while (j < n && letter(j)) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // \p{N}{1,3}
    if (number(i)) {
      j = i + 1;
      while (j < n && j < i + 3 && number(j)) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    size_t start = n;
    if (other(i)) {
      start = i;
    } else if (c == ' ' && i + 1 < n && other(i + 1)) {
      start = i + 1;
    }
    if (start < n) {
      j = start;
      while (j < n && other(j)) ++j;
      while (j < n && IsNewline(d.cp[j])) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // White space from here on: \s*[\r\n]+ | \s+(?!\S) | \s+
    size_t last_newline = n;
    j = i;
    while (j < n && space(j)) {
      if (IsNewline(d.cp[j])) last_newline = j;
      ++j;
    }
    if (last_newline < n) {
      j = last_newline + 1;  // \s* backs off to the last newline of the run
    } else if (j < n && j - i > 1) {
      j = j - 1;  // leave the last space to prefix the next word
    }
    emit(i, j);
    i = j;
  }
  // A huge text's decoding is not kept by the thread for ever (64K code points are).
  if (d.cp.capacity() > (size_t{1} << 16)) d = Decoded();
}

}  // namespace glmserve
