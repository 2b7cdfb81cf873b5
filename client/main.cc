// glm-client: talks to glm-server from a shell.
//
//   glm-client info
//   glm-client generate --prompt=151331,151333,9703 --max_new_tokens=16   # streams tokens
//   glm-client generate --text="Once upon a time" --stop=.               # streams text
//   glm-client chat --message="Hello!"        # one turn; without --message: one turn a line
//   glm-client tokenize --text="Hello"        # ids, comma-separated (as --prompt takes them)
//   glm-client detokenize --ids=9703,1435
//   glm-client forward --prompt=1,2,3 --logits --last_only --logits_out=/tmp/logits.npy
//   glm-client forward --hidden_in=/tmp/h.npy --layer_begin=2 --hidden --hidden_out=/tmp/o.npy
//   glm-client --session=s1 close-session
//   glm-client health --service=readiness --wait=60s
//   glm-client bench --rpc=generate --concurrency=16 --duration=20s --metrics=127.0.0.1:9090
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/bench.h"
#include "client/cli_output.h"
#include "client/client.h"
#include "core/base/npy.h"
#include "core/base/status_macros.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "server: host:port, dns:///name:port (every address, round robin), ipv4:a:p,b:p");
ABSL_FLAG(bool, tls, false, "use TLS");
ABSL_FLAG(std::string, ca_cert, "", "PEM CA that signed the server certificate (TLS)");
ABSL_FLAG(std::string, client_cert, "", "PEM client certificate (mutual TLS)");
ABSL_FLAG(std::string, client_key, "", "PEM client private key (mutual TLS)");
ABSL_FLAG(std::string, tls_server_name, "", "name to verify in the server certificate");
ABSL_FLAG(std::string, token_file, "", "file whose first line is the bearer token");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "deadline of each call");
ABSL_FLAG(int, max_attempts, 4, "attempts per call when the server is UNAVAILABLE");
ABSL_FLAG(bool, json, false, "print one JSON object (every field, zeros included) for scripts");
ABSL_FLAG(std::string, request_id, "", "generate/forward: id echoed in the reply and access log");
// generate / forward
ABSL_FLAG(std::string, prompt, "151331,151333,9703,1435,11", "comma-separated token ids");
ABSL_FLAG(int, max_new_tokens, 16, "generate: tokens to generate at most");
ABSL_FLAG(double, temperature, 0.0, "generate: 0 is greedy");
ABSL_FLAG(int, top_k, 0, "generate: 0 is off");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus sampling");
ABSL_FLAG(double, min_p, 0.0, "generate: drop tokens below min_p x the top probability (0: off)");
ABSL_FLAG(double, repetition_penalty, 1.0,
          "generate: divide logits of tokens already seen by this (1: off)");
ABSL_FLAG(std::string, stop_token_ids, "", "generate: comma-separated ids that end generation");
ABSL_FLAG(uint64_t, seed, 0, "generate: sampling seed");
ABSL_FLAG(bool, ignore_eos, false, "generate: do not stop at end-of-sequence tokens");
ABSL_FLAG(int, top_logprobs, -1, "generate: print logprobs with this many alternatives");
// text (needs a server with a tokenizer: `glm-client info` shows has_tokenizer)
ABSL_FLAG(std::string, text, "",
          "generate: prompt as text instead of --prompt; tokenize: the text");
ABSL_FLAG(std::string, message, "",
          "chat: the user message (one turn); empty: read one message a line from stdin");
ABSL_FLAG(std::string, system, "", "chat / tokenize --message: a system message first");
ABSL_FLAG(std::string, thinking, "auto",
          "chat: auto (the model decides), on or off (GLM-4.5's enable_thinking)");
ABSL_FLAG(std::vector<std::string>, stop, {},
          "generate / chat: comma-separated stop strings (the text ends before the first)");
