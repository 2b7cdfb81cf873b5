#include "server/forward_call.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/status.h"

namespace glmserve {
namespace {

double Seconds(glmserve::SteadyTime from, glmserve::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

ForwardCallReactor::ForwardCallReactor(GlmServiceImpl* glm, Executor* encoder, Rpc rpc,
                                       grpc::CallbackServerContext* context)
    : glm_(glm),
      context_(context),
      arrival_(std::chrono::steady_clock::now()),
      encoder_(encoder),
      rpc_(rpc) {}

void ForwardCallReactor::Submit(const Backend& backend, glmserve::ForwardRequest body,
                                v1::DataType output_dtype, const std::string& client_request_id) {
  const ForwardOutputSize size =
      ForwardOutputBytes(body, backend.engine->model().config(), output_dtype);
  if (!glm_->ReserveOutput(size.engine_bytes + size.reply_bytes)) {
    return Reply(ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("the outputs of Forward calls in flight would pass the server's limit of ",
                     glm_->options().max_output_bytes_in_flight, " bytes (this call needs ",
                     size.engine_bytes + size.reply_bytes, "); retry later"))));
  }
  reserved_bytes_ = size.engine_bytes + size.reply_bytes;
  body.session_owner = glm_->CallerIdentity(context_);
  engine_ = backend.engine;
  glmserve::Request engine_request(std::move(body));
  engine_request.deadline = glm_->EngineDeadline(context_);
  engine_request.client_request_id = client_request_id;
  absl::StatusOr<glmserve::RequestId> id = engine_->Submit(
      std::move(engine_request), [this](glmserve::Event&& event) { OnEvent(std::move(event)); });
  if (!id.ok()) return Reply(ToGrpcStatus(id.status()));
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id_ = *id;
    cancelled = cancelled_;
  }
  if (cancelled) engine_->Cancel(*id);
}

void ForwardCallReactor::OnCancel() {
  glmserve::RequestId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    id = id_;
  }
  if (id != 0) engine_->Cancel(id);
}

void ForwardCallReactor::OnDone() {
  glm_->ReleaseOutput(reserved_bytes_);
  glm_->CallDone(rpc_, status_, context_, arrival_, request_id_, finished_ ? &finish_ : nullptr);
  delete this;
}

void ForwardCallReactor::Reply(grpc::Status status) {
  status_ = status;
  Finish(std::move(status));
}

// Engine thread: keep the output (a move), and on the finish hand the encoding to the encoder
// pool so the engine thread goes straight back to its loop.
void ForwardCallReactor::OnEvent(glmserve::Event&& event) {
  if (auto* output = std::get_if<glmserve::ForwardOutput>(&event.body)) {
    output_ = std::move(*output);
    return;
  }
  auto* finish = std::get_if<glmserve::FinishEvent>(&event.body);
  if (finish == nullptr) return;
  Metrics* metrics = glm_->metrics();
  if (finish->times.first_scheduled) {
    metrics->RecordQueue(rpc_, Seconds(arrival_, *finish->times.first_scheduled));
  }
  metrics->RecordTokens(finish->prompt_tokens, 0);
  finish_ = std::move(*finish);
  finished_ = true;
  encoder_->Run([this] { Complete(); });
}

void ForwardCallReactor::Complete() {
  grpc::Status status = ToGrpcStatus(finish_.status);
  if (status.ok()) status = ToGrpcStatus(Encode(output_, finish_, engine_->model().config()));
  Reply(std::move(status));  // last: OnDone may delete `this`
}

}  // namespace glmserve
