#include "server/convert.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "proto/tensor_codec.h"

namespace glmserve {
namespace {

double Seconds(glmserve::SteadyTime from, glmserve::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

absl::StatusOr<glmserve::GenerateRequest> ToEngineGenerate(const v1::GenerateRequest& request,
                                                           const glmserve::ModelRunner& model,
                                                           const ServingLimits& limits) {
  return ToEngineGenerate(
      request,
      std::vector<int32_t>(request.prompt_token_ids().begin(), request.prompt_token_ids().end()),
      model, limits);
}

absl::StatusOr<glmserve::GenerateRequest> ToEngineGenerate(const v1::GenerateRequest& request,
                                                           std::vector<int32_t> prompt,
                                                           const glmserve::ModelRunner& model,
                                                           const ServingLimits& limits) {
  const glmserve::ModelConfig& config = model.config();
  glmserve::GenerateRequest out;
  // The prompt's length and max_new_tokens' range are the engine's rules (Engine::Submit's
  // ValidateGenerate); here only the default that an unset max_new_tokens gets.
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  out.prompt = std::move(prompt);

  const v1::StopCriteria& stop = request.stop();
  int64_t max_new = limits.default_max_new_tokens;
  if (stop.has_max_new_tokens()) max_new = stop.max_new_tokens();
  if (max_new >= 1 && prompt_len + max_new > config.max_position_embeddings) {
    if (stop.has_max_new_tokens()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt (", prompt_len, " tokens) + stop.max_new_tokens (", max_new,
                       ") exceeds the model's ", config.max_position_embeddings, " positions"));
    }
    // The default shrinks to fit rather than failing a request that asked for nothing (a
    // prompt that fills the context is the engine's to refuse).
    max_new = std::max<int64_t>(1, config.max_position_embeddings - prompt_len);
  }
  out.stop.max_new_tokens = static_cast<int32_t>(max_new);
  out.stop.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  out.stop.ignore_eos = stop.ignore_eos();

  const v1::SamplingParams& sampling = request.sampling();
  out.sampling.temperature = sampling.temperature();
  out.sampling.top_k = sampling.top_k();
  out.sampling.top_p = sampling.has_top_p() ? sampling.top_p() : 1.0f;
  out.sampling.min_p = sampling.min_p();
  out.sampling.repetition_penalty =
      sampling.has_repetition_penalty() ? sampling.repetition_penalty() : 1.0f;
  out.sampling.seed = sampling.seed();

  const v1::LogprobsOptions& logprobs = request.logprobs();
  // Asking for alternatives implies asking for the chosen token's logprob.
  out.logprobs = logprobs.enabled() || logprobs.top_logprobs() > 0;
  out.top_logprobs = logprobs.top_logprobs();
  out.mtp_draft_tokens = request.has_mtp_draft_tokens() ? request.mtp_draft_tokens() : -1;
  return out;
}

absl::StatusOr<glmserve::ForwardRequest> ToEngineForward(const v1::ForwardRequest& request,
                                                         const glmserve::ModelRunner& model,
                                                         const ServingLimits& limits) {
  const glmserve::ModelConfig& config = model.config();
  glmserve::ForwardRequest out;

  // The span's rules (served, non-empty, its input kind, logits needing the last layer) and
  // an input's emptiness are the engine's (ValidateForward, core/engine/engine.cc); here only
  // what decoding the message needs.
  const int64_t begin = request.has_layer_begin() ? request.layer_begin() : model.layer_begin();
  const int64_t end = request.has_layer_end() ? request.layer_end() : model.layer_end();
  out.layer_begin = begin;
  out.layer_end = end;

  switch (request.input_case()) {
    case v1::ForwardRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.size() > limits.max_prompt_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token_ids has ", ids.size(), " tokens; the limit is ", limits.max_prompt_tokens));
      }
      out.token_ids.assign(ids.begin(), ids.end());
      break;
    }
    case v1::ForwardRequest::kHiddenStates: {
      const v1::Tensor& t = request.hidden_states();
      if (t.shape_size() != 2 || t.shape(1) != config.hidden_size || t.shape(0) < 1) {
        std::string shape;
        for (int i = 0; i < t.shape_size(); ++i) {
          absl::StrAppend(&shape, i ? ", " : "", t.shape(i));
        }
        return absl::InvalidArgumentError(absl::StrCat("hidden_states: shape [", shape,
                                                       "] must be [num_tokens >= 1, ",
                                                       config.hidden_size, "]"));
      }
      if (t.shape(0) > limits.max_prompt_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "hidden_states has ", t.shape(0), " rows; the limit is ", limits.max_prompt_tokens));
      }
      ASSIGN_OR_RETURN(std::vector<float> values, DecodeTensor(t, "hidden_states"));
      out.hidden = std::move(values);
      out.num_tokens = t.shape(0);
      break;
    }
    default:
      return absl::InvalidArgumentError("input: set token_ids or hidden_states");
  }

  out.session_id = request.session_id();
  out.create_session = request.create_session();
  out.return_hidden = request.return_hidden_states();
  out.last_position_only = request.last_position_only();
  out.logits = !request.return_logits()       ? glmserve::LogitsRows::kNone
               : request.last_position_only() ? glmserve::LogitsRows::kLast
                                              : glmserve::LogitsRows::kAll;
  RETURN_IF_ERROR(CheckForwardRequest(out, request.output_dtype(), config, limits));
  return out;
}

