#include "server/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "prometheus/text_serializer.h"
#include "server/status.h"

namespace glmserve {
namespace {

using prometheus::Histogram;

// Buckets sized to each quantity: end-to-end and TTFT span a millisecond to minutes; queueing
// and engine steps go down to 100 us (a tiny model's step); inter-token latency is a
// milliseconds quantity (a decode step plus the stream's write).
const Histogram::BucketBoundaries kRequestBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
const Histogram::BucketBoundaries kQueueBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                   0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                   1,      2.5,     5,      10,    30};
const Histogram::BucketBoundaries kTtftBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1,     2.5,  5,     10,   30};
const Histogram::BucketBoundaries kInterTokenBuckets = {
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1};
const Histogram::BucketBoundaries kStepBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
const Histogram::BucketBoundaries kBatchTokenBuckets = {1,   2,   4,   8,    16,   32,   64,
                                                        128, 256, 512, 1024, 2048, 4096, 8192};
// Tokens per request: up to GLM-4.5's 131072 positions.
// Tokenizing a prompt: microseconds for a chat turn, ~a second for megabytes of text.
const Histogram::BucketBoundaries kTokenizerBuckets = {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
                                                       1e-3, 2.5e-3, 5e-3, 0.01, 0.025,  0.05,
                                                       0.1,  0.25,   0.5,  1,    2.5};
// One bucket per length: 1 .. kMaxMtpDraftTokens + 1.
const Histogram::BucketBoundaries kAcceptanceLengthBuckets = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const Histogram::BucketBoundaries kRequestTokenBuckets = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 131072};

// The process facts behind process_* (the names every Prometheus client library exports).
struct ProcessStats {
  double rss_bytes = 0, vsize_bytes = 0, cpu_seconds = 0, start_time = 0;
  double open_fds = 0, max_fds = 0;
};

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces, hence the last ')').
  const size_t close = stat.rfind(')');
  if (close != std::string::npos && ticks > 0) {
    std::istringstream in(stat.substr(close + 2));
    std::vector<std::string> f;
    for (std::string field; in >> field;) f.push_back(field);
    // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    if (f.size() > 21) {
      p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
      p.vsize_bytes = std::stod(f[20]);
      p.rss_bytes = std::stod(f[21]) * static_cast<double>(sysconf(_SC_PAGESIZE));
      std::ifstream proc_stat("/proc/stat");
      for (std::string key; proc_stat >> key;) {
        if (key == "btime") {
          double boot = 0;
          proc_stat >> boot;
          p.start_time = boot + std::stod(f[19]) / ticks;
          break;
        }
      }
    }
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
    p.open_fds = n - 1;  // not counting the directory's own descriptor
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) p.max_fds = static_cast<double>(limit.rlim_cur);
  return p;
}

}  // namespace

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kGenerate:
      return "Generate";
    case Rpc::kForward:
      return "Forward";
    case Rpc::kCloseSession:
      return "CloseSession";
    case Rpc::kGetModelInfo:
      return "GetModelInfo";
    case Rpc::kTokenize:
      return "Tokenize";
    case Rpc::kDetokenize:
      return "Detokenize";
    case Rpc::kModelInfer:
      return "ModelInfer";
    case Rpc::kKServeMetadata:
      return "KServeMetadata";
    case Rpc::kOpenAIModels:
      return "/v1/models";
    case Rpc::kOpenAICompletions:
      return "/v1/completions";
    case Rpc::kOpenAIChatCompletions:
      return "/v1/chat/completions";
  }
  return "unknown";
}

const char* RpcApi(Rpc rpc) {
  switch (rpc) {
    case Rpc::kModelInfer:
    case Rpc::kKServeMetadata:
      return "kserve";
    case Rpc::kOpenAIModels:
    case Rpc::kOpenAICompletions:
    case Rpc::kOpenAIChatCompletions:
      return "openai";
    default:
      return "glmserve";
  }
}

bool RpcUsesEngine(Rpc rpc) {
  return rpc == Rpc::kGenerate || rpc == Rpc::kForward || rpc == Rpc::kModelInfer ||
         rpc == Rpc::kOpenAICompletions || rpc == Rpc::kOpenAIChatCompletions;
}

bool RpcIsForward(Rpc rpc) { return rpc == Rpc::kForward || rpc == Rpc::kModelInfer; }

