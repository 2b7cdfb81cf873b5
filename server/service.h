// GlmService over the engine, with the gRPC callback API.
//
// No reaction blocks: handlers validate and Submit (the engine only queues), the engine
// thread does the compute and hands each event to its reactor through a mutex-protected
// queue, and whichever thread finds no write in flight starts the next one. OnCancel
// cancels the engine request, which frees its KV blocks before the engine's next step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/engine/engine.h"
#include "core/text/text_assets.h"
#include "glmserve/v1/glmserve.grpc.pb.h"
#include "server/access_log.h"
#include "server/convert.h"
#include "server/executor.h"
#include "server/metrics.h"

namespace glmserve {

struct ServiceOptions {
  int64_t max_concurrent_streams = 256;  // Generate streams in flight; 0: no limit
  // Applied to calls without a deadline; zero: none.
  absl::Duration default_deadline = absl::ZeroDuration();
  // Longer (or absent, when no default applies) deadlines are shortened to this; zero: none.
  absl::Duration max_deadline = absl::ZeroDuration();
  // Accepted bearer tokens; empty: no authentication.
  std::vector<std::string> auth_tokens;
  int encoder_threads = 2;  // Forward response encoding (see Executor)
  // Where each finished call is logged; nullptr: no access log. Must outlive the service.
  AccessLog* access_log = nullptr;
  // Bytes that Forward calls in flight may hold for their outputs (the engine's fp32 rows
  // plus the encoded reply, reserved from the request's shape at admission); beyond it a
  // call gets RESOURCE_EXHAUSTED. Bounds the server's output memory whatever the traffic.
  int64_t max_output_bytes_in_flight = int64_t{1} << 30;
};

// What the service serves once the model is loaded and warmed up.
struct Backend {
  glmserve::Engine* engine = nullptr;
  ServingLimits limits;
  v1::ModelInfo info;
  // The checkpoint's tokenizer and chat template (core/text/text_assets.h); never null, and
  // empty (text requests FAILED_PRECONDITION) when the checkpoint has none.
  std::shared_ptr<const TextAssets> text;
};

// Generate, Forward, Tokenize and CloseSession take `string` fields a client fills: they are raw
// methods (grpc::ByteBuffer in and out), so that their requests' UTF-8 is checked on the wire
// bytes before parsing (server/raw_call.h, server/wire_utf8.h) and invalid text is
// INVALID_ARGUMENT naming the field instead of the gRPC library's generic parse failure.
// Everything else about a call (authentication, deadlines, cancellation, the receive size
// limit, metrics, the access log, status mapping) is the same as for the typed methods.
using GlmServiceBase = v1::GlmService::WithRawCallbackMethod_Generate<
    v1::GlmService::WithRawCallbackMethod_Forward<v1::GlmService::WithRawCallbackMethod_Tokenize<
        v1::GlmService::WithRawCallbackMethod_CloseSession<v1::GlmService::CallbackService>>>>;

class GlmServiceImpl final : public GlmServiceBase {
 public:
  GlmServiceImpl(ServiceOptions options, Metrics* metrics);
  ~GlmServiceImpl() override;

  // Starts serving `backend` (until then every call is UNAVAILABLE). Called once; the engine
  // must outlive every call (GlmServer shuts the gRPC server down before destroying it).
  void Attach(std::unique_ptr<Backend> backend);
  // New calls are refused with UNAVAILABLE from now on; calls in flight continue.
  void StartDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  // Calls of this service in flight (accepted or not, until their reactor is done).
  int64_t calls_in_flight() const { return in_flight_.load(); }
  // Output bytes reserved by Forward calls in flight (see max_output_bytes_in_flight).
  int64_t output_bytes_in_flight() const { return output_bytes_.load(); }
  // Waits until no call is in flight or `deadline` passes; true when idle.
  bool WaitIdle(absl::Time deadline);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;

  // ---- Shared with the other front ends on this server (the KServe v2 service on the same
  // gRPC port, the OpenAI-compatible HTTP endpoint), so that every API admits, limits,
  // counts and drains calls the same way.

  // The checks every call passes before any engine work, in order: bearer token
  // (UNAUTHENTICATED), draining (UNAVAILABLE), loaded and warmed up (UNAVAILABLE). Returns
  // the backend, or the status to finish with.
  const Backend* Admit(grpc::CallbackServerContext* context, grpc::Status* status) const;
  bool Authorized(grpc::CallbackServerContext* context) const;
  // Who is calling, for session ownership: the accepted bearer token (by its position in the
  // token file, never the token itself) and the verified client certificate's identity;
  // empty when the server authenticates nobody.
  std::string CallerIdentity(grpc::CallbackServerContext* context) const;
  // Reserves `bytes` of the output budget; false (nothing reserved) when it would overflow.
  bool ReserveOutput(int64_t bytes);
  void ReleaseOutput(int64_t bytes) { output_bytes_.fetch_sub(bytes); }
  // The engine deadline of a call: its own, bounded by max_deadline, or the default.
  std::optional<glmserve::SteadyTime> EngineDeadline(grpc::CallbackServerContext* context) const;
  bool AcquireStream();
  void ReleaseStream();
  void CallStarted();
  // Every reactor's OnDone: the request metrics and the access log line, then CallDone.
  // `finish` is the engine's FinishEvent when the call reached the engine.
  void CallDone(Rpc rpc, const grpc::Status& status, grpc::CallbackServerContext* context,
                glmserve::SteadyTime arrival, const std::string& request_id,
                const glmserve::FinishEvent* finish);
  void CallDone();
  const ServiceOptions& options() const { return options_; }
  Metrics* metrics() const { return metrics_; }
  // The attached backend, or nullptr while loading (no authentication or draining check).
  const Backend* backend() const { return backend_.load(); }

 private:
  friend class GenerateReactor;
  friend class ForwardReactor;
  friend class SimpleReactor;

  const ServiceOptions options_;
  Metrics* const metrics_;
  Executor encoder_;
  std::unique_ptr<Backend> backend_owner_;
  std::atomic<const Backend*> backend_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> streams_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> output_bytes_{0};  // reserved by Forward calls in flight
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
};

}  // namespace glmserve
