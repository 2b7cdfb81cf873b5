// Client requests to engine requests (server/convert.h): any GenerateRequest or
// ForwardRequest bytes either convert into a request the engine's own rules accept as
// well-formed (ids in the vocabulary, sizes within the limits, the reply within the message
// limit) or are refused with a client-error status; a Generate request's text fields
// (server/text_convert.h, with the embedded default model's tokenizer) likewise give a
// bounded prompt (and bounded forced tokens for a tool_choice) or a client error, after the
// server's wire walk (server/wire_utf8.h: the UTF-8 of every string field, checked on the raw
// bytes before the parse). The walk itself is checked against protobuf's own parser on every
// input, as each raw method's request type: it refuses nothing protobuf accepts (short of its
// nesting bound), and what it accepts parses with valid UTF-8 in every string field. The
// first byte picks the message type for the conversion.
#include "core/cpu/cpu_model.h"
#include "core/model/checkpoint.h"
#include "core/text/unicode.h"
#include "inference/grpc_service.pb.h"
#include "server/convert.h"
#include "server/text_convert.h"
#include "server/wire_utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const glmserve::ModelRunner& TinyModel() {
  static const glmserve::CpuModel* model = [] {
    absl::StatusOr<glmserve::ModelWeights> w = glmserve::LoadModel("tiny");
    GLM_FUZZ_CHECK(w.ok());
    return new glmserve::CpuModel(*std::move(w));
  }();
  return *model;
}

const glmserve::TextAssets& Assets() {
  static const glmserve::TextAssets* assets = [] {
    absl::StatusOr<glmserve::TextAssets> a =
        glmserve::LoadTextAssets(std::string(GLMSERVE_SOURCE_DIR) + "/models/glm-4.5-mini");
    GLM_FUZZ_CHECK(a.ok() && a->tokenizer != nullptr);
    return new glmserve::TextAssets(*std::move(a));
  }();
  return *assets;
}

bool ClientError(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted ||
         code == absl::StatusCode::kFailedPrecondition;
}

// An independent oracle for the walk: every string field of the parsed message, by reflection.
bool AllTextValid(const google::protobuf::Message& message) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection& r = *message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r.ListFields(message, &fields);
  for (const FieldDescriptor* f : fields) {
    const int n = f->is_repeated() ? r.FieldSize(message, f) : 1;
    for (int i = 0; i < n; ++i) {
      if (f->type() == FieldDescriptor::TYPE_STRING) {
        std::string scratch;
        const std::string& v = f->is_repeated()
                                   ? r.GetRepeatedStringReference(message, f, i, &scratch)
                                   : r.GetStringReference(message, f, &scratch);
        if (!glmserve::ValidateUtf8(v, "").ok()) return false;
      } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
        if (!AllTextValid(f->is_repeated() ? r.GetRepeatedMessage(message, f, i)
                                           : r.GetMessage(message, f))) {
          return false;
        }
      }
    }
  }
  return true;
}