ABSL_FLAG(std::string, ids, "", "detokenize: comma-separated token ids");
ABSL_FLAG(bool, skip_special, false, "detokenize: leave special tokens out");
ABSL_FLAG(int64_t, layer_begin, -1, "forward: first layer (-1: the served span's)");
ABSL_FLAG(int64_t, layer_end, -1, "forward: end layer (-1: the served span's)");
ABSL_FLAG(std::string, session, "", "forward / close-session: session id");
ABSL_FLAG(bool, create_session, false, "forward: this call creates --session");
ABSL_FLAG(bool, hidden, false, "forward: return hidden states");
ABSL_FLAG(bool, logits, true, "forward: return logits");
ABSL_FLAG(bool, last_only, false, "forward: last position only");
ABSL_FLAG(std::string, output_dtype, "fp32", "forward: fp32, bf16 or fp16 on the wire");
ABSL_FLAG(std::string, hidden_in, "", "forward: input hidden states [tokens, hidden] (.npy)");
ABSL_FLAG(std::string, hidden_out, "", "forward: write hidden states here (.npy)");
ABSL_FLAG(std::string, logits_out, "", "forward: write logits here (.npy)");
// health
ABSL_FLAG(std::string, service, "readiness", "health: liveness, readiness or ''");
ABSL_FLAG(absl::Duration, wait, absl::ZeroDuration(),
          "health: poll until SERVING or this long has passed");
// bench
ABSL_FLAG(std::string, rpc, "generate", "bench: generate or forward");
ABSL_FLAG(int, concurrency, 8, "bench: concurrent streams");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10), "bench: how long (without --requests)");
ABSL_FLAG(int64_t, requests, 0, "bench: stop after this many calls (0: use --duration)");
ABSL_FLAG(int, prompt_len, 16, "bench: prompt tokens per call");
ABSL_FLAG(bool, forward_logits, false, "bench: Forward returns last-position logits, not hidden");
ABSL_FLAG(std::string, metrics, "", "bench: host:port of the server's /metrics (step time)");
ABSL_FLAG(int64_t, max_consecutive_failures, 100,
          "bench: stop after this many failed calls in a row (0: never)");

namespace {

using glmserve::v1::DataType;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "glm-client: %s\n", status.ToString().c_str());
  return 1;
}

void PrintJson(const nlohmann::json& value) { std::printf("%s\n", value.dump().c_str()); }

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text,
                                              const char* flag = "--prompt") {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", piece, "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<glmserve::ClientOptions> OptionsFromFlags() {
  glmserve::ClientOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  o.tls = absl::GetFlag(FLAGS_tls);
  o.ca_cert_file = absl::GetFlag(FLAGS_ca_cert);
  o.client_cert_file = absl::GetFlag(FLAGS_client_cert);
  o.client_key_file = absl::GetFlag(FLAGS_client_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.timeout = absl::GetFlag(FLAGS_timeout);
  o.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
    char line[4096] = {0};
    const bool read = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    if (!read) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is empty"));
    o.token = std::string(absl::StripAsciiWhitespace(line));
  }
  return o;
}

int Info(glmserve::Client& client) {
  absl::StatusOr<glmserve::v1::ModelInfo> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(glmserve::cli::MessageJson(*info));
  } else {
    std::printf("%s", glmserve::cli::MessageText(*info).c_str());
  }
  return 0;
}

int CloseSession(glmserve::Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  if (session.empty()) return Fail(absl::InvalidArgumentError("close-session needs --session"));
  if (absl::Status s = client.CloseSession(session); !s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson({{"session_id", session}, {"closed", true}});
  } else {
    std::printf("closed session %s\n", session.c_str());
  }
  return 0;
}

// The sampling and stop flags shared by generate and chat.
absl::Status SetSamplingAndStop(glmserve::v1::GenerateRequest* request) {
  request->mutable_stop()->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  request->mutable_stop()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  glmserve::v1::SamplingParams* sampling = request->mutable_sampling();
  sampling->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  sampling->set_top_k(absl::GetFlag(FLAGS_top_k));
  sampling->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  sampling->set_seed(absl::GetFlag(FLAGS_seed));
  sampling->set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  sampling->set_repetition_penalty(static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty)));
  ASSIGN_OR_RETURN(std::vector<int32_t> stop_ids,
                   ParseIds(absl::GetFlag(FLAGS_stop_token_ids), "--stop_token_ids"));
  request->mutable_stop()->mutable_stop_token_ids()->Add(stop_ids.begin(), stop_ids.end());
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) {
    request->mutable_stop()->add_stop_strings(stop);
  }
  request->set_request_id(absl::GetFlag(FLAGS_request_id));
  return absl::OkStatus();
}

