// The raw methods end to end (server/raw_call.h, server/service.h): a client sending hand-
// encoded requests (as a client built from any schema may) through gRPC's generic stub to the
// real server. Invalid UTF-8 in any text field of Generate, Tokenize and CloseSession is
// INVALID_ARGUMENT naming the field before any engine work; valid text, 4-byte UTF-8
// included, is served; broken wire data and oversized messages are refused cleanly; and the
// admission checks, metrics and status mapping apply to the raw methods as to the typed ones.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/scrape.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "inference/grpc_service.pb.h"
#include "tests/server/test_server.h"
#include "tests/server/wire_encode.h"

namespace glmserve {
namespace {

using testing::kBadUtf8;
using testing::StartTextServer;
using testing::TinyOptions;
using testing::WaitUntil;
using testing::WireInt;
using testing::WireLen;

// Everything one call returned: its status and each reply message's bytes.
struct RawResult {
  grpc::Status status;
  std::vector<std::string> replies;
};

// One call of `method` ("/glmserve.v1.GlmService/Generate") with `request` as its message,
// streaming or unary alike (the wire is the same), over gRPC's generic (ByteBuffer) stub.
RawResult RawCall(const std::string& target, const std::string& method, const std::string& request,
                  const std::string& bearer = "") {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!bearer.empty()) context.AddMetadata("authorization", "Bearer " + bearer);
  grpc::CompletionQueue cq;
  RawResult out;
  void* tag;
  bool ok;
  const auto next = [&] {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  call->StartCall(nullptr);
  if (next()) {
    grpc::Slice slice(request);
    grpc::ByteBuffer buffer(&slice, 1);
    call->WriteLast(buffer, grpc::WriteOptions(), nullptr);
    next();  // a failed write still ends with Finish's status
    for (;;) {
      grpc::ByteBuffer reply;
      call->Read(&reply, nullptr);
      if (!next()) break;
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(reply.Dump(&slices).ok());
      std::string bytes;
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      out.replies.push_back(std::move(bytes));
    }
  }
  call->Finish(&out.status, nullptr);
  next();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return out;
}

constexpr char kGenerate[] = "/glmserve.v1.GlmService/Generate";
constexpr char kForward[] = "/glmserve.v1.GlmService/Forward";
constexpr char kTokenize[] = "/glmserve.v1.GlmService/Tokenize";
constexpr char kCloseSession[] = "/glmserve.v1.GlmService/CloseSession";

// A text Generate request: prompt_text (6), 4 tokens (stop 3: max_new_tokens 1, ignore_eos 3).
std::string TextGenerate(const std::string& prompt) {
  return WireLen(6, prompt) + WireLen(3, WireInt(1, 4) + WireInt(3, 1));
}

std::string Chat(const std::string& role, const std::string& content) {
  return WireLen(7, WireLen(1, role) + WireLen(2, content));
}

class RawCallTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = TinyOptions()) {
    options.metrics_port = 0;
    server_ = StartTextServer(options);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_ == nullptr) return;
    EXPECT_TRUE(WaitUntil([&] { return testing::EngineDrained(server_->engine()); }));
    EXPECT_EQ(server_->engine()->Stats().invariant_error, "");
  }
  RawResult Call(const char* method, const std::string& request, const std::string& bearer = "") {
    return RawCall(server_->target(), method, request, bearer);
  }
  double Requests(const std::string& labels) {
    absl::StatusOr<std::string> page =
        HttpGet(absl::StrCat("127.0.0.1:", server_->metrics_port()), "/metrics");
    EXPECT_TRUE(page.ok()) << page.status();
    absl::StatusOr<double> v =
        page.ok() ? SampleValue(*page, "glmserve_requests_total", labels) : page.status();
    return v.ok() ? *v : 0;  // absent: never counted
  }

  std::unique_ptr<GlmServer> server_;
};

