#include "server/kserve_convert.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "proto/tensor_codec.h"

namespace glmserve {
namespace {

using InputTensor = inference::ModelInferRequest::InferInputTensor;

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Element bytes of the datatypes an input may have; 0 for the others.
int64_t DatatypeBytes(const std::string& datatype) {
  if (datatype == "INT64") return 8;
  if (datatype == "INT32" || datatype == "FP32") return 4;
  if (datatype == "BF16" || datatype == "FP16") return 2;
  return 0;
}

v1::DataType WireDatatype(const std::string& datatype) {
  if (datatype == "FP32") return v1::DATA_TYPE_FP32;
  if (datatype == "BF16") return v1::DATA_TYPE_BF16;
  if (datatype == "FP16") return v1::DATA_TYPE_FP16;
  return v1::DATA_TYPE_UNSPECIFIED;
}

const char* DatatypeName(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_BF16:
      return "BF16";
    case v1::DATA_TYPE_FP16:
      return "FP16";
    default:
      return "FP32";
  }
}

// The input's positions from its shape: [n] / [1, n] for ids, [n, hidden] / [1, n, hidden]
// for hidden states. Sets *batch_dim when the leading 1 is there.
absl::StatusOr<int64_t> Positions(const InputTensor& input, bool ids, const KServeModel& model,
                                  int64_t max_positions, bool* batch_dim) {
  const auto& shape = input.shape();
  const int rank = shape.size();
  const int base = ids ? 1 : 2;
  const std::string expected =
      ids ? "[n] or [1, n]"
          : absl::StrCat("[n, ", model.hidden_size, "] or [1, n, ", model.hidden_size, "]");
  if (rank != base && rank != base + 1) {
    return absl::InvalidArgumentError(absl::StrCat("input '", input.name(), "': shape ",
                                                   ShapeString(shape), " must be ", expected));
  }
  *batch_dim = rank == base + 1;
  if (*batch_dim && shape[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", input.name(), "': batch size ", shape[0],
                     " is not supported (one sequence per ModelInfer call; send the others "
                     "as separate calls, which the server batches)"));
  }
  const int64_t n = shape[*batch_dim ? 1 : 0];
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("input '", input.name(), "': shape ",
                                                   ShapeString(shape), " has no positions"));
  }
  if (n > max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("input '", input.name(), "' has ", n,
                                                   " positions; the limit is ", max_positions));
  }
  if (!ids && shape[rank - 1] != model.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("input '", input.name(), "': shape ",
                                                   ShapeString(shape), " must be ", expected));
  }
  return n;
}

// Typed contents hold exactly the values of the one field that matches `datatype`.
bool OnlyField(const inference::InferTensorContents& c, int field_count) {
  const int total = c.bool_contents_size() + c.int_contents_size() + c.int64_contents_size() +
                    c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
                    c.fp64_contents_size() + c.bytes_contents_size();
  return total == field_count;
}

absl::Status ReadTokenIds(const InputTensor& input, const std::string* raw, int64_t n,
                          std::vector<int32_t>* ids) {
  const bool int64 = input.datatype() == "INT64";
  ids->reserve(static_cast<size_t>(n));
  const auto add = [&](int64_t id) -> absl::Status {
    if (id < 0 || id > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("input 'input_ids': token id ", id, " is outside [0, 2^31)"));
    }
    ids->push_back(static_cast<int32_t>(id));
    return absl::OkStatus();
  };
  if (raw != nullptr) {
    const int64_t width = int64 ? 8 : 4;
    if (static_cast<int64_t>(raw->size()) != n * width) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw_input_contents for 'input_ids' has ", raw->size(), " bytes; shape ",
                       ShapeString(input.shape()), " of ", input.datatype(), " needs ", n * width));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (int64) {
        int64_t v;
        std::memcpy(&v, raw->data() + i * 8, 8);  // little-endian, as the protocol says
        RETURN_IF_ERROR(add(v));
      } else {
        int32_t v;
        std::memcpy(&v, raw->data() + i * 4, 4);
        RETURN_IF_ERROR(add(v));
      }
    }
    return absl::OkStatus();
  }
  const inference::InferTensorContents& c = input.contents();
  const int count = int64 ? c.int64_contents_size() : c.int_contents_size();
  if (count != n || !OnlyField(c, count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input 'input_ids': contents must hold exactly ", n, " values in ",
        int64 ? "int64_contents" : "int_contents", " (shape ", ShapeString(input.shape()), ")"));
  }
  for (int i = 0; i < count; ++i)
    RETURN_IF_ERROR(add(int64 ? c.int64_contents(i) : c.int_contents(i)));
  return absl::OkStatus();
}