void PrintFinished(const glmserve::v1::Finished& finished) {
  const auto& t = finished.timings();
  std::fprintf(stderr,
               "finished: %s%s%s, %lld prompt + %lld generated tokens; server: queue %.2f ms, "
               "first token %.2f ms, total %.2f ms\n",
               glmserve::v1::FinishReason_Name(finished.reason()).c_str(),
               finished.stop_string().empty()
                   ? ""
                   : absl::StrCat(" (stop string \"", finished.stop_string(), "\")").c_str(),
               finished.request_id().empty()
                   ? ""
                   : absl::StrCat(" (request ", finished.request_id(), ")").c_str(),
               static_cast<long long>(finished.prompt_tokens()),
               static_cast<long long>(finished.generated_tokens()), t.queue_seconds() * 1e3,
               t.time_to_first_token_seconds() * 1e3, t.total_seconds() * 1e3);
}

// generate --text: the text streams as it is generated.
int GenerateText(glmserve::Client& client) {
  glmserve::v1::GenerateRequest request;
  request.set_prompt_text(absl::GetFlag(FLAGS_text));
  if (absl::Status s = SetSamplingAndStop(&request); !s.ok()) return Fail(s);
  const bool json = absl::GetFlag(FLAGS_json);
  glmserve::v1::GenerateResponse collected;  // --json: everything in one message
  absl::StatusOr<glmserve::v1::Finished> finished =
      client.GenerateChunks(request, [&](const glmserve::v1::GenerateResponse& r) {
        if (json) {
          collected.mutable_tokens()->MergeFrom(r.tokens());
          collected.mutable_text()->append(r.text());
          return;
        }
        std::fwrite(r.text().data(), 1, r.text().size(), stdout);
        std::fflush(stdout);
      });
  if (!json) std::printf("\n");
  std::fflush(stdout);
  if (!finished.ok()) return Fail(finished.status());
  if (json) {
    *collected.mutable_finished() = *finished;
    PrintJson(glmserve::cli::MessageJson(collected));
  } else {
    PrintFinished(*finished);
  }
  return 0;
}

int Generate(glmserve::Client& client) {
  if (!absl::GetFlag(FLAGS_text).empty()) return GenerateText(client);
  absl::StatusOr<std::vector<int32_t>> prompt = ParseIds(absl::GetFlag(FLAGS_prompt));
  if (!prompt.ok()) return Fail(prompt.status());
  glmserve::v1::GenerateRequest request;
  request.mutable_prompt_token_ids()->Add(prompt->begin(), prompt->end());
  request.mutable_stop()->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  request.mutable_stop()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  request.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  request.mutable_sampling()->set_top_k(absl::GetFlag(FLAGS_top_k));
  request.mutable_sampling()->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  request.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed));
  request.mutable_sampling()->set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  request.mutable_sampling()->set_repetition_penalty(
      static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty)));
  absl::StatusOr<std::vector<int32_t>> stop_ids =
      ParseIds(absl::GetFlag(FLAGS_stop_token_ids), "--stop_token_ids");
  if (!stop_ids.ok()) return Fail(stop_ids.status());
  request.mutable_stop()->mutable_stop_token_ids()->Add(stop_ids->begin(), stop_ids->end());
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) {
    request.mutable_stop()->add_stop_strings(stop);
  }
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  const bool json = absl::GetFlag(FLAGS_json);
  // --json: the tokens and the final message as one GenerateResponse-shaped object.
  glmserve::v1::GenerateResponse collected;
  const int top_logprobs = absl::GetFlag(FLAGS_top_logprobs);
  if (top_logprobs >= 0) {
    request.mutable_logprobs()->set_enabled(true);
    request.mutable_logprobs()->set_top_logprobs(top_logprobs);
  }
  absl::StatusOr<glmserve::v1::Finished> finished =
      client.Generate(request, [&](const glmserve::v1::GeneratedToken& t) {
        if (json) {
          *collected.add_tokens() = t;
          return;
        }
        if (top_logprobs >= 0) {
          std::printf("%d (%.4f)", t.token_id(), t.logprob());
          for (const auto& alt : t.top_logprobs()) {
            std::printf(" [%d %.4f]", alt.token_id(), alt.logprob());
          }
          std::printf("\n");
        } else {
          std::printf("%d ", t.token_id());
        }
        std::fflush(stdout);  // tokens appear as they stream
      });
  if (!json) std::printf("\n");
  std::fflush(stdout);
  if (!finished.ok()) return Fail(finished.status());
  if (json) {
    *collected.mutable_finished() = *finished;
    PrintJson(glmserve::cli::MessageJson(collected));
    return 0;
  }
  PrintFinished(*finished);
  return 0;
}