TEST_F(RawCallTest, InvalidUtf8InEveryTextFieldIsInvalidArgumentNamingIt) {
  Start();
  const struct {
    const char* method;
    std::string request;
    const char* field;
  } cases[] = {
      {kGenerate, TextGenerate(kBadUtf8), "prompt_text is not valid UTF-8"},
      {kGenerate, WireLen(5, kBadUtf8) + TextGenerate("hi"), "request_id is not valid UTF-8"},
      {kGenerate, Chat("user", "hi") + Chat("assistant", kBadUtf8), "messages[1].content is not"},
      {kGenerate, Chat(kBadUtf8, "hi"), "messages[0].role is not"},
      {kGenerate, Chat("user", "hi") + WireLen(7, WireLen(1, "assistant") + WireLen(3, kBadUtf8)),
       "messages[1].reasoning_content is not"},
      {kGenerate, WireLen(7, WireLen(1, "assistant") + WireLen(4, WireLen(1, kBadUtf8))),
       "messages[0].tool_calls[0].name is not"},
      {kGenerate,
       WireLen(7, WireLen(1, "assistant") + WireLen(4, WireLen(1, "f") + WireLen(2, kBadUtf8))),
       "messages[0].tool_calls[0].arguments_json is not"},
      {kGenerate, TextGenerate("hi") + WireLen(3, WireLen(4, "ok") + WireLen(4, kBadUtf8)),
       "stop.stop_strings[1] is not"},
      {kGenerate, Chat("user", "hi") + WireLen(8, kBadUtf8), "tools_json[0] is not"},
      {kGenerate, Chat("user", "hi") + WireLen(13, kBadUtf8), "tool_choice is not"},
      {kGenerate, Chat("user", "hi") + WireLen(14, kBadUtf8), "tool_choice_function is not"},
      {kForward, WireLen(1, WireInt(1, 3)) + WireLen(10, kBadUtf8), "request_id is not valid"},
      {kForward, WireLen(1, WireInt(1, 3)) + WireLen(5, kBadUtf8), "session_id is not valid"},
      {kTokenize, WireLen(1, kBadUtf8), "text is not valid UTF-8"},
      {kTokenize, WireLen(2, WireLen(1, "user") + WireLen(2, kBadUtf8)),
       "messages[0].content is not"},
      {kTokenize, WireLen(2, WireLen(1, "user")) + WireLen(3, "{}") + WireLen(3, kBadUtf8),
       "tools_json[1] is not"},
      {kCloseSession, WireLen(1, kBadUtf8), "session_id is not valid UTF-8"},
  };
  const int64_t steps = server_->engine()->Stats().steps;
  for (const auto& c : cases) {
    const RawResult r = Call(c.method, c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.field), std::string::npos)
        << r.status.error_message();
    EXPECT_TRUE(r.replies.empty()) << c.field;
  }
  EXPECT_EQ(server_->engine()->Stats().steps, steps);  // no engine work for any of them
  // Counted like any refused call.
  EXPECT_EQ(Requests(R"({api="glmserve",code="INVALID_ARGUMENT",rpc="Generate"})"), 11);
  EXPECT_EQ(Requests(R"({api="glmserve",code="INVALID_ARGUMENT",rpc="Forward"})"), 2);
  EXPECT_EQ(Requests(R"({api="glmserve",code="INVALID_ARGUMENT",rpc="Tokenize"})"), 3);
  EXPECT_EQ(Requests(R"({api="glmserve",code="INVALID_ARGUMENT",rpc="CloseSession"})"), 1);
}