absl::Status CheckForwardRequest(const glmserve::ForwardRequest& body, v1::DataType output_dtype,
                                 const glmserve::ModelConfig& config, const ServingLimits& limits) {
  if (!body.session_id.empty()) RETURN_IF_ERROR(glmserve::ValidateSessionId(body.session_id));
  if (body.create_session && body.session_id.empty()) {
    return absl::InvalidArgumentError("create_session needs a session_id");
  }
  switch (output_dtype) {
    case v1::DATA_TYPE_UNSPECIFIED:
    case v1::DATA_TYPE_FP32:
    case v1::DATA_TYPE_BF16:
    case v1::DATA_TYPE_FP16:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "output_dtype ", static_cast<int>(output_dtype), " is not a known DataType"));
  }
  // A few tokens can ask for gigabytes of logits (2000 positions x 151552 fp32 = 1.2 GB):
  // refuse from the shape, before the engine computes anything.
  const ForwardOutputSize size = ForwardOutputBytes(body, config, output_dtype);
  if (size.reply_bytes > limits.max_reply_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the reply would be ", size.reply_bytes,
                     " bytes, over the server's message limit of ", limits.max_reply_bytes,
                     " bytes; ask for last_position_only, fewer positions per call, "
                     "a 16-bit output_dtype, or hidden states without logits"));
  }
  return absl::OkStatus();
}

ForwardOutputSize ForwardOutputBytes(const glmserve::ForwardRequest& body,
                                     const glmserve::ModelConfig& config,
                                     v1::DataType output_dtype) {
  const int64_t positions =
      body.token_ids.empty() ? body.num_tokens : static_cast<int64_t>(body.token_ids.size());
  const int64_t rows = body.last_position_only ? 1 : positions;
  const int64_t per_row = (body.return_hidden ? config.hidden_size : 0) +
                          (body.logits != glmserve::LogitsRows::kNone ? config.vocab_size : 0);
  const int64_t wire_element =
      output_dtype == v1::DATA_TYPE_BF16 || output_dtype == v1::DATA_TYPE_FP16 ? 2 : 4;
  // Rows are bounded by max_prompt_tokens and per_row by the config: no overflow.
  constexpr int64_t kEnvelopeBytes = 1024;  // shapes, timings, field tags
  ForwardOutputSize size;
  size.engine_bytes = rows * per_row * static_cast<int64_t>(sizeof(float));
  size.reply_bytes = rows * per_row * wire_element + kEnvelopeBytes;
  return size;
}

