#include "client/bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/scrape.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* CodeName(absl::StatusCode code) {
  // absl's names match gRPC's apart from the spelling ("INVALID_ARGUMENT" for both here).
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

// What one worker measured; merged at the end so workers never contend on a lock.
struct WorkerResult {
  std::vector<double> e2e, ttft, inter_token;
  double server_total = 0, server_engine = 0, server_queue = 0;
  int64_t ok = 0, tokens = 0;
  std::map<std::string, int64_t> errors;
};

struct StepCounters {
  double steps = 0, seconds = 0, batch_tokens = 0;
};

absl::StatusOr<StepCounters> ScrapeSteps(const std::string& address) {
  ASSIGN_OR_RETURN(std::string page, HttpGet(address, "/metrics"));
  StepCounters c;
  c.steps = SumSamples(page, "glmserve_step_duration_seconds_count");
  c.seconds = SumSamples(page, "glmserve_step_duration_seconds_sum");
  c.batch_tokens = SumSamples(page, "glmserve_batch_tokens_sum");
  return c;
}

}  // namespace

Percentiles Summarize(std::vector<double>* values) {
  Percentiles p;
  p.count = static_cast<int64_t>(values->size());
  if (values->empty()) return p;
  std::sort(values->begin(), values->end());
  p.mean = std::accumulate(values->begin(), values->end(), 0.0) / values->size();
  const auto at = [&](double q) {
    const double rank = q / 100.0 * (values->size() - 1);
    const size_t lo = static_cast<size_t>(rank);
    const size_t hi = std::min(lo + 1, values->size() - 1);
    return (*values)[lo] + (rank - lo) * ((*values)[hi] - (*values)[lo]);
  };
  p.p50 = at(50);
  p.p90 = at(90);
  p.p99 = at(99);
  return p;
}

namespace {

// One run's shared state and what each of its workers does: issue calls until the run's end
// (a request count or a deadline), backing off on UNAVAILABLE, giving up after too many
// failures in a row.
class BenchRun {
 public:
  BenchRun(Client& client, const BenchOptions& options, int64_t vocab)
      : client_(client),
        options_(options),
        vocab_(vocab),
        stop_at_(Clock::now() + absl::ToChronoNanoseconds(options.duration)) {}

  void Worker(WorkerResult& r) {
    absl::Duration backoff = absl::ZeroDuration();
    for (;;) {
      if (give_up_.load()) break;
      const int64_t index = issued_.fetch_add(1);
      if (options_.requests > 0 ? index >= options_.requests : Clock::now() >= stop_at_) break;
      const Clock::time_point t0 = Clock::now();
      ServerTimings timings;
      const absl::Status status = options_.rpc == BenchOptions::Rpc::kGenerate
                                      ? Generate(index, t0, r, &timings)
                                      : Forward(index, &timings);
      if (!status.ok()) {
        ++r.errors[CodeName(status.code())];
        if (options_.max_consecutive_failures > 0 &&
            consecutive_failures_.fetch_add(1) + 1 >= options_.max_consecutive_failures) {
          give_up_.store(true);
          break;
        }
        if (status.code() == absl::StatusCode::kUnavailable) BackOff(&backoff);
        continue;
      }
      consecutive_failures_.store(0);
      backoff = absl::ZeroDuration();
      r.e2e.push_back(Seconds(t0, Clock::now()));
      ++r.ok;
      r.server_total += timings.total;
      r.server_engine += timings.engine;
      r.server_queue += timings.queue;
    }
  }

  bool gave_up() const { return give_up_.load(); }

 private:
  struct ServerTimings {
    double total = 0, engine = 0, queue = 0;
  };
  static ServerTimings Read(const v1::Timings& t) {
    return {t.total_seconds(), t.engine_seconds(), t.queue_seconds()};
  }

  // Every request gets its own prompt (a different first token), so the prefix cache does
  // not turn the benchmark into a cache benchmark.
  template <typename Ids>
  void MakePrompt(int64_t index, Ids* ids) const {
    for (int i = 0; i < options_.prompt_tokens; ++i) {
      ids->Add(static_cast<int32_t>((index * 7919 + i * 31 + 1) % vocab_));
    }
  }

