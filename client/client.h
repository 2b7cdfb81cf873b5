// glmserve::Client: a thin C++ client of glmserve.v1.GlmService.
//
//   glmserve::ClientOptions options;
//   options.target = "dns:///glm-server.default.svc.cluster.local:50051";
//   auto client = glmserve::Client::Create(options);
//   glmserve::v1::GenerateRequest request;
//   request.add_prompt_token_ids(151331);
//   absl::StatusOr<glmserve::v1::Finished> done = (*client)->Generate(
//       request, [](const glmserve::v1::GeneratedToken& t) { printf("%d ", t.token_id()); });
//
// Requests and responses are the wire messages themselves (glmserve/v1/glmserve.pb.h);
// tensors convert with EncodeTensor / DecodeTensor (proto/tensor_codec.h). Errors are
// absl::Status with the server's gRPC code and message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "glmserve/v1/glmserve.grpc.pb.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "proto/tensor_codec.h"

namespace glmserve {

struct ClientOptions {
  // gRPC target: "host:port" (resolved by DNS: every address of the name is used),
  // "dns:///name:port", "ipv4:127.0.0.1:1,127.0.0.1:2", "unix:/path".
  std::string target = "127.0.0.1:50051";
  // Spread calls over every address the target resolves to (a Kubernetes headless Service
  // lists one per pod; without this, gRPC keeps one connection to the first).
  bool round_robin = true;

  bool tls = false;
  std::string ca_cert_file;      // PEM roots that sign the server's certificate; empty: system
  std::string client_cert_file;  // PEM certificate for mutual TLS
  std::string client_key_file;   // its private key
  std::string tls_server_name;   // name to check in the server certificate; empty: the target's

  // Sent as "authorization: Bearer <token>" on every call except health; empty: none.
  std::string token;

  // Deadline of each call, retries included; InfiniteDuration(): none.
  absl::Duration timeout = absl::Seconds(60);
  // Calls ending with UNAVAILABLE (server starting, draining or unreachable) are retried with
  // exponential backoff and jitter, up to this many attempts in all. Other codes are never
  // retried, and a Generate stream only before its first token (never duplicated).
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);

  int64_t max_message_bytes = 64 << 20;
};

// The serving status of a grpc.health.v1 service name ("liveness", "readiness", "").
using HealthStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

// A Generate call read as an iterator: Next() until false, then Finish().
class GenerateStream {
 public:
  ~GenerateStream();  // cancels the call if it is still running
  // The next generated token (waits for the next chunk when needed); false at the end.
  bool Next(v1::GeneratedToken* token);
  // How the call ended: the final `finished` message, or the error.
  absl::StatusOr<v1::Finished> Finish();
  // Cancels the call (the server frees its KV cache at once); Next() then returns false.
  void Cancel();

 private:
  friend class Client;
  GenerateStream() = default;

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  v1::GenerateResponse chunk_;
  int next_ = 0;
  bool done_ = false;
  std::optional<absl::Status> status_;
  v1::Finished finished_;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);

  absl::StatusOr<v1::ModelInfo> Info();
  absl::StatusOr<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  // Calls `on_token` for every token as its chunk arrives; returns the final message.
  absl::StatusOr<v1::Finished> Generate(
      const v1::GenerateRequest& request,
      const std::function<void(const v1::GeneratedToken&)>& on_token);
  // Calls `on_chunk` with every response message as it arrives: its tokens and, for text
  // requests, its text / reasoning / content / tool-call deltas. Returns the final message.
  absl::StatusOr<v1::Finished> GenerateChunks(
      const v1::GenerateRequest& request,
      const std::function<void(const v1::GenerateResponse&)>& on_chunk);
  absl::StatusOr<v1::TokenizeResponse> Tokenize(const v1::TokenizeRequest& request);
  absl::StatusOr<v1::DetokenizeResponse> Detokenize(const v1::DetokenizeRequest& request);
  // The iterator form (no retries: the caller sees the stream as it happens).
  std::unique_ptr<GenerateStream> StartGenerate(const v1::GenerateRequest& request);
  absl::Status CloseSession(const std::string& session_id);
  // grpc.health.v1 Check of one service name; not retried, no token sent.
  absl::StatusOr<HealthStatus> Health(const std::string& service);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const ClientOptions& options() const { return options_; }

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  // A context with the call's deadline and the token.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline, bool auth) const;
  absl::Time Deadline() const;
  // Runs `attempt` until it returns anything but UNAVAILABLE, attempts run out, the
  // deadline would pass during the next backoff, or *no_retry is set.
  absl::Status WithRetries(absl::Time deadline,
                           const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
                           const bool* no_retry = nullptr);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GlmService::Stub> stub_;
};

// gRPC status -> absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace glmserve
