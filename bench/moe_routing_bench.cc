// MoE routing of a trained router beside random ones: how skewed the expert load is on real
// text, and what that does to the speed of the MoE steps. Random routers (the presets) spread
// tokens almost uniformly; trained ones do not, which changes how many distinct experts a step
// reads (decode: the weight bytes, the memory-bound cost) and how uneven the per-expert GEMMs
// are (prefill). Three models on the same text:
//   * --model (default: the embedded glm-4.5-kjv, trained), its routing counted by the CPU
//     runner (ForwardOptions::return_expert_counts) over --text in windows of 256 tokens;
//   * the same shape with seeded random weights (RandomWeights of its config);
//   * each of --presets (random weights, e.g. glm-4.5-mini).
// Then each is timed on --device (cpu, or cuda with a GPU): a 256-token prefill and decode
// steps at batch 1 and 8 (best of 3 / mean of --decode_steps), next to the machine's read
// bandwidth measured in the same run; the decode row's "distinct experts" is what a step of
// that batch touches on this text.
//
//   build/bench/moe_routing_bench
//   build/bench/moe_routing_bench --device=cuda --presets=glm-4.5-mini,glm-4.5-air:layers=2
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/machine_limits.h"
#include "bench/spec_ceiling.h"
#include "core/base/file_io.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/kv_cache.h"
#include "core/text/text_assets.h"

ABSL_FLAG(std::string, model, GLMSERVE_SOURCE_DIR "/models/glm-4.5-kjv",
          "trained checkpoint (its tokenizer encodes --text)");
ABSL_FLAG(std::string, text, GLMSERVE_SOURCE_DIR "/tests/golden/kjv/heldout.txt",
          "text whose routing is counted and which the prefills run on");
ABSL_FLAG(std::string, presets, "glm-4.5-mini", "random-weight presets to compare (comma list)");
ABSL_FLAG(std::string, device, "cpu", "the timing runner: cpu or cuda");
ABSL_FLAG(int, decode_steps, 16, "decode steps timed per batch size");
ABSL_FLAG(int, threads, 0, "threads (0: all cores)");

