// inference.GRPCInferenceService (KServe v2) end to end: a generated KServe stub (what
// Triton's clients speak) against the real server with the tiny model. ModelInfer equals the
// native Forward bit for bit; every bad request gets its precise status before any engine
// work; auth, readiness and metrics behave as on glmserve.v1.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/base/dtype.h"
#include "grpcpp/create_channel.h"
#include "inference/grpc_service.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;
using testing::Connect;
using testing::EngineDrained;
using testing::StartServer;
using testing::TinyOptions;
using testing::WaitUntil;

std::vector<float> FloatsOf(const std::string& raw) {
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

std::string RawInt32(const std::vector<int32_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
}

ModelInferRequest IdsRequest(const std::vector<int32_t>& ids) {
  ModelInferRequest r;
  r.set_model_name("tiny");
  auto* in = r.add_inputs();
  in->set_name("input_ids");
  in->set_datatype("INT32");
  in->add_shape(1);
  in->add_shape(static_cast<int64_t>(ids.size()));
  r.add_raw_input_contents(RawInt32(ids));
  return r;
}

class KServeTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(TinyOptions()); }
  void Start(const ServerOptions& options) {
    server_ = StartServer(options);
    ASSERT_NE(server_, nullptr);
    stub_ = inference::GRPCInferenceService::NewStub(
        grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
    EXPECT_EQ(server_->engine()->Stats().invariant_error, "");
  }
  grpc::Status Infer(const ModelInferRequest& request, ModelInferResponse* response,
                     const std::string& token = "") {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    return stub_->ModelInfer(&context, request, response);
  }

  std::unique_ptr<GlmServer> server_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(KServeTest, HealthAndMetadata) {
  {
    grpc::ClientContext c;
    inference::ServerLiveResponse r;
    ASSERT_TRUE(stub_->ServerLive(&c, {}, &r).ok());
    EXPECT_TRUE(r.live());
  }
  {
    grpc::ClientContext c;
    inference::ServerReadyResponse r;
    ASSERT_TRUE(stub_->ServerReady(&c, {}, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  {
    grpc::ClientContext c;
    inference::ModelReadyRequest q;
    q.set_name("tiny");
    inference::ModelReadyResponse r;
    ASSERT_TRUE(stub_->ModelReady(&c, q, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  {
    grpc::ClientContext c;
    inference::ModelReadyRequest q;
    q.set_name("other");
    inference::ModelReadyResponse r;
    const grpc::Status s = stub_->ModelReady(&c, q, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(s.error_message().find("unknown model 'other'"), std::string::npos)
        << s.error_message();
  }
  {
    grpc::ClientContext c;
    inference::ServerMetadataResponse r;
    ASSERT_TRUE(stub_->ServerMetadata(&c, {}, &r).ok());
    EXPECT_EQ(r.name(), "glmserve");
    EXPECT_EQ(r.version(), ServerVersion());
  }
  {
    grpc::ClientContext c;
    inference::ModelMetadataRequest q;
    q.set_name("tiny");
    inference::ModelMetadataResponse r;
    ASSERT_TRUE(stub_->ModelMetadata(&c, q, &r).ok());
    EXPECT_EQ(r.name(), "tiny");
    ASSERT_EQ(r.versions_size(), 1);
    EXPECT_EQ(r.versions(0), "1");
    ASSERT_EQ(r.inputs_size(), 2);
    EXPECT_EQ(r.inputs(0).name(), "input_ids");
    EXPECT_EQ(r.inputs(1).name(), "hidden_states");
    EXPECT_EQ(r.inputs(1).shape(1), 64);
    ASSERT_EQ(r.outputs_size(), 2);
    EXPECT_EQ(r.outputs(1).name(), "logits");
    EXPECT_EQ(r.outputs(1).shape(1), 256);
  }
  {
    grpc::ClientContext c;
    inference::ModelMetadataRequest q;
    q.set_name("tiny");
    q.set_version("7");
    inference::ModelMetadataResponse r;
    EXPECT_EQ(stub_->ModelMetadata(&c, q, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(KServeTest, ModelInferEqualsTheNativeForwardBitForBit) {
  const std::vector<int32_t> ids = {5, 17, 200, 3, 99, 42, 7};
  v1::ForwardRequest native;
  native.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  native.set_return_logits(true);
  native.set_return_hidden_states(true);
  absl::StatusOr<v1::ForwardResponse> ref = Connect(*server_)->Forward(native);
  ASSERT_TRUE(ref.ok()) << ref.status();

  ModelInferRequest request = IdsRequest(ids);
  request.set_id("req-1");
  request.add_outputs()->set_name("logits");
  request.add_outputs()->set_name("hidden_states");
  ModelInferResponse response;
  grpc::Status s = Infer(request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.model_name(), "tiny");
  EXPECT_EQ(response.id(), "req-1");
  ASSERT_EQ(response.outputs_size(), 2);
  ASSERT_EQ(response.raw_output_contents_size(), 2);
  EXPECT_EQ(response.outputs(0).name(), "logits");
  EXPECT_EQ(response.outputs(0).datatype(), "FP32");
  EXPECT_EQ(
      std::vector<int64_t>(response.outputs(0).shape().begin(), response.outputs(0).shape().end()),
      (std::vector<int64_t>{1, 7, 256}));
  EXPECT_EQ(response.raw_output_contents(0), ref->logits().raw_data());
  EXPECT_EQ(response.raw_output_contents(1), ref->hidden_states().raw_data());

  // INT64 ids in typed contents, no batch dimension, last position only, BF16 out, and no
  // output named: logits by default (the span ends at the last layer).
  ModelInferRequest typed;
  typed.set_model_name("tiny");
  typed.set_model_version("1");
  auto* in = typed.add_inputs();
  in->set_name("input_ids");
  in->set_datatype("INT64");
  in->add_shape(7);
  for (int32_t id : ids) in->mutable_contents()->add_int64_contents(id);
  (*typed.mutable_parameters())["last_position_only"].set_bool_param(true);
  (*typed.mutable_parameters())["output_datatype"].set_string_param("BF16");
  s = Infer(typed, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "logits");
  EXPECT_EQ(response.outputs(0).datatype(), "BF16");
  EXPECT_EQ(response.outputs(0).shape_size(), 2);
  ASSERT_EQ(response.raw_output_contents(0).size(), 256u * 2);
  const std::vector<float> ref_logits = FloatsOf(ref->logits().raw_data());
  const auto* bf16 = reinterpret_cast<const uint16_t*>(response.raw_output_contents(0).data());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(bf16[i], FloatToBf16(ref_logits[6 * 256 + i])) << i;
}

TEST_F(KServeTest, HiddenStatesThroughTwoSpansEqualTheWholeModel) {
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  ModelInferRequest first = IdsRequest(ids);
  (*first.mutable_parameters())["layer_end"].set_int64_param(2);
  ModelInferResponse a;
  grpc::Status s = Infer(first, &a);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(a.outputs(0).name(), "hidden_states");  // the default before the last layer

  ModelInferRequest second;
  second.set_model_name("tiny");
  auto* in = second.add_inputs();
  in->set_name("hidden_states");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(5);
  in->add_shape(64);
  second.add_raw_input_contents(a.raw_output_contents(0));
  (*second.mutable_parameters())["layer_begin"].set_int64_param(2);
  ModelInferResponse b;
  s = Infer(second, &b);
  ASSERT_TRUE(s.ok()) << s.error_message();

  ModelInferResponse whole;
  ASSERT_TRUE(Infer(IdsRequest(ids), &whole).ok());
  EXPECT_EQ(b.raw_output_contents(0), whole.raw_output_contents(0));
}

TEST_F(KServeTest, SessionsContinueTheSequence) {
  // [1..5] in one call equals [1, 2, 3] then [4, 5] on a session (positions continue).
  ModelInferResponse whole;
  ASSERT_TRUE(Infer(IdsRequest({1, 2, 3, 4, 5}), &whole).ok());
  ModelInferRequest first = IdsRequest({1, 2, 3});
  (*first.mutable_parameters())["session_id"].set_string_param("s1");
  (*first.mutable_parameters())["create_session"].set_bool_param(true);
  ModelInferResponse a;
  grpc::Status s = Infer(first, &a);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(a.parameters().at("start_position").int64_param(), 0);
  ModelInferRequest second = IdsRequest({4, 5});
  (*second.mutable_parameters())["session_id"].set_string_param("s1");
  ModelInferResponse b;
  s = Infer(second, &b);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(b.parameters().at("start_position").int64_param(), 3);
  EXPECT_EQ(b.raw_output_contents(0), whole.raw_output_contents(0).substr(3 * 256 * 4));
  // An unknown session is NOT_FOUND, never a silent restart at position 0.
  (*second.mutable_parameters())["session_id"].set_string_param("nope");
  EXPECT_EQ(Infer(second, &b).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Connect(*server_)->CloseSession("s1").ok());
}

TEST_F(KServeTest, EveryBadRequestGetsItsStatusAndChangesNothing) {
  const int64_t steps = server_->engine()->Stats().steps;
  struct Case {
    const char* what;
    std::function<void(ModelInferRequest*)> edit;
    grpc::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"unknown model", [](ModelInferRequest* r) { r->set_model_name("gpt"); },
       grpc::StatusCode::NOT_FOUND, "unknown model 'gpt'"},
      {"unknown version", [](ModelInferRequest* r) { r->set_model_version("2"); },
       grpc::StatusCode::NOT_FOUND, "no version '2'"},
      {"no input",
       [](ModelInferRequest* r) {
         r->clear_inputs();
         r->clear_raw_input_contents();
       },
       grpc::StatusCode::INVALID_ARGUMENT, "exactly one input"},
      {"unknown input", [](ModelInferRequest* r) { r->mutable_inputs(0)->set_name("x"); },
       grpc::StatusCode::INVALID_ARGUMENT, "unknown input 'x'"},
      {"datatype", [](ModelInferRequest* r) { r->mutable_inputs(0)->set_datatype("FP32"); },
       grpc::StatusCode::INVALID_ARGUMENT, "must be INT32 or INT64"},
      {"rank", [](ModelInferRequest* r) { r->mutable_inputs(0)->add_shape(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "must be [n] or [1, n]"},
      {"batch", [](ModelInferRequest* r) { r->mutable_inputs(0)->set_shape(0, 2); },
       grpc::StatusCode::INVALID_ARGUMENT, "batch size 2"},
      {"byte count", [](ModelInferRequest* r) { r->mutable_raw_input_contents(0)->pop_back(); },
       grpc::StatusCode::INVALID_ARGUMENT, "has 11 bytes"},
      {"too many positions",
       [](ModelInferRequest* r) { r->mutable_inputs(0)->set_shape(1, int64_t{1} << 40); },
       grpc::StatusCode::INVALID_ARGUMENT, "the limit is 1024"},
      {"both contents",
       [](ModelInferRequest* r) { r->mutable_inputs(0)->mutable_contents()->add_int_contents(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "not both"},
      {"out of vocabulary",
       [](ModelInferRequest* r) {
         *r = IdsRequest({1, 999, 2});
       },
       grpc::StatusCode::INVALID_ARGUMENT, "999"},
      {"unknown parameter",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["tempreature"].set_int64_param(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "unknown parameter 'tempreature'"},
      {"parameter type",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["layer_end"].set_string_param("2"); },
       grpc::StatusCode::INVALID_ARGUMENT, "'layer_end' must be a int64"},
      {"unknown output", [](ModelInferRequest* r) { r->add_outputs()->set_name("probs"); },
       grpc::StatusCode::INVALID_ARGUMENT, "unknown output 'probs'"},
      {"logits before the last layer",
       [](ModelInferRequest* r) {
         (*r->mutable_parameters())["layer_end"].set_int64_param(1);
         r->add_outputs()->set_name("logits");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "logits"},
  };
  for (const Case& c : cases) {
    ModelInferRequest request = IdsRequest({1, 2, 3});
    c.edit(&request);
    ModelInferResponse response;
    const grpc::Status s = Infer(request, &response);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos)
        << c.what << ": " << s.error_message();
  }
  EXPECT_EQ(server_->engine()->Stats().steps, steps);  // nothing reached the engine
  // A call is counted in OnDone, just after its client has the answer.
  ASSERT_TRUE(WaitUntil([&] { return server_->service().calls_in_flight() == 0; }));
  EXPECT_NE(server_->metrics().Scrape().find("glmserve_requests_total{api=\"kserve\",code="
                                             "\"INVALID_ARGUMENT\",rpc=\"ModelInfer\"} 13"),
            std::string::npos);
}

TEST_F(KServeTest, MetricsCountKServeCallsWithTheirApiLabel) {
  ModelInferResponse response;
  ASSERT_TRUE(Infer(IdsRequest({1, 2, 3}), &response).ok());
  ASSERT_TRUE(WaitUntil([&] { return server_->service().calls_in_flight() == 0; }));
  const std::string page = server_->metrics().Scrape();
  EXPECT_NE(page.find("glmserve_requests_total{api=\"kserve\",code=\"OK\",rpc=\"ModelInfer\"} 1"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("glmserve_queue_duration_seconds_count{rpc=\"ModelInfer\"} 1"),
            std::string::npos);
  EXPECT_NE(page.find("glmserve_request_success_total{finished_reason=\"forward\"} 1"),
            std::string::npos);
}

TEST(KServeAuthTest, InferNeedsTheBearerTokenProbesDoNot) {
  const std::string path = ::testing::TempDir() + "/kserve_tokens";
  std::ofstream(path) << "sesame\n";
  ServerOptions options = TinyOptions();
  options.auth_token_file = path;
  std::unique_ptr<GlmServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server->target(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext c;
    inference::ServerReadyResponse r;
    ASSERT_TRUE(stub->ServerReady(&c, {}, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  const int64_t steps = server->engine()->Stats().steps;
  for (const char* token : {"", "wrong"}) {
    grpc::ClientContext c;
    if (*token) c.AddMetadata("authorization", std::string("Bearer ") + token);
    ModelInferResponse r;
    EXPECT_EQ(stub->ModelInfer(&c, IdsRequest({1, 2}), &r).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext m;
    if (*token) m.AddMetadata("authorization", std::string("Bearer ") + token);
    inference::ModelMetadataRequest q;
    q.set_name("tiny");
    inference::ModelMetadataResponse mr;
    EXPECT_EQ(stub->ModelMetadata(&m, q, &mr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(server->engine()->Stats().steps, steps);
  grpc::ClientContext c;
  c.AddMetadata("authorization", "Bearer sesame");
  ModelInferResponse r;
  EXPECT_TRUE(stub->ModelInfer(&c, IdsRequest({1, 2}), &r).ok());
}

TEST(KServeDrainTest, NotReadyWhileLoading) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  ASSERT_NE(server, nullptr);
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(stub->ServerLive(&c1, {}, &live).ok());
  EXPECT_TRUE(live.live());
  grpc::ClientContext c2;
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub->ServerReady(&c2, {}, &ready).ok());
  EXPECT_FALSE(ready.ready());
  grpc::ClientContext c3;
  ModelInferResponse r;
  EXPECT_EQ(stub->ModelInfer(&c3, IdsRequest({1}), &r).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace glmserve
