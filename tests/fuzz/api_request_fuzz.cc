// The standard APIs' request parsers: any bytes as an OpenAI request body (server/http/
// openai_request.h, first byte: chat or completions; linear strict JSON, server/http/
// json_body.h) either parse into a request within the wire bounds or are refused with
// INVALID_ARGUMENT; any bytes as a KServe ModelInferRequest (server/kserve_convert.h) either become
// a Forward request of at most the position limit or are refused with INVALID_ARGUMENT. Never a
// crash, never another code.
#include "inference/grpc_service.pb.h"
#include "server/http/openai_request.h"
#include "server/kserve_convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 3;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode < 2) {
    absl::StatusOr<glmserve::OpenAIRequest> r = glmserve::ParseOpenAIBody(body, mode == 1);
    if (!r.ok()) {
      GLM_FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
      return 0;
    }
    GLM_FUZZ_CHECK(r->stop.size() <= glmserve::kMaxWireStopStrings);
    GLM_FUZZ_CHECK(r->stop_token_ids.size() <= glmserve::kMaxWireStopTokenIds);
    // Its upper bound is the engine's (kMaxTopLogprobs), checked when the engine request is
    // built (ToEngineRequest), as are the sampling values'.
    GLM_FUZZ_CHECK(r->top_logprobs >= 0);
    GLM_FUZZ_CHECK(r->chat ? !r->messages.empty()
                           : (r->prompt_text.has_value() || !r->prompt_ids.empty()));
    GLM_FUZZ_CHECK(!r->max_tokens || *r->max_tokens >= 1);
    return 0;
  }
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) return 0;
  glmserve::KServeModel model;
  model.name = "tiny";
  model.hidden_size = 64;
  model.vocab_size = 256;
  model.layer_begin = 0;
  model.layer_end = 3;
  model.num_layers = 3;
  constexpr int64_t kMaxPositions = 1024;
  absl::StatusOr<glmserve::KServeForward> f =
      glmserve::ToKServeForward(request, model, kMaxPositions);
  if (!f.ok()) {
    GLM_FUZZ_CHECK(f.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const glmserve::ForwardRequest& fwd = f->body;
  GLM_FUZZ_CHECK(fwd.token_ids.empty() != fwd.hidden.empty());
  if (!fwd.token_ids.empty()) {
    GLM_FUZZ_CHECK(static_cast<int64_t>(fwd.token_ids.size()) <= kMaxPositions);
  } else {
    GLM_FUZZ_CHECK(fwd.num_tokens >= 1 && fwd.num_tokens <= kMaxPositions &&
                   static_cast<int64_t>(fwd.hidden.size()) == fwd.num_tokens * model.hidden_size);
  }
  GLM_FUZZ_CHECK(fwd.return_hidden || fwd.logits != glmserve::LogitsRows::kNone);
  GLM_FUZZ_CHECK(!f->outputs.empty() && f->outputs.size() <= 2);
  return 0;
}