namespace {

using glmserve::bench::Clock;
using glmserve::bench::Since;
constexpr int64_t kWindow = 256;

struct Entry {
  std::string name;
  glmserve::ModelWeights weights;
};

// Load statistics of one MoE layer: counts of each expert's routed tokens.
struct LoadStats {
  double max_over_mean = 0, min_over_mean = 0, cv = 0, entropy = 0;  // entropy / log(E)
};

LoadStats Stats(const std::vector<int64_t>& counts) {
  const double n = static_cast<double>(counts.size());
  double total = 0;
  for (int64_t c : counts) total += static_cast<double>(c);
  const double mean = total / n;
  LoadStats s;
  double var = 0;
  s.min_over_mean = 1e30;
  for (int64_t c : counts) {
    s.max_over_mean = std::max(s.max_over_mean, c / mean);
    s.min_over_mean = std::min(s.min_over_mean, c / mean);
    var += (c - mean) * (c - mean) / n;
    if (c > 0) s.entropy -= (c / total) * std::log(c / total);
  }
  s.cv = std::sqrt(var) / mean;
  s.entropy /= std::log(n);
  return s;
}

// Per MoE layer, the routing counts over `ids` (CPU runner, exact arithmetic, windows of
// kWindow tokens), the mean number of distinct experts that 8 tokens from 8 places of a
// window (as a batch-8 decode step of 8 sequences would hold) choose in one layer, and that 2
// consecutive tokens choose (as a verify step of one draft holds; bench/spec_ceiling.h takes
// tokens as routed independently).
absl::Status CountRouting(const glmserve::ModelWeights& weights, const std::vector<int32_t>& ids,
                          std::vector<std::vector<int64_t>>* counts, double* distinct_at_8,
                          double* distinct_pair) {
  ASSIGN_OR_RETURN(auto runner, glmserve::CreateModelRunner(weights, glmserve::DeviceKind::kCpu));
  ASSIGN_OR_RETURN(auto cache, runner->CreateCache(kWindow / 16, 16));
  const int64_t top_k = weights.config.num_experts_per_tok;
  glmserve::ForwardOptions options;
  options.logits = glmserve::LogitsRows::kNone;
  options.return_expert_choices = true;
  counts->clear();
  double distinct = 0, pair = 0;
  int64_t groups = 0, pairs = 0;
  for (size_t b = 0; b + kWindow <= ids.size(); b += kWindow) {
    glmserve::BlockTable table;
    RETURN_IF_ERROR(cache->Reserve(&table, kWindow));
    glmserve::ForwardResult result;
    glmserve::ForwardBatch batch;
    batch.sequences = {{kWindow, 0, &table}};
    batch.token_ids = absl::MakeConstSpan(ids).subspan(b, kWindow);
    const absl::Status run = runner->Forward(batch, cache.get(), options, &result);
    cache->Free(&table);
    RETURN_IF_ERROR(run);
    counts->resize(result.expert_choices.size(),
                   std::vector<int64_t>(weights.config.n_routed_experts, 0));
    for (size_t l = 0; l < result.expert_choices.size(); ++l) {
      const std::vector<int32_t>& chosen = result.expert_choices[l];  // [kWindow * top_k]
      for (const int32_t e : chosen) ++(*counts)[l][e];
      for (int64_t g = 0; g < kWindow / 8; ++g) {  // tokens g, g + 32, ..., g + 224
        std::vector<bool> hit(weights.config.n_routed_experts, false);
        for (int64_t k = 0; k < 8; ++k) {
          for (int64_t j = 0; j < top_k; ++j)
            hit[chosen[((g + k * kWindow / 8) * top_k) + j]] = true;
        }
        distinct += static_cast<double>(std::count(hit.begin(), hit.end(), true));
        ++groups;
      }
      for (int64_t t = 0; t + 1 < kWindow; ++t) {  // tokens t and t + 1
        std::vector<bool> hit(weights.config.n_routed_experts, false);
        for (int64_t j = 0; j < 2 * top_k; ++j) hit[chosen[t * top_k + j]] = true;
        pair += static_cast<double>(std::count(hit.begin(), hit.end(), true));
        ++pairs;
      }
    }
  }
  *distinct_at_8 = groups > 0 ? distinct / groups : 0;
  *distinct_pair = pairs > 0 ? pair / pairs : 0;
  return absl::OkStatus();
}

struct Timing {
  double prefill_s = 0, decode1_s = 0, decode8_s = 0;
};

absl::StatusOr<Timing> Time(const glmserve::ModelWeights& weights, const std::vector<int32_t>& ids,
                            glmserve::DeviceKind device, int steps) {
  ASSIGN_OR_RETURN(auto runner, glmserve::CreateModelRunner(weights, device));
  const int64_t per_seq = kWindow + steps + 1;
  const int64_t blocks = (per_seq + 15) / 16;
  ASSIGN_OR_RETURN(auto cache, runner->CreateCache(blocks * 9, 16));
  std::vector<glmserve::BlockTable> tables(9);
  for (auto& t : tables) RETURN_IF_ERROR(cache->Reserve(&t, per_seq));
  glmserve::ForwardOptions options;
  glmserve::ForwardResult result;
  glmserve::ForwardBatch fb;
  Timing t;
  absl::Status status;
  t.prefill_s = glmserve::bench::BestOf(3, [&] {
    fb.sequences = {{kWindow, 0, &tables[0]}};
    fb.token_ids = absl::MakeConstSpan(ids).subspan(0, kWindow);
    status.Update(runner->Forward(fb, cache.get(), options, &result));
  });
  RETURN_IF_ERROR(status);
  // Decode: batch 1 continues sequence 0; batch 8 runs sequences 1..8, each prefilled with
  // its own 16 tokens of the text; the decoded tokens are the text's next ones.
  for (int k = 1; k <= 8; ++k) {
    fb.sequences = {{16, 0, &tables[k]}};
    fb.token_ids = absl::MakeConstSpan(ids).subspan(k * 16, 16);
    RETURN_IF_ERROR(runner->Forward(fb, cache.get(), options, &result));
  }
  for (const int batch : {1, 8}) {
    std::vector<int32_t> next(batch);
    double total = 0;
    for (int step = 0; step <= steps; ++step) {
      fb.sequences.clear();
      for (int k = 0; k < batch; ++k) {
        const int seq = batch == 1 ? 0 : k + 1;
        const int64_t pos = batch == 1 ? kWindow + step : 16 + step;
        fb.sequences.push_back({1, pos, &tables[seq]});
        next[k] = ids[(seq * 16 + pos) % ids.size()];
      }
      fb.token_ids = next;
      const auto t0 = Clock::now();
      RETURN_IF_ERROR(runner->Forward(fb, cache.get(), options, &result));
      if (step > 0) total += Since(t0);  // step 0 warms up
    }
    (batch == 1 ? t.decode1_s : t.decode8_s) = total / steps;
  }
  return t;
}

absl::StatusOr<std::vector<int32_t>> TextIds() {
  ASSIGN_OR_RETURN(glmserve::TextAssets assets,
                   glmserve::LoadTextAssets(absl::GetFlag(FLAGS_model)));
  if (assets.tokenizer == nullptr) return absl::NotFoundError("--model has no tokenizer.json");
  ASSIGN_OR_RETURN(const std::string text,
                   glmserve::ReadRegularFile(absl::GetFlag(FLAGS_text), uint64_t{16} << 20));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, assets.tokenizer->Encode(text));
  if (ids.size() < 2 * kWindow) return absl::InvalidArgumentError("--text is under 512 tokens");
  return ids;
}

