#include "server/service.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/forward_call.h"
#include "server/raw_call.h"
#include "server/status.h"
#include "server/text_convert.h"

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(glmserve::SteadyTime from, glmserve::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

// Token comparison whose time does not depend on where the strings differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The status a call reports in glmserve_requests_total: a call that was cancelled because its
// own deadline passed is counted as DEADLINE_EXCEEDED (which is what its client saw).
grpc::StatusCode ReportedCode(const grpc::Status& status, grpc::CallbackServerContext* context) {
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      context->deadline() <= std::chrono::system_clock::now()) {
    return grpc::StatusCode::DEADLINE_EXCEEDED;
  }
  return status.error_code();
}

}  // namespace

// ---- Unary calls answered on the spot (errors, CloseSession, GetModelInfo) -------------------

class SimpleReactor final : public grpc::ServerUnaryReactor {
 public:
  SimpleReactor(GlmServiceImpl* service, grpc::CallbackServerContext* context, Rpc rpc)
      : service_(service), context_(context), rpc_(rpc), arrival_(Clock::now()) {}

  void Reply(grpc::Status status) {
    status_ = status;
    Finish(std::move(status));
  }
  void OnDone() override {
    service_->CallDone(rpc_, status_, context_, arrival_, "", nullptr);
    delete this;
  }

 private:
  GlmServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const Rpc rpc_;
  const glmserve::SteadyTime arrival_;
  grpc::Status status_;
};

