// Speculative decoding with the MTP layer (docs/mtp.md) on the CPU, through the engine: tokens/s
// and time per output token with k = 0 (off), 1, 2, 3 drafts per step at 1, 8 and 64 concurrent
// streams, the mean acceptance length, and whether every output equals the k = 0 output (the
// contract: it must). Before the table, what one decode step costs at batch 1 with 1 .. 4 new
// tokens (the verify step of k drafts feeds k + 1) and what one MTP-layer step costs, beside the
// floor the machine's read bandwidth (measured in the same run) puts under a step that reads
// every weight once: speculation pays when a step of k + 1 tokens costs little more than a
// step of 1, which a memory-bound step does, unless the drafts route to other experts whose
// weights the step must then also read.
//
//   build/bench/mtp_bench                      # the embedded glm-4.5-kjv, its held-out text
//   build/bench/mtp_bench --streams=1 --drafts=0,1,3 --math=bf16_amx
//   build/bench/mtp_bench --device=cuda     # a GPU (tools/gpu_bundle.sh runs it)
//   build/bench/mtp_bench --ceiling         # the weight-read-bound ceiling (bench/spec_ceiling.h)
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/int_list.h"
#include "bench/machine_limits.h"
#include "bench/spec_ceiling.h"
#include "core/base/file_io.h"
#include "core/base/parallel.h"
#include "core/engine/engine.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/text/text_assets.h"

ABSL_FLAG(std::string, model, GLMSERVE_SOURCE_DIR "/models/glm-4.5-kjv",
          "checkpoint with a trained MTP layer (its tokenizer encodes --text)");
ABSL_FLAG(std::string, text, GLMSERVE_SOURCE_DIR "/tests/golden/kjv/heldout.txt",
          "the prompts are windows of this text");
ABSL_FLAG(std::string, streams, "1,8,64", "concurrent streams (comma list)");
ABSL_FLAG(std::string, drafts, "0,1,2,3", "drafts per step to compare (comma list; 0 = off)");
ABSL_FLAG(int, prompt_tokens, 48, "prompt length");
ABSL_FLAG(int, new_tokens, 64, "tokens generated per stream (greedy, eos ignored)");
ABSL_FLAG(std::string, math, "bf16", "CPU arithmetic: exact, bf16, bf16_amx");
ABSL_FLAG(std::string, device, "cpu",
          "the runner: cpu or cuda (a GPU; the read floor is the CPU's)");
ABSL_FLAG(int, threads, 0, "threads (0: all cores)");
ABSL_FLAG(int64_t, mtp_max_batch, 0,
          "EngineOptions::mtp_max_batch (0: drafts at every batch size, the raw cost; the "
          "server's default is 4)");
ABSL_FLAG(std::string, step_tokens, "1,2,3,4", "new tokens of the timed batch-1 steps");
ABSL_FLAG(int, step_reps, 7, "timed repetitions of each step (best of)");
ABSL_FLAG(bool, ceiling, false,
          "print only the weight-read-bound ceiling of the speed-up for the released shapes and "
          "--model's config (bench/spec_ceiling.h; nothing runs) and exit");

namespace {

using glmserve::bench::BestOf;
using glmserve::bench::Clock;
using glmserve::bench::Since;

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "mtp_bench: %s: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(v);
}

std::unique_ptr<glmserve::ModelRunner> Runner(glmserve::CpuMath math) {
  glmserve::ModelWeights w = Check(glmserve::LoadModel(absl::GetFlag(FLAGS_model)), "model");
  const glmserve::DeviceKind device = absl::GetFlag(FLAGS_device) == "cuda"
                                          ? glmserve::DeviceKind::kCuda
                                          : glmserve::DeviceKind::kCpu;
  return Check(glmserve::CreateModelRunner(std::move(w), device, math), "runner");
}

// Seconds of one step at batch 1 after a 48-token context: the model over `tokens` new tokens
// (best of 7), or the MTP layer over one pair.
double StepSeconds(glmserve::ModelRunner& runner, int64_t tokens, bool mtp) {
  const int64_t context = 48, hidden = runner.config().hidden_size;
  auto cache = Check(runner.CreateCache(8, 16), "cache");
  glmserve::BlockTable table;
  Check(cache->Reserve(&table, context + tokens).ok() ? absl::StatusOr<int>(0)
                                                      : absl::InternalError("reserve"),
        "reserve");
  std::vector<int32_t> prompt(context, 17);
  glmserve::ForwardBatch batch;
  batch.sequences = {{context, 0, &table}};
  batch.token_ids = prompt;
  glmserve::ForwardResult result;
  Check(runner.Forward(batch, cache.get(), {}, &result).ok() ? absl::StatusOr<int>(0)
                                                             : absl::InternalError("forward"),
        "prefill");
  std::vector<int32_t> ids(tokens, 23);
  std::vector<float> h(tokens * hidden, 0.1f);
  glmserve::ForwardBatch step;
  step.sequences = {{tokens, context, &table}};
  step.token_ids = ids;
  glmserve::ForwardOptions options;
  options.logits = glmserve::LogitsRows::kAll;
  options.return_head_input = !mtp;
  options.mtp = mtp;
  if (mtp) step.hidden_in = h;
  return BestOf(absl::GetFlag(FLAGS_step_reps), [&] {
    if (!runner.Forward(step, cache.get(), options, &result).ok()) std::abort();
  });
}

