// Host-overhead benchmark: what the engine, the sampler and (second table) the gRPC server
// with its client cost per token and per step when the model itself costs nothing. The
// model is bench/instant_runner.h, in two forms (--returns):
//   rows:   logits at once (its Forward only copies the rows into the result, as the CUDA
//           runner's host side did before device sampling); the host samples them;
//   tokens: what the CUDA runner returns with device sampling (ForwardOptions::sample): a
//           token per sequence, rows only for logprobs. Choosing the tokens is the device's
//           work, so host time here is the step minus the runner's time.
// Every figure is host time that a GPU step would have to hide. Targets (issue 27): at 64
// streams with tokens returned, at most 0.15 ms per step greedy and 0.5 ms with top-p.
//
//   build/bench/host_bench                               # both tables, 1/16/64/256 streams
//   build/bench/host_bench --streams=64 --server=false   # one engine row set
//   build/bench/host_bench --returns=tokens --server=false
//   GLM_NUM_THREADS=16 build/bench/host_bench            # the sampling pool's width
// The third table (--overlap_device_ms) gives the instant runner a step time, as a device
// would take, and measures the decode step period with the engine's steps in sequence and
// overlapped (docs/engine.md): in sequence a step costs device + host time, overlapped the
// longer of the two. The first table measures host time, so its steps run in sequence.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/instant_runner.h"
#include "bench/int_list.h"
#include "client/bench.h"
#include "client/client.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/engine/engine.h"
#include "core/model/config.h"
#include "server/server.h"

ABSL_FLAG(std::string, preset, "glm-4.5-mini", "model config (only its shapes and vocabulary)");
ABSL_FLAG(std::string, streams, "1,16,64,256", "concurrent streams, comma-separated");
ABSL_FLAG(std::string, modes, "greedy,top_k,whole_row",
          "engine table sampling: greedy; top_k (T 0.7, top_k 50, top_p 0.9, penalty 1.1); "
          "whole_row (T 1, top_p 0.95: every token's weight)");
ABSL_FLAG(int, prompt_tokens, 128, "prompt length");
ABSL_FLAG(int, max_new_tokens, 64, "tokens generated per request");
ABSL_FLAG(bool, engine, true, "measure the engine alone (first table)");
ABSL_FLAG(std::string, returns, "rows,tokens",
          "what the runner returns: rows (the host samples) and/or tokens (device sampling)");
ABSL_FLAG(bool, server, true, "measure through the gRPC server and client (second table, greedy)");
ABSL_FLAG(int, rounds, 2, "server table: requests per stream");
ABSL_FLAG(double, gpu_step_ms, 3.0, "the GPU step time the host overhead is compared with");
ABSL_FLAG(double, server_device_ms, 0,
          "second table: > 0 gives the server's runner the tokens form with steps of this many "
          "ms (a device), the engine's steps overlapped; 0: the rows form, no step time");
ABSL_FLAG(bool, server_overlap, true, "second table: the engine's overlap_steps (docs/engine.md)");
ABSL_FLAG(double, overlap_device_ms, 3.0,
          "third table: a runner whose steps take this long (a device), its steps in sequence "
          "and overlapped (docs/engine.md); 0 skips it");

namespace {

using Clock = std::chrono::steady_clock;

glmserve::SamplingParams ModeParams(const std::string& mode, uint64_t seed) {
  glmserve::SamplingParams p;
  p.seed = seed;
  if (mode == "top_k") {
    p.temperature = 0.7f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.1f;
  } else if (mode == "whole_row") {
    p.temperature = 1.0f;
    p.top_p = 0.95f;
  }
  return p;
}

glmserve::EngineOptions EngineOptionsFor(int streams, int prompt, int new_tokens) {
  glmserve::EngineOptions o;
  o.max_running = std::max(1, streams);
  o.max_waiting = std::max<int64_t>(1024, 4 * streams);
  // Room for every stream's prompt and output, so that nothing is preempted.
  o.kv_capacity_tokens = static_cast<int64_t>(streams + 1) * (prompt + new_tokens + 16);
  return o;
}

std::vector<int32_t> Prompt(int key, int length, int64_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i) {
    p.push_back(static_cast<int32_t>((key * 7919 + i * 104729 + 11) % vocab));
  }
  return p;
}

struct StepSample {
  glmserve::StepReport report;
  double forward_seconds;  // the runner's share of the step
  Clock::time_point read;  // when the engine had read it
};

struct EngineRow {
  int64_t decode_steps = 0;
  double period_ms = 0;   // mean wall time between full decode steps' ends
  double step_ms = 0;     // mean host time of a decode step with every stream in it
  double forward_ms = 0;  // the runner's time: row copies (host) or sampling (device)
  double token_us = 0;    // step_ms per sequence
  double tokens_per_second = 0;
};

