// Shared by the server and client tests: the real GlmServer on an ephemeral loopback port
// with the tiny preset model, the real client connected to it, and helpers to run the
// glm-server / glm-client / glm-run binaries.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/config.h"
#include "core/text/text_assets.h"
#include "server/server.h"

namespace glmserve::testing {

// Loopback only, ephemeral port, no metrics endpoint unless a test asks for one.
inline ServerOptions TinyOptions() {
  ServerOptions o;
  o.address = "127.0.0.1";
  o.port = 0;
  o.metrics_port = -1;
  o.model_name = "tiny";
  o.engine.check_invariants = true;  // every step verifies the engine's bookkeeping
  return o;
}

inline std::unique_ptr<glmserve::ModelRunner> TinyRunner(glmserve::DType* dtype = nullptr) {
  absl::StatusOr<glmserve::ModelWeights> weights = glmserve::LoadModel("tiny");
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (dtype != nullptr) *dtype = weights->weight_dtype;
  absl::StatusOr<std::unique_ptr<glmserve::ModelRunner>> runner =
      glmserve::CreateModelRunner(*std::move(weights), glmserve::DeviceKind::kCpu);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return *std::move(runner);
}

// Started, and (when `serve`) loaded with the tiny model, warmed up and ready.
inline std::unique_ptr<GlmServer> StartServer(const ServerOptions& options = TinyOptions(),
                                              bool serve = true) {
  absl::StatusOr<std::unique_ptr<GlmServer>> server = GlmServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  if (serve) {
    glmserve::DType dtype;
    std::unique_ptr<glmserve::ModelRunner> runner = TinyRunner(&dtype);
    absl::Status s = (*server)->Serve(std::move(runner), dtype);
    EXPECT_TRUE(s.ok()) << s;
  }
  return *std::move(server);
}

// The embedded default model's tokenizer (models/glm-4.5-mini) and a tiny random model whose
// vocabulary covers it, for the text API's tests.
inline const std::string kTokenizerDir = std::string(GLMSERVE_SOURCE_DIR) + "/models/glm-4.5-mini";

inline TextAssets MiniAssets() {
  absl::StatusOr<TextAssets> assets = LoadTextAssets(kTokenizerDir);
  EXPECT_TRUE(assets.ok()) << assets.status();
  return *std::move(assets);
}

// The tiny preset with a vocabulary just large enough for the tokenizer's 8,228 ids plus
// padding rows past them (as real checkpoints have), so sampling must be bounded.
inline std::unique_ptr<glmserve::ModelRunner> TextRunner(glmserve::DType* dtype) {
  ModelConfig config = *PresetConfig("tiny");
  config.vocab_size = 8320;
  absl::StatusOr<ModelWeights> weights = RandomWeights(config);
  EXPECT_TRUE(weights.ok()) << weights.status();
  *dtype = weights->weight_dtype;
  absl::StatusOr<std::unique_ptr<glmserve::ModelRunner>> runner =
      CreateModelRunner(*std::move(weights), DeviceKind::kCpu);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return *std::move(runner);
}

inline std::unique_ptr<GlmServer> StartTextServer(ServerOptions options = TinyOptions()) {
  std::unique_ptr<GlmServer> server = StartServer(options, /*serve=*/false);
  if (server == nullptr) return nullptr;
  DType dtype;
  absl::Status s = server->Serve(TextRunner(&dtype), dtype, MiniAssets());
  EXPECT_TRUE(s.ok()) << s;
  return server;
}

inline std::unique_ptr<Client> Connect(const std::string& target, ClientOptions options = {}) {
  options.target = target;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

inline std::unique_ptr<Client> Connect(const GlmServer& server, ClientOptions options = {}) {
  return Connect(server.target(), std::move(options));
}

// Polls `predicate` every 2 ms until it holds or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& predicate,
                      absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!predicate()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// True once the engine holds no request and no KV block (prefix-cache blocks count as free).
inline bool EngineDrained(glmserve::Engine* engine) {
  const glmserve::EngineStats s = engine->Stats();
  return s.running == 0 && s.waiting == 0 && s.kv_usage() == 0.0;
}

inline void SetIds(google::protobuf::RepeatedField<int32_t>* field,
                   std::initializer_list<int32_t> ids) {
  field->Clear();
  field->Add(ids.begin(), ids.end());
}

inline v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_new_tokens) {
  v1::GenerateRequest request;
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_stop()->set_max_new_tokens(max_new_tokens);
  request.mutable_stop()->set_ignore_eos(true);
  return request;
}

// Runs a command line; returns its exit status and stdout + stderr.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
inline CommandResult RunCommand(const std::string& command) {
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  CommandResult r;
  if (pipe == nullptr) return r;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// glm-run's greedy continuation of `prompt` on a preset, the tiny model by default (the
// reference Generate must reproduce).
inline std::vector<int32_t> GlmRunGreedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                                         const std::string& model = "tiny") {
  const CommandResult r = RunCommand(absl::StrCat(GLM_RUN_PATH, " --model=", model,
                                                  " --prompt=", absl::StrJoin(prompt, ","),
                                                  " --max_new_tokens=", max_new_tokens));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<int32_t> tokens;
  const size_t at = r.output.find("greedy    ");
  EXPECT_NE(at, std::string::npos) << r.output;
  if (at == std::string::npos) return tokens;
  const std::string line = r.output.substr(at + 10, r.output.find('\n', at) - at - 10);
  for (absl::string_view piece : absl::StrSplit(line, ',')) {
    int32_t id;
    if (absl::SimpleAtoi(piece, &id)) tokens.push_back(id);
  }
  return tokens;
}

// A child process (glm-server) whose stdout is read line by line.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ != nullptr) fclose(out_);
  }

  pid_t pid() const { return pid_; }
  // Reads stdout lines until one contains `text`; returns that line ("" at end of output).
  std::string ReadUntil(const std::string& text) {
    char line[4096];
    while (out_ != nullptr && fgets(line, sizeof line, out_) != nullptr) {
      output_ += line;
      if (std::string(line).find(text) != std::string::npos) return line;
    }
    return "";
  }
  const std::string& output() const { return output_; }
  void Signal(int sig) { kill(pid_, sig); }
  // The exit code once the process ends within `timeout`; -1 if it does not (or crashed).
  int Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    int status = 0;
    while (absl::Now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  bool reaped_ = false;
  std::string output_;
};

// Starts glm-server on an ephemeral loopback port with the tiny model (or, with
// default_model, no --model at all: the embedded default) and waits until it is ready;
// *target receives "127.0.0.1:PORT".
inline std::unique_ptr<ChildProcess> StartServerProcess(std::vector<std::string> flags,
                                                        std::string* target,
                                                        bool default_model = false) {
  std::vector<std::string> argv = {GLM_SERVER_PATH, "--address=127.0.0.1", "--port=0",
                                   "--metrics_port=-1"};
  if (!default_model) argv.insert(argv.begin() + 1, "--model=tiny");
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto child = std::make_unique<ChildProcess>(argv);
  const std::string listening = child->ReadUntil("listening on ");
  EXPECT_FALSE(listening.empty()) << child->output();
  const size_t at = listening.find("listening on ") + 13;
  *target = listening.substr(at, listening.find_first_of(",\n", at) - at);
  EXPECT_FALSE(child->ReadUntil("ready").empty()) << child->output();
  return child;
}

}  // namespace glmserve::testing