absl::Status Main() {
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  ASSIGN_OR_RETURN(const glmserve::DeviceKind device,
                   glmserve::ParseDeviceKind(absl::GetFlag(FLAGS_device)));
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, TextIds());
  std::vector<Entry> entries;
  ASSIGN_OR_RETURN(glmserve::ModelWeights trained, glmserve::LoadModel(absl::GetFlag(FLAGS_model)));
  ASSIGN_OR_RETURN(glmserve::ModelWeights same_shape, glmserve::RandomWeights(trained.config));
  entries.push_back({"trained (--model)", std::move(trained)});
  entries.push_back({"same shape, random", std::move(same_shape)});
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',', absl::SkipEmpty())) {
    ASSIGN_OR_RETURN(glmserve::ModelWeights w, glmserve::LoadModel(std::string(p)));
    entries.push_back({std::string(p) + " (random)", std::move(w)});
  }
  const double read_gbs = glmserve::bench::MeasureMachine().read_gbs;
  std::printf("text: %zu tokens of %s; threads %d; machine read bandwidth %.1f GB/s\n\n",
              ids.size(), absl::GetFlag(FLAGS_text).c_str(), glmserve::NumThreads(), read_gbs);
  std::printf(
      "| model | experts (top-k) | max/mean load | min/mean | CV | entropy/log E | "
      "distinct experts, 8 tokens | 2 consecutive tokens (independent: %s) | prefill 256 tok/s | "
      "decode b1 ms | decode b8 ms |\n",
      "E(1 - (1 - k/E)^2)");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Entry& e : entries) {
    std::vector<std::vector<int64_t>> counts;
    double distinct = 0, pair = 0;
    RETURN_IF_ERROR(CountRouting(e.weights, ids, &counts, &distinct, &pair));
    LoadStats mean;
    double worst = 0;
    for (const auto& layer : counts) {
      const LoadStats s = Stats(layer);
      mean.max_over_mean += s.max_over_mean / counts.size();
      mean.min_over_mean += s.min_over_mean / counts.size();
      mean.cv += s.cv / counts.size();
      mean.entropy += s.entropy / counts.size();
      worst = std::max(worst, s.max_over_mean);
    }
    ASSIGN_OR_RETURN(const Timing t,
                     Time(e.weights, ids, device, absl::GetFlag(FLAGS_decode_steps)));
    const auto& c = e.weights.config;
    std::printf(
        "| %s | %lld (%lld) | %.2f (worst layer %.2f) | %.2f | %.2f | %.3f | %.1f | %.2f (%.2f) | "
        "%.0f | %.2f | %.2f |\n",
        e.name.c_str(), static_cast<long long>(c.n_routed_experts),
        static_cast<long long>(c.num_experts_per_tok), mean.max_over_mean, worst,
        mean.min_over_mean, mean.cv, mean.entropy, distinct, pair,
        glmserve::bench::DistinctExperts(c.n_routed_experts, c.num_experts_per_tok, 2),
        kWindow / t.prefill_s, 1e3 * t.decode1_s, 1e3 * t.decode8_s);
  }
  std::printf(
      "\nload: an expert's routed tokens over the layer's mean (1.00 = uniform), averaged "
      "over the MoE layers; CV: their coefficient of variation; timings on %s.\n",
      absl::GetFlag(FLAGS_device).c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Main(); !s.ok()) {
    std::fprintf(stderr, "moe_routing_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