void FillTimings(const glmserve::Timestamps& times, glmserve::SteadyTime arrival,
                 v1::Timings* out) {
  if (times.first_scheduled) out->set_queue_seconds(Seconds(arrival, *times.first_scheduled));
  if (times.first_token) {
    out->set_time_to_first_token_seconds(Seconds(arrival, *times.first_token));
  }
  if (times.finished) {
    out->set_total_seconds(Seconds(arrival, *times.finished));
    if (times.first_scheduled) {
      out->set_engine_seconds(Seconds(*times.first_scheduled, *times.finished));
    }
  }
}

void FillFinished(const glmserve::FinishEvent& finish, glmserve::SteadyTime arrival,
                  const std::string& request_id, v1::Finished* out) {
  out->set_reason(finish.reason == glmserve::FinishReason::kLength ? v1::FINISH_REASON_LENGTH
                                                                   : v1::FINISH_REASON_STOP);
  out->set_prompt_tokens(finish.prompt_tokens);
  out->set_cached_prompt_tokens(finish.cached_prompt_tokens);
  out->set_generated_tokens(finish.generated_tokens);
  out->set_preemptions(finish.preemptions);
  FillTimings(finish.times, arrival, out->mutable_timings());
  out->set_request_id(request_id);
}

void FillToken(const glmserve::TokenEvent& token, v1::GeneratedToken* out) {
  out->set_token_id(token.token);
  out->set_index(token.index);
  out->set_logprob(token.logprob);
  for (const glmserve::TokenLogprob& t : token.top) {
    v1::TokenLogprob* p = out->add_top_logprobs();
    p->set_token_id(t.token);
    p->set_logprob(t.logprob);
  }
}

void FillForwardResponse(const glmserve::ForwardOutput& output, const glmserve::ModelConfig& config,
                         const v1::ForwardRequest& request, v1::ForwardResponse* out) {
  out->set_rows(output.rows);
  out->set_start_position(output.start_position);
  out->set_request_id(request.request_id());
  if (request.return_hidden_states()) {
    const int64_t shape[] = {output.rows, config.hidden_size};
    EncodeTensor(output.hidden, shape, request.output_dtype(), out->mutable_hidden_states());
  }
  if (request.return_logits()) {
    const int64_t shape[] = {output.rows, config.vocab_size};
    EncodeTensor(output.logits, shape, request.output_dtype(), out->mutable_logits());
  }
}

namespace {

// Sets proto field `f` of `out` from a ModelConfig member (overloads by member type); a field
// of another type is left unset rather than crashing protobuf's reflection (the test catches it).
void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor* f,
              int64_t value, google::protobuf::Message* out) {
  if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT64 && !f->is_repeated())
    r.SetInt64(out, f, value);
}
void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor* f,
              double value, google::protobuf::Message* out) {
  if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE && !f->is_repeated())
    r.SetDouble(out, f, value);
}
void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor* f,
              bool value, google::protobuf::Message* out) {
  if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL && !f->is_repeated())
    r.SetBool(out, f, value);
}
void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor* f,
              const std::string& value, google::protobuf::Message* out) {
  if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING && !f->is_repeated())
    r.SetString(out, f, value);
}
void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor* f,
              const std::vector<int32_t>& values, google::protobuf::Message* out) {
  if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_INT32 || !f->is_repeated())
    return;
  for (int32_t v : values) r.AddInt32(out, f, v);
}

void SetField(const google::protobuf::Reflection& r, const google::protobuf::FieldDescriptor* f,
              const std::vector<std::string>& values, google::protobuf::Message* out) {
  if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING || !f->is_repeated())
    return;
  for (const std::string& v : values) r.AddString(out, f, v);
}

}  // namespace

// v1.ModelConfig names its fields as ModelConfig's members (tests/server/convert_test.cc
// checks that every member has its proto field, of the right type), so the one field list
// fills it by name.
void FillModelConfig(const glmserve::ModelConfig& c, v1::ModelConfig* out) {
  const google::protobuf::Descriptor& descriptor = *out->GetDescriptor();
  const google::protobuf::Reflection& reflection = *out->GetReflection();
  ForEachConfigField(c, [&](const ConfigField& f, const auto& member) {
    if (const google::protobuf::FieldDescriptor* field = descriptor.FindFieldByName(f.name)) {
      SetField(reflection, field, member, out);
    }
  });
}

}  // namespace glmserve
