// TLS, mutual TLS and bearer tokens accept the right client and refuse the wrong one; a
// refused call costs no engine work. Certificates are throwaway ones made at test time with
// the openssl CLI (a CA, a server certificate for 127.0.0.1, a client certificate, and a
// rogue CA with its own client certificate).
#include <gtest/gtest.h>

#include <fstream>

#include "client/scrape.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::GreedyRequest;
using testing::RunCommand;
using testing::StartServer;
using testing::TinyOptions;

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(glmserve::testing::MakeTempDir("glmserve_tls"));
    const std::string d = *dir_;
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::vector<std::string> commands = {
        absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/ca.key -out ", d,
                     "/ca.crt -days 2 -subj /CN=glmserve-test-ca"),
        absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/rogue.key -out ", d,
                     "/rogue.crt -days 2 -subj /CN=rogue-ca"),
        absl::StrCat("printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ", d, "/san.ext"),
        absl::StrCat("openssl req ", key, " -keyout ", d, "/server.key -out ", d,
                     "/server.csr -subj /CN=localhost"),
        absl::StrCat("openssl x509 -req -in ", d, "/server.csr -CA ", d, "/ca.crt -CAkey ", d,
                     "/ca.key -CAcreateserial -out ", d, "/server.crt -days 2 -extfile ", d,
                     "/san.ext"),
        absl::StrCat("openssl req ", key, " -keyout ", d, "/client.key -out ", d,
                     "/client.csr -subj /CN=client"),
        absl::StrCat("openssl x509 -req -in ", d, "/client.csr -CA ", d, "/ca.crt -CAkey ", d,
                     "/ca.key -CAcreateserial -out ", d, "/client.crt -days 2"),
        absl::StrCat("openssl req ", key, " -keyout ", d, "/rogue_client.key -out ", d,
                     "/rogue_client.csr -subj /CN=rogue"),
        absl::StrCat("openssl x509 -req -in ", d, "/rogue_client.csr -CA ", d, "/rogue.crt -CAkey ",
                     d, "/rogue.key -CAcreateserial -out ", d, "/rogue_client.crt -days 2"),
    };
    for (const std::string& c : commands) {
      const testing::CommandResult r = RunCommand(c);
      ASSERT_EQ(r.exit_code, 0) << c << "\n" << r.output;
    }
  }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  static ServerOptions TlsServer(bool mutual) {
    ServerOptions o = TinyOptions();
    o.tls.cert_file = File("server.crt");
    o.tls.key_file = File("server.key");
    if (mutual) o.tls.client_ca_file = File("ca.crt");
    return o;
  }
  static ClientOptions TlsClient(const std::string& ca, const std::string& cert = "") {
    ClientOptions o;
    o.tls = true;
    o.ca_cert_file = File(ca);
    if (!cert.empty()) {
      o.client_cert_file = File(cert + ".crt");
      o.client_key_file = File(cert + ".key");
    }
    o.max_attempts = 1;
    o.timeout = absl::Seconds(5);
    return o;
  }

  static std::string* dir_;
};
std::string* SecurityTest::dir_ = nullptr;