TEST_F(RawCallTest, ValidTextIncludingFourByteUtf8IsServed) {
  Start();
  const std::string text = "Hi \xF0\x9F\x98\x80 \xF0\x90\x8D\x88 \xE4\xBD\xA0\xE5\xA5\xBD";
  const RawResult g = Call(kGenerate, WireLen(5, "raw-1") + TextGenerate(text));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_FALSE(g.replies.empty());
  int tokens = 0;
  v1::GenerateResponse last;
  for (const std::string& bytes : g.replies) {
    ASSERT_TRUE(last.ParseFromString(bytes));  // each reply is a GenerateResponse
    tokens += last.tokens_size();
  }
  EXPECT_EQ(tokens, 4);
  EXPECT_EQ(last.finished().request_id(), "raw-1");
  EXPECT_EQ(last.finished().generated_tokens(), 4);

  const RawResult t = Call(kTokenize, WireLen(1, text));
  ASSERT_TRUE(t.status.ok()) << t.status.error_message();
  ASSERT_EQ(t.replies.size(), 1u);
  v1::TokenizeResponse tokenized;
  ASSERT_TRUE(tokenized.ParseFromString(t.replies[0]));
  EXPECT_EQ(tokenized.token_ids_size(), last.finished().prompt_tokens());
  EXPECT_GT(tokenized.token_ids_size(), 0);
  // The typed client (string fields) gets the same ids.
  std::unique_ptr<Client> client = testing::Connect(*server_);
  v1::TokenizeRequest typed;
  typed.set_text(text);
  absl::StatusOr<v1::TokenizeResponse> ids = client->Tokenize(typed);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->SerializeAsString(), tokenized.SerializeAsString());

  // Forward with a UTF-8 session id: the reply equals the typed client's for the same input.
  v1::ForwardRequest forward;
  forward.mutable_token_ids()->add_ids(1);
  forward.mutable_token_ids()->add_ids(2);
  forward.set_return_logits(true);
  forward.set_last_position_only(true);
  forward.set_request_id("f\xC3\xA9");
  absl::StatusOr<v1::ForwardResponse> typed_forward = client->Forward(forward);
  ASSERT_TRUE(typed_forward.ok()) << typed_forward.status();
  forward.set_session_id("s\xC3\xA9ssion \xF0\x9F\x98\x80");
  forward.set_create_session(true);
  const RawResult f = Call(kForward, forward.SerializeAsString());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message();
  ASSERT_EQ(f.replies.size(), 1u);
  v1::ForwardResponse raw_forward;
  ASSERT_TRUE(raw_forward.ParseFromString(f.replies[0]));
  EXPECT_EQ(raw_forward.request_id(), "f\xC3\xA9");
  EXPECT_EQ(raw_forward.logits().raw_data(), typed_forward->logits().raw_data());
  EXPECT_GT(raw_forward.logits().raw_data().size(), 0u);
  // CloseSession of it: OK with an empty reply; again: the engine's NOT_FOUND.
  const std::string close = WireLen(1, "s\xC3\xA9ssion \xF0\x9F\x98\x80");
  RawResult c = Call(kCloseSession, close);
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_EQ(c.replies.size(), 1u);
  EXPECT_TRUE(c.replies[0].empty());
  c = Call(kCloseSession, close);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::NOT_FOUND) << c.status.error_message();
}

TEST_F(RawCallTest, MalformedAndOversizedRequestsAreRefusedCleanly) {
  ServerOptions options = TinyOptions();
  options.max_message_bytes = 1 << 20;
  Start(options);
  const int64_t steps = server_->engine()->Stats().steps;
  for (const char* method : {kGenerate, kForward, kTokenize, kCloseSession}) {
    for (const std::string& wire : {std::string("\x80", 1),
                                    std::string("\x32\x05"
                                                "abc",
                                                5),
                                    std::string("\x07", 1), std::string("\x0c", 1)}) {
      const RawResult r = Call(method, wire);
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << ": " << r.status.error_message();
      EXPECT_TRUE(absl::StrContains(r.status.error_message(), "the request is not a valid"))
          << r.status.error_message();
    }
  }
  // Deep nesting (unknown groups) is bounded.
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "\xfb\x05";  // field 95, start group
  RawResult r = Call(kGenerate, deep);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(r.status.error_message(), "nested deeper than 100"))
      << r.status.error_message();
  // Beyond the receive limit: gRPC's own refusal, before any handler.
  r = Call(kTokenize, WireLen(1, std::string(2 << 20, 'a')));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  // A large field within it is walked and refused by the prompt limit, as before.
  r = Call(kTokenize, WireLen(1, std::string(900 << 10, 'a')));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->engine()->Stats().steps, steps);
  // Still serving.
  EXPECT_TRUE(Call(kGenerate, TextGenerate("still fine")).status.ok());
}

