#include "core/text/unicode.h"

#include <algorithm>
#include <array>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace glmserve {
namespace {

bool IsCont(uint8_t b) { return (b & 0xC0) == 0x80; }

// The second byte's allowed range for a lead byte (RFC 3629's table): excludes overlong
// forms, surrogates and code points above U+10FFFF.
bool SecondOk(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return IsCont(b);
  }
}

int Width(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // a continuation byte, C0/C1 (always overlong) or F5..FF: never a lead
}

bool InRanges(const text_internal::CodepointRange* r, size_t n, uint32_t cp) {
  const text_internal::CodepointRange* end = r + n;
  const auto* it = std::upper_bound(
      r, end, cp, [](uint32_t v, const text_internal::CodepointRange& x) { return v < x.first; });
  return it != r && cp <= (it - 1)->last;
}

bool IsWhiteSpace(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

uint8_t ComputeClass(uint32_t cp) {
  uint8_t c = 0;
  if (InRanges(text_internal::kLetterRanges, text_internal::kLetterRangesSize, cp))
    c |= kCharLetter;
  if (InRanges(text_internal::kNumberRanges, text_internal::kNumberRangesSize, cp))
    c |= kCharNumber;
  if (IsWhiteSpace(cp)) c |= kCharSpace;
  return c;
}

// The Basic Multilingual Plane's classes in a table (64 KiB), built once: nearly every code
// point of real text is there, and a lookup beats a binary search in the hot loop.
const std::array<uint8_t, 0x10000>& BmpClasses() {
  static const auto* table = [] {
    auto* t = new std::array<uint8_t, 0x10000>();
    for (uint32_t cp = 0; cp < 0x10000; ++cp) (*t)[cp] = ComputeClass(cp);
    return t;
  }();
  return *table;
}

}  // namespace

int Utf8Next(std::string_view s, size_t i, uint32_t* cp) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  const size_t avail = s.size() - i;
  const uint8_t b0 = p[0];
  const int w = Width(b0);
  if (w == 1) {
    *cp = b0;
    return 1;
  }
  if (w == 0) return -1;
  if (avail < 2 || !SecondOk(b0, p[1])) return -1;
  if (w == 2) {
    *cp = (uint32_t{b0 & 0x1Fu} << 6) | (p[1] & 0x3Fu);
    return 2;
  }
  if (avail < 3 || !IsCont(p[2])) return -2;
  if (w == 3) {
    *cp = (uint32_t{b0 & 0x0Fu} << 12) | (uint32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
    return 3;
  }
  if (avail < 4 || !IsCont(p[3])) return -3;
  *cp = (uint32_t{b0 & 0x07u} << 18) | (uint32_t{p[1] & 0x3Fu} << 12) |
        (uint32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
  return 4;
}

absl::Status ValidateUtf8(std::string_view s, std::string_view what) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs dominate real text: skip them without decoding.
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    const int n = Utf8Next(s, i, &cp);
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is not valid UTF-8: an ill-formed sequence starts with byte "
                          "0x%02X at offset %d",
                          std::string(what), static_cast<uint8_t>(s[i]), i));
    }
    i += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    uint32_t cp;
    const int n = Utf8Next(bytes, i, &cp);
    if (n > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

size_t Utf8PendingTail(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto lead = static_cast<uint8_t>(bytes[n - k]);
    const int w = Width(lead);
    if (w == 0) continue;  // a continuation byte (or a never-lead byte): look further back
    if (w <= static_cast<int>(k)) return 0;  // the sequence starting here is already complete
    // A lead with k-1 bytes after it: pending only if those bytes can still begin a
    // well-formed sequence.
    if (k >= 2 && !SecondOk(lead, static_cast<uint8_t>(bytes[n - k + 1]))) return 0;
    if (k >= 3 && !IsCont(static_cast<uint8_t>(bytes[n - k + 2]))) return 0;
    return k;
  }
  return 0;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint8_t CharClassOf(uint32_t cp) {
  if (cp < 0x10000) return BmpClasses()[cp];
  return ComputeClass(cp);
}

}  // namespace glmserve