// ParseCheckedMessage as `prototype`'s type, against protobuf's parser and the oracle above.
void CheckWalk(const google::protobuf::Message& prototype, std::string_view wire) {
  std::unique_ptr<google::protobuf::Message> checked(prototype.New());
  std::unique_ptr<google::protobuf::Message> plain(prototype.New());
  const absl::Status s = glmserve::ParseCheckedMessage(wire, checked.get());
  const bool protobuf_ok = plain->ParseFromArray(wire.data(), static_cast<int>(wire.size()));
  if (!s.ok()) {
    GLM_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    GLM_FUZZ_CHECK(!protobuf_ok || s.message().find("nested deeper") != std::string::npos);
    return;
  }
  GLM_FUZZ_CHECK(protobuf_ok && AllTextValid(*checked));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const glmserve::ModelRunner& model = TinyModel();
  const glmserve::ModelConfig& config = model.config();
  glmserve::ServingLimits limits;
  limits.max_prompt_tokens = 64;
  limits.max_new_tokens = 64;
  limits.default_max_new_tokens = 16;
  limits.max_reply_bytes = 1 << 16;
  const std::string_view wire(reinterpret_cast<const char*>(data + 1), size - 1);
  CheckWalk(glmserve::v1::GenerateRequest::default_instance(), wire);
  CheckWalk(glmserve::v1::ForwardRequest::default_instance(), wire);
  CheckWalk(glmserve::v1::TokenizeRequest::default_instance(), wire);
  CheckWalk(glmserve::v1::CloseSessionRequest::default_instance(), wire);
  CheckWalk(inference::ModelInferRequest::default_instance(), wire);
  if (data[0] & 1) {
    // As the raw Generate method decodes it (server/raw_call.h).
    glmserve::v1::GenerateRequest request;
    if (!glmserve::ParseCheckedMessage(wire, &request).ok()) return 0;
    absl::StatusOr<std::optional<glmserve::TextInput>> text =
        glmserve::TextInputFromGenerate(request);
    if (!text.ok()) {
      GLM_FUZZ_CHECK(ClientError(text.status().code()));
    } else if (text->has_value()) {
      absl::StatusOr<glmserve::TextPrompt> prompt =
          glmserve::BuildTextPrompt(Assets(), **text, limits.max_prompt_tokens);
      if (!prompt.ok()) {
        GLM_FUZZ_CHECK(ClientError(prompt.status().code()));
      } else {
        GLM_FUZZ_CHECK(!prompt->ids.empty() &&
                       static_cast<int64_t>(prompt->ids.size()) <= limits.max_prompt_tokens);
        GLM_FUZZ_CHECK(prompt->forced.tokens.size() <= glmserve::kMaxForcedTokens);
      }
    }
    if (glmserve::WantsText(request)) {
      absl::Status s =
          glmserve::TextStream::Create(Assets(), glmserve::TextStreamOptionsFor(request, nullptr))
              .status();
      GLM_FUZZ_CHECK(s.ok() || ClientError(s.code()));
    }
    absl::StatusOr<glmserve::GenerateRequest> out =
        glmserve::ToEngineGenerate(request, model, limits);
    if (!out.ok()) {
      GLM_FUZZ_CHECK(ClientError(out.status().code()));
      return 0;
    }
    // The prompt as given; an explicit max_new_tokens as given, an unset one the default
    // fitted to the context. The prompt's length, token ids, max_new_tokens' range, sampling
    // values and top_logprobs are the engine's rules (Engine::Submit,
    // tests/core/engine/engine_test.cc), not the wire conversion's: not checked here.
    GLM_FUZZ_CHECK(static_cast<int>(out->prompt.size()) == request.prompt_token_ids_size());
    if (request.stop().has_max_new_tokens()) {
      GLM_FUZZ_CHECK(out->stop.max_new_tokens == request.stop().max_new_tokens());
    } else {
      GLM_FUZZ_CHECK(out->stop.max_new_tokens >= 1 &&
                     out->stop.max_new_tokens <= limits.default_max_new_tokens);
    }
    return 0;
  }
  glmserve::v1::ForwardRequest request;
  if (!glmserve::ParseCheckedMessage(wire, &request).ok()) return 0;
  absl::StatusOr<glmserve::ForwardRequest> out = glmserve::ToEngineForward(request, model, limits);
  if (!out.ok()) {
    GLM_FUZZ_CHECK(ClientError(out.status().code()));
    return 0;
  }
  // Never both inputs. Neither is the engine's rule to refuse (ValidateForward: the front end
  // decodes, the engine decides), so the conversion may pass an empty request on.
  GLM_FUZZ_CHECK(out->token_ids.empty() || out->hidden.empty());
  if (!out->hidden.empty()) {
    GLM_FUZZ_CHECK(static_cast<int64_t>(out->hidden.size()) ==
                   out->num_tokens * config.hidden_size);
  }
  const glmserve::ForwardOutputSize bytes =
      glmserve::ForwardOutputBytes(*out, config, request.output_dtype());
  GLM_FUZZ_CHECK(bytes.reply_bytes <= limits.max_reply_bytes);
  if (!out->session_id.empty()) GLM_FUZZ_CHECK(glmserve::ValidateSessionId(out->session_id).ok());
  return 0;
}