// hidden_states sent as typed contents: FP32 only, exactly n x hidden values, into t's bytes.
absl::Status ReadFp32Contents(const InputTensor& input, int64_t n, const KServeModel& model,
                              int64_t bytes, v1::Tensor* t);

// The hidden states [n, hidden] as fp32, through the wire-tensor codec (proto/tensor_codec.h:
// the byte count, the BF16/FP16 widening and the finite check the native API's tensors get).
absl::Status ReadHiddenStates(const InputTensor& input, std::string* raw, int64_t n,
                              const KServeModel& model, glmserve::ForwardRequest* out) {
  v1::Tensor tensor;
  v1::Tensor* t = &tensor;
  t->set_dtype(WireDatatype(input.datatype()));
  t->add_shape(n);
  t->add_shape(model.hidden_size);
  const int64_t bytes = n * model.hidden_size * DatatypeBytes(input.datatype());
  if (raw != nullptr) {
    if (static_cast<int64_t>(raw->size()) != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw_input_contents for 'hidden_states' has ", raw->size(), " bytes; shape ",
                       ShapeString(input.shape()), " of ", input.datatype(), " needs ", bytes));
    }
    t->set_raw_data(std::move(*raw));
  } else {
    RETURN_IF_ERROR(ReadFp32Contents(input, n, model, bytes, t));
  }
  ASSIGN_OR_RETURN(out->hidden, DecodeTensor(*t, "hidden_states"));
  out->num_tokens = n;
  return absl::OkStatus();
}

absl::Status ReadFp32Contents(const InputTensor& input, int64_t n, const KServeModel& model,
                              int64_t bytes, v1::Tensor* t) {
  if (input.datatype() != "FP32") {
    return absl::InvalidArgumentError(
        "input 'hidden_states': BF16 and FP16 tensors travel only as raw_input_contents");
  }
  const inference::InferTensorContents& c = input.contents();
  if (c.fp32_contents_size() != n * model.hidden_size || !OnlyField(c, c.fp32_contents_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("input 'hidden_states': contents must hold exactly ", n * model.hidden_size,
                     " values in fp32_contents (shape ", ShapeString(input.shape()), ")"));
  }
  std::string* data = t->mutable_raw_data();
  data->resize(static_cast<size_t>(bytes));
  std::memcpy(data->data(), c.fp32_contents().data(), static_cast<size_t>(bytes));
  return absl::OkStatus();
}