glmserve::v1::ChatMessage ChatMessage(const std::string& role, const std::string& content) {
  glmserve::v1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

absl::Status SetThinking(glmserve::v1::GenerateRequest* request) {
  const std::string thinking = absl::GetFlag(FLAGS_thinking);
  if (thinking == "on" || thinking == "off") {
    request->set_enable_thinking(thinking == "on");
  } else if (thinking != "auto") {
    return absl::InvalidArgumentError("--thinking must be auto, on or off");
  }
  return absl::OkStatus();
}

// One chat turn: streams the reply, its reasoning under "[reasoning]" and its answer under
// "[answer]" (so the two are never mixed), tool calls on their own lines; returns the
// assistant message to keep in the history.
absl::StatusOr<glmserve::v1::ChatMessage> ChatTurn(glmserve::Client& client,
                                                   const glmserve::v1::GenerateRequest& request,
                                                   bool json) {
  glmserve::v1::ChatMessage reply = ChatMessage("assistant", "");
  std::string reasoning;
  enum class Part { kNone, kReasoning, kAnswer } part = Part::kNone;
  const auto switch_to = [&](Part p, const char* label) {
    if (part == p) return;
    std::printf("%s%s ", part == Part::kNone ? "" : "\n", label);
    part = p;
  };
  ASSIGN_OR_RETURN(glmserve::v1::Finished finished,
                   client.GenerateChunks(request, [&](const glmserve::v1::GenerateResponse& r) {
                     reasoning += r.reasoning_content();
                     reply.mutable_content()->append(r.content());
                     for (const glmserve::v1::ToolCall& call : r.tool_calls())
                       *reply.add_tool_calls() = call;
                     if (json) return;
                     if (!r.reasoning_content().empty()) {
                       switch_to(Part::kReasoning, "[reasoning]");
                       std::fwrite(r.reasoning_content().data(), 1, r.reasoning_content().size(),
                                   stdout);
                     }
                     if (!r.content().empty()) {
                       switch_to(Part::kAnswer, "[answer]");
                       std::fwrite(r.content().data(), 1, r.content().size(), stdout);
                     }
                     for (const glmserve::v1::ToolCall& call : r.tool_calls()) {
                       std::printf("%s[tool call] %s %s\n", part == Part::kNone ? "" : "\n",
                                   call.name().c_str(), call.arguments_json().c_str());
                       part = Part::kNone;
                     }
                     std::fflush(stdout);
                   }));
  if (!reasoning.empty()) reply.set_reasoning_content(reasoning);
  if (json) {
    nlohmann::json out = glmserve::cli::MessageJson(reply);
    out["finished"] = glmserve::cli::MessageJson(finished);
    PrintJson(out);
  } else {
    std::printf("\n");
    std::fflush(stdout);
    PrintFinished(finished);
  }
  return reply;
}

// chat --message: one turn. Without --message: every stdin line is a user turn of one
// conversation (the replies stay in its history) until EOF or "/exit".
int Chat(glmserve::Client& client) {
  glmserve::v1::GenerateRequest request;
  if (absl::Status s = SetSamplingAndStop(&request); !s.ok()) return Fail(s);
  if (absl::Status s = SetThinking(&request); !s.ok()) return Fail(s);
  if (!absl::GetFlag(FLAGS_system).empty()) {
    *request.add_messages() = ChatMessage("system", absl::GetFlag(FLAGS_system));
  }
  const bool json = absl::GetFlag(FLAGS_json);
  if (const std::string message = absl::GetFlag(FLAGS_message); !message.empty()) {
    *request.add_messages() = ChatMessage("user", message);
    absl::StatusOr<glmserve::v1::ChatMessage> reply = ChatTurn(client, request, json);
    return reply.ok() ? 0 : Fail(reply.status());
  }
  const bool tty = isatty(STDIN_FILENO) != 0;
  std::string line;
  for (;;) {
    if (tty) {
      std::fprintf(stderr, "you> ");
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    *request.add_messages() = ChatMessage("user", line);
    absl::StatusOr<glmserve::v1::ChatMessage> reply = ChatTurn(client, request, json);
    if (!reply.ok()) return Fail(reply.status());
    *request.add_messages() = *std::move(reply);
  }
  return 0;
}

int Tokenize(glmserve::Client& client) {
  glmserve::v1::TokenizeRequest request;
  request.set_text(absl::GetFlag(FLAGS_text));
  if (!absl::GetFlag(FLAGS_system).empty()) {
    *request.add_messages() = ChatMessage("system", absl::GetFlag(FLAGS_system));
  }
  if (!absl::GetFlag(FLAGS_message).empty()) {
    *request.add_messages() = ChatMessage("user", absl::GetFlag(FLAGS_message));
  }
  absl::StatusOr<glmserve::v1::TokenizeResponse> response = client.Tokenize(request);
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(glmserve::cli::MessageJson(*response));
    return 0;
  }
  std::printf("%s\n", absl::StrJoin(response->token_ids(), ",").c_str());
  std::fflush(stdout);  // the ids first, then the count on stderr
  std::fprintf(stderr, "%d tokens\n", response->token_ids_size());
  return 0;
}

int Detokenize(glmserve::Client& client) {
  absl::StatusOr<std::vector<int32_t>> ids = ParseIds(absl::GetFlag(FLAGS_ids), "--ids");
  if (!ids.ok()) return Fail(ids.status());
  glmserve::v1::DetokenizeRequest request;
  request.mutable_token_ids()->Add(ids->begin(), ids->end());
  request.set_skip_special_tokens(absl::GetFlag(FLAGS_skip_special));
  absl::StatusOr<glmserve::v1::DetokenizeResponse> response = client.Detokenize(request);
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(glmserve::cli::MessageJson(*response));
  } else {
    std::printf("%s\n", response->text().c_str());
  }
  return 0;
}

