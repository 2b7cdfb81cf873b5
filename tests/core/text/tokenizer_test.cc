// The GLM-4.5 tokenizer against Hugging Face `tokenizers`: tests/golden/tokenizer holds a
// tokenizer.json built by tools/make_tokenizer_goldens.py with GLM-4.5's structure and what
// `tokenizers` encodes and decodes for >= 10,000 strings; every one is checked here, also
// through the streaming detokenizer.
#include "core/text/tokenizer.h"

#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "core/text/detokenizer.h"
#include "core/text/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using Json = nlohmann::json;

const std::string kDir = std::string(GLMSERVE_GOLDEN_DIR) + "/tokenizer";

std::vector<Json> ReadJsonl(const std::string& path) {
  std::ifstream f(path);
  std::vector<Json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(Json::parse(line));
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

const Tokenizer& Golden() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromFile(kDir + "/glm45_small/tokenizer.json");
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->release() : nullptr;
  }();
  return *tok;
}

// Decodes through the streaming detokenizer, checking that no delta splits a character.
std::string StreamDecode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDetokenizer d(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    auto delta = d.Push(id);
    EXPECT_TRUE(delta.ok()) << delta.status();
    if (!delta.ok()) return "";
    EXPECT_TRUE(ValidateUtf8(*delta, "delta").ok());
    EXPECT_LE(d.pending_bytes(), 3u);
    all += *delta;
  }
  const std::string tail = d.Finish();
  EXPECT_TRUE(ValidateUtf8(tail, "tail").ok());
  return all + tail;
}

TEST(TokenizerGolden, EncodeDecodeAndStreamEveryString) {
  const Tokenizer& tok = Golden();
  const std::vector<Json> cases = ReadJsonl(kDir + "/encode.jsonl");
  ASSERT_GE(cases.size(), 10000u);
  size_t failures = 0;
  for (size_t k = 0; k < cases.size() && failures < 20; ++k) {
    const Json& c = cases[k];
    const std::string text = c.at("t").get<std::string>();
    const std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
    auto ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (*ids != want) {
      ++failures;
      ADD_FAILURE() << "case " << k << " encodes differently: " << Json(text).dump() << "\n want "
                    << Json(want).dump() << "\n got  " << Json(*ids).dump();
      continue;
    }
    const std::string d = c.value("d", text);
    const std::string ds = c.value("ds", d);
    auto got_d = tok.Decode(want, false);
    auto got_ds = tok.Decode(want, true);
    ASSERT_TRUE(got_d.ok() && got_ds.ok());
    if (*got_d != d || *got_ds != ds || StreamDecode(tok, want, false) != d ||
        StreamDecode(tok, want, true) != ds) {
      ++failures;
      ADD_FAILURE() << "case " << k << " decodes differently: " << Json(text).dump();
    }
  }
  EXPECT_EQ(failures, 0u);
}

TEST(TokenizerGolden, DecodeArbitraryIdsLikeHf) {
  // Random id sequences: many join into ill-formed UTF-8, replaced as HF (Rust) does.
  const Tokenizer& tok = Golden();
  const std::vector<Json> cases = ReadJsonl(kDir + "/decode.jsonl");
  ASSERT_GE(cases.size(), 1000u);
  size_t replaced = 0;
  for (const Json& c : cases) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const std::string d = c.at("d").get<std::string>(), ds = c.at("ds").get<std::string>();
    auto got = tok.Decode(ids, false);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, d) << c.dump();
    ASSERT_EQ(*tok.Decode(ids, true), ds) << c.dump();
    ASSERT_EQ(StreamDecode(tok, ids, false), d) << c.dump();
    ASSERT_EQ(StreamDecode(tok, ids, true), ds) << c.dump();
    if (d.find("\xEF\xBF\xBD") != std::string::npos) ++replaced;
  }
  EXPECT_GT(replaced, 100u);  // the fixture does exercise the replacement
}

TEST(TokenizerGolden, InvalidUtf8IsRefusedWithTheOffset) {
  // HF cannot even be given these (a Python str is valid Unicode): glmserve refuses them.
  const Tokenizer& tok = Golden();
  const std::vector<Json> cases = ReadJsonl(kDir + "/invalid_utf8.jsonl");
  ASSERT_GE(cases.size(), 100u);
  for (const Json& c : cases) {
    const std::string bytes = absl::HexStringToBytes(c.at("hex").get<std::string>());
    auto ids = tok.Encode(bytes);
    ASSERT_FALSE(ids.ok()) << c.dump();
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos);
    EXPECT_NE(ids.status().message().find("offset"), std::string::npos);
  }
}

TEST(Tokenizer, AddedTokensAndIds) {
  const Tokenizer& tok = Golden();
  auto user = tok.AddedTokenId("<|user|>");
  auto think = tok.AddedTokenId("<think>");
  ASSERT_TRUE(user && think);
  EXPECT_TRUE(tok.IsSpecial(*user));
  EXPECT_FALSE(tok.IsSpecial(*think));
  EXPECT_TRUE(tok.IsAdded(*think));
  EXPECT_FALSE(tok.AddedTokenId("<|nope|>").has_value());
  auto ids = tok.Encode("a<think>b<|user|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[1], *think);
  EXPECT_EQ(ids->back(), *user);
  // Special tokens vanish with skip_special_tokens, ordinary added ones stay.
  EXPECT_EQ(*tok.Decode(*ids, true), "a<think>b");
  auto bad = tok.Decode({0, tok.id_limit()});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("position 1"), std::string::npos);
}