  // A streamed Generate call; its tokens' arrival times go to `r`.
  absl::Status Generate(int64_t index, Clock::time_point t0, WorkerResult& r,
                        ServerTimings* timings) {
    v1::GenerateRequest request;
    MakePrompt(index, request.mutable_prompt_token_ids());
    request.mutable_stop()->set_max_new_tokens(options_.max_new_tokens);
    request.mutable_stop()->set_ignore_eos(options_.ignore_eos);
    std::optional<Clock::time_point> last;
    absl::StatusOr<v1::Finished> done = client_.Generate(request, [&](const v1::GeneratedToken&) {
      const Clock::time_point now = Clock::now();
      if (last) {
        r.inter_token.push_back(Seconds(*last, now));
      } else {
        r.ttft.push_back(Seconds(t0, now));
      }
      last = now;
      ++r.tokens;
    });
    if (!done.ok()) return done.status();
    *timings = Read(done->timings());
    return absl::OkStatus();
  }

  absl::Status Forward(int64_t index, ServerTimings* timings) {
    v1::ForwardRequest request;
    MakePrompt(index, request.mutable_token_ids()->mutable_ids());
    request.set_last_position_only(true);
    if (options_.forward_logits) {
      request.set_return_logits(true);
    } else {
      request.set_return_hidden_states(true);
    }
    absl::StatusOr<v1::ForwardResponse> response = client_.Forward(request);
    if (!response.ok()) return response.status();
    *timings = Read(response->timings());
    return absl::OkStatus();
  }