// ---- Generate ------------------------------------------------------------------------------

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(GlmServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), arrival_(Clock::now()) {}

  // Runs inside the handler: OnDone cannot run before the handler returns, so `this` is
  // safe here even if the engine finishes the request before Submit returns.
  void Start(const grpc::ByteBuffer& raw) {
    // Decoded before the admission checks, so that a refused call is logged with its
    // request_id as before (gRPC parsed typed requests before the handler ran), but reported
    // after them: an unauthenticated caller learns nothing about its request.
    const absl::Status decoded = ParseRawRequest(raw, &request_);
    if (decoded.ok()) request_id_ = request_.request_id();  // logged whatever happens next
    grpc::Status status;
    const Backend* backend = service_->Admit(context_, &status);
    if (backend == nullptr) return FinishEarly(status);
    if (!decoded.ok()) return FinishEarly(ToGrpcStatus(decoded));
    const v1::GenerateRequest& request = request_;
    absl::StatusOr<glmserve::GenerateRequest> body = PrepareText(request, *backend);
    if (!body.ok()) return FinishEarly(ToGrpcStatus(body.status()));
    // The engine's rules before a stream slot is taken, so that a bad request never holds one.
    if (absl::Status valid = backend->engine->Validate(*body); !valid.ok()) {
      return FinishEarly(ToGrpcStatus(valid));
    }
    if (!service_->AcquireStream()) {
      return FinishEarly(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("too many concurrent Generate streams (limit ",
                       service_->options_.max_concurrent_streams, ")"))));
    }
    holds_stream_ = true;
    engine_ = backend->engine;
    glmserve::Request engine_request(*std::move(body));
    engine_request.deadline = service_->EngineDeadline(context_);
    engine_request.client_request_id = request_id_;
    absl::StatusOr<glmserve::RequestId> id = engine_->Submit(
        std::move(engine_request), [this](glmserve::Event&& event) { OnEvent(std::move(event)); });
    if (!id.ok()) return FinishEarly(ToGrpcStatus(id.status()));
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id_ = *id;
      cancelled = cancelled_;
    }
    if (cancelled) engine_->Cancel(*id);
  }

  void OnWriteDone(bool ok) override {
    glmserve::RequestId cancel = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok && !broken_) {
        // The stream is gone (client disconnected): stop computing for it now.
        broken_ = true;
        cancel = id_;
      }
    }
    if (cancel != 0) engine_->Cancel(cancel);
    Pump();
  }

  void OnCancel() override {
    glmserve::RequestId id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      id = id_;
    }
    if (id != 0) engine_->Cancel(id);
  }

  void OnDone() override {
    if (holds_stream_) service_->ReleaseStream();
    std::optional<glmserve::FinishEvent> finish;
    {
      std::lock_guard<std::mutex> lock(mu_);  // orders the engine thread's write of finish_
      finish = finish_;
    }
    // Last use of the service: once CallDone reports idle, a drain may destroy it.
    service_->CallDone(Rpc::kGenerate, status_, context_, arrival_, request_id_,
                       finish.has_value() ? &*finish : nullptr);
    delete this;
  }

 private:
  void FinishEarly(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    finish_called_ = true;
    status_ = status;
    Finish(std::move(status));
  }

  // The text side of a request (core/text/text_generation.h): the prompt from prompt_text or
  // messages, the stream that turns generated ids into text deltas, and the engine request.
  absl::StatusOr<glmserve::GenerateRequest> PrepareText(const v1::GenerateRequest& request,
                                                        const Backend& backend) {
    ASSIGN_OR_RETURN(std::optional<TextInput> input, TextInputFromGenerate(request));
    const glmserve::ModelRunner& model = backend.engine->model();
    const TextAssets& assets = *backend.text;
    Metrics* metrics = service_->metrics_;
    std::optional<TextPrompt> prompt;
    if (input.has_value()) {
      const auto start = Clock::now();
      absl::StatusOr<TextPrompt> built = BuildTextPrompt(
          assets, *input,
          static_cast<size_t>(std::max<int64_t>(1, backend.limits.max_prompt_tokens)));
      if (assets.tokenizer != nullptr) {
        metrics->RecordTokenizer(input->is_chat() ? "chat" : "encode",
                                 Seconds(start, Clock::now()));
      }
      RETURN_IF_ERROR(built.status());  // after the metric: a failed encode took time too
      prompt = *std::move(built);
    }
    if (WantsText(request)) {
      ASSIGN_OR_RETURN(
          text_,
          TextStream::Create(assets, TextStreamOptionsFor(request, prompt ? &*prompt : nullptr)));
    }
    absl::StatusOr<glmserve::GenerateRequest> body =
        prompt.has_value()
            ? ToEngineGenerate(request, std::move(prompt->ids), model, backend.limits)
            : ToEngineGenerate(request, model, backend.limits);
    if (body.ok() && text_ != nullptr) ApplyTextDefaults(assets, &*body);
    if (body.ok() && prompt.has_value()) body->forced = std::move(prompt->forced);
    if (body.ok()) {
      metrics->RecordGenerateInput(!input.has_value() ? "token_ids"
                                   : input->is_chat() ? "messages"
                                                      : "prompt_text");
    }
    return body;
  }

  // Engine thread, under mu_: the text a token completes. A stop string ends the generation
  // in the engine at once (Cancel only queues, so it is safe here); tokens still in flight
  // after it are dropped. Returns the request to cancel, or 0.
  glmserve::RequestId PushText(glmserve::RequestId id, int32_t token) {
    absl::StatusOr<TextDelta> delta = text_->Push(token);
    if (!delta.ok()) {
      // Sampling is bounded by the tokenizer's ids (ApplyTextDefaults): only a tokenizer with
      // holes in its ids gets here.
      text_error_ = absl::InternalError(absl::StrCat(
          "the model generated a token the tokenizer cannot decode: ", delta.status().message()));
      return id;
    }
    const bool stopped = delta->stopped;
    AppendTextDelta(*std::move(delta), &pending_text_);
    return stopped ? id : 0;
  }

  // Engine thread, under mu_: a stop string's cancellation is a normal end (stop), a text
  // error ends the call with it; on a normal end the stream's last delta and reason.
  void FinishText(glmserve::FinishEvent* finish) {
    if (!text_error_.ok()) {
      finish->reason = glmserve::FinishReason::kError;
      finish->status = text_error_;
      return;
    }
    if (text_->stopped()) {
      finish->reason = glmserve::FinishReason::kStop;
      finish->status = absl::OkStatus();
    }
    if (!finish->status.ok()) return;
    TextResult result = text_->Finish(finish->reason);
    AppendTextDelta(std::move(result.last), &pending_text_);
    text_reason_ = WireFinishReason(result.reason);
    if (result.stop_index >= 0) {
      service_->metrics_->RecordStopString();
      stop_string_ = text_->options().stop[result.stop_index];
    }
  }

  // Under mu_: the pending tokens (and text) into response_.
  void FillPending() {
    response_.Clear();
    for (const glmserve::TokenEvent& t : pending_) FillToken(t, response_.add_tokens());
    pending_.clear();
    if (text_ != nullptr) {
      FillTextDelta(pending_text_, text_->options().chat, &response_);
      pending_text_ = TextDelta();
    }
  }

  // Engine thread: record, queue, and start a write if none is in flight.
  void OnEvent(glmserve::Event&& event) {
    Metrics* metrics = service_->metrics_;
    if (auto* token = std::get_if<glmserve::TokenEvent>(&event.body)) {
      if (!last_token_time_) {
        metrics->RecordTimeToFirstToken(Seconds(arrival_, token->time));
      } else {
        metrics->RecordInterToken(Seconds(*last_token_time_, token->time));
      }
      last_token_time_ = token->time;
      glmserve::RequestId cancel = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (text_ != nullptr) {
          if (text_->stopped() || !text_error_.ok()) return;  // cancelled: nothing more to send
          cancel = PushText(event.id, token->token);
        }
        pending_.push_back(std::move(*token));
      }
      if (cancel != 0) engine_->Cancel(cancel);
    } else if (auto* finish = std::get_if<glmserve::FinishEvent>(&event.body)) {
      if (finish->times.first_scheduled) {
        metrics->RecordQueue(Rpc::kGenerate, Seconds(arrival_, *finish->times.first_scheduled));
      }
      metrics->RecordTokens(finish->prompt_tokens, finish->generated_tokens);
      std::lock_guard<std::mutex> lock(mu_);
      if (text_ != nullptr) FinishText(finish);
      finish_ = std::move(*finish);
    } else {
      return;  // Generate has no ForwardOutput
    }
    Pump();
  }

  // Sends what is pending, from whichever thread finds the stream idle. The message buffer
  // is only touched by the thread that claimed the write under the lock, and the gRPC call
  // is the last thing done: once Finish is called, OnDone may delete `this` on another thread.
  void Pump() {
    enum class Action { kNone, kWrite, kWriteAndFinish, kFinish } action = Action::kNone;
    grpc::Status status;
    glmserve::RequestId cancel = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (write_in_flight_ || finish_called_) return;
      if (finish_.has_value()) {
        finish_called_ = true;
        if (!finish_->status.ok() || broken_) {
          // Tokens still pending are dropped: the call ends with an error status anyway.
          status = broken_ && finish_->status.ok()
                       ? ToGrpcStatus(absl::CancelledError("stream broken"))
                       : ToGrpcStatus(finish_->status);
          action = Action::kFinish;
        } else {
          FillPending();
          FillFinished(*finish_, arrival_, request_id_, response_.mutable_finished());
          if (text_ != nullptr) {
            response_.mutable_finished()->set_reason(text_reason_);
            response_.mutable_finished()->set_stop_string(stop_string_);
          }
          action = Action::kWriteAndFinish;
          if (const absl::Status s = SerializeRawReply(response_, &wire_); !s.ok()) {
            status = ToGrpcStatus(s);
            action = Action::kFinish;
          }
        }
        status_ = status;
      } else if (!pending_.empty() && !broken_) {
        // Every token produced while the previous write was in flight goes in this one.
        FillPending();
        action = Action::kWrite;
        if (const absl::Status s = SerializeRawReply(response_, &wire_); !s.ok()) {
          // Not reachable within the reply limits; if it were, the call ends here.
          finish_called_ = true;
          status_ = status = ToGrpcStatus(s);
          cancel = id_;
          action = Action::kFinish;
        } else {
          write_in_flight_ = true;
        }
      }
    }
    if (cancel != 0) engine_->Cancel(cancel);  // before Finish: OnDone may delete `this`
    switch (action) {
      case Action::kNone:
        break;
      case Action::kWrite:
        StartWrite(&wire_);
        break;
      case Action::kWriteAndFinish:
        StartWriteAndFinish(&wire_, grpc::WriteOptions(), grpc::Status::OK);
        break;
      case Action::kFinish:
        Finish(status);
        break;
    }
  }

  GlmServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const glmserve::SteadyTime arrival_;
  glmserve::Engine* engine_ = nullptr;
  std::string request_id_;
  bool holds_stream_ = false;
  std::optional<glmserve::SteadyTime> last_token_time_;  // engine thread only

  std::mutex mu_;
  glmserve::RequestId id_ = 0;                   // guarded by mu_
  bool cancelled_ = false;                       // guarded by mu_
  bool broken_ = false;                          // guarded by mu_: a write failed
  bool write_in_flight_ = false;                 // guarded by mu_
  bool finish_called_ = false;                   // guarded by mu_
  std::vector<glmserve::TokenEvent> pending_;    // guarded by mu_
  std::optional<glmserve::FinishEvent> finish_;  // guarded by mu_
  // Text calls only (null otherwise); set in Start, then guarded by mu_.
  std::unique_ptr<TextStream> text_;
  TextDelta pending_text_;                                 // guarded by mu_
  absl::Status text_error_;                                // guarded by mu_
  v1::FinishReason text_reason_ = v1::FINISH_REASON_STOP;  // guarded by mu_
  std::string stop_string_;                                // guarded by mu_
  grpc::Status status_;                                    // the final status; read in OnDone
  v1::GenerateResponse response_;  // owned by the thread that claimed the write
  grpc::ByteBuffer wire_;          // response_ serialized: what that write sends
  v1::GenerateRequest request_;    // parsed in Start; read-only afterwards
};