struct Run {
  double seconds = 0;
  int64_t tokens = 0;
  double tpot_ms = 0;  // mean over streams of (last token - first token) / (tokens - 1)
  double acceptance = 0;
  std::map<int, std::vector<int32_t>> outputs;
};

Run Serve(int k, const std::vector<std::vector<int32_t>>& prompts, glmserve::CpuMath math) {
  glmserve::EngineOptions options;
  options.mtp_draft_tokens = k;
  options.mtp_max_batch = absl::GetFlag(FLAGS_mtp_max_batch);
  options.max_running = 64;
  options.kv_capacity_tokens = 16384;
  auto engine = Check(glmserve::Engine::Create(Runner(math), options), "engine");
  {  // warm-up: first-use allocations and page faults stay out of the timed run
    glmserve::GenerateRequest g;
    g.prompt = prompts.front();
    g.stop.max_new_tokens = 8;
    glmserve::EventQueue queue;
    Check(engine->Submit({g}, queue.Callback()), "warm-up");
    while (true) {
      std::optional<glmserve::Event> e = queue.Pop();
      if (e && std::holds_alternative<glmserve::FinishEvent>(e->body)) break;
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::map<int, std::vector<Clock::time_point>> times;
  Run run;
  const glmserve::EngineStats warm = engine->Stats();
  const auto t0 = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    glmserve::GenerateRequest g;
    g.prompt = prompts[i];
    g.stop.max_new_tokens = absl::GetFlag(FLAGS_new_tokens);
    g.stop.ignore_eos = true;
    const int key = static_cast<int>(i);
    Check(engine->Submit({g},
                         [&, key](glmserve::Event&& e) {
                           std::lock_guard<std::mutex> lock(mu);
                           if (auto* t = std::get_if<glmserve::TokenEvent>(&e.body)) {
                             run.outputs[key].push_back(t->token);
                             times[key].push_back(t->time);
                           } else if (std::holds_alternative<glmserve::FinishEvent>(e.body)) {
                             ++done;
                             cv.notify_all();
                           }
                         }),
          "submit");
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == static_cast<int>(prompts.size()); });
  run.seconds = Since(t0);
  for (auto& [key, t] : times) {
    run.tokens += static_cast<int64_t>(t.size());
    if (t.size() > 1) {
      run.tpot_ms +=
          std::chrono::duration<double, std::milli>(t.back() - t.front()).count() / (t.size() - 1);
    }
  }
  run.tpot_ms /= static_cast<double>(times.size());
  const glmserve::EngineStats s = engine->Stats();
  const double steps = static_cast<double>(s.spec_verify_steps - warm.spec_verify_steps);
  run.acceptance =
      steps > 0
          ? 1.0 + static_cast<double>(s.spec_accepted_tokens - warm.spec_accepted_tokens) / steps
          : 1.0;
  return run;
}

}  // namespace

