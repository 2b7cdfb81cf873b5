#include "core/text/stop_strings.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace glmserve {
namespace {

// Feeds `text` in random pieces; returns the released text and whether it stopped.
std::pair<std::string, bool> Feed(const std::vector<std::string>& stops, const std::string& text,
                                  uint32_t seed) {
  auto m = StopStringMatcher::Create(stops);
  EXPECT_TRUE(m.ok());
  std::mt19937 rng(seed);
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    size_t n = 1 + rng() % 5;
    // Whole UTF-8 characters only, as the detokenizer delivers them.
    while (i + n < text.size() && (static_cast<uint8_t>(text[i + n]) & 0xC0) == 0x80) ++n;
    n = std::min(n, text.size() - i);
    auto r = m->Push(text.substr(i, n));
    out += r.text;
    i += n;
    if (r.stopped) return {out, true};
  }
  return {out + m->Finish(), false};
}

TEST(StopStrings, MatchesAcrossAnyBoundary) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    auto [text, stopped] = Feed({"STOP", "字字", "\n\n"}, "abc ST STO 字x字 STOP tail", seed);
    EXPECT_TRUE(stopped);
    EXPECT_EQ(text, "abc ST STO 字x字 ");
    auto [t2, s2] = Feed({"STOP", "字字"}, "a 字字 STOP", seed);
    EXPECT_EQ(t2, "a ");
    auto [t3, s3] = Feed({"STOP"}, "no stop here, ST", seed);
    EXPECT_FALSE(s3);
    EXPECT_EQ(t3, "no stop here, ST");
  }
}

TEST(StopStrings, LeftmostWinsAndNothingAfterAStop) {
  auto m = StopStringMatcher::Create({"bcd", "abc"});
  ASSERT_TRUE(m.ok());
  auto r = m->Push("xabcd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 1);
  EXPECT_EQ(r.text, "x");
  EXPECT_TRUE(m->Push("more").text.empty());
  EXPECT_TRUE(m->Finish().empty());
}

TEST(StopStrings, BoundsAndValidation) {
  EXPECT_EQ(StopStringMatcher::Create(std::vector<std::string>(100000, "x")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(StopStringMatcher::Create({""}).ok());
  EXPECT_FALSE(StopStringMatcher::Create({std::string(257, 'a')}).ok());
  EXPECT_FALSE(StopStringMatcher::Create({"\xff"}).ok());
  EXPECT_TRUE(StopStringMatcher::Create({}).ok());
}

}  // namespace
}  // namespace glmserve