// ---- Forward -------------------------------------------------------------------------------

class ForwardReactor final : public ForwardCallReactor {
 public:
  ForwardReactor(GlmServiceImpl* service, grpc::CallbackServerContext* context,
                 grpc::ByteBuffer* raw_response)
      : ForwardCallReactor(service, &service->encoder_, Rpc::kForward, context),
        raw_response_(raw_response) {}

  void Start(const grpc::ByteBuffer& raw) {
    // As Generate's: decoded first (for the log's request_id), reported after admission.
    const absl::Status decoded = ParseRawRequest(raw, &request_);
    if (decoded.ok()) request_id_ = request_.request_id();  // logged whatever happens next
    grpc::Status status;
    const Backend* backend = glm_->Admit(context_, &status);
    if (backend == nullptr) return Reply(status);
    if (!decoded.ok()) return Reply(ToGrpcStatus(decoded));
    absl::StatusOr<glmserve::ForwardRequest> body =
        ToEngineForward(request_, backend->engine->model(), backend->limits);
    if (!body.ok()) return Reply(ToGrpcStatus(body.status()));
    // The engine has its own copy of the input now: the request's tensor can go.
    request_.clear_hidden_states();
    request_.clear_token_ids();
    Submit(*backend, *std::move(body), request_.output_dtype(), request_.request_id());
  }

