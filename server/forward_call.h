// The unary reactor behind every API's Forward: glmserve.v1 Forward and KServe's ModelInfer
// differ only in how they decode a request and encode a reply; admission to the output
// budget, the engine submission, cancellation, the metrics and the hand-off of the reply's
// encoding to an encoder pool (never on the engine thread) are written here once.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "core/engine/engine.h"
#include "server/executor.h"
#include "server/metrics.h"
#include "server/service.h"

namespace glmserve {

class ForwardCallReactor : public grpc::ServerUnaryReactor {
 public:
  void OnCancel() override;
  void OnDone() override;

 protected:
  ForwardCallReactor(GlmServiceImpl* glm, Executor* encoder, Rpc rpc,
                     grpc::CallbackServerContext* context);
  ~ForwardCallReactor() override = default;

  // Reserves the call's output bytes (`output_dtype`: the reply's; RESOURCE_EXHAUSTED beyond
  // the server's budget) and submits `body` to the backend's engine; on any error the call
  // finishes with it. The subclass's Encode runs once the engine has finished.
  void Submit(const Backend& backend, glmserve::ForwardRequest body, v1::DataType output_dtype,
              const std::string& client_request_id);
  // Finishes the call with `status` (OnDone may then delete `this`).
  void Reply(grpc::Status status);

  // On an encoder thread, after a successful engine call: writes the reply from `output`
  // (the subclass may move from it) and the engine's `finish` (timings). An error (a reply
  // that does not serialize) finishes the call instead.
  virtual absl::Status Encode(glmserve::ForwardOutput& output, const glmserve::FinishEvent& finish,
                              const ModelConfig& config) = 0;

  GlmServiceImpl* const glm_;
  grpc::CallbackServerContext* const context_;
  const glmserve::SteadyTime arrival_;
  std::string request_id_;  // logged whatever happens

 private:
  void OnEvent(glmserve::Event&& event);
  void Complete();

  Executor* const encoder_;
  const Rpc rpc_;
  glmserve::Engine* engine_ = nullptr;
  int64_t reserved_bytes_ = 0;  // of the service's output budget, released in OnDone
  // Written on the engine thread before the encoder task is queued (which orders them, and
  // the encoder's Finish orders them before OnDone).
  glmserve::ForwardOutput output_;
  glmserve::FinishEvent finish_;
  bool finished_ = false;
  grpc::Status status_;

  std::mutex mu_;
  glmserve::RequestId id_ = 0;  // guarded by mu_
  bool cancelled_ = false;      // guarded by mu_
};

}  // namespace glmserve
