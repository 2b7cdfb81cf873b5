// grpc.health.v1 liveness/readiness through the server's lifecycle (loading, ready,
// draining), and server reflection, with stock protocol messages.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using grpc::health::v1::HealthCheckResponse;
using testing::Connect;
using testing::GreedyRequest;
using testing::StartServer;
using testing::TinyOptions;
using testing::WaitUntil;

TEST(HealthTest, NotServingBeforeTheModelIsReadyThenServing) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  ClientOptions options;
  options.max_attempts = 1;
  std::unique_ptr<Client> client = Connect(*server, options);
  EXPECT_EQ(*client->Health(kLivenessService), HealthCheckResponse::SERVING);
  EXPECT_EQ(*client->Health(kReadinessService), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(*client->Health(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(client->Health("no.such.Service").status().code(), absl::StatusCode::kNotFound);
  // Calls are refused while loading.
  EXPECT_EQ(client->Generate(GreedyRequest({1, 2}, 2), nullptr).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->Info().status().code(), absl::StatusCode::kUnavailable);

  glmserve::DType dtype;
  std::unique_ptr<glmserve::ModelRunner> runner = testing::TinyRunner(&dtype);
  ASSERT_TRUE(server->Serve(std::move(runner), dtype).ok());
  EXPECT_EQ(*client->Health(kReadinessService), HealthCheckResponse::SERVING);
  EXPECT_EQ(*client->Health(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(*client->Health("glmserve.v1.GlmService"), HealthCheckResponse::SERVING);
  EXPECT_TRUE(client->Generate(GreedyRequest({1, 2}, 2), nullptr).ok());
}

TEST(HealthTest, DrainingIsNotServingRefusesNewCallsAndFinishesCallsInFlight) {
  std::unique_ptr<GlmServer> server = StartServer();
  ClientOptions options;
  options.max_attempts = 1;
  std::unique_ptr<Client> client = Connect(*server, options);
  const std::vector<int32_t> prompt = {7, 8, 9};
  std::unique_ptr<GenerateStream> stream = client->StartGenerate(GreedyRequest(prompt, 400));
  v1::GeneratedToken t;
  ASSERT_TRUE(stream->Next(&t));
  int tokens = 1;

  std::thread drain([&] { server->Drain(absl::Seconds(30)); });
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<HealthStatus> s = client->Health(kReadinessService);
    return s.ok() && *s == HealthCheckResponse::NOT_SERVING;
  }));
  EXPECT_EQ(*client->Health(kLivenessService), HealthCheckResponse::SERVING);
  absl::StatusOr<v1::Finished> refused = client->Generate(GreedyRequest({1}, 2), nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();

  while (stream->Next(&t)) ++tokens;
  absl::StatusOr<v1::Finished> finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(tokens, 400);
  drain.join();
}

// ---- Reflection, spoken with the stock v1alpha messages
// ------------------------------------------

// The reflection messages come from gRPC's own library (linked by the server), so they are
// used through their descriptors rather than generated headers Debian does not ship.
class ReflectionClient {
 public:
  explicit ReflectionClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)),
        pool_(google::protobuf::DescriptorPool::generated_pool()),
        request_type_(
            pool_->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionRequest")),
        response_type_(
            pool_->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionResponse")) {}

  bool available() const { return request_type_ != nullptr && response_type_ != nullptr; }

  // One request with `field` set to `value`; the response message (or nullptr).
  std::unique_ptr<google::protobuf::Message> Ask(const std::string& field,
                                                 const std::string& value) {
    std::unique_ptr<google::protobuf::Message> request(factory_.GetPrototype(request_type_)->New());
    request->GetReflection()->SetString(request.get(), request_type_->FindFieldByName(field),
                                        value);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::internal::RpcMethod method(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel_.get(), method, &context));
    const std::string bytes = request->SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer out(&slice, 1);
    if (!stream->Write(out)) return nullptr;
    stream->WritesDone();
    grpc::ByteBuffer in;
    std::unique_ptr<google::protobuf::Message> response(
        factory_.GetPrototype(response_type_)->New());
    if (!stream->Read(&in)) return nullptr;
    std::vector<grpc::Slice> slices;
    in.Dump(&slices).IgnoreError();
    std::string data;
    for (const grpc::Slice& s : slices)
      data.append(reinterpret_cast<const char*>(s.begin()), s.size());
    if (!response->ParseFromString(data)) return nullptr;
    while (stream->Read(&in)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
    return response;
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const google::protobuf::DescriptorPool* pool_;
  const google::protobuf::Descriptor* request_type_;
  const google::protobuf::Descriptor* response_type_;
  google::protobuf::DynamicMessageFactory factory_;
};

TEST(ReflectionTest, ListsTheServicesAndDescribesThem) {
  std::unique_ptr<GlmServer> server = StartServer();
  std::unique_ptr<Client> client = Connect(*server);
  ReflectionClient reflection(client->channel());
  ASSERT_TRUE(reflection.available());

  std::unique_ptr<google::protobuf::Message> r = reflection.Ask("list_services", "");
  ASSERT_NE(r, nullptr);
  const google::protobuf::Reflection* refl = r->GetReflection();
  const google::protobuf::Message& list =
      refl->GetMessage(*r, r->GetDescriptor()->FindFieldByName("list_services_response"));
  const google::protobuf::FieldDescriptor* services =
      list.GetDescriptor()->FindFieldByName("service");
  std::set<std::string> names;
  for (int i = 0; i < list.GetReflection()->FieldSize(list, services); ++i) {
    const google::protobuf::Message& s =
        list.GetReflection()->GetRepeatedMessage(list, services, i);
    names.insert(s.GetReflection()->GetString(s, s.GetDescriptor()->FindFieldByName("name")));
  }
  EXPECT_TRUE(names.count("glmserve.v1.GlmService")) << names.size();
  EXPECT_TRUE(names.count("grpc.health.v1.Health"));
  EXPECT_TRUE(names.count("grpc.reflection.v1alpha.ServerReflection"));

  // The schema of our service is served too (what grpcurl needs to call it).
  r = reflection.Ask("file_containing_symbol", "glmserve.v1.GlmService");
  ASSERT_NE(r, nullptr);
  const google::protobuf::Message& files = r->GetReflection()->GetMessage(
      *r, r->GetDescriptor()->FindFieldByName("file_descriptor_response"));
  const google::protobuf::FieldDescriptor* protos =
      files.GetDescriptor()->FindFieldByName("file_descriptor_proto");
  ASSERT_GE(files.GetReflection()->FieldSize(files, protos), 1);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(files.GetReflection()->GetRepeatedString(files, protos, 0)));
  EXPECT_EQ(file.package(), "glmserve.v1");
}

}  // namespace
}  // namespace glmserve