absl::Status WriteTensor(const glmserve::v1::Tensor& tensor, const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<float> values,
                   glmserve::DecodeTensor(tensor, "response", /*require_finite=*/false));
  return glmserve::WriteNpy(path, {tensor.shape().begin(), tensor.shape().end()}, values.data());
}

int Forward(glmserve::Client& client) {
  glmserve::v1::ForwardRequest request;
  if (const std::string path = absl::GetFlag(FLAGS_hidden_in); !path.empty()) {
    absl::StatusOr<glmserve::NpyArray> in = glmserve::ReadNpy(path);
    if (!in.ok()) return Fail(in.status());
    glmserve::EncodeTensor(in->data, in->shape, glmserve::v1::DATA_TYPE_FP32,
                           request.mutable_hidden_states());
  } else {
    absl::StatusOr<std::vector<int32_t>> prompt = ParseIds(absl::GetFlag(FLAGS_prompt));
    if (!prompt.ok()) return Fail(prompt.status());
    request.mutable_token_ids()->mutable_ids()->Add(prompt->begin(), prompt->end());
  }
  if (absl::GetFlag(FLAGS_layer_begin) >= 0)
    request.set_layer_begin(absl::GetFlag(FLAGS_layer_begin));
  if (absl::GetFlag(FLAGS_layer_end) >= 0) request.set_layer_end(absl::GetFlag(FLAGS_layer_end));
  request.set_session_id(absl::GetFlag(FLAGS_session));
  request.set_create_session(absl::GetFlag(FLAGS_create_session));
  request.set_return_hidden_states(absl::GetFlag(FLAGS_hidden));
  request.set_return_logits(absl::GetFlag(FLAGS_logits));
  request.set_last_position_only(absl::GetFlag(FLAGS_last_only));
  const std::string dtype = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_output_dtype));
  DataType wire;
  if (!glmserve::v1::DataType_Parse(absl::StrCat("DATA_TYPE_", dtype), &wire)) {
    return Fail(absl::InvalidArgumentError("--output_dtype must be fp32, bf16 or fp16"));
  }
  request.set_output_dtype(wire);
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  absl::StatusOr<glmserve::v1::ForwardResponse> response = client.Forward(request);
  if (!response.ok()) return Fail(response.status());
  const bool json = absl::GetFlag(FLAGS_json);
  // --json: the response's fields with each tensor's shape and dtype (not its bytes).
  nlohmann::json out = glmserve::cli::MessageJson(*response);
  if (!json) {
    std::printf("rows %lld from position %lld; server total %.2f ms (engine %.2f ms)\n",
                static_cast<long long>(response->rows()),
                static_cast<long long>(response->start_position()),
                response->timings().total_seconds() * 1e3,
                response->timings().engine_seconds() * 1e3);
  }
  const struct {
    const char* name;
    const char* field;
    bool present;
    const glmserve::v1::Tensor& tensor;
    std::string path;
  } outputs[] = {
      {"hidden", "hidden_states", response->has_hidden_states(), response->hidden_states(),
       absl::GetFlag(FLAGS_hidden_out)},
      {"logits", "logits", response->has_logits(), response->logits(),
       absl::GetFlag(FLAGS_logits_out)},
  };
  for (const auto& o : outputs) {
    if (!o.present) {
      out.erase(o.field);
      continue;
    }
    absl::StatusOr<std::vector<float>> values =
        glmserve::DecodeTensor(o.tensor, o.name, /*require_finite=*/false);
    if (!values.ok()) return Fail(values.status());
    if (!json) {
      std::printf("%s [%s] %s", o.name, absl::StrJoin(o.tensor.shape(), ", ").c_str(),
                  glmserve::WireDTypeName(o.tensor.dtype()));
    }
    if (std::string(o.name) == "logits" && o.tensor.shape_size() == 2 && o.tensor.shape(1) > 0) {
      // The greedy next token of the last row: a quick sanity check from the shell.
      const int64_t cols = o.tensor.shape(1);
      const float* last = values->data() + values->size() - cols;
      const int64_t argmax = std::max_element(last, last + cols) - last;
      if (json) {
        out[o.field]["argmax_last_row"] = argmax;
      } else {
        std::printf(", argmax of last row %lld", static_cast<long long>(argmax));
      }
    }
    if (!json) std::printf("\n");
    if (!o.path.empty()) {
      if (absl::Status s = WriteTensor(o.tensor, o.path); !s.ok()) return Fail(s);
      if (json) out[o.field]["written_to"] = o.path;
    }
  }
  if (json) PrintJson(out);
  return 0;
}