  // Doubles the backoff (within its bounds) and sleeps it in slices, so that the run's end (or
  // giving up) is not delayed by it.
  void BackOff(absl::Duration* backoff) const {
    *backoff = std::clamp(*backoff * 2, options_.initial_backoff, options_.max_backoff);
    const Clock::time_point wake = Clock::now() + absl::ToChronoNanoseconds(*backoff);
    while (Clock::now() < wake && !give_up_.load() &&
           (options_.requests > 0 || Clock::now() < stop_at_)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  Client& client_;
  const BenchOptions& options_;
  const int64_t vocab_;
  const Clock::time_point stop_at_;
  std::atomic<int64_t> issued_{0};
  std::atomic<int64_t> consecutive_failures_{0};
  std::atomic<bool> give_up_{false};
};

// The workers' results merged into the report's counts, means and percentiles.
BenchReport Merge(std::vector<WorkerResult>& results, double wall_seconds) {
  BenchReport report;
  report.wall_seconds = wall_seconds;
  std::vector<double> e2e, ttft, itl;
  for (WorkerResult& r : results) {
    report.ok += r.ok;
    report.tokens += r.tokens;
    for (const auto& [code, n] : r.errors) {
      report.errors[code] += n;
      report.failed += n;
    }
    e2e.insert(e2e.end(), r.e2e.begin(), r.e2e.end());
    ttft.insert(ttft.end(), r.ttft.begin(), r.ttft.end());
    itl.insert(itl.end(), r.inter_token.begin(), r.inter_token.end());
    report.server_total_mean += r.server_total;
    report.server_engine_mean += r.server_engine;
    report.server_queue_mean += r.server_queue;
  }
  if (report.ok > 0) {
    report.server_total_mean /= report.ok;
    report.server_engine_mean /= report.ok;
    report.server_queue_mean /= report.ok;
  }
  if (report.ok + report.failed > 0) {
    report.failure_rate = static_cast<double>(report.failed) / (report.ok + report.failed);
  }
  report.e2e = Summarize(&e2e);
  report.ttft = Summarize(&ttft);
  report.inter_token = Summarize(&itl);
  report.requests_per_second = report.ok / report.wall_seconds;
  report.tokens_per_second = report.tokens / report.wall_seconds;
  return report;
}

}  // namespace

absl::StatusOr<BenchReport> RunBench(Client& client, const BenchOptions& options) {
  if (options.concurrency < 1) return absl::InvalidArgumentError("concurrency must be >= 1");
  if (options.initial_backoff <= absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError("backoff: need 0 < initial_backoff <= max_backoff");
  }
  if (options.max_consecutive_failures < 0) {
    return absl::InvalidArgumentError("max_consecutive_failures must be >= 0");
  }
  ASSIGN_OR_RETURN(v1::ModelInfo info, client.Info());

  StepCounters before;
  if (!options.metrics_address.empty()) {
    ASSIGN_OR_RETURN(StepCounters c, ScrapeSteps(options.metrics_address));
    before = c;
  }

  const Clock::time_point start = Clock::now();
  BenchRun run(client, options, info.config().vocab_size());
  std::vector<WorkerResult> results(options.concurrency);
  std::vector<std::thread> workers;
  for (int w = 0; w < options.concurrency; ++w) {
    workers.emplace_back([&run, &results, w] { run.Worker(results[w]); });
  }
  for (std::thread& t : workers) t.join();

  BenchReport report = Merge(results, Seconds(start, Clock::now()));
  report.stopped_on_failures = run.gave_up();
  if (!options.metrics_address.empty()) {
    ASSIGN_OR_RETURN(StepCounters after, ScrapeSteps(options.metrics_address));
    report.steps = static_cast<int64_t>(after.steps - before.steps);
    if (report.steps > 0) {
      report.step_mean = (after.seconds - before.seconds) / report.steps;
      report.batch_tokens_mean = (after.batch_tokens - before.batch_tokens) / report.steps;
    }
  }
  return report;
}

std::string FormatBenchReport(const BenchOptions& o, const BenchReport& r) {
  const bool generate = o.rpc == BenchOptions::Rpc::kGenerate;
  std::string out = absl::StrFormat(
      "%s  concurrency %d  prompt %d tokens%s\n", generate ? "Generate" : "Forward", o.concurrency,
      o.prompt_tokens,
      generate ? absl::StrCat("  max_new_tokens ", o.max_new_tokens) : std::string());
  absl::StrAppendFormat(&out, "  calls ok %lld in %.2f s: %.1f calls/s", r.ok, r.wall_seconds,
                        r.requests_per_second);
  if (generate) absl::StrAppendFormat(&out, ", %.1f tokens/s", r.tokens_per_second);
  out += "\n";
  if (!r.errors.empty()) {
    absl::StrAppendFormat(&out, "  calls failed %lld of %lld (%.1f%%):", r.failed, r.ok + r.failed,
                          r.failure_rate * 100);
    for (const auto& [code, n] : r.errors) absl::StrAppendFormat(&out, " %s=%lld", code, n);
    out += "\n";
  }
  if (r.stopped_on_failures) {
    absl::StrAppendFormat(&out, "  stopped early: %lld calls failed in a row\n",
                          o.max_consecutive_failures);
  }
  const auto row = [&](const char* name, const Percentiles& p) {
    if (p.count == 0) return;
    absl::StrAppendFormat(&out, "  %-12s mean %8.3f ms  p50 %8.3f  p90 %8.3f  p99 %8.3f ms\n", name,
                          p.mean * 1e3, p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3);
  };
  row("end-to-end", r.e2e);
  row("TTFT", r.ttft);
  row("inter-token", r.inter_token);
  absl::StrAppendFormat(&out,
                        "  server (means)  queue %.3f ms  engine %.3f ms  total %.3f ms  "
                        "client overhead (e2e - server total) %.3f ms\n",
                        r.server_queue_mean * 1e3, r.server_engine_mean * 1e3,
                        r.server_total_mean * 1e3, (r.e2e.mean - r.server_total_mean) * 1e3);
  if (r.steps > 0) {
    absl::StrAppendFormat(&out, "  engine steps %lld: mean %.3f ms/step, %.1f tokens/step\n",
                          r.steps, r.step_mean * 1e3, r.batch_tokens_mean);
  }
  return out;
}

}  // namespace glmserve
