// CPU sampler micro-benchmark: the cost per sequence per step of choosing one token from a
// 151552-wide logits row (GLM-4.5's vocabulary), for the sampling settings a server sees,
// next to the pre-fast-path sampler (tests/core/engine/sampler_legacy.cc) on the same inputs. Every
// draw of both is compared: the table's "differ" column counts draws whose token (or
// logprobs) are not bit-identical, and the run fails if any is.
//
//   build/bench/sampler_bench                  # the table
//   build/bench/sampler_bench --draws=2000     # more draws per setting (steadier figures)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/engine/sampler.h"
#include "tests/core/engine/sampler_legacy.h"

ABSL_FLAG(int, vocab, 151552, "logits row width");
ABSL_FLAG(int, draws, 300, "draws per setting (each on one of --rows distinct rows)");
ABSL_FLAG(int, rows, 16, "distinct logits rows cycled through (a batch's worth)");
ABSL_FLAG(int, history, 192, "history length for the repetition penalty (prompt + output)");

namespace {

using Clock = std::chrono::steady_clock;

// A logits row shaped like a language model's: a broad Gaussian bulk, a few dozen plausible
// tokens several nats above it and one clear favourite, at random ids.
std::vector<float> LogitsRow(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(-2.0f, 2.5f);
  std::vector<float> row(vocab);
  for (float& x : row) x = bulk(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::uniform_real_distribution<float> lift(6.0f, 14.0f);
  for (int i = 0; i < 40; ++i) row[id(rng)] = lift(rng);
  row[id(rng)] = 17.0f;
  return row;
}

struct Setting {
  const char* name;
  glmserve::SamplingParams params;
  bool logprobs;
  int top_logprobs;
};

std::vector<Setting> Settings() {
  std::vector<Setting> out;
  glmserve::SamplingParams p;
  out.push_back({"greedy", p, false, 0});
  out.push_back({"greedy + logprobs, top 5", p, true, 5});
  p.repetition_penalty = 1.1f;
  out.push_back({"greedy, penalty 1.1", p, false, 0});
  p = glmserve::SamplingParams{};
  p.temperature = 0.8f;
  p.seed = 11;
  out.push_back({"T 0.8", p, false, 0});
  glmserve::SamplingParams k = p;
  k.top_k = 50;
  out.push_back({"T 0.8, top_k 50", k, false, 0});
  glmserve::SamplingParams tp = p;
  tp.top_p = 0.95f;
  out.push_back({"T 0.8, top_p 0.95", tp, false, 0});
  glmserve::SamplingParams mp = p;
  mp.min_p = 0.05f;
  out.push_back({"T 0.8, min_p 0.05", mp, false, 0});
  glmserve::SamplingParams all = p;
  all.temperature = 0.7f;
  all.top_k = 50;
  all.top_p = 0.9f;
  all.repetition_penalty = 1.1f;
  out.push_back({"T 0.7, top_k 50, top_p 0.9, pen 1.1", all, false, 0});
  glmserve::SamplingParams lp = p;
  lp.temperature = 1.0f;
  lp.top_p = 0.9f;
  out.push_back({"T 1, top_p 0.9 + logprobs, top 5", lp, true, 5});
  return out;
}

bool Same(const glmserve::SampledToken& a, const glmserve::SampledToken& b, bool logprobs) {
  if (a.token != b.token) return false;
  if (!logprobs) return true;
  if (a.logprob != b.logprob || a.top.size() != b.top.size()) return false;
  for (size_t i = 0; i < a.top.size(); ++i) {
    if (a.top[i].token != b.top[i].token || a.top[i].logprob != b.top[i].logprob) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int vocab = absl::GetFlag(FLAGS_vocab);
  const int draws = absl::GetFlag(FLAGS_draws);
  const int num_rows = std::max(1, absl::GetFlag(FLAGS_rows));
  if (vocab < 64 || draws < 1) {
    std::fprintf(stderr, "--vocab must be >= 64 and --draws >= 1\n");
    return 2;
  }
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < num_rows; ++r) rows.push_back(LogitsRow(vocab, 1000 + r));
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> history(absl::GetFlag(FLAGS_history));
  for (int32_t& t : history) t = id(rng);

  std::printf("sampler: vocab %d, %d draws per setting over %d rows, history %zu\n", vocab, draws,
              num_rows, history.size());
  std::printf("| setting | before us/seq | after us/seq | speedup | differ |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  int total_differ = 0;
  for (const Setting& s : Settings()) {
    const int32_t want_top = s.top_logprobs;
    std::vector<glmserve::SampledToken> before(draws), after(draws);
    auto time = [&](auto&& sample, std::vector<glmserve::SampledToken>* out) {
      // One untimed warm-up call (first-touch of scratch buffers), then every draw.
      sample(0);
      const auto t0 = Clock::now();
      for (int i = 0; i < draws; ++i) (*out)[i] = sample(i);
      return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / draws;
    };
    const double us_before = time(
        [&](int i) {
          return glmserve::legacy::LegacySampleToken(rows[i % num_rows], s.params, history,
                                                     static_cast<uint64_t>(i), want_top);
        },
        &before);
    const glmserve::LogprobRequest want{s.logprobs, want_top};
    const double us_after = time(
        [&](int i) {
          return glmserve::SampleToken(rows[i % num_rows], s.params, history,
                                       static_cast<uint64_t>(i), want);
        },
        &after);
    int differ = 0;
    for (int i = 0; i < draws; ++i) differ += !Same(before[i], after[i], s.logprobs);
    total_differ += differ;
    std::printf("| %s | %.1f | %.1f | %.1fx | %d |\n", s.name, us_before, us_after,
                us_before / us_after, differ);
  }
  if (total_differ > 0) {
    std::fprintf(stderr, "%d draws differ from the reference sampler\n", total_differ);
    return 1;
  }
  return 0;
}
