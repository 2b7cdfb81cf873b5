// The wire helpers on their own: tensor encoding (exact fp32, round-to-nearest-even bf16 and
// fp16), tensor validation, and the one absl -> gRPC status mapping.
#include "server/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/base/dtype.h"
#include "core/model/config.h"
#include "google/protobuf/descriptor.h"
#include "proto/tensor_codec.h"
#include "server/status.h"

namespace glmserve {
namespace {

TEST(TensorCodecTest, Fp32RoundTripsExactlyAndHalfTypesRoundToNearestEven) {
  const std::vector<float> values = {0.0f,        -0.0f, 1.0f,     -2.5f,
                                     3.14159265f, 1e-8f, 65504.0f, 1.00390625f /* bf16 tie */};
  const int64_t shape[] = {2, 4};
  for (v1::DataType dtype : {v1::DATA_TYPE_FP32, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    v1::Tensor t;
    EncodeTensor(values, shape, dtype, &t);
    EXPECT_EQ(t.dtype(), dtype);
    ASSERT_EQ(t.shape_size(), 2);
    EXPECT_EQ(t.raw_data().size(), values.size() * WireDTypeSize(dtype));
    absl::StatusOr<std::vector<float>> back = DecodeTensor(t, "t");
    ASSERT_TRUE(back.ok()) << back.status();
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = dtype == v1::DATA_TYPE_FP32 ? values[i]
                             : dtype == v1::DATA_TYPE_BF16
                                 ? glmserve::Bf16ToFloat(glmserve::FloatToBf16(values[i]))
                                 : glmserve::F16ToFloat(glmserve::FloatToF16(values[i]));
      EXPECT_EQ((*back)[i], expected) << i;
    }
  }
  v1::Tensor t;
  EncodeTensor(values, shape, v1::DATA_TYPE_UNSPECIFIED, &t);  // means FP32
  EXPECT_EQ(t.dtype(), v1::DATA_TYPE_FP32);
}

TEST(TensorCodecTest, RejectsMalformedTensorsWithAPreciseMessage) {
  const std::vector<float> values(6, 1.0f);
  const int64_t shape[] = {2, 3};
  v1::Tensor good;
  EncodeTensor(values, shape, v1::DATA_TYPE_FP32, &good);

  v1::Tensor t = good;
  t.set_dtype(v1::DATA_TYPE_UNSPECIFIED);
  EXPECT_EQ(DecodeTensor(t, "x").status().code(), absl::StatusCode::kInvalidArgument);
  t = good;
  t.mutable_raw_data()->append("x");
  absl::Status s = DecodeTensor(t, "x").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("25 bytes"), absl::string_view::npos) << s;
  t = good;
  t.set_shape(0, -2);
  EXPECT_EQ(DecodeTensor(t, "x").status().code(), absl::StatusCode::kInvalidArgument);
  t = good;
  t.set_shape(0, int64_t{1} << 40);
  t.set_shape(1, int64_t{1} << 40);  // the product would overflow
  EXPECT_EQ(DecodeTensor(t, "x").status().code(), absl::StatusCode::kInvalidArgument);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> v = values;
    v[4] = bad;
    EncodeTensor(v, shape, v1::DATA_TYPE_BF16, &t);
    s = DecodeTensor(t, "hidden_states").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("element 4"), absl::string_view::npos) << s;
    EXPECT_TRUE(DecodeTensor(t, "logits", /*require_finite=*/false).ok());
  }
}