 private:
  absl::Status Encode(glmserve::ForwardOutput& output, const glmserve::FinishEvent& finish,
                      const ModelConfig& config) override {
    v1::ForwardResponse response;
    FillForwardResponse(output, config, request_, &response);
    FillTimings(finish.times, arrival_, response.mutable_timings());
    output = glmserve::ForwardOutput();  // the floats are encoded: free them now
    return SerializeRawReply(response, raw_response_);
  }

  grpc::ByteBuffer* const raw_response_;
  v1::ForwardRequest request_;  // parsed in Start
};

// ---- The service -----------------------------------------------------------------------------

GlmServiceImpl::GlmServiceImpl(ServiceOptions options, Metrics* metrics)
    : options_(std::move(options)), metrics_(metrics), encoder_(options_.encoder_threads) {}

GlmServiceImpl::~GlmServiceImpl() = default;

void GlmServiceImpl::Attach(std::unique_ptr<Backend> backend) {
  backend_owner_ = std::move(backend);
  backend_.store(backend_owner_.get());
}

bool GlmServiceImpl::WaitIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_until(lock, absl::ToChronoTime(deadline),
                             [this] { return in_flight_.load() == 0; });
}

void GlmServiceImpl::CallStarted() { in_flight_.fetch_add(1); }

void GlmServiceImpl::CallDone(Rpc rpc, const grpc::Status& status,
                              grpc::CallbackServerContext* context, glmserve::SteadyTime arrival,
                              const std::string& request_id, const glmserve::FinishEvent* finish) {
  const double total = Seconds(arrival, Clock::now());
  const grpc::StatusCode code = ReportedCode(status, context);
  metrics_->RecordRequest(rpc, code, total);
  if (code == grpc::StatusCode::OK && finish != nullptr) metrics_->RecordSuccess(rpc, *finish);
  if (options_.access_log != nullptr) {
    AccessRecord r;
    r.time = absl::Now();
    r.rpc = RpcName(rpc);
    r.code = GrpcCodeName(code);
    r.request_id = request_id;
    r.peer = context->peer();
    r.total_ms = total * 1e3;
    if (finish != nullptr) {
      r.prompt_tokens = finish->prompt_tokens;
      r.generated_tokens = finish->generated_tokens;
      if (finish->times.first_scheduled) {
        r.queue_ms = Seconds(arrival, *finish->times.first_scheduled) * 1e3;
      }
      if (rpc == Rpc::kGenerate && finish->times.first_token) {
        r.ttft_ms = Seconds(arrival, *finish->times.first_token) * 1e3;
      }
    }
    options_.access_log->Record(std::move(r));
  }
  CallDone();
}

