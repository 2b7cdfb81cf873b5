// Tensor parallel on the CPU (docs/parallel.md): the same model on one rank with every thread
// against a group of ranks that split the threads (TP 2: two ranks of one core each on this
// 2-vCPU machine), decode at batch 1 and 8 and a prefill, in interleaved rounds (the median
// of each), with the greedy tokens of the two checked equal. The cost of a group over one rank
// is its collectives (two sums per layer, the head's gather, the step hand-off to the rank
// threads); on a machine with one memory system the ranks share its bandwidth, so the best a
// group can do here is to match one rank (docs/parallel.md states the two-socket model).
//   tp_bench --preset=glm-4.5-air:layers=2 --mode=bf16 --tensor_parallel=1,2
// With --device=cuda the ranks are GPUs (CUDA ranks over NCCL, a rank per GPU; bf16 weights):
// the multi-GPU figures of docs/parallel.md, per GPU against one GPU (the GPU bundle runs it on
// a host with several GPUs).
//   tp_bench --device=cuda --preset=glm-4.5-air:layers=8 --tensor_parallel=1,2,4,8
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_modes.h"
#include "bench/int_list.h"
#include "bench/machine_limits.h"
#include "core/base/parallel.h"
#include "core/cuda/runner.h"
#include "core/engine/runner_factory.h"
#include "core/engine/scoring.h"
#include "core/model/checkpoint.h"

ABSL_FLAG(std::string, preset, "glm-4.5-air:layers=2", "model preset (random bf16 weights)");
ABSL_FLAG(std::string, mode, "bf16", "exact, bf16, bf16_amx or int8 (bench/cpu_modes.h)");
ABSL_FLAG(std::string, tensor_parallel, "1,2", "group sizes to compare (the first is the base)");
ABSL_FLAG(int, threads, 0, "threads in all (0: all cores), split evenly among a group's ranks");
ABSL_FLAG(int, rounds, 5, "interleaved rounds; each figure is the median");
ABSL_FLAG(int, decode_steps, 8, "decode steps per round (after one warm-up step)");
ABSL_FLAG(int, prefill_tokens, 128, "prompt length of the prefill measurement");
ABSL_FLAG(std::string, device, "cpu",
          "cpu (ranks are thread groups) or cuda (a rank per GPU; --mode and --threads unused)");

