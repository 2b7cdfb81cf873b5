// Metrics: every Prometheus family of the server, built once here and injected into the
// service, so that names, units, labels and buckets live in one place (documented in
// docs/metrics.md, which says exactly when each clock starts and stops).
//
// Hot paths only touch pre-built metric objects (an atomic add or a short-mutex histogram
// observe). The engine's gauges and cumulative counters (running, waiting, KV usage, sessions,
// preemptions, prefix cache) are read from Engine::Stats() when /metrics is scraped, never
// from inside the engine loop.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/engine/engine.h"
#include "grpcpp/support/status.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace glmserve {

// The calls of every API, as the `rpc` label spells them; the `api` label says which API
// (glmserve.v1, the KServe v2 gRPC service, the OpenAI-compatible HTTP endpoint) each is.
enum class Rpc {
  kGenerate,
  kForward,
  kCloseSession,
  kGetModelInfo,
  kTokenize,
  kDetokenize,
  // inference.GRPCInferenceService: ModelInfer, and the health/metadata calls together.
  kModelInfer,
  kKServeMetadata,
  // The OpenAI-compatible HTTP endpoint, by route.
  kOpenAIModels,
  kOpenAICompletions,
  kOpenAIChatCompletions,
};
constexpr int kNumRpcs = 11;
const char* RpcName(Rpc rpc);
// "glmserve", "kserve" or "openai".
const char* RpcApi(Rpc rpc);
// Calls that run on the engine (queued, with a FinishEvent).
bool RpcUsesEngine(Rpc rpc);
// Calls whose engine request is a Forward (the others that use the engine generate).
bool RpcIsForward(Rpc rpc);

class Metrics {
 public:
  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // What /metrics exposes: refreshes the engine-derived values, then collects the registry
  // (Scrape serialises it; server/http/metrics_server.h serves that).
  std::shared_ptr<prometheus::Collectable> collectable() const { return collectable_; }
  // The text exposition format of the same (for tests and debugging).
  std::string Scrape() const;

  // glmserve_build_info{version, model, device} = 1; set once the model is loaded.
  void SetBuildInfo(const std::string& version, const std::string& model,
                    const std::string& device);
  // The engine whose Stats() feed the gauges at scrape time; nullptr detaches it (before the
  // engine is destroyed).
  void SetEngine(const glmserve::Engine* engine);

  // One finished RPC: its final status and its duration from arrival to last byte.
  void RecordRequest(Rpc rpc, grpc::StatusCode code, double seconds);
  // Per-request engine facts, from its events (called from the reactors).
  void RecordQueue(Rpc rpc, double seconds);
  void RecordTimeToFirstToken(double seconds);
  void RecordInterToken(double seconds);
  void RecordTokens(int64_t prompt_tokens, int64_t generated_tokens);
  // A call that reached the engine and ended OK (Generate: stop or length; Forward): the
  // finished_reason counter and the per-request token and phase-time histograms.
  void RecordSuccess(Rpc rpc, const glmserve::FinishEvent& finish);
  // Text: the tokenizer's work on one request (`op`: "encode" a prompt_text or Tokenize text,
  // "chat" render and encode messages, "decode" a Detokenize call), the input kind of each
  // admitted Generate call ("token_ids", "prompt_text", "messages"), and generations ended by
  // a stop string (cancelled in the engine at once).
  void RecordTokenizer(const char* op, double seconds);
  void RecordGenerateInput(const char* input);
  void RecordStopString();
  // The engine's step observer (engine thread; a few histogram observes).
  void ObserveStep(const glmserve::StepReport& report);

  // Pulls Engine::Stats() into the gauges and counters (done on every scrape).
  void Refresh() const;

 private:
  class RefreshingCollectable;

  // The constructor's parts, by what the metrics count (each registers its families).
  void RegisterCallMetrics(prometheus::Registry& r);
  void RegisterTokenMetrics(prometheus::Registry& r);
  void RegisterEngineMetrics(prometheus::Registry& r);
  void RegisterProcessMetrics(prometheus::Registry& r);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collectable_;

  prometheus::Family<prometheus::Counter>* requests_total_;
  std::array<prometheus::Histogram*, kNumRpcs> request_duration_;
  std::array<prometheus::Histogram*, kNumRpcs> queue_duration_{};  // Generate, Forward only
  prometheus::Counter* success_stop_;
  prometheus::Counter* success_length_;
  prometheus::Counter* success_forward_;
  prometheus::Family<prometheus::Histogram>* tokenizer_duration_;
  prometheus::Family<prometheus::Counter>* generate_input_;
  prometheus::Counter* stop_string_stops_;
  prometheus::Histogram* request_prompt_tokens_;
  prometheus::Histogram* request_generation_tokens_;
  prometheus::Histogram* request_prefill_time_;
  prometheus::Histogram* request_decode_time_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* inter_token_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* kv_capacity_tokens_;
  prometheus::Gauge* sessions_;
  prometheus::Histogram* step_prefill_;
  prometheus::Histogram* step_decode_;
  prometheus::Histogram* step_mixed_;
  prometheus::Histogram* batch_tokens_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* steps_overlapped_;
  prometheus::Counter* sessions_evicted_;
  prometheus::Gauge* session_kv_usage_;
  prometheus::Counter* nonfinite_outputs_;
  prometheus::Counter* prefix_query_blocks_;
  prometheus::Counter* prefix_hit_blocks_;
  prometheus::Counter* prefix_query_tokens_;
  prometheus::Counter* prefix_hit_tokens_;
  // Speculative decoding with the MTP layer (docs/mtp.md), named as vLLM names its own.
  prometheus::Counter* spec_drafts_;
  prometheus::Counter* spec_draft_tokens_;
  prometheus::Counter* spec_accepted_tokens_;
  prometheus::Histogram* spec_acceptance_length_;
  // process_*: the standard Prometheus process metrics, read from /proc at scrape time.
  prometheus::Gauge* process_rss_;
  prometheus::Gauge* process_vsize_;
  prometheus::Counter* process_cpu_;
  prometheus::Gauge* process_open_fds_;
  prometheus::Gauge* process_max_fds_;
  prometheus::Gauge* process_start_time_;
  prometheus::Family<prometheus::Gauge>* build_info_;

  // Guards the engine pointer and the last cumulative values already added to the counters.
  mutable std::mutex mu_;
  const glmserve::Engine* engine_ = nullptr;
  mutable glmserve::EngineStats last_;
  mutable double last_cpu_seconds_ = 0;
};

}  // namespace glmserve
