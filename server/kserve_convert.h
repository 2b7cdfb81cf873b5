// KServe v2 / Open Inference Protocol messages to and from glmserve's Forward call.
//
// ModelInfer is a Forward: one input tensor, either
//   input_ids      INT32 or INT64, shape [n] or [1, n]             (the span starts at layer 0)
//   hidden_states  FP32, BF16 or FP16, shape [n, hidden] or [1, n, hidden]  (it starts later)
// and the outputs it asks for by name ("hidden_states" [rows, hidden], "logits" [rows, vocab];
// none named: logits when the span ends at the model's last layer, else hidden_states).
// Request parameters carry what Forward's other fields do: layer_begin, layer_end (int64),
// last_position_only, create_session (bool), session_id, output_datatype ("FP32", "BF16",
// "FP16"; string). The request becomes the engine's ForwardRequest directly; the checks after
// decoding are the native API's (CheckForwardRequest, server/convert.h) and the engine's
// (Engine::Submit). docs/api_kserve.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "core/model/config.h"
#include "glmserve/v1/glmserve.pb.h"
#include "inference/grpc_service.pb.h"

namespace glmserve {

// What KServe clients see of the served model.
struct KServeModel {
  std::string name;  // the only model name served (ModelInfo.model)
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t layer_begin = 0;  // the served span
  int64_t layer_end = 0;
  int64_t num_layers = 0;
};

// The version glmserve reports; requests may name it or leave the version empty.
inline constexpr char kKServeModelVersion[] = "1";
inline constexpr char kKServeInputIds[] = "input_ids";
inline constexpr char kKServeHiddenStates[] = "hidden_states";
inline constexpr char kKServeLogits[] = "logits";

// NOT_FOUND unless `name` is the served model and `version` is empty or kKServeModelVersion.
absl::Status CheckKServeModel(const std::string& name, const std::string& version,
                              const KServeModel& model);

void FillKServeModelMetadata(const KServeModel& model, inference::ModelMetadataResponse* out);

// A ModelInfer request as the engine's Forward request, with the output dtype, the output
// names in the order they are answered and whether the client used a leading batch dimension
// of 1 (kept in the outputs).
struct KServeForward {
  glmserve::ForwardRequest body;
  v1::DataType output_dtype = v1::DATA_TYPE_UNSPECIFIED;
  std::vector<std::string> outputs;
  bool batch_dim = false;
};

// INVALID_ARGUMENT naming the input, parameter or output for: not exactly one input, an
// unknown input or output name, a datatype the input does not take, a malformed shape or a
// batch other than 1, more than `max_positions` positions (checked from the shape, before
// any byte is read), contents whose size does not match the shape, both raw and typed
// contents, an unknown parameter or one of the wrong type, an INT64 id outside int32.
absl::StatusOr<KServeForward> ToKServeForward(const inference::ModelInferRequest& request,
                                              const KServeModel& model, int64_t max_positions);

// The reply: each requested output with its datatype and shape, its bytes moved from the
// Forward response into raw_output_contents; parameter start_position.
void FillKServeInferResponse(const glmserve::ForwardOutput& output, const KServeForward& call,
                             const inference::ModelInferRequest& request, const KServeModel& model,
                             inference::ModelInferResponse* out);

}  // namespace glmserve
