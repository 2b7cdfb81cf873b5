// Tokenizer encode throughput on the golden corpus, single-threaded: the same text that
// tools/make_tokenizer_goldens.py --bench_corpus times Hugging Face `tokenizers` on (the
// corpus strings of tests/golden/tokenizer/encode.jsonl joined by newlines, repeated to about
// 8 MB), encoded one line per call ("lines") and in ~1 MB newline-aligned chunks ("chunks").
// docs/performance.md records both figures next to HF's.
//
//   build/bench/tokenizer_bench [--tokenizer=...] [--corpus=...jsonl] [--repeats=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/text/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "tests/golden/tokenizer/glm45_small/tokenizer.json",
          "tokenizer.json to load");
ABSL_FLAG(std::string, corpus, "tests/golden/tokenizer/encode.jsonl",
          "golden corpus (JSON lines with a \"t\" string each)");
ABSL_FLAG(int, repeats, 3, "timed passes per mode (the best is reported)");

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  size_t b = 0;
  while (true) {
    const size_t e = text.find('\n', b);
    if (e == std::string::npos) {
      out.push_back(text.substr(b));
      return out;
    }
    out.push_back(text.substr(b, e - b));
    b = e + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto tok = glmserve::Tokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  std::ifstream f(absl::GetFlag(FLAGS_corpus));
  std::string line, joined;
  bool first = true;
  while (std::getline(f, line)) {
    if (!first) joined += "\n";
    first = false;
    joined += nlohmann::json::parse(line).at("t").get<std::string>();
  }
  if (joined.empty()) {
    std::fprintf(stderr, "empty corpus\n");
    return 1;
  }
  // As the Python script: (text + "\n") * max(1, (8 MiB) // len(text)).
  const size_t reps = std::max<size_t>(1, (size_t{8} << 20) / joined.size());
  std::string text;
  for (size_t r = 0; r < reps; ++r) text += joined + "\n";
  const std::vector<std::string> lines = SplitLines(text);
  std::vector<std::string> chunks;
  for (size_t b = 0; b < text.size();) {
    size_t e = std::min(text.size(), b + (size_t{1} << 20));
    const size_t nl = text.find('\n', e);
    e = nl == std::string::npos ? text.size() : nl + 1;
    chunks.push_back(text.substr(b, e - b));
    b = e;
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("corpus: %.1f MB, %zu lines, %zu chunks\n", mb, lines.size(), chunks.size());
  for (const auto& [name, pieces] :
       {std::pair<const char*, const std::vector<std::string>*>{"lines", &lines},
        {"chunks", &chunks}}) {
    double best = 0;
    size_t tokens = 0;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
      tokens = 0;
      const auto t0 = Clock::now();
      for (const std::string& p : *pieces) {
        auto ids = (*tok)->Encode(p);
        if (!ids.ok()) {
          std::fprintf(stderr, "%s\n", std::string(ids.status().message()).c_str());
          return 1;
        }
        tokens += ids->size();
      }
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      best = std::max(best, mb / s);
    }
    std::printf("glmserve encode (%s, 1 thread): %.2f MB/s, %zu tokens\n", name, best, tokens);
  }
  return 0;
}