TEST(Tokenizer, LimitsBoundTheWork) {
  TokenizerLimits limits;
  limits.max_input_bytes = 1000;
  limits.max_tokens = 50;
  auto tok = Tokenizer::FromFile(kDir + "/glm45_small/tokenizer.json", limits);
  ASSERT_TRUE(tok.ok());
  auto too_long = (*tok)->Encode(std::string(1001, 'a'));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  auto fits = (*tok)->Encode("x y z w v u t s r q p o n m l k j i h");
  EXPECT_TRUE(fits.ok()) << fits.status();
  std::string words;
  for (int i = 0; i < 120; ++i) words += " w" + std::to_string(i);
  auto over = (*tok)->Encode(words);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*tok)->Encode(words, 10).status().code(), absl::StatusCode::kResourceExhausted);
  limits.max_file_bytes = 1000;
  auto small = Tokenizer::FromFile(kDir + "/glm45_small/tokenizer.json", limits);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
}

// A prompt limit stops the work, not just the result: a text whose fewest possible tokens
// (one per longest token's bytes) pass the limit is refused before any work, and encoding
// stops once the ids pass it; below the limit the ids are exactly the unbounded ones.
TEST(Tokenizer, EncodeStopsOnceTheLimitIsPassed) {
  const Tokenizer& tok = Golden();
  const auto cpu = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  for (const std::string& text : {std::string(size_t{16} << 20, 'a'),  // one 16 MiB word
                                  [] {
                                    std::string words;  // 16 MiB of short words
                                    while (words.size() + 6 <= (size_t{16} << 20))
                                      words += "hi yo ";
                                    return words;
                                  }()}) {
    const double start = cpu();
    auto over = tok.Encode(text, 8192);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_LT(cpu() - start, 0.1) << "the limit did not stop the work";
  }
  std::string words;  // ~3,000 tokens, past the first-words bound only once encoded
  for (int i = 0; i < 1000; ++i) words += " w" + std::to_string(i);
  auto all = tok.Encode(words);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(tok.Encode(words, all->size() - 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto exact = tok.Encode(words, all->size());
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(*exact, *all);
}

TEST(Tokenizer, LongInputsSliceWithoutChangingTheResult) {
  // Encode slices long text at newlines; the ids must equal those of the pieces' regex split,
  // i.e. the concatenation of each line's encoding when lines end in "\n" + a letter.
  const Tokenizer& tok = Golden();
  std::string text, line = "The quick brown fox, it's 12345 jumps!  ";
  std::vector<int32_t> want;
  for (int i = 0; i < 4000; ++i) {
    const std::string l = line + std::to_string(i) + "\n";
    text += l;
    auto ids = tok.Encode(l);
    ASSERT_TRUE(ids.ok());
    want.insert(want.end(), ids->begin(), ids->end());
  }
  ASSERT_GT(text.size(), size_t{128} << 10);
  auto got = tok.Encode(text);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, want);
}

// Each option glmserve does not implement is refused, naming it.
TEST(Tokenizer, RefusesWhatItDoesNotImplement) {
  const Json base = Json::parse(ReadFile(kDir + "/glm45_small/tokenizer.json"));
  struct Case {
    const char* name;
    void (*edit)(Json&);
    const char* message;
  };
  const Case cases[] = {
      {"normalizer",
       [](Json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "normalizer"},
      {"wordpiece", [](Json& j) { j["model"]["type"] = "WordPiece"; }, "not BPE"},
      {"regex",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
       "not GLM-4.5's"},
      {"metaspace",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "Sequence"},
      {"decoder",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder"},
      {"lstrip", [](Json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"unk", [](Json& j) { j["model"]["unk_token"] = "<unk>"; }, "unk_token"},
      {"byte_fallback", [](Json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, "dropout"},
      {"template",
       [](Json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "post_processor"},
      {"missing byte", [](Json& j) { j["model"]["vocab"].erase("!"); }, "byte 33"},
      {"bad merge", [](Json& j) { j["model"]["merges"][0] = "zzzq qqqz"; },
       "not in the vocabulary"},
      {"huge id", [](Json& j) { j["added_tokens"][0]["id"] = 1 << 30; }, "outside"},
  };
  for (const Case& c : cases) {
    Json j = base;
    c.edit(j);
    auto tok = Tokenizer::FromJson(j.dump(), "t.json");
    ASSERT_FALSE(tok.ok()) << c.name;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(tok.status().message().find(c.message), std::string::npos)
        << c.name << ": " << tok.status();
  }
  EXPECT_FALSE(Tokenizer::FromJson("{not json", "t.json").ok());
  EXPECT_FALSE(Tokenizer::FromJson("[]", "t.json").ok());
  // Merges written as "a b" strings (older files) load as the pair form does.
  Json strings = base;
  for (Json& m : strings["model"]["merges"])
    m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  auto tok = Tokenizer::FromJson(strings.dump(), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("hello world, 字"), *Golden().Encode("hello world, 字"));
}

}  // namespace
}  // namespace glmserve