TEST(StatusMapTest, EveryCanonicalCodeMapsToItsGrpcTwin) {
  const std::pair<absl::Status, grpc::StatusCode> cases[] = {
      {absl::OkStatus(), grpc::StatusCode::OK},
      {absl::InvalidArgumentError("a"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::NotFoundError("a"), grpc::StatusCode::NOT_FOUND},
      {absl::AlreadyExistsError("a"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::ResourceExhaustedError("a"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::DeadlineExceededError("a"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::CancelledError("a"), grpc::StatusCode::CANCELLED},
      {absl::UnauthenticatedError("a"), grpc::StatusCode::UNAUTHENTICATED},
      {absl::UnavailableError("a"), grpc::StatusCode::UNAVAILABLE},
      {absl::FailedPreconditionError("a"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::InternalError("a"), grpc::StatusCode::INTERNAL},
      {absl::DataLossError("a"), grpc::StatusCode::INTERNAL},
      {absl::UnknownError("a"), grpc::StatusCode::INTERNAL},
  };
  for (const auto& [in, code] : cases) {
    const grpc::Status out = ToGrpcStatus(in);
    EXPECT_EQ(out.error_code(), code) << in;
    EXPECT_EQ(out.error_message(), std::string(in.message()));
  }
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
}

// v1.ModelConfig is filled by name from ModelConfig's one field list: every member must have
// a proto field of the same name and type, or GetModelInfo would silently drop it.
TEST(ModelConfigProtoTest, EveryConfigFieldHasItsProtoFieldAndIsCarried) {
  absl::StatusOr<ModelConfig> config = PresetConfig("glm-4.5");
  ASSERT_TRUE(config.ok()) << config.status();
  v1::ModelConfig proto;
  FillModelConfig(*config, &proto);
  const google::protobuf::Descriptor& d = *proto.GetDescriptor();
  int fields = 0;
  ForEachConfigField(*config, [&](const ConfigField& f, const auto& member) {
    ++fields;
    const google::protobuf::FieldDescriptor* field = d.FindFieldByName(f.name);
    ASSERT_NE(field, nullptr) << f.name << " has no v1.ModelConfig field";
    using T = std::decay_t<decltype(member)>;
    using FD = google::protobuf::FieldDescriptor;
    const google::protobuf::Reflection& r = *proto.GetReflection();
    if constexpr (std::is_same_v<T, int64_t>) {
      ASSERT_EQ(field->cpp_type(), FD::CPPTYPE_INT64) << f.name;
      EXPECT_EQ(r.GetInt64(proto, field), member) << f.name;
    } else if constexpr (std::is_same_v<T, double>) {
      ASSERT_EQ(field->cpp_type(), FD::CPPTYPE_DOUBLE) << f.name;
      EXPECT_EQ(r.GetDouble(proto, field), member) << f.name;
    } else if constexpr (std::is_same_v<T, bool>) {
      ASSERT_EQ(field->cpp_type(), FD::CPPTYPE_BOOL) << f.name;
      EXPECT_EQ(r.GetBool(proto, field), member) << f.name;
    } else if constexpr (std::is_same_v<T, std::string>) {
      ASSERT_EQ(field->cpp_type(), FD::CPPTYPE_STRING) << f.name;
      EXPECT_EQ(r.GetString(proto, field), member) << f.name;
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      ASSERT_TRUE(field->is_repeated()) << f.name;
      ASSERT_EQ(field->cpp_type(), FD::CPPTYPE_STRING) << f.name;
      ASSERT_EQ(r.FieldSize(proto, field), static_cast<int>(member.size())) << f.name;
      for (size_t i = 0; i < member.size(); ++i) {
        EXPECT_EQ(r.GetRepeatedString(proto, field, static_cast<int>(i)), member[i]) << f.name;
      }
    } else {
      static_assert(std::is_same_v<T, std::vector<int32_t>>);
      ASSERT_TRUE(field->is_repeated()) << f.name;
      ASSERT_EQ(r.FieldSize(proto, field), static_cast<int>(member.size())) << f.name;
      for (size_t i = 0; i < member.size(); ++i) {
        EXPECT_EQ(r.GetRepeatedInt32(proto, field, static_cast<int>(i)), member[i]) << f.name;
      }
    }
  });
  EXPECT_EQ(fields, d.field_count()) << "v1.ModelConfig has a field ModelConfig lacks";
  EXPECT_EQ(proto.num_hidden_layers(), 92);
  EXPECT_EQ(proto.eos_token_ids_size(), 3);
  EXPECT_EQ(proto.hidden_act(), "silu");
  EXPECT_EQ(proto.model_type(), "glm4_moe");
}

// GLM-5's fields, lists included, reach GetModelInfo.
TEST(ModelConfigProtoTest, CarriesGlm5Fields) {
  absl::StatusOr<ModelConfig> config = PresetConfig("glm-5:layers=4");
  ASSERT_TRUE(config.ok()) << config.status();
  v1::ModelConfig proto;
  FillModelConfig(*config, &proto);
  EXPECT_EQ(proto.model_type(), "glm_moe_dsa");
  EXPECT_EQ(proto.kv_lora_rank(), 512);
  EXPECT_EQ(proto.qk_rope_head_dim(), 64);
  EXPECT_EQ(proto.index_topk(), 2048);
  ASSERT_EQ(proto.indexer_types_size(), 4);
  EXPECT_EQ(proto.indexer_types(0), "full");
  ASSERT_EQ(proto.mlp_layer_types_size(), 4);
  EXPECT_EQ(proto.mlp_layer_types(2), "dense");
  EXPECT_EQ(proto.mlp_layer_types(3), "sparse");
}

}  // namespace
}  // namespace glmserve