// The request parameters glmserve reads, each with its one accepted type.
absl::Status ReadParameters(const inference::ModelInferRequest& request, KServeForward* out) {
  glmserve::ForwardRequest& body = out->body;
  for (const auto& entry : request.parameters()) {
    // Named copies, not structured bindings: clang 14 cannot capture those in the lambda.
    const std::string& key = entry.first;
    const inference::InferParameter& value = entry.second;
    const auto want = [&](inference::InferParameter::ParameterChoiceCase c, const char* type) {
      return value.parameter_choice_case() == c
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(
                       absl::StrCat("parameter '", key, "' must be a ", type, " parameter"));
    };
    if (key == "layer_begin" || key == "layer_end") {
      RETURN_IF_ERROR(want(inference::InferParameter::kInt64Param, "int64"));
      (key == "layer_begin" ? body.layer_begin : body.layer_end) = value.int64_param();
    } else if (key == "last_position_only" || key == "create_session") {
      RETURN_IF_ERROR(want(inference::InferParameter::kBoolParam, "bool"));
      (key == "create_session" ? body.create_session : body.last_position_only) =
          value.bool_param();
    } else if (key == "session_id") {
      RETURN_IF_ERROR(want(inference::InferParameter::kStringParam, "string"));
      body.session_id = value.string_param();
    } else if (key == "output_datatype") {
      RETURN_IF_ERROR(want(inference::InferParameter::kStringParam, "string"));
      const v1::DataType dtype = WireDatatype(value.string_param());
      if (dtype == v1::DATA_TYPE_UNSPECIFIED) {
        return absl::InvalidArgumentError(absl::StrCat("parameter 'output_datatype' is '",
                                                       value.string_param().substr(0, 32),
                                                       "'; use FP32, BF16 or FP16"));
      }
      out->output_dtype = dtype;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown parameter '", key.substr(0, 64),
          "' (known: layer_begin, layer_end, last_position_only, session_id, create_session, "
          "output_datatype)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckKServeModel(const std::string& name, const std::string& version,
                              const KServeModel& model) {
  if (name != model.name) {
    return absl::NotFoundError(absl::StrCat("unknown model '", name.substr(0, 128),
                                            "'; this server serves '", model.name, "'"));
  }
  if (!version.empty() && version != kKServeModelVersion) {
    return absl::NotFoundError(absl::StrCat("model '", model.name, "' has no version '",
                                            version.substr(0, 64), "' (only '", kKServeModelVersion,
                                            "')"));
  }
  return absl::OkStatus();
}

void FillKServeModelMetadata(const KServeModel& model, inference::ModelMetadataResponse* out) {
  out->set_name(model.name);
  out->add_versions(kKServeModelVersion);
  out->set_platform("glmserve");
  const auto add =
      [](google::protobuf::RepeatedPtrField<inference::ModelMetadataResponse::TensorMetadata>* list,
         const char* name, const char* datatype, std::vector<int64_t> shape) {
        auto* t = list->Add();
        t->set_name(name);
        t->set_datatype(datatype);
        for (int64_t d : shape) t->add_shape(d);
      };
  // Inputs the served span can take; the datatypes listed are the first of those accepted.
  if (model.layer_begin == 0) add(out->mutable_inputs(), kKServeInputIds, "INT32", {-1});
  if (model.layer_end > 0) {
    add(out->mutable_inputs(), kKServeHiddenStates, "FP32", {-1, model.hidden_size});
  }
  add(out->mutable_outputs(), kKServeHiddenStates, "FP32", {-1, model.hidden_size});
  if (model.layer_end == model.num_layers) {
    add(out->mutable_outputs(), kKServeLogits, "FP32", {-1, model.vocab_size});
  }
}

absl::StatusOr<KServeForward> ToKServeForward(const inference::ModelInferRequest& request,
                                              const KServeModel& model, int64_t max_positions) {
  KServeForward call;
  glmserve::ForwardRequest& out = call.body;
  out.layer_begin = model.layer_begin;  // the served span unless the parameters narrow it
  out.layer_end = model.layer_end;
  if (request.inputs_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelInfer takes exactly one input ('input_ids' or 'hidden_states'); got ",
                     request.inputs_size()));
  }
  const InputTensor& input = request.inputs(0);
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents has ", request.raw_input_contents_size(), " entries for ",
                     request.inputs_size(), " input"));
  }
  if (raw && input.has_contents()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input '", input.name(), "': set either contents or raw_input_contents, not both"));
  }
  if (!input.parameters().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", input.name(), "': input parameters are not supported"));
  }
  const bool ids = input.name() == kKServeInputIds;
  if (!ids && input.name() != kKServeHiddenStates) {
    return absl::InvalidArgumentError(absl::StrCat("unknown input '", input.name().substr(0, 64),
                                                   "' (inputs: input_ids, hidden_states)"));
  }
  const bool datatype_ok = ids ? (input.datatype() == "INT32" || input.datatype() == "INT64")
                               : WireDatatype(input.datatype()) != v1::DATA_TYPE_UNSPECIFIED;
  if (!datatype_ok) {
    return absl::InvalidArgumentError(absl::StrCat("input '", input.name(), "': datatype '",
                                                   input.datatype().substr(0, 32), "' must be ",
                                                   ids ? "INT32 or INT64" : "FP32, BF16 or FP16"));
  }
  ASSIGN_OR_RETURN(const int64_t n, Positions(input, ids, model, max_positions, &call.batch_dim));
  // A copy of the one raw buffer we move from (the request is const; hidden states are the
  // only large one, and they are moved into the Forward request without another copy).
  std::string raw_bytes;
  if (raw) raw_bytes = request.raw_input_contents(0);
  if (ids) {
    RETURN_IF_ERROR(ReadTokenIds(input, raw ? &raw_bytes : nullptr, n, &out.token_ids));
  } else {
    RETURN_IF_ERROR(ReadHiddenStates(input, raw ? &raw_bytes : nullptr, n, model, &out));
  }
  RETURN_IF_ERROR(ReadParameters(request, &call));

  for (const auto& o : request.outputs()) {
    if (o.name() != kKServeHiddenStates && o.name() != kKServeLogits) {
      return absl::InvalidArgumentError(absl::StrCat("unknown output '", o.name().substr(0, 64),
                                                     "' (outputs: hidden_states, logits)"));
    }
    if (!o.parameters().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", o.name(), "': output parameters are not supported"));
    }
    for (const std::string& seen : call.outputs) {
      if (seen == o.name()) {
        return absl::InvalidArgumentError(absl::StrCat("output '", o.name(), "' requested twice"));
      }
    }
    call.outputs.push_back(o.name());
  }
  if (call.outputs.empty()) {
    call.outputs.push_back(out.layer_end == model.num_layers ? kKServeLogits : kKServeHiddenStates);
  }
  out.logits = glmserve::LogitsRows::kNone;
  for (const std::string& name : call.outputs) {
    if (name == kKServeLogits) {
      out.logits =
          out.last_position_only ? glmserve::LogitsRows::kLast : glmserve::LogitsRows::kAll;
    } else {
      out.return_hidden = true;
    }
  }
  return call;
}

void FillKServeInferResponse(const glmserve::ForwardOutput& output, const KServeForward& call,
                             const inference::ModelInferRequest& request, const KServeModel& model,
                             inference::ModelInferResponse* out) {
  out->set_model_name(model.name);
  out->set_model_version(kKServeModelVersion);
  out->set_id(request.id());
  (*out->mutable_parameters())["start_position"].set_int64_param(output.start_position);
  for (const std::string& name : call.outputs) {
    const bool logits = name == kKServeLogits;
    const int64_t width = logits ? model.vocab_size : model.hidden_size;
    // The wire codec's encoding (proto/tensor_codec.h), its bytes moved into the reply.
    v1::Tensor t;
    const int64_t shape[] = {output.rows, width};
    EncodeTensor(logits ? output.logits : output.hidden, shape, call.output_dtype, &t);
    auto* o = out->add_outputs();
    o->set_name(name);
    o->set_datatype(DatatypeName(t.dtype()));
    if (call.batch_dim) o->add_shape(1);
    o->add_shape(output.rows);
    o->add_shape(width);
    out->add_raw_output_contents(std::move(*t.mutable_raw_data()));
  }
}

}  // namespace glmserve