// The ceiling where a step reads its weights (bench/spec_ceiling.h) for the released shapes and
// the --model's own config: what k drafts cost a verify step and the MTP passes, the speed-up
// if every draft were accepted, and the acceptance length that 1.4x would need.
int PrintCeiling() {
  std::vector<std::pair<std::string, glmserve::ModelConfig>> models;
  for (const char* preset : {"glm-4.5", "glm-4.5-air", "glm-5"}) {
    models.emplace_back(preset, Check(glmserve::PresetConfig(preset), "preset"));
  }
  const std::string model = absl::GetFlag(FLAGS_model);
  models.emplace_back(model.substr(model.find_last_of('/') + 1),
                      Check(glmserve::LoadConfigFile(model + "/config.json"), "config"));
  std::printf(
      "| model | context | k | distinct experts per layer | verify step / 1-token step | "
      "k MTP passes / step | ceiling, every draft accepted | accept len needed for 1.4x |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const auto& [name, config] : models) {
    const glmserve::bench::ModelReads r = glmserve::bench::ReadsOf(config);
    for (const int64_t context : {int64_t{0}, int64_t{32768}}) {
      const double one = glmserve::bench::StepBytes(r, 1, context);
      for (int k = 1; k <= 3; ++k) {
        const double cost = glmserve::bench::StepBytes(r, k + 1, context) +
                            k * glmserve::bench::MtpPassBytes(r, context);
        const double needed = 1.4 * cost / one;
        std::printf("| %s | %ld | %d | %.1f of %ld | %.2f | %.2f | %.2fx | %.2f%s |\n",
                    name.c_str(), static_cast<long>(context), k,
                    glmserve::bench::DistinctExperts(r.experts, r.top_k, k + 1),
                    static_cast<long>(r.experts),
                    glmserve::bench::StepBytes(r, k + 1, context) / one,
                    k * glmserve::bench::MtpPassBytes(r, context) / one,
                    glmserve::bench::CeilingSpeedup(r, k, k + 1.0, context), needed,
                    needed > k + 1 ? " (more than k + 1)" : "");
      }
    }
  }
  std::printf(
      "\nA step at batch 1 taken as the time to read its bytes (bf16 weights, fp32 cache read once "
      "per step), tokens routed independently and uniformly, one one-token MTP pass per draft.\n");
  return 0;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_ceiling)) return PrintCeiling();
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  const glmserve::CpuMath math = Check(glmserve::ParseCpuMath(absl::GetFlag(FLAGS_math)), "math");
  // Every list is checked before the model loads: a typo fails at once, naming its flag.
  const std::vector<int> step_tokens = Check(
      glmserve::bench::ParseIntList("step_tokens", absl::GetFlag(FLAGS_step_tokens), 1), "flags");
  const std::vector<int> stream_counts =
      Check(glmserve::bench::ParseIntList("streams", absl::GetFlag(FLAGS_streams), 1), "flags");
  const std::vector<int> draft_counts =
      Check(glmserve::bench::ParseIntList("drafts", absl::GetFlag(FLAGS_drafts), 0), "flags");
  const std::string model = absl::GetFlag(FLAGS_model);
  glmserve::TextAssets assets = Check(glmserve::LoadTextAssets(model), "tokenizer");
  if (assets.tokenizer == nullptr) {
    std::fprintf(stderr, "mtp_bench: %s has no tokenizer\n", model.c_str());
    return 1;
  }
  const std::string text =
      Check(glmserve::ReadRegularFile(absl::GetFlag(FLAGS_text), 64 << 20), "text");
  const std::vector<int32_t> ids = Check(assets.tokenizer->Encode(text), "encode");
  const int prompt_len = absl::GetFlag(FLAGS_prompt_tokens);
  if (prompt_len < 1 || static_cast<size_t>(prompt_len) > ids.size()) {
    std::fprintf(stderr, "mtp_bench: --prompt_tokens=%d: the text has %zu tokens\n", prompt_len,
                 ids.size());
    return 1;
  }

  // The step costs, and the floor the read bandwidth puts under a step reading every weight.
  std::unique_ptr<glmserve::ModelRunner> runner = Runner(math);
  if (!runner->has_mtp() || !runner->EnableMtp().ok()) {
    std::fprintf(stderr, "mtp_bench: %s has no MTP layer\n", model.c_str());
    return 1;
  }
  const double read_gbs = glmserve::bench::ReadBandwidth(4);
  const double floor_ms = runner->weight_bytes() / (read_gbs * 1e9) * 1e3;
  std::printf(
      "model %s: %.1f MB of weights, %s math, %d threads; read bandwidth %.1f GB/s: a "
      "step reading every weight once takes >= %.3f ms\n\n",
      model.c_str(), runner->weight_bytes() / 1e6, glmserve::CpuMathName(math),
      glmserve::NumThreads(), read_gbs, floor_ms);
  std::printf("%-34s %10s %10s\n", "step at batch 1, context 48", "ms", "x 1 token");
  const double one = StepSeconds(*runner, 1, false);
  for (int n : step_tokens) {
    const double s = n == 1 ? one : StepSeconds(*runner, n, false);
    std::printf("%-34s %10.3f %10.2f\n",
                (std::to_string(n) + " token" + (n > 1 ? "s (verify of " : "") +
                 (n > 1 ? std::to_string(n - 1) + " drafts)" : ""))
                    .c_str(),
                s * 1e3, s / one);
  }
  const double mtp = StepSeconds(*runner, 1, true);
  std::printf("%-34s %10.3f %10.2f\n\n", "MTP layer, 1 token", mtp * 1e3, mtp / one);
  runner.reset();

  std::printf("%8s %6s %12s %10s %10s %12s %10s\n", "streams", "k", "tokens/s", "TPOT ms",
              "speed-up", "accept len", "same out");
  bool all_same = true;
  for (int streams : stream_counts) {
    std::vector<std::vector<int32_t>> prompts;
    const size_t stride = (ids.size() - prompt_len) / std::max(1, streams);
    for (int i = 0; i < streams; ++i) {
      prompts.emplace_back(ids.begin() + i * stride, ids.begin() + i * stride + prompt_len);
    }
    Run base;
    for (int k : draft_counts) {
      const Run r = Serve(k, prompts, math);
      if (k == 0) base = r;
      const bool same = base.outputs.empty() || r.outputs == base.outputs;
      all_same &= same;
      std::printf("%8d %6d %12.1f %10.3f %10.2f %12.3f %10s\n", streams, k, r.tokens / r.seconds,
                  r.tpot_ms, base.tpot_ms > 0 ? base.tpot_ms / r.tpot_ms : 1.0, r.acceptance,
                  same ? "yes" : "NO");
    }
  }
  std::printf(
      "\nspeed-up: TPOT with k = 0 over TPOT with k (same run); accept len: tokens per "
      "verify step (accepted drafts + 1)\n");
  return all_same ? 0 : 2;
}
