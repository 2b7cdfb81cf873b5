// Text from a client or a model (core/text): any bytes either encode (valid UTF-8) to ids that
// decode back to the same bytes, directly and through the streaming detokenizer, or are
// refused as invalid UTF-8; the output parser gives the same parts whatever the delta split;
// JSON re-serialization and stop-string matching never crash.
#include <cstring>
#include <memory>
#include <string>

#include "core/text/detokenizer.h"
#include "core/text/output_parser.h"
#include "core/text/py_json.h"
#include "core/text/stop_strings.h"
#include "core/text/tokenizer.h"
#include "core/text/unicode.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const glmserve::Tokenizer& Tok() {
  static const glmserve::Tokenizer* tok = [] {
    auto t = glmserve::Tokenizer::FromFile(std::string(GLMSERVE_SOURCE_DIR) +
                                           "/tests/golden/tokenizer/glm45_small/tokenizer.json");
    GLM_FUZZ_CHECK(t.ok());
    return t->release();
  }();
  return *tok;
}

glmserve::ParsedDelta ParseAll(std::string_view text, size_t cut) {
  glmserve::Glm45OutputParser p;
  glmserve::ParsedDelta all;
  for (const glmserve::ParsedDelta& d :
       {p.Push(text.substr(0, cut)), p.Push(text.substr(cut)), p.Finish()}) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    all.tool_calls.insert(all.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const glmserve::Tokenizer& tok = Tok();
  auto ids = tok.Encode(text);
  if (!glmserve::ValidateUtf8(text, "text").ok()) {
    GLM_FUZZ_CHECK(!ids.ok() && ids.status().code() == absl::StatusCode::kInvalidArgument);
  } else {
    GLM_FUZZ_CHECK(ids.ok());
    auto back = tok.Decode(*ids);
    GLM_FUZZ_CHECK(back.ok() && *back == text);  // byte-level BPE is lossless
    glmserve::StreamDetokenizer d(tok, false);
    std::string streamed;
    for (int32_t id : *ids) {
      auto delta = d.Push(id);
      GLM_FUZZ_CHECK(delta.ok());
      streamed += *delta;
    }
    streamed += d.Finish();
    GLM_FUZZ_CHECK(streamed == text);
    const size_t cut = size == 0 ? 0 : data[0] % (size + 1);
    const glmserve::ParsedDelta a = ParseAll(text, cut), b = ParseAll(text, size / 2);
    GLM_FUZZ_CHECK(a.reasoning == b.reasoning && a.content == b.content &&
                   a.tool_calls.size() == b.tool_calls.size());
    auto stops = glmserve::StopStringMatcher::Create({"\n\n", "</s>", "字"});
    GLM_FUZZ_CHECK(stops.ok());
    auto r = stops->Push(text);
    GLM_FUZZ_CHECK(r.text.size() <= size);
  }
  // Arbitrary ids decode without crashing (unknown ones are refused).
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  auto decoded = tok.Decode(raw);
  GLM_FUZZ_CHECK(decoded.ok() || decoded.status().code() == absl::StatusCode::kInvalidArgument);
  (void)glmserve::PythonJsonDumps(text);
  return 0;
}