TEST_F(RawCallTest, AuthenticationComesBeforeTheRequestIsJudged) {
  const std::string token_file = ::testing::TempDir() + "/raw_call_tokens";
  std::ofstream(token_file) << "raw-token\n";
  ServerOptions options = TinyOptions();
  options.auth_token_file = token_file;
  Start(options);
  // Without a token, a bad request learns nothing about itself.
  RawResult r = Call(kGenerate, TextGenerate(kBadUtf8));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  r = Call(kTokenize, std::string("\x80", 1));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  r = Call(kCloseSession, WireLen(1, "x"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // With it, the same request is judged.
  r = Call(kGenerate, TextGenerate(kBadUtf8), "raw-token");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Call(kGenerate, TextGenerate("ok"), "raw-token").status.ok());
}

TEST_F(RawCallTest, KServeNamesAreCheckedToo) {
  // The KServe service's methods with string fields are raw as well (server/kserve_service.h).
  Start();
  const char* ready = "/inference.GRPCInferenceService/ModelReady";
  const char* metadata = "/inference.GRPCInferenceService/ModelMetadata";
  const char* infer = "/inference.GRPCInferenceService/ModelInfer";
  const struct {
    const char* method;
    std::string request;
    const char* field;
  } cases[] = {
      {ready, WireLen(1, kBadUtf8), "name is not valid UTF-8"},
      {metadata, WireLen(2, kBadUtf8), "version is not valid UTF-8"},
      {infer, WireLen(1, kBadUtf8), "model_name is not valid UTF-8"},
      {infer, WireLen(1, "m") + WireLen(5, WireLen(1, "input_ids") + WireLen(2, kBadUtf8)),
       "inputs[0].datatype is not valid UTF-8"},
      {infer, WireLen(1, "m") + WireLen(6, WireLen(1, "logits")) + WireLen(6, WireLen(1, kBadUtf8)),
       "outputs[1].name is not valid UTF-8"},
      {infer, WireLen(1, "m") + WireLen(4, WireLen(1, "k") + WireLen(2, WireLen(3, kBadUtf8))),
       "parameters[0].value.string_param is not valid UTF-8"},
  };
  for (const auto& c : cases) {
    const RawResult r = Call(c.method, c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.field), std::string::npos)
        << r.status.error_message();
  }
  // The same names, valid: the handlers' own answers (the served model is named "tiny").
  RawResult r = Call(metadata, WireLen(1, "no-such-model"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND) << r.status.error_message();
  r = Call(ready, WireLen(1, "tiny"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.replies.size(), 1u);
  inference::ModelReadyResponse ready_reply;
  ASSERT_TRUE(ready_reply.ParseFromString(r.replies[0]));
  EXPECT_TRUE(ready_reply.ready());
}

TEST_F(RawCallTest, DeadlinesAndDrainingApplyToRawMethods) {
  // (The typed client's tests in service_test.cc and text_test.cc run on the raw Generate too:
  // cancellation, stream limits and deadlines there exercise this path.)
  // The server's deadline cap (the raw client sends a 30 s deadline) ends a long generation.
  ServerOptions options = TinyOptions();
  options.service.max_deadline = absl::Milliseconds(60);
  Start(options);
  const RawResult r =
      Call(kGenerate, WireLen(6, "hello") + WireLen(3, WireInt(1, 1000) + WireInt(3, 1)));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.status.error_message();
  EXPECT_TRUE(WaitUntil([&] { return testing::EngineDrained(server_->engine()); }));
  server_->service().StartDraining();
  for (const char* method : {kGenerate, kForward, kTokenize, kCloseSession}) {
    const RawResult d = Call(method, TextGenerate("x"));
    EXPECT_EQ(d.status.error_code(), grpc::StatusCode::UNAVAILABLE) << d.status.error_message();
  }
}

}  // namespace
}  // namespace glmserve
