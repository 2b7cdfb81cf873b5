// Server reflection as a client that knows nothing but reflection sees it: both protocol
// versions (grpc.reflection.v1 and v1alpha) list the same services, every listed service can
// be described, and grpc.health.v1.Health, resolved from reflection alone, answers a call
// built from the returned descriptors.
#include "server/reflection.h"

#include <gtest/gtest.h>

#include <future>

#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_callback.h"
#include "grpcpp/support/byte_buffer.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

namespace rv1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptorProto;

// One reflection stream on `method` (v1 or v1alpha: the messages are wire-identical).
class ReflectionClient {
 public:
  ReflectionClient(std::shared_ptr<grpc::Channel> channel, const std::string& version)
      : path_(absl::StrCat("/grpc.reflection.", version, ".ServerReflection/ServerReflectionInfo")),
        method_(path_.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING),
        channel_(std::move(channel)) {
    stream_.reset(
        grpc::internal::ClientReaderWriterFactory<
            rv1::ServerReflectionRequest, rv1::ServerReflectionResponse>::Create(channel_.get(),
                                                                                 method_,
                                                                                 &context_));
  }
  ~ReflectionClient() {
    stream_->WritesDone();
    rv1::ServerReflectionResponse ignored;
    while (stream_->Read(&ignored)) {
    }
    EXPECT_TRUE(stream_->Finish().ok());
  }

  rv1::ServerReflectionResponse Ask(const rv1::ServerReflectionRequest& request) {
    rv1::ServerReflectionResponse response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    return response;
  }

  std::vector<std::string> ListServices() {
    rv1::ServerReflectionRequest request;
    request.set_list_services("");
    std::vector<std::string> names;
    const rv1::ServerReflectionResponse response = Ask(request);
    for (const auto& s : response.list_services_response().service()) {
      names.push_back(s.name());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Adds the files describing `symbol` to `pool` (dependencies first, as a pool needs them).
  bool Resolve(const std::string& symbol, DescriptorPool* pool) {
    rv1::ServerReflectionRequest request;
    request.set_file_containing_symbol(symbol);
    const rv1::ServerReflectionResponse response = Ask(request);
    if (!response.has_file_descriptor_response()) return false;
    std::vector<FileDescriptorProto> files;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      files.emplace_back();
      if (!files.back().ParseFromString(bytes)) return false;
    }
    // Files come requested-first: build in reverse so imports exist before their users.
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
      if (pool->FindFileByName(it->name()) == nullptr && pool->BuildFile(*it) == nullptr) {
        return false;
      }
    }
    return pool->FindServiceByName(symbol) != nullptr ||
           pool->FindMessageTypeByName(symbol) != nullptr;
  }

 private:
  const std::string path_;  // RpcMethod keeps a pointer to it
  grpc::internal::RpcMethod method_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<rv1::ServerReflectionRequest, rv1::ServerReflectionResponse>>
      stream_;
};