// Runs `streams` requests together through an engine over the instant runner.
// With `device_ms` > 0 each runner step takes that long; `overlap`: EngineOptions::overlap_steps.
absl::StatusOr<EngineRow> RunEngine(const glmserve::ModelConfig& config, int streams,
                                    const std::string& mode, bool device_sampling,
                                    double device_ms = 0, bool overlap = false) {
  const int prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  auto owned = std::make_unique<glmserve::InstantRunner>(config);
  owned->set_device_sampling(device_sampling);
  owned->set_step_time(std::chrono::microseconds(static_cast<int64_t>(device_ms * 1e3)));
  glmserve::InstantRunner* runner = owned.get();
  glmserve::EngineOptions options = EngineOptionsFor(streams, prompt, new_tokens);
  options.overlap_steps = overlap;
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::Engine> engine,
                   glmserve::Engine::Create(std::move(owned), options));

  std::mutex mu;
  std::condition_variable cv;
  std::vector<StepSample> steps;
  double last_forward = 0;
  engine->SetStepObserver([&](const glmserve::StepReport& r) {
    const double f = runner->forward_seconds();
    std::lock_guard<std::mutex> lock(mu);
    steps.push_back({r, f - last_forward, Clock::now()});
    last_forward = f;
  });
  int finished = 0;
  int64_t tokens = 0;
  absl::Status failure;
  const auto start = Clock::now();
  for (int k = 0; k < streams; ++k) {
    glmserve::GenerateRequest g;
    g.prompt = Prompt(k, prompt, config.vocab_size);
    g.sampling = ModeParams(mode, 1000 + k);
    g.stop.max_new_tokens = new_tokens;
    g.stop.ignore_eos = true;
    absl::StatusOr<glmserve::RequestId> id = engine->Submit(g, [&](glmserve::Event&& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (std::holds_alternative<glmserve::TokenEvent>(e.body)) {
        ++tokens;
      } else if (auto* f = std::get_if<glmserve::FinishEvent>(&e.body)) {
        if (!f->status.ok() && failure.ok()) failure = f->status;
        ++finished;
        cv.notify_all();
      }
    });
    if (!id.ok()) return id.status();
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == streams; });
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  if (!failure.ok()) return failure;
  EngineRow row;
  double seconds = 0, forward = 0;
  Clock::time_point first, last;
  for (const StepSample& s : steps) {
    const glmserve::StepReport& r = s.report;
    if (r.prefill_tokens != 0 || r.forward_tokens != 0 || r.sequences != streams) continue;
    if (row.decode_steps == 0) first = s.read;
    last = s.read;
    ++row.decode_steps;
    seconds += r.seconds;
    forward += s.forward_seconds;
  }
  if (row.decode_steps > 1) {
    row.period_ms = 1e3 * std::chrono::duration<double>(last - first).count() /
                    static_cast<double>(row.decode_steps - 1);
  }
  if (row.decode_steps > 0) {
    row.forward_ms = 1e3 * forward / row.decode_steps;
    // Sampling inside the runner stands for the device's work: not host time.
    row.step_ms = 1e3 * (device_sampling ? seconds - forward : seconds) / row.decode_steps;
    row.token_us = 1e3 * row.step_ms / streams;
  }
  row.tokens_per_second = tokens / wall;
  return row;
}