TEST_F(SecurityTest, TlsServesClientsThatTrustItsCaAndNoOneElse) {
  std::unique_ptr<GlmServer> server = StartServer(TlsServer(/*mutual=*/false));
  EXPECT_TRUE(Connect(*server, TlsClient("ca.crt"))->Info().ok());
  EXPECT_TRUE(Connect(*server, TlsClient("ca.crt"))->Generate(GreedyRequest({1}, 3), nullptr).ok());
  // Plaintext to a TLS port, and a client that trusts another CA, never get through.
  ClientOptions plain;
  plain.max_attempts = 1;
  plain.timeout = absl::Seconds(5);
  EXPECT_EQ(Connect(*server, plain)->Info().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Connect(*server, TlsClient("rogue.crt"))->Info().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  std::unique_ptr<GlmServer> server = StartServer(TlsServer(/*mutual=*/true));
  EXPECT_TRUE(Connect(*server, TlsClient("ca.crt", "client"))->Info().ok());
  EXPECT_EQ(Connect(*server, TlsClient("ca.crt"))->Info().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Connect(*server, TlsClient("ca.crt", "rogue_client"))->Info().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(SecurityTest, BearerTokenIsCheckedBeforeAnyEngineWork) {
  const std::string token_file = File("tokens");
  std::ofstream(token_file) << "# accepted tokens\n  s3cret-one  \n\ns3cret-two\n";
  ServerOptions options = TinyOptions();
  options.auth_token_file = token_file;
  std::unique_ptr<GlmServer> server = StartServer(options);
  const int64_t steps = server->engine()->Stats().steps;

  ClientOptions none, wrong, right, other;
  wrong.token = "s3cret-on";
  right.token = "s3cret-one";
  other.token = "s3cret-two";
  for (const ClientOptions& o : {none, wrong}) {
    std::unique_ptr<Client> client = Connect(*server, o);
    EXPECT_EQ(client->Generate(GreedyRequest({1, 2}, 4), nullptr).status().code(),
              absl::StatusCode::kUnauthenticated);
    v1::ForwardRequest forward;
    testing::SetIds(forward.mutable_token_ids()->mutable_ids(), {1});
    EXPECT_EQ(client->Forward(forward).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->Info().status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->CloseSession("x").code(), absl::StatusCode::kUnauthenticated);
    // The text RPCs too (before the tokenizer check: this server has none).
    v1::TokenizeRequest tokenize;
    tokenize.set_text("x");
    EXPECT_EQ(client->Tokenize(tokenize).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->Detokenize(v1::DetokenizeRequest()).status().code(),
              absl::StatusCode::kUnauthenticated);
    // Health needs no token (probes carry none).
    EXPECT_EQ(*client->Health(kReadinessService), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(server->engine()->Stats().steps, steps);
  EXPECT_TRUE(Connect(*server, right)->Generate(GreedyRequest({1, 2}, 4), nullptr).ok());
  EXPECT_TRUE(Connect(*server, other)->Info().ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  EXPECT_EQ(*SampleValue(server->metrics().Scrape(), "glmserve_requests_total",
                         "{api=\"glmserve\",code=\"UNAUTHENTICATED\",rpc=\"Generate\"}"),
            2);
}

TEST_F(SecurityTest, TokenOverMutualTls) {
  const std::string token_file = File("token_mtls");
  std::ofstream(token_file) << "tls-token\n";
  ServerOptions options = TlsServer(/*mutual=*/true);
  options.auth_token_file = token_file;
  std::unique_ptr<GlmServer> server = StartServer(options);
  ClientOptions client = TlsClient("ca.crt", "client");
  EXPECT_EQ(Connect(*server, client)->Info().status().code(), absl::StatusCode::kUnauthenticated);
  client.token = "tls-token";
  EXPECT_TRUE(Connect(*server, client)->Generate(GreedyRequest({5}, 2), nullptr).ok());
}

TEST_F(SecurityTest, BadSecurityConfigurationFailsAtStart) {
  ServerOptions options = TinyOptions();
  options.tls.cert_file = File("missing.crt");
  options.tls.key_file = File("server.key");
  EXPECT_FALSE(GlmServer::Start(options).ok());
  options = TinyOptions();
  options.tls.client_ca_file = File("ca.crt");  // mutual TLS without a server certificate
  EXPECT_FALSE(GlmServer::Start(options).ok());
  const std::string empty = File("empty_tokens");
  std::ofstream(empty) << "# nothing\n\n";
  options = TinyOptions();
  options.auth_token_file = empty;
  EXPECT_FALSE(GlmServer::Start(options).ok());
}

}  // namespace
}  // namespace glmserve
