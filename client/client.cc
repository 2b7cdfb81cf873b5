#include "client/client.h"

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace glmserve {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(const ClientOptions& o) {
  if (!o.tls) {
    if (!o.client_cert_file.empty() || !o.ca_cert_file.empty()) {
      return absl::InvalidArgumentError("certificates given but TLS is off");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!o.ca_cert_file.empty()) {
    ASSIGN_OR_RETURN(std::string ca, ReadFile(o.ca_cert_file, "TLS CA"));
    ssl.pem_root_certs = ca;
  }
  if (o.client_cert_file.empty() != o.client_key_file.empty()) {
    return absl::InvalidArgumentError("mutual TLS needs both a client certificate and its key");
  }
  if (!o.client_cert_file.empty()) {
    ASSIGN_OR_RETURN(std::string cert, ReadFile(o.client_cert_file, "TLS client certificate"));
    ASSIGN_OR_RETURN(std::string key, ReadFile(o.client_key_file, "TLS client key"));
    ssl.pem_cert_chain = cert;
    ssl.pem_private_key = key;
  }
  return grpc::SslCredentials(ssl);
}

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::chrono::system_clock::time_point::max();
  return absl::ToChronoTime(t);
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  // gRPC and absl share the canonical code numbering.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// ---- GenerateStream --------------------------------------------------------------------------

GenerateStream::~GenerateStream() {
  if (!done_ && context_ != nullptr) {
    context_->TryCancel();
    Finish().IgnoreError();
  }
}

bool GenerateStream::Next(v1::GeneratedToken* token) {
  while (!done_) {
    if (next_ < chunk_.tokens_size()) {
      *token = chunk_.tokens(next_++);
      return true;
    }
    if (chunk_.has_finished()) finished_ = chunk_.finished();
    next_ = 0;
    if (!reader_->Read(&chunk_)) {
      done_ = true;
      status_ = FromGrpcStatus(reader_->Finish());
    }
  }
  return false;
}

absl::StatusOr<v1::Finished> GenerateStream::Finish() {
  v1::GeneratedToken ignored;
  while (Next(&ignored)) {
  }
  if (!status_->ok()) return *status_;
  return finished_;
}

void GenerateStream::Cancel() {
  if (context_ != nullptr) context_->TryCancel();
}

// ---- Client ------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("empty target");
  if (options.max_attempts < 1) return absl::InvalidArgumentError("max_attempts must be >= 1");
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, MakeCredentials(options));
  grpc::ChannelArguments args;
  if (options.round_robin) args.SetLoadBalancingPolicyName("round_robin");
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, credentials, args);
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::GlmService::NewStub(channel_)) {}

absl::Time Client::Deadline() const {
  return options_.timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                      : absl::Now() + options_.timeout;
}

std::unique_ptr<grpc::ClientContext> Client::NewContext(absl::Time deadline, bool auth) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (deadline != absl::InfiniteFuture()) context->set_deadline(ToChrono(deadline));
  if (auth && !options_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  return context;
}

absl::Status Client::WithRetries(absl::Time deadline,
                                 const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
                                 const bool* no_retry) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = options_.initial_backoff;
  for (int i = 1;; ++i) {
    std::unique_ptr<grpc::ClientContext> context = NewContext(deadline, /*auth=*/true);
    grpc::Status status = attempt(context.get());
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || i >= options_.max_attempts ||
        (no_retry != nullptr && *no_retry)) {
      return FromGrpcStatus(status);
    }
    // Full jitter: a fleet of clients retrying a restarted server does not arrive in step.
    const absl::Duration sleep = absl::Nanoseconds(
        std::uniform_int_distribution<int64_t>(0, absl::ToInt64Nanoseconds(backoff))(rng));
    if (absl::Now() + sleep >= deadline) return FromGrpcStatus(status);
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::StatusOr<v1::ModelInfo> Client::Info() {
  v1::ModelInfo info;
  absl::Status s = WithRetries(Deadline(), [&](grpc::ClientContext* context) {
    return stub_->GetModelInfo(context, v1::GetModelInfoRequest(), &info);
  });
  if (!s.ok()) return s;
  return info;
}

absl::StatusOr<v1::ForwardResponse> Client::Forward(const v1::ForwardRequest& request) {
  v1::ForwardResponse response;
  absl::Status s = WithRetries(Deadline(), [&](grpc::ClientContext* context) {
    return stub_->Forward(context, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::Status Client::CloseSession(const std::string& session_id) {
  v1::CloseSessionRequest request;
  request.set_session_id(session_id);
  v1::CloseSessionResponse response;
  return WithRetries(Deadline(), [&](grpc::ClientContext* context) {
    return stub_->CloseSession(context, request, &response);
  });
}

absl::StatusOr<v1::Finished> Client::Generate(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GeneratedToken&)>& on_token) {
  return GenerateChunks(request, [&](const v1::GenerateResponse& chunk) {
    if (!on_token) return;
    for (const v1::GeneratedToken& t : chunk.tokens()) on_token(t);
  });
}

absl::StatusOr<v1::Finished> Client::GenerateChunks(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GenerateResponse&)>& on_chunk) {
  v1::Finished finished;
  bool got_output = false;
  absl::Status s = WithRetries(
      Deadline(),
      [&](grpc::ClientContext* context) {
        std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
            stub_->Generate(context, request);
        v1::GenerateResponse chunk;
        while (reader->Read(&chunk)) {
          got_output = true;
          if (on_chunk) on_chunk(chunk);
          if (chunk.has_finished()) finished = chunk.finished();
        }
        return reader->Finish();
      },
      /*no_retry=*/&got_output);  // once output went to the caller, a retry would repeat it
  if (!s.ok()) return s;
  return finished;
}

absl::StatusOr<v1::TokenizeResponse> Client::Tokenize(const v1::TokenizeRequest& request) {
  v1::TokenizeResponse response;
  RETURN_IF_ERROR(WithRetries(Deadline(), [&](grpc::ClientContext* context) {
    return stub_->Tokenize(context, request, &response);
  }));
  return response;
}

absl::StatusOr<v1::DetokenizeResponse> Client::Detokenize(const v1::DetokenizeRequest& request) {
  v1::DetokenizeResponse response;
  RETURN_IF_ERROR(WithRetries(Deadline(), [&](grpc::ClientContext* context) {
    return stub_->Detokenize(context, request, &response);
  }));
  return response;
}

std::unique_ptr<GenerateStream> Client::StartGenerate(const v1::GenerateRequest& request) {
  std::unique_ptr<GenerateStream> stream(new GenerateStream());
  stream->context_ = NewContext(Deadline(), /*auth=*/true);
  stream->reader_ = stub_->Generate(stream->context_.get(), request);
  return stream;
}

absl::StatusOr<HealthStatus> Client::Health(const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  std::unique_ptr<grpc::ClientContext> context = NewContext(Deadline(), /*auth=*/false);
  grpc::Status status = stub->Check(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

}  // namespace glmserve