// A unary call of `method` with a message serialized by the caller, through the generic stub.
grpc::Status CallRaw(grpc::Channel* channel, const std::string& method, const std::string& request,
                     std::string* response) {
  grpc::GenericStub stub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext context;
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &in, &out,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  std::vector<grpc::Slice> slices;
  if (status.ok() && out.Dump(&slices).ok()) {
    response->clear();
    for (const grpc::Slice& s : slices) {
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

const std::vector<std::string> kExpectedServices = {
    "glmserve.v1.GlmService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection", "inference.GRPCInferenceService"};

class ReflectionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReflectionTest, ListsOnlyWhatItCanDescribeAndResolvesHealth) {
  std::unique_ptr<GlmServer> server = testing::StartServer();
  auto channel = grpc::CreateChannel(server->target(), grpc::InsecureChannelCredentials());
  ReflectionClient reflection(channel, GetParam());
  const std::vector<std::string> services = reflection.ListServices();
  EXPECT_EQ(services, kExpectedServices);
  DescriptorPool pool;
  for (const std::string& name : services) {
    EXPECT_TRUE(reflection.Resolve(name, &pool)) << name << " is listed but not described";
  }

  // Health, from the reflected descriptors only: a dynamic request, a generic call.
  const google::protobuf::ServiceDescriptor* health =
      pool.FindServiceByName("grpc.health.v1.Health");
  ASSERT_NE(health, nullptr);
  const google::protobuf::MethodDescriptor* check = health->FindMethodByName("Check");
  ASSERT_NE(check, nullptr);
  google::protobuf::DynamicMessageFactory factory(&pool);
  std::unique_ptr<google::protobuf::Message> request(
      factory.GetPrototype(check->input_type())->New());
  request->GetReflection()->SetString(request.get(),
                                      check->input_type()->FindFieldByName("service"), "readiness");
  std::string bytes;
  ASSERT_TRUE(request->SerializeToString(&bytes));
  std::string answer;
  const grpc::Status status =
      CallRaw(channel.get(), "/grpc.health.v1.Health/Check", bytes, &answer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::unique_ptr<google::protobuf::Message> response(
      factory.GetPrototype(check->output_type())->New());
  ASSERT_TRUE(response->ParseFromString(answer));
  const google::protobuf::FieldDescriptor* field = check->output_type()->FindFieldByName("status");
  EXPECT_EQ(response->GetReflection()->GetEnum(*response, field)->name(), "SERVING");

  // The GlmService's methods resolve too, with their request types.
  const google::protobuf::ServiceDescriptor* glm = pool.FindServiceByName("glmserve.v1.GlmService");
  ASSERT_NE(glm, nullptr);
  ASSERT_NE(glm->FindMethodByName("Generate"), nullptr);
  EXPECT_EQ(glm->FindMethodByName("Generate")->input_type()->full_name(),
            "glmserve.v1.GenerateRequest");
}

TEST_P(ReflectionTest, UnknownNamesAreNotFound) {
  std::unique_ptr<GlmServer> server = testing::StartServer();
  ReflectionClient reflection(
      grpc::CreateChannel(server->target(), grpc::InsecureChannelCredentials()), GetParam());
  rv1::ServerReflectionRequest request;
  request.set_file_containing_symbol("no.such.Symbol");
  rv1::ServerReflectionResponse response = reflection.Ask(request);
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  request.set_file_by_filename("grpc/health/v1/health.proto");
  response = reflection.Ask(request);
  ASSERT_TRUE(response.has_file_descriptor_response());
  FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.package(), "grpc.health.v1");
}

// The glm-server binary itself: unlike this test binary, which links the health messages
// through the client library, it has only what server/ pulls in.
TEST_P(ReflectionTest, TheGlmServerBinaryDescribesHealth) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> child = testing::StartServerProcess({}, &target);
  {
    ReflectionClient reflection(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()),
                                GetParam());
    EXPECT_EQ(reflection.ListServices(), kExpectedServices);
    DescriptorPool pool;
    EXPECT_TRUE(reflection.Resolve("grpc.health.v1.Health", &pool));
    EXPECT_TRUE(reflection.Resolve("glmserve.v1.GlmService", &pool));
  }
  child->Signal(SIGTERM);
  EXPECT_EQ(child->Wait(absl::Seconds(30)), 0);
}

INSTANTIATE_TEST_SUITE_P(Versions, ReflectionTest, ::testing::Values("v1", "v1alpha"));

TEST(ReflectionV1Test, ExtensionsAndEmptyRequests) {
  ReflectionV1Service service({"glmserve.v1.GlmService", "not.linked.Service"});
  rv1::ServerReflectionRequest request;
  request.set_list_services("*");
  rv1::ServerReflectionResponse response = service.Answer(request);
  ASSERT_EQ(response.list_services_response().service_size(), 1);  // only what it can describe
  EXPECT_EQ(response.list_services_response().service(0).name(), "glmserve.v1.GlmService");
  request.set_all_extension_numbers_of_type("glmserve.v1.GenerateRequest");
  response = service.Answer(request);
  EXPECT_EQ(response.all_extension_numbers_response().base_type_name(),
            "glmserve.v1.GenerateRequest");
  EXPECT_EQ(response.all_extension_numbers_response().extension_number_size(), 0);
  request.mutable_file_containing_extension()->set_containing_type("glmserve.v1.Tensor");
  request.mutable_file_containing_extension()->set_extension_number(99);
  EXPECT_EQ(service.Answer(request).error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(service.Answer(rv1::ServerReflectionRequest()).error_response().error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace glmserve