// Exposer's view of the registry: every scrape first refreshes the engine-derived values,
// so that gauges are as fresh as the scrape and nothing polls the engine in between.
class Metrics::RefreshingCollectable : public prometheus::Collectable {
 public:
  RefreshingCollectable(const Metrics* metrics, std::shared_ptr<prometheus::Registry> registry)
      : metrics_(metrics), registry_(std::move(registry)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_->Refresh();
    return registry_->Collect();
  }

 private:
  const Metrics* metrics_;
  std::shared_ptr<prometheus::Registry> registry_;
};

namespace {

// One unlabelled series of a new family: most of the metrics below.
prometheus::Counter* NewCounter(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Gauge* NewGauge(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram* NewHistogram(prometheus::Registry& r, const char* name, const char* help,
                                    const Histogram::BucketBoundaries& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

}  // namespace

// The families are registered in this order (a scrape lists them so): the calls, the tokens,
// the engine's state and steps, the process, the build.
Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  RegisterCallMetrics(r);
  RegisterTokenMetrics(r);
  RegisterEngineMetrics(r);
  RegisterProcessMetrics(r);
  build_info_ = &prometheus::BuildGauge()
                     .Name("glmserve_build_info")
                     .Help("Always 1; labels name the server version, model and device")
                     .Register(r);
  collectable_ = std::make_shared<RefreshingCollectable>(this, registry_);
}

void Metrics::RegisterCallMetrics(prometheus::Registry& r) {
  requests_total_ = &prometheus::BuildCounter()
                         .Name("glmserve_requests_total")
                         .Help("RPCs finished, by method and final gRPC status code")
                         .Register(r);
  auto& duration = prometheus::BuildHistogram()
                       .Name("glmserve_request_duration_seconds")
                       .Help("RPC duration from the handler's entry to the last byte sent")
                       .Register(r);
  auto& queue = prometheus::BuildHistogram()
                    .Name("glmserve_queue_duration_seconds")
                    .Help("From the handler's entry until the engine first scheduled the request")
                    .Register(r);
  for (int i = 0; i < kNumRpcs; ++i) {
    const char* name = RpcName(static_cast<Rpc>(i));
    // Created up front so that every method's OK series exists (at 0) from the first scrape.
    const Rpc rpc = static_cast<Rpc>(i);
    const char* api = RpcApi(rpc);
    requests_total_->Add({{"api", api}, {"rpc", name}, {"code", "OK"}});
    request_duration_[i] = &duration.Add({{"api", api}, {"rpc", name}}, kRequestBuckets);
    // Only engine calls are ever queued: no empty series for CloseSession / GetModelInfo.
    if (RpcUsesEngine(rpc)) {
      queue_duration_[i] = &queue.Add({{"rpc", name}}, kQueueBuckets);
    }
  }
  auto& success = prometheus::BuildCounter()
                      .Name("glmserve_request_success_total")
                      .Help(
                          "Calls that ended OK, by why they finished: stop (EOS or a stop token), "
                          "length (max_new_tokens), forward (a Forward call)")
                      .Register(r);
  success_stop_ = &success.Add({{"finished_reason", "stop"}});
  success_length_ = &success.Add({{"finished_reason", "length"}});
  success_forward_ = &success.Add({{"finished_reason", "forward"}});
  tokenizer_duration_ = &prometheus::BuildHistogram()
                             .Name("glmserve_tokenizer_duration_seconds")
                             .Help(
                                 "Tokenizer work per request: encode (prompt_text, Tokenize "
                                 "text), chat (render and encode messages), decode (Detokenize)")
                             .Register(r);
  for (const char* op : {"encode", "chat", "decode"}) {
    tokenizer_duration_->Add({{"op", op}}, kTokenizerBuckets);
  }
  generate_input_ = &prometheus::BuildCounter()
                         .Name("glmserve_generate_input_total")
                         .Help(
                             "Generate calls admitted, by prompt kind: token_ids, prompt_text, "
                             "messages")
                         .Register(r);
  for (const char* input : {"token_ids", "prompt_text", "messages"}) {
    generate_input_->Add({{"input", input}});
  }
  stop_string_stops_ = NewCounter(r, "glmserve_stop_string_stops_total",
                                  "Generations ended by a stop string (cancelled in the engine)");
}

void Metrics::RegisterTokenMetrics(prometheus::Registry& r) {
  request_prompt_tokens_ =
      NewHistogram(r, "glmserve_request_prompt_tokens",
                   "Prompt tokens (Generate) or input positions (Forward) of each successful call",
                   kRequestTokenBuckets);
  request_generation_tokens_ =
      NewHistogram(r, "glmserve_request_generation_tokens",
                   "Tokens generated by each successful Generate call", kRequestTokenBuckets);
  request_prefill_time_ = NewHistogram(
      r, "glmserve_request_prefill_time_seconds",
      "Successful Generate calls: from first scheduled until the first token", kRequestBuckets);
  request_decode_time_ = NewHistogram(
      r, "glmserve_request_decode_time_seconds",
      "Successful Generate calls: from the first token until finished", kRequestBuckets);
  ttft_ = NewHistogram(r, "glmserve_time_to_first_token_seconds",
                       "Generate: from the handler's entry until the first token was sampled",
                       kTtftBuckets);
  inter_token_ =
      NewHistogram(r, "glmserve_inter_token_latency_seconds",
                   "Generate: time between consecutive tokens of one request", kInterTokenBuckets);
  prompt_tokens_ = NewCounter(r, "glmserve_prompt_tokens_total",
                              "Prompt tokens (Generate) and input positions (Forward) of "
                              "finished requests, prefix-cache hits included");
  generation_tokens_ = NewCounter(r, "glmserve_generation_tokens_total",
                                  "Tokens generated by finished Generate requests");
}

void Metrics::RegisterEngineMetrics(prometheus::Registry& r) {
  running_ = NewGauge(r, "glmserve_requests_running",
                      "Sequences in the engine's running set (at scrape time)");
  waiting_ = NewGauge(r, "glmserve_requests_waiting",
                      "Requests queued in the engine, not yet running (at scrape time)");
  kv_capacity_tokens_ = NewGauge(r, "glmserve_kv_cache_capacity_tokens",
                                 "Tokens the KV cache holds (--kv_capacity_tokens, or the "
                                 "--gpu_memory_fraction plan's)");
  kv_usage_ = NewGauge(r, "glmserve_kv_cache_usage_ratio",
                       "Fraction of KV cache blocks held by sequences (0..1; blocks held "
                       "only by the prefix cache count as free)");
  sessions_ =
      NewGauge(r, "glmserve_sessions_active", "Forward sessions holding KV cache on this server");
  auto& step = prometheus::BuildHistogram()
                   .Name("glmserve_step_duration_seconds")
                   .Help(
                       "Engine step wall time, by phase: prefill (prompt or Forward tokens "
                       "only), decode (decode tokens only), mixed")
                   .Register(r);
  step_prefill_ = &step.Add({{"phase", "prefill"}}, kStepBuckets);
  step_decode_ = &step.Add({{"phase", "decode"}}, kStepBuckets);
  step_mixed_ = &step.Add({{"phase", "mixed"}}, kStepBuckets);
  batch_tokens_ = NewHistogram(r, "glmserve_batch_tokens", "New tokens computed per engine step",
                               kBatchTokenBuckets);
  preemptions_ = NewCounter(r, "glmserve_preemptions_total",
                            "Sequences preempted (KV dropped, recomputed later)");
  steps_overlapped_ = NewCounter(r, "glmserve_steps_overlapped_total",
                                 "Engine steps built and launched while the step before them ran "
                                 "(docs/engine.md, overlapped steps)");
  sessions_evicted_ =
      NewCounter(r, "glmserve_sessions_evicted_total",
                 "Idle Forward sessions evicted to free KV blocks for other requests");
  session_kv_usage_ = NewGauge(r, "glmserve_kv_cache_session_usage_ratio",
                               "Fraction of KV cache blocks pinned by Forward sessions (0..1)");
  nonfinite_outputs_ = NewCounter(r, "glmserve_nonfinite_outputs_total",
                                  "Requests failed with INTERNAL because the model produced NaN "
                                  "or Inf logits or hidden states");
  // Blocks, as the engine counts them, and the tokens they hold (vLLM counts tokens).
  prefix_query_blocks_ = NewCounter(r, "glmserve_prefix_cache_query_blocks_total",
                                    "Full prompt KV blocks looked up in the prefix cache");
  prefix_hit_blocks_ = NewCounter(r, "glmserve_prefix_cache_hit_blocks_total",
                                  "Full prompt KV blocks found in the prefix cache");
  prefix_query_tokens_ =
      NewCounter(r, "glmserve_prefix_cache_query_tokens_total",
                 "Prompt tokens in the full blocks looked up in the prefix cache");
  prefix_hit_tokens_ = NewCounter(r, "glmserve_prefix_cache_hit_tokens_total",
                                  "Prompt tokens whose KV came from the prefix cache");
  spec_drafts_ = NewCounter(r, "glmserve_spec_decode_num_drafts_total",
                            "Verify steps of speculative decoding (one per sequence and step that "
                            "checked MTP drafts)");
  spec_draft_tokens_ = NewCounter(r, "glmserve_spec_decode_num_draft_tokens_total",
                                  "Tokens drafted by the MTP layer and verified");
  spec_accepted_tokens_ = NewCounter(r, "glmserve_spec_decode_num_accepted_tokens_total",
                                     "Drafted tokens the model agreed with (emitted)");
  spec_acceptance_length_ = NewHistogram(
      r, "glmserve_spec_decode_acceptance_length",
      "Tokens a verify step gave its sequence (accepted drafts + 1)", kAcceptanceLengthBuckets);
}

// The names and help texts every Prometheus client library exports.
void Metrics::RegisterProcessMetrics(prometheus::Registry& r) {
  process_rss_ = NewGauge(r, "process_resident_memory_bytes",
                          "Resident memory size in bytes (mapped checkpoint pages included)");
  process_vsize_ = NewGauge(r, "process_virtual_memory_bytes", "Virtual memory size in bytes");
  process_cpu_ =
      NewCounter(r, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds");
  process_open_fds_ = NewGauge(r, "process_open_fds", "Number of open file descriptors");
  process_max_fds_ = NewGauge(r, "process_max_fds", "Maximum number of open file descriptors");
  process_start_time_ = NewGauge(r, "process_start_time_seconds",
                                 "Start time of the process since unix epoch in seconds");
}

std::string Metrics::Scrape() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collectable_->Collect());
  return out.str();
}

void Metrics::SetBuildInfo(const std::string& version, const std::string& model,
                           const std::string& device) {
  build_info_->Add({{"version", version}, {"model", model}, {"device", device}}).Set(1);
}

void Metrics::SetEngine(const glmserve::Engine* engine) {
  std::lock_guard<std::mutex> lock(mu_);
  engine_ = engine;
  // Counters count from the moment of attachment (not the warm-up before it).
  last_ = engine != nullptr ? engine->Stats() : glmserve::EngineStats{};
}

void Metrics::RecordRequest(Rpc rpc, grpc::StatusCode code, double seconds) {
  requests_total_->Add({{"api", RpcApi(rpc)}, {"rpc", RpcName(rpc)}, {"code", GrpcCodeName(code)}})
      .Increment();
  request_duration_[static_cast<int>(rpc)]->Observe(seconds);
}

void Metrics::RecordTokenizer(const char* op, double seconds) {
  tokenizer_duration_->Add({{"op", op}}, kTokenizerBuckets).Observe(seconds);
}

void Metrics::RecordGenerateInput(const char* input) {
  generate_input_->Add({{"input", input}}).Increment();
}

void Metrics::RecordStopString() { stop_string_stops_->Increment(); }

void Metrics::RecordQueue(Rpc rpc, double seconds) {
  if (prometheus::Histogram* h = queue_duration_[static_cast<int>(rpc)]) h->Observe(seconds);
}

void Metrics::RecordSuccess(Rpc rpc, const glmserve::FinishEvent& finish) {
  const auto seconds = [](glmserve::SteadyTime a, glmserve::SteadyTime b) {
    return std::chrono::duration<double>(b - a).count();
  };
  request_prompt_tokens_->Observe(static_cast<double>(finish.prompt_tokens));
  if (RpcIsForward(rpc)) {
    success_forward_->Increment();
    return;
  }
  (finish.reason == glmserve::FinishReason::kLength ? success_length_ : success_stop_)->Increment();
  request_generation_tokens_->Observe(static_cast<double>(finish.generated_tokens));
  const glmserve::Timestamps& t = finish.times;
  if (t.first_scheduled && t.first_token) {
    request_prefill_time_->Observe(seconds(*t.first_scheduled, *t.first_token));
  }
  if (t.first_token && t.finished) {
    request_decode_time_->Observe(seconds(*t.first_token, *t.finished));
  }
}

void Metrics::RecordTimeToFirstToken(double seconds) { ttft_->Observe(seconds); }

void Metrics::RecordInterToken(double seconds) { inter_token_->Observe(seconds); }

void Metrics::RecordTokens(int64_t prompt_tokens, int64_t generated_tokens) {
  prompt_tokens_->Increment(static_cast<double>(prompt_tokens));
  generation_tokens_->Increment(static_cast<double>(generated_tokens));
}

void Metrics::ObserveStep(const glmserve::StepReport& report) {
  const int64_t prefill = report.prefill_tokens + report.forward_tokens;
  const int64_t decode = report.decode_tokens;
  prometheus::Histogram* step = decode == 0    ? step_prefill_
                                : prefill == 0 ? step_decode_
                                               : step_mixed_;
  step->Observe(report.seconds);
  batch_tokens_->Observe(static_cast<double>(prefill + decode));
}

void Metrics::Refresh() const {
  std::lock_guard<std::mutex> lock(mu_);
  const ProcessStats p = ReadProcessStats();
  process_rss_->Set(p.rss_bytes);
  process_vsize_->Set(p.vsize_bytes);
  if (p.cpu_seconds > last_cpu_seconds_) process_cpu_->Increment(p.cpu_seconds - last_cpu_seconds_);
  last_cpu_seconds_ = std::max(last_cpu_seconds_, p.cpu_seconds);
  process_open_fds_->Set(p.open_fds);
  process_max_fds_->Set(p.max_fds);
  process_start_time_->Set(p.start_time);
  if (engine_ == nullptr) return;
  const glmserve::EngineStats s = engine_->Stats();
  running_->Set(static_cast<double>(s.running));
  waiting_->Set(static_cast<double>(s.waiting));
  kv_usage_->Set(s.kv_usage());
  kv_capacity_tokens_->Set(static_cast<double>(engine_->kv_capacity_tokens()));
  sessions_->Set(static_cast<double>(s.sessions));
  session_kv_usage_->Set(s.kv_blocks_total == 0 ? 0.0
                                                : static_cast<double>(s.kv_blocks_sessions) /
                                                      static_cast<double>(s.kv_blocks_total));
  // Cumulative engine counters become Prometheus counters by adding what is new since the
  // last scrape (never negative: the engine's counters only grow).
  const auto add = [](prometheus::Counter* c, int64_t now, int64_t* last) {
    if (now > *last) c->Increment(static_cast<double>(now - *last));
    *last = now;
  };
  add(preemptions_, s.preemptions, &last_.preemptions);
  add(steps_overlapped_, s.overlapped_steps, &last_.overlapped_steps);
  add(sessions_evicted_, s.sessions_evicted, &last_.sessions_evicted);
  add(nonfinite_outputs_, s.nonfinite_outputs, &last_.nonfinite_outputs);
  const int64_t block = engine_->options().block_size;
  if (s.prefix_queries > last_.prefix_queries) {
    prefix_query_tokens_->Increment(
        static_cast<double>((s.prefix_queries - last_.prefix_queries) * block));
  }
  if (s.prefix_hits > last_.prefix_hits) {
    prefix_hit_tokens_->Increment(static_cast<double>((s.prefix_hits - last_.prefix_hits) * block));
  }
  add(prefix_query_blocks_, s.prefix_queries, &last_.prefix_queries);
  add(prefix_hit_blocks_, s.prefix_hits, &last_.prefix_hits);
  add(spec_drafts_, s.spec_verify_steps, &last_.spec_verify_steps);
  add(spec_draft_tokens_, s.spec_draft_tokens, &last_.spec_draft_tokens);
  add(spec_accepted_tokens_, s.spec_accepted_tokens, &last_.spec_accepted_tokens);
  // The engine counts steps per length; the histogram takes what is new in bulk.
  std::vector<double> increments(kAcceptanceLengthBuckets.size() + 1, 0.0);
  double sum = 0, any = 0;
  last_.spec_acceptance_lengths.resize(s.spec_acceptance_lengths.size(), 0);
  for (size_t n = 1; n < s.spec_acceptance_lengths.size(); ++n) {
    const int64_t delta = s.spec_acceptance_lengths[n] - last_.spec_acceptance_lengths[n];
    if (delta <= 0) continue;
    increments[std::min(n - 1, increments.size() - 1)] += static_cast<double>(delta);
    sum += static_cast<double>(n) * static_cast<double>(delta);
    any += static_cast<double>(delta);
  }
  if (any > 0) spec_acceptance_length_->ObserveMultiple(increments, sum);
  last_.spec_acceptance_lengths = s.spec_acceptance_lengths;
}

}  // namespace glmserve
