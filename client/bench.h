// `glm-client bench`: N concurrent streams of Generate or Forward calls for a duration or a
// request count, reporting throughput, latency percentiles and errors by code, and (given
// the server's /metrics address) the engine's own step time measured over the same run, so
// that per-request serving overhead can be compared with compute.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace glmserve {

struct BenchOptions {
  enum class Rpc { kGenerate, kForward } rpc = Rpc::kGenerate;
  int concurrency = 8;
  absl::Duration duration = absl::Seconds(10);  // used when requests == 0
  int64_t requests = 0;                         // > 0: stop after this many calls
  int prompt_tokens = 16;       // prompt length (token ids spread over the vocabulary)
  int max_new_tokens = 32;      // Generate
  bool ignore_eos = true;       // Generate: every request produces max_new_tokens
  bool forward_logits = false;  // Forward: return last-position logits (else hidden)
  std::string metrics_address;  // "host:port" of /metrics; empty: no step-time figures
  // A worker whose call ends UNAVAILABLE (server gone, draining, starting) waits before its
  // next call, doubling from initial_backoff up to max_backoff and resetting on a success,
  // so that a dead server is probed, not hammered.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // The whole run stops after this many failed calls in a row, across workers (0: never).
  int64_t max_consecutive_failures = 100;
};

struct Percentiles {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;  // seconds
};

struct BenchReport {
  double wall_seconds = 0;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // by gRPC code name
  int64_t failed = 0;                     // calls that ended with an error
  double failure_rate = 0;                // failed / (ok + failed)
  bool stopped_on_failures = false;       // max_consecutive_failures ended the run
  int64_t tokens = 0;                     // generated tokens received
  double requests_per_second = 0;
  double tokens_per_second = 0;
  Percentiles e2e;          // call start to its last message (client side)
  Percentiles ttft;         // Generate: call start to the first token received
  Percentiles inter_token;  // Generate: between consecutive tokens received
  // The server's own view, from each response's timings (means over successful calls).
  double server_total_mean = 0;   // handler entry to the engine finishing it
  double server_engine_mean = 0;  // first scheduled to finished
  double server_queue_mean = 0;   // handler entry to first scheduled
  // From /metrics deltas over the run (when metrics_address is set).
  int64_t steps = 0;
  double step_mean = 0;  // seconds per engine step
  double batch_tokens_mean = 0;
};

absl::StatusOr<BenchReport> RunBench(Client& client, const BenchOptions& options);

// A fixed-width table of the report, for the terminal and docs/performance.md.
std::string FormatBenchReport(const BenchOptions& options, const BenchReport& report);

// p-th percentile (0..100) of `values` by linear interpolation; sorts them.
Percentiles Summarize(std::vector<double>* values);

}  // namespace glmserve