void GlmServiceImpl::CallDone() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_cv_.notify_all();
  }
}

bool GlmServiceImpl::AcquireStream() {
  const int64_t limit = options_.max_concurrent_streams;
  if (streams_.fetch_add(1) >= limit && limit > 0) {
    streams_.fetch_sub(1);
    return false;
  }
  return true;
}

void GlmServiceImpl::ReleaseStream() { streams_.fetch_sub(1); }

bool GlmServiceImpl::Authorized(grpc::CallbackServerContext* context) const {
  if (options_.auth_tokens.empty()) return true;
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) return false;
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(value, kBearer)) return false;
  const absl::string_view token = value.substr(kBearer.size());
  bool ok = false;
  for (const std::string& accepted : options_.auth_tokens) {
    ok |= ConstantTimeEquals(token, accepted);
  }
  return ok;
}

std::string GlmServiceImpl::CallerIdentity(grpc::CallbackServerContext* context) const {
  std::string identity;
  if (!options_.auth_tokens.empty()) {
    const auto& metadata = context->client_metadata();
    const auto it = metadata.find("authorization");
    constexpr absl::string_view kBearer = "Bearer ";
    if (it != metadata.end()) {
      const absl::string_view value(it->second.data(), it->second.size());
      const absl::string_view token =
          absl::StartsWith(value, kBearer) ? value.substr(kBearer.size()) : absl::string_view();
      for (size_t i = 0; i < options_.auth_tokens.size(); ++i) {
        if (ConstantTimeEquals(token, options_.auth_tokens[i]))
          identity = absl::StrCat("token#", i);
      }
    }
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
      absl::StrAppend(&identity, "|cert:", absl::string_view(name.data(), name.size()));
    }
  }
  return identity;
}

bool GlmServiceImpl::ReserveOutput(int64_t bytes) {
  int64_t current = output_bytes_.load();
  do {
    if (current + bytes > options_.max_output_bytes_in_flight) return false;
  } while (!output_bytes_.compare_exchange_weak(current, current + bytes));
  return true;
}

const Backend* GlmServiceImpl::Admit(grpc::CallbackServerContext* context,
                                     grpc::Status* status) const {
  if (!Authorized(context)) {
    *status = ToGrpcStatus(absl::UnauthenticatedError(
        "missing or invalid bearer token (metadata 'authorization: Bearer <token>')"));
    return nullptr;
  }
  if (draining_.load()) {
    *status = ToGrpcStatus(absl::UnavailableError("server is draining for shutdown"));
    return nullptr;
  }
  const Backend* backend = backend_.load();
  if (backend == nullptr) {
    *status = ToGrpcStatus(absl::UnavailableError("server is loading the model"));
  }
  return backend;
}