absl::StatusOr<glmserve::BenchReport> RunServer(const glmserve::ModelConfig& config, int streams) {
  const int prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  glmserve::ServerOptions options;
  options.address = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;  // ephemeral: the bench reads the engine's step time from it
  options.model_name = "instant";
  options.engine = EngineOptionsFor(streams, prompt, new_tokens);
  options.engine.overlap_steps = absl::GetFlag(FLAGS_server_overlap);
  // Headroom over the bench's streams: a stream's next call may arrive before the server has
  // retired its previous one.
  options.service.max_concurrent_streams = streams + 64;
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::GlmServer> server,
                   glmserve::GlmServer::Start(options));
  auto runner = std::make_unique<glmserve::InstantRunner>(config);
  if (const double device_ms = absl::GetFlag(FLAGS_server_device_ms); device_ms > 0) {
    runner->set_device_sampling(true);
    runner->set_step_time(std::chrono::microseconds(static_cast<int64_t>(device_ms * 1e3)));
  }
  if (absl::Status s = server->Serve(std::move(runner), glmserve::DType::kBF16); !s.ok()) {
    return s;
  }
  glmserve::ClientOptions client_options;
  client_options.target = server->target();
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::Client> client,
                   glmserve::Client::Create(client_options));
  glmserve::BenchOptions bench;
  bench.concurrency = streams;
  bench.requests = static_cast<int64_t>(streams) * std::max(1, absl::GetFlag(FLAGS_rounds));
  bench.prompt_tokens = prompt;
  bench.max_new_tokens = new_tokens;
  bench.metrics_address = absl::StrCat("127.0.0.1:", server->metrics_port());
  absl::StatusOr<glmserve::BenchReport> report = glmserve::RunBench(*client, bench);
  server->Shutdown();
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<glmserve::ModelConfig> config =
      glmserve::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::fprintf(stderr, "--preset: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const absl::StatusOr<std::vector<int>> parsed_streams =
      glmserve::bench::ParseIntList("streams", absl::GetFlag(FLAGS_streams), 1, 4096);
  if (!parsed_streams.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed_streams.status().message()).c_str());
    return 2;
  }
  const std::vector<int>& streams = *parsed_streams;
  std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  for (const std::string& m : modes) {
    if (m != "greedy" && m != "top_k" && m != "whole_row") {
      std::fprintf(stderr, "--modes: unknown mode '%s'\n", m.c_str());
      return 2;
    }
  }
  const double gpu_ms = absl::GetFlag(FLAGS_gpu_step_ms);
  std::printf("host overhead: preset %s (vocab %lld), prompt %d, %d new tokens, %d threads\n",
              absl::GetFlag(FLAGS_preset).c_str(), static_cast<long long>(config->vocab_size),
              absl::GetFlag(FLAGS_prompt_tokens), absl::GetFlag(FLAGS_max_new_tokens),
              glmserve::NumThreads());
  if (absl::GetFlag(FLAGS_engine)) {
    std::printf("\nengine + sampler (decode steps with every stream in the batch)\n");
    std::printf(
        "| sampling | runner returns | streams | host ms/step | runner ms/step | us/token |"
        " tokens/s | %% of %.1f ms step |\n",
        gpu_ms);
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    const std::vector<std::string> all_returns = absl::StrSplit(absl::GetFlag(FLAGS_returns), ',');
    for (const std::string& returns : all_returns) {
      if (returns != "rows" && returns != "tokens") {
        std::fprintf(stderr, "--returns: unknown '%s'\n", returns.c_str());
        return 2;
      }
      const bool device = returns == "tokens";
      for (const std::string& mode : modes) {
        for (int n : streams) {
          absl::StatusOr<EngineRow> row = RunEngine(*config, n, mode, device);
          if (!row.ok()) {
            std::fprintf(stderr, "engine, %d streams: %s\n", n, row.status().ToString().c_str());
            return 1;
          }
          // The runner's time: row copies (host work, inside host ms) or device sampling
          // (the device's, left out of host ms).
          std::printf("| %s | %s | %d | %.3f | %.3f%s | %.1f | %.0f | %.1f%% |\n", mode.c_str(),
                      returns.c_str(), n, row->step_ms, row->forward_ms,
                      device ? " (device)" : " (copies)", row->token_us, row->tokens_per_second,
                      100.0 * row->step_ms / gpu_ms);
          std::fflush(stdout);
        }
      }
    }
  }
  if (const double device_ms = absl::GetFlag(FLAGS_overlap_device_ms); device_ms > 0) {
    std::printf(
        "\noverlapped steps: the runner returns tokens and each step takes %.1f ms (a device); "
        "decode step period, %s sampling\n",
        device_ms, modes[0].c_str());
    std::printf(
        "| streams | in sequence ms/step | overlapped ms/step | host ms/step (in sequence) |"
        " in sequence / device | overlapped / device |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int n : streams) {
      absl::StatusOr<EngineRow> seq = RunEngine(*config, n, modes[0], true, device_ms, false);
      absl::StatusOr<EngineRow> ovl = RunEngine(*config, n, modes[0], true, device_ms, true);
      if (!seq.ok() || !ovl.ok()) {
        std::fprintf(stderr, "overlap, %d streams: %s\n", n,
                     (seq.ok() ? ovl.status() : seq.status()).ToString().c_str());
        return 1;
      }
      std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", n, seq->period_ms, ovl->period_ms,
                  seq->period_ms - device_ms, seq->period_ms / device_ms,
                  ovl->period_ms / device_ms);
      std::fflush(stdout);
    }
  }
  if (!absl::GetFlag(FLAGS_server)) return 0;
  if (const double device_ms = absl::GetFlag(FLAGS_server_device_ms); device_ms > 0) {
    std::printf(
        "\ngRPC server + client, greedy (glm-client bench's Generate load, in-process); the "
        "runner returns tokens, %.1f ms a step, steps %s\n",
        device_ms, absl::GetFlag(FLAGS_server_overlap) ? "overlapped" : "in sequence");
  } else {
    std::printf("\ngRPC server + client, greedy (glm-client bench's Generate load, in-process)\n");
  }
  std::printf(
      "| streams | tokens/s | engine ms/step | tokens/step | inter-token p50 ms |"
      " p50 / step | %% of %.1f ms step |\n",
      gpu_ms);
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int n : streams) {
    absl::StatusOr<glmserve::BenchReport> r = RunServer(*config, n);
    if (!r.ok()) {
      std::fprintf(stderr, "server, %d streams: %s\n", n, r.status().ToString().c_str());
      return 1;
    }
    if (!r->errors.empty()) {
      for (const auto& [code, count] : r->errors) {
        std::fprintf(stderr, "server, %d streams: %lld calls failed with %s\n", n,
                     static_cast<long long>(count), code.c_str());
      }
      return 1;
    }
    const double step_ms = 1e3 * r->step_mean;
    const double itl_ms = 1e3 * r->inter_token.p50;
    std::printf("| %d | %.0f | %.3f | %.1f | %.3f | %.2f | %.1f%% |\n", n, r->tokens_per_second,
                step_ms, r->batch_tokens_mean, itl_ms, step_ms > 0 ? itl_ms / step_ms : 0.0,
                100.0 * step_ms / gpu_ms);
    std::fflush(stdout);
  }
  return 0;
}