namespace {

using glmserve::bench::Clock;
using glmserve::bench::Median;
using glmserve::bench::Since;

struct Figures {
  std::vector<double> prefill_s, decode1_s, decode8_s;  // one per round
  std::vector<int32_t> tokens;                          // greedy tokens of the batch-1 decode
};

// One round on `runner`: a prefill of `prefill` tokens (timed), then decode steps of one
// sequence (greedy, timed per step) and of 8 sequences.
bool Round(glmserve::ModelRunner& runner, int prefill, int steps, Figures* f) {
  const int64_t vocab = runner.config().vocab_size;
  auto cache = runner.CreateCache((prefill + steps + 18) / 16 * 10 + 20, 16);
  if (!cache.ok()) return false;
  std::vector<glmserve::BlockTable> tables(9);
  std::vector<int32_t> ids(prefill);
  for (int i = 0; i < prefill; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  glmserve::ForwardBatch fb;
  glmserve::ForwardResult result;
  if (!(*cache)->Reserve(&tables[0], prefill + steps + 2).ok()) return false;
  fb.sequences = {{prefill, 0, &tables[0]}};
  fb.token_ids = ids;
  auto t = Clock::now();
  if (!runner.Forward(fb, cache->get(), {}, &result).ok()) return false;
  f->prefill_s.push_back(Since(t));
  int32_t next = glmserve::ArgMaxRow(result.logits.data(), vocab);
  double sum = 0;
  std::vector<int32_t> tokens;
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up
    fb.sequences = {{1, prefill + s, &tables[0]}};
    fb.token_ids = absl::MakeConstSpan(&next, 1);
    t = Clock::now();
    if (!runner.Forward(fb, cache->get(), {}, &result).ok()) return false;
    if (s > 0) sum += Since(t);
    next = glmserve::ArgMaxRow(result.logits.data(), vocab);
    tokens.push_back(next);
  }
  f->decode1_s.push_back(sum / steps);
  f->tokens = tokens;
  std::vector<int32_t> prompts(8 * 16);
  for (int i = 0; i < 8 * 16; ++i) prompts[i] = static_cast<int32_t>((i * 104729) % vocab);
  fb.sequences.clear();
  for (int k = 0; k < 8; ++k) {
    if (!(*cache)->Reserve(&tables[k + 1], 16 + steps + 2).ok()) return false;
    fb.sequences.push_back({16, 0, &tables[k + 1]});
  }
  fb.token_ids = prompts;
  if (!runner.Forward(fb, cache->get(), {}, &result).ok()) return false;
  std::vector<int32_t> batch_next(8, 1);
  sum = 0;
  for (int s = 0; s <= steps; ++s) {
    fb.sequences.clear();
    for (int k = 0; k < 8; ++k) fb.sequences.push_back({1, 16 + s, &tables[k + 1]});
    fb.token_ids = batch_next;
    t = Clock::now();
    if (!runner.Forward(fb, cache->get(), {}, &result).ok()) return false;
    if (s > 0) sum += Since(t);
  }
  f->decode8_s.push_back(sum / steps);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int total =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : glmserve::NumThreads();
  glmserve::SetNumThreads(total);
  const absl::StatusOr<std::vector<int>> parsed_sizes =
      glmserve::bench::ParseIntList("tensor_parallel", absl::GetFlag(FLAGS_tensor_parallel), 1);
  if (!parsed_sizes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed_sizes.status().message()).c_str());
    return 1;
  }
  const std::vector<int>& sizes = *parsed_sizes;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  glmserve::bench::UseKernelsOf(mode);
  auto config = glmserve::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  auto base = glmserve::RandomWeights(*config, {});
  if (!base.ok()) {
    std::fprintf(stderr, "%s\n", base.status().ToString().c_str());
    return 1;
  }
  auto weights = glmserve::bench::WeightsForMode(*base, mode);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", weights.status().ToString().c_str());
    return 1;
  }
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (!cuda && absl::GetFlag(FLAGS_device) != "cpu") {
    std::fprintf(stderr, "--device: cpu or cuda\n");
    return 1;
  }
  if (cuda) {
    std::printf("machine: %s\nmodel: %s, bf16, %.2f GB\n",
                glmserve::CudaDeviceDescription().c_str(), absl::GetFlag(FLAGS_preset).c_str(),
                base->ParameterBytes() / 1e9);
  } else {
    const glmserve::bench::MachineLimits limits = glmserve::bench::MeasureMachine();
    std::printf(
        "machine: read bandwidth %.1f GB/s, %d threads in all\nmodel: %s, mode %s, %.2f GB\n",
        limits.read_gbs, total, absl::GetFlag(FLAGS_preset).c_str(), mode.c_str(),
        weights->ParameterBytes() / 1e9);
  }
  std::vector<std::unique_ptr<glmserve::ModelRunner>> runners;
  for (const int n : sizes) {
    if (cuda) {  // GPUs: one, or a group of n CUDA ranks (GPUs 0..n-1)
      glmserve::ParallelConfig parallel;
      parallel.tensor_parallel = n;
      std::string how;
      auto runner = n == 1 ? glmserve::CreateCudaRunner(*base)
                           : glmserve::CreateCudaTensorParallelRunner(
                                 *base, parallel, nullptr, glmserve::Fp8TensorCores::kOff, &how);
      if (!runner.ok()) {
        std::fprintf(stderr, "TP %d: %s\n", n, runner.status().ToString().c_str());
        return 1;
      }
      std::printf("TP %d: %s%s%s\n", n, (*runner)->device_name().c_str(), how.empty() ? "" : "; ",
                  how.c_str());
      runners.push_back(*std::move(runner));
      continue;
    }
    if (n == 1) {
      auto one = glmserve::CreateModelRunner(*weights, glmserve::DeviceKind::kCpu,
                                             glmserve::bench::MathOf(mode));
      if (!one.ok()) return 1;
      runners.push_back(*std::move(one));
      continue;
    }
    glmserve::ParallelConfig parallel;
    parallel.tensor_parallel = n;
    std::string how;
    auto group = glmserve::CreateCpuTensorParallelRunner(
        *weights, parallel, glmserve::bench::MathOf(mode), std::max(1, total / n), &how);
    if (!group.ok()) {
      std::fprintf(stderr, "TP %d: %s\n", n, group.status().ToString().c_str());
      return 1;
    }
    std::printf("TP %d: %s; pinning: %s\n", n, (*group)->compute_description().c_str(),
                how.c_str());
    runners.push_back(*std::move(group));
  }
  std::vector<Figures> figures(sizes.size());
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {  // interleaved: noise hits every layout alike
      if (!Round(*runners[i], absl::GetFlag(FLAGS_prefill_tokens),
                 absl::GetFlag(FLAGS_decode_steps), &figures[i])) {
        std::fprintf(stderr, "TP %d: a step failed\n", sizes[i]);
        return 1;
      }
    }
  }
  // Per rank (per GPU with --device=cuda): the base's time over n times this layout's time, the
  // throughput each rank delivers against the base (1.0: perfect scaling).
  std::printf(
      "\n| layout | threads per rank | phase | median | vs TP %d | per rank vs TP %d | "
      "greedy tokens = TP %d |\n",
      sizes[0], sizes[0], sizes[0]);
  std::printf("|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int per_rank = cuda ? 1 : sizes[i] == 1 ? total : std::max(1, total / sizes[i]);
    const bool same = figures[i].tokens == figures[0].tokens;
    const struct {
      const char* phase;
      const std::vector<double>* v;
      const std::vector<double>* base;
      double scale;
      const char* unit;
    } rows[] = {
        {"prefill", &figures[i].prefill_s, &figures[0].prefill_s, 1.0, "s"},
        {"decode batch 1", &figures[i].decode1_s, &figures[0].decode1_s, 1e3, "ms/step"},
        {"decode batch 8", &figures[i].decode8_s, &figures[0].decode8_s, 1e3, "ms/step"},
    };
    for (const auto& r : rows) {
      const double ratio = Median(*r.v) / Median(*r.base);
      std::printf("| TP %d | %d | %s | %.3f %s | %.3fx | %.3f | %s |\n", sizes[i], per_rank,
                  r.phase, Median(*r.v) * r.scale, r.unit, ratio,
                  static_cast<double>(sizes[0]) / (sizes[i] * ratio), same ? "yes" : "NO");
    }
  }
  for (size_t i = 1; i < sizes.size(); ++i) {
    if (figures[i].tokens != figures[0].tokens) return 2;
  }
  return 0;
}