std::optional<glmserve::SteadyTime> GlmServiceImpl::EngineDeadline(
    grpc::CallbackServerContext* context) const {
  // The engine wants its monotonic clock; gRPC gives the wall clock. The remaining time
  // carries over (clock adjustments during the call are ignored, as they should be).
  const auto wall_deadline = context->deadline();
  std::optional<absl::Duration> remaining;
  if (wall_deadline != std::chrono::system_clock::time_point::max()) {
    remaining = absl::FromChrono(wall_deadline - std::chrono::system_clock::now());
  } else if (options_.default_deadline > absl::ZeroDuration()) {
    remaining = options_.default_deadline;
  }
  if (options_.max_deadline > absl::ZeroDuration() &&
      (!remaining || *remaining > options_.max_deadline)) {
    remaining = options_.max_deadline;
  }
  if (!remaining) return std::nullopt;
  return Clock::now() + absl::ToChronoNanoseconds(std::max(*remaining, absl::ZeroDuration()));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GlmServiceImpl::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  CallStarted();
  auto* reactor = new GenerateReactor(this, context);
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* GlmServiceImpl::Forward(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  CallStarted();
  auto* reactor = new ForwardReactor(this, context, response);
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* GlmServiceImpl::CloseSession(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw_request,
                                                       grpc::ByteBuffer* raw_response) {
  CallStarted();
  auto* reactor = new SimpleReactor(this, context, Rpc::kCloseSession);
  v1::CloseSessionRequest request;
  const absl::Status decoded = ParseRawRequest(*raw_request, &request);  // reported after Admit
  grpc::Status status;
  if (const Backend* backend = Admit(context, &status)) {
    // A mutex and a map lookup on the engine's session registry: no waiting on compute.
    status = ToGrpcStatus([&]() -> absl::Status {
      RETURN_IF_ERROR(decoded);
      RETURN_IF_ERROR(backend->engine->CloseSession(request.session_id(), CallerIdentity(context)));
      return SerializeRawReply(v1::CloseSessionResponse(), raw_response);
    }());
  }
  reactor->Reply(std::move(status));
  return reactor;
}

grpc::ServerUnaryReactor* GlmServiceImpl::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest* request,
                                                       v1::ModelInfo* response) {
  CallStarted();
  auto* reactor = new SimpleReactor(this, context, Rpc::kGetModelInfo);
  grpc::Status status;
  const Backend* backend = Admit(context, &status);
  if (backend != nullptr) *response = backend->info;
  reactor->Reply(std::move(status));
  return reactor;
}

grpc::ServerUnaryReactor* GlmServiceImpl::Tokenize(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw_request,
                                                   grpc::ByteBuffer* raw_response) {
  CallStarted();
  auto* reactor = new SimpleReactor(this, context, Rpc::kTokenize);
  v1::TokenizeRequest parsed;
  const absl::Status decoded = ParseRawRequest(*raw_request, &parsed);  // reported after Admit
  const v1::TokenizeRequest* request = &parsed;
  grpc::Status status;
  if (const Backend* backend = Admit(context, &status); backend != nullptr && !decoded.ok()) {
    status = ToGrpcStatus(decoded);
  } else if (backend != nullptr) {
    // Tokenizing is bounded by the message size and the prompt limit, and fast (docs/text.md):
    // done here, as Generate's prompt is.
    const auto start = Clock::now();
    absl::StatusOr<TextPrompt> prompt = [&]() -> absl::StatusOr<TextPrompt> {
      ASSIGN_OR_RETURN(TextInput input, TextInputFromTokenize(*request));
      return BuildTextPrompt(
          *backend->text, input,
          static_cast<size_t>(std::max<int64_t>(1, backend->limits.max_prompt_tokens)));
    }();
    if (backend->text->tokenizer != nullptr) {  // only the tokenizer's work is timed
      metrics_->RecordTokenizer(request->messages_size() > 0 ? "chat" : "encode",
                                Seconds(start, Clock::now()));
    }
    status = ToGrpcStatus([&]() -> absl::Status {
      RETURN_IF_ERROR(prompt.status());
      v1::TokenizeResponse response;
      response.mutable_token_ids()->Add(prompt->ids.begin(), prompt->ids.end());
      response.set_text(std::move(prompt->text));
      return SerializeRawReply(response, raw_response);
    }());
  }
  reactor->Reply(std::move(status));
  return reactor;
}

grpc::ServerUnaryReactor* GlmServiceImpl::Detokenize(grpc::CallbackServerContext* context,
                                                     const v1::DetokenizeRequest* request,
                                                     v1::DetokenizeResponse* response) {
  CallStarted();
  auto* reactor = new SimpleReactor(this, context, Rpc::kDetokenize);
  grpc::Status status;
  if (const Backend* backend = Admit(context, &status)) {
    const auto start = Clock::now();
    absl::StatusOr<std::string> text = DetokenizeIds(
        *backend->text, absl::MakeConstSpan(request->token_ids().data(), request->token_ids_size()),
        request->skip_special_tokens());
    if (backend->text->tokenizer != nullptr) {
      metrics_->RecordTokenizer("decode", Seconds(start, Clock::now()));
    }
    status = ToGrpcStatus(text.status());
    if (text.ok()) response->set_text(*std::move(text));
  }
  reactor->Reply(std::move(status));
  return reactor;
}

}  // namespace glmserve