int Health(glmserve::Client& client) {
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_wait);
  for (;;) {
    absl::StatusOr<glmserve::HealthStatus> status = client.Health(absl::GetFlag(FLAGS_service));
    const bool serving = status.ok() && *status == grpc::health::v1::HealthCheckResponse::SERVING;
    if (serving || absl::Now() >= deadline) {
      if (!status.ok()) return Fail(status.status());
      const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status);
      if (absl::GetFlag(FLAGS_json)) {
        PrintJson({{"service", absl::GetFlag(FLAGS_service)}, {"status", name}});
      } else {
        std::printf("%s\n", name.c_str());
      }
      return serving ? 0 : 2;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

nlohmann::json PercentilesJson(const glmserve::Percentiles& p) {
  return {{"count", p.count},
          {"mean_ms", p.mean * 1e3},
          {"p50_ms", p.p50 * 1e3},
          {"p90_ms", p.p90 * 1e3},
          {"p99_ms", p.p99 * 1e3}};
}

nlohmann::json BenchJson(const glmserve::BenchReport& r) {
  return {{"wall_seconds", r.wall_seconds},
          {"ok", r.ok},
          {"failed", r.failed},
          {"failure_rate", r.failure_rate},
          {"errors", r.errors},
          {"stopped_on_failures", r.stopped_on_failures},
          {"tokens", r.tokens},
          {"requests_per_second", r.requests_per_second},
          {"tokens_per_second", r.tokens_per_second},
          {"e2e", PercentilesJson(r.e2e)},
          {"ttft", PercentilesJson(r.ttft)},
          {"inter_token", PercentilesJson(r.inter_token)},
          {"server_queue_mean_ms", r.server_queue_mean * 1e3},
          {"server_engine_mean_ms", r.server_engine_mean * 1e3},
          {"server_total_mean_ms", r.server_total_mean * 1e3},
          {"steps", r.steps},
          {"step_mean_ms", r.step_mean * 1e3},
          {"batch_tokens_mean", r.batch_tokens_mean}};
}

int Bench(glmserve::Client& client) {
  glmserve::BenchOptions o;
  const std::string rpc = absl::GetFlag(FLAGS_rpc);
  if (rpc == "generate") {
    o.rpc = glmserve::BenchOptions::Rpc::kGenerate;
  } else if (rpc == "forward") {
    o.rpc = glmserve::BenchOptions::Rpc::kForward;
  } else {
    return Fail(absl::InvalidArgumentError("--rpc must be generate or forward"));
  }
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.duration = absl::GetFlag(FLAGS_duration);
  o.requests = absl::GetFlag(FLAGS_requests);
  o.prompt_tokens = absl::GetFlag(FLAGS_prompt_len);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.ignore_eos = true;
  o.forward_logits = absl::GetFlag(FLAGS_forward_logits);
  o.metrics_address = absl::GetFlag(FLAGS_metrics);
  o.max_consecutive_failures = absl::GetFlag(FLAGS_max_consecutive_failures);
  absl::StatusOr<glmserve::BenchReport> report = glmserve::RunBench(client, o);
  if (!report.ok()) return Fail(report.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(BenchJson(*report));
  } else {
    std::printf("%s", glmserve::FormatBenchReport(o, *report).c_str());
  }
  return report->errors.empty() ? 0 : 3;
}

constexpr char kCommands[] =
    "info|generate|chat|tokenize|detokenize|forward|close-session|health|bench";

const glmserve::cli::ProgramHelp& Help() {
  static const glmserve::cli::ProgramHelp* help = new glmserve::cli::ProgramHelp{
      "glm-client",
      "talks to glm-server from a shell",
      {absl::StrCat("glm-client [flags] ", kCommands),
       "glm-client generate --prompt=151331,151333,9703 --max_new_tokens=32",
       "glm-client chat --message=\"Hello!\" --thinking=off",
       "glm-client generate --text=\"Once upon a time\" --stop=.",
       "glm-client --json info | jq .kv_capacity_tokens",
       "glm-client bench --rpc=generate --concurrency=16 --duration=20s"},
      {{"Connection",
        {"target", "tls", "ca_cert", "client_cert", "client_key", "tls_server_name", "token_file",
         "timeout", "max_attempts"}},
       {"Output", {"json"}},
       {"generate (chat takes the same, except --prompt, --text and --top_logprobs)",
        {"prompt", "text", "max_new_tokens", "temperature", "top_k", "top_p", "min_p",
         "repetition_penalty", "seed", "stop_token_ids", "stop", "ignore_eos", "top_logprobs",
         "request_id"}},
       {"chat, tokenize, detokenize", {"message", "system", "thinking", "ids", "skip_special"}},
       {"forward (also --prompt, --request_id)",
        {"hidden_in", "layer_begin", "layer_end", "session", "create_session", "hidden", "logits",
         "last_only", "output_dtype", "hidden_out", "logits_out"}},
       {"health", {"service", "wait"}},
       {"bench (also --max_new_tokens)",
        {"rpc", "concurrency", "duration", "requests", "prompt_len", "forward_logits", "metrics",
         "max_consecutive_failures"}}},
      "client/main.cc",
      "close-session frees the Forward session named by --session. Exit status: 0 ok, 1 error,\n"
      "2 health not SERVING, 3 bench saw failed calls."};
  return *help;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> code = glmserve::cli::HandleHelpAndVersion(argc, argv, Help()))
    return *code;
  absl::SetProgramUsageMessage(
      absl::StrCat("Client of glm-server: glm-client [flags] ", kCommands));
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: glm-client [flags] %s (--help: every flag)\n", kCommands);
    return 1;
  }
  const std::string command = args[1];
  absl::StatusOr<glmserve::ClientOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  if (command == "bench") options->max_attempts = 1;  // errors are what bench reports
  if (command == "health") options->timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<glmserve::Client>> client = glmserve::Client::Create(*options);
  if (!client.ok()) return Fail(client.status());
  if (command == "info") return Info(**client);
  if (command == "generate") return Generate(**client);
  if (command == "chat") return Chat(**client);
  if (command == "tokenize") return Tokenize(**client);
  if (command == "detokenize") return Detokenize(**client);
  if (command == "forward") return Forward(**client);
  if (command == "close-session") return CloseSession(**client);
  if (command == "health") return Health(**client);
  if (command == "bench") return Bench(**client);
  std::fprintf(stderr, "glm-client: unknown command '%s'\n", command.c_str());
  return 1;
}
