// The OpenAI-compatible HTTP endpoint end to end: libcurl (a real HTTP client) against the real
// server on loopback, with a tiny random model whose vocabulary covers the embedded default
// model's tokenizer. Every route, streaming (server-sent events) and not, usage, logprobs,
// stop strings, seeds, the same text as glmserve.v1, every error with its HTTP status and
// OpenAI error JSON (changing nothing in the engine), auth, and client disconnects cancelling
// the engine request.
#include <arpa/inet.h>
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/config.h"
#include "core/text/text_assets.h"
#include "nlohmann/json.hpp"
#include "server/http/openai_server.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;
using testing::EngineDrained;
using testing::StartServer;
using testing::TinyOptions;
using testing::WaitUntil;

const std::string kTokenizerDir = std::string(GLMSERVE_SOURCE_DIR) + "/models/glm-4.5-mini";

// The tiny preset with a vocabulary covering the tokenizer's 8,228 ids, and room for long
// generations (the disconnect tests need one that outlasts the client).
std::unique_ptr<ModelRunner> TextRunner(DType* dtype) {
  ModelConfig config = *PresetConfig("tiny");
  config.vocab_size = 8320;
  config.max_position_embeddings = 65536;
  absl::StatusOr<ModelWeights> weights = RandomWeights(config);
  EXPECT_TRUE(weights.ok()) << weights.status();
  *dtype = weights->weight_dtype;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(*std::move(weights), DeviceKind::kCpu);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return *std::move(runner);
}

ServerOptions HttpOptions() {
  ServerOptions o = TinyOptions();
  o.http.port = 0;
  o.engine.kv_capacity_tokens = 65536;
  return o;
}

std::unique_ptr<GlmServer> StartHttpServer(ServerOptions options = HttpOptions(),
                                           bool tokenizer = true) {
  std::unique_ptr<GlmServer> server = StartServer(options, /*serve=*/false);
  if (server == nullptr) return nullptr;
  DType dtype;
  TextAssets assets;
  if (tokenizer) assets = *LoadTextAssets(kTokenizerDir);
  absl::Status s = server->Serve(TextRunner(&dtype), dtype, std::move(assets));
  EXPECT_TRUE(s.ok()) << s;
  return server;
}

struct HttpResponse {
  CURLcode curl = CURLE_OK;
  long status = 0;
  std::string body;
  std::string content_type;
  // Server-sent events' data, in order (streaming responses).
  std::vector<std::string> events() const {
    std::vector<std::string> out;
    for (absl::string_view block : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
      if (absl::StartsWith(block, "data: ")) out.emplace_back(block.substr(6));
    }
    return out;
  }
  Json json() const { return Json::parse(body, nullptr, /*allow_exceptions=*/false); }
};

struct RequestOptions {
  std::string token;
  std::string header;  // one more header line
  long timeout_ms = 60000;
  // Called with each received piece; returning false aborts the transfer (a disconnect).
  std::function<bool(const std::string&)> on_data;
};

HttpResponse Call(const std::string& method, const std::string& url, const std::string& body,
                  const RequestOptions& options = {}) {
  HttpResponse r;
  CURL* curl = curl_easy_init();
  struct Sink {
    HttpResponse* r;
    const RequestOptions* o;
  } sink{&r, &options};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!options.token.empty()) {
    headers = curl_slist_append(headers, ("Authorization: Bearer " + options.token).c_str());
  }
  if (!options.header.empty()) headers = curl_slist_append(headers, options.header.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, options.timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* user) -> size_t {
        auto* s = static_cast<Sink*>(user);
        const std::string piece(data, size * n);
        s->r->body += piece;
        if (s->o->on_data && !s->o->on_data(piece)) return 0;  // aborts: the client leaves
        return size * n;
      });
  r.curl = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  char* type = nullptr;
  curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
  if (type != nullptr) r.content_type = type;
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return r;
}

class OpenAIHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { curl_global_init(CURL_GLOBAL_DEFAULT); }
  void SetUp() override {
    server_ = StartHttpServer();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(server_->http_port(), 0);
    base_ = absl::StrCat("http://127.0.0.1:", server_->http_port());
  }
  void TearDown() override {
    EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
    EXPECT_EQ(server_->engine()->Stats().invariant_error, "");
  }
  HttpResponse Post(const std::string& route, const Json& body, const RequestOptions& o = {}) {
    return Call("POST", base_ + route, body.dump(), o);
  }
  // The text of a stream's chunks (completions) and the last chunk's finish reason.
  static std::string StreamedText(const HttpResponse& r, std::string* finish = nullptr) {
    std::string text;
    for (const std::string& e : r.events()) {
      if (e == "[DONE]") continue;
      const Json j = Json::parse(e);
      if (j["choices"].empty()) continue;
      text += j["choices"][0]["text"].get<std::string>();
      if (finish && !j["choices"][0]["finish_reason"].is_null()) {
        *finish = j["choices"][0]["finish_reason"];
      }
    }
    return text;
  }
  int64_t Counter(const std::string& series) {
    const std::string page = server_->metrics().Scrape();
    // A sample line (not the "# HELP name" / "# TYPE name" lines).
    const size_t at = page.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stoll(page.substr(at + series.size() + 2));
  }

  std::unique_ptr<GlmServer> server_;
  std::string base_;
};

Json Tool(const std::string& name) {
  return {{"type", "function"},
          {"function",
           {{"name", name}, {"parameters", {{"type", "object"}, {"properties", Json::object()}}}}}};
}

Json Completion(const std::string& prompt, int max_tokens) {
  return {{"model", "tiny"},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

TEST_F(OpenAIHttpTest, ModelsListsTheServedModel) {
  const HttpResponse r = Call("GET", base_ + "/v1/models", "");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "application/json");
  const Json j = r.json();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 65536);
  // One model by id, in the same form; another id is 404 in OpenAI's error shape.
  const HttpResponse one = Call("GET", base_ + "/v1/models/tiny", "");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.json(), j["data"][0]);
  const HttpResponse other = Call("GET", base_ + "/v1/models/gpt-4", "");
  EXPECT_EQ(other.status, 404) << other.body;
  EXPECT_EQ(other.json()["error"]["type"], "not_found_error");
  EXPECT_NE(other.body.find("the model 'gpt-4' does not exist"), std::string::npos);
}

TEST_F(OpenAIHttpTest, CompletionStreamedAndNotAgreeAndCountUsage) {
  const HttpResponse whole = Post("/v1/completions", Completion("The quick brown fox", 24));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json j = whole.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  const int64_t prompt_tokens = j["usage"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 0);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + 24);
  const std::string text = j["choices"][0]["text"];
  EXPECT_FALSE(text.empty());

  Json stream = Completion("The quick brown fox", 24);
  stream["stream"] = true;
  stream["stream_options"] = {{"include_usage", true}};
  const HttpResponse s = Post("/v1/completions", stream);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.content_type, "text/event-stream");
  const std::vector<std::string> events = s.events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string finish;
  EXPECT_EQ(StreamedText(s, &finish), text);  // the same greedy text, however it is cut
  EXPECT_EQ(finish, "length");
  const Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 24);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt_tokens);

  // The same prompt as token ids gives the same text.
  std::vector<int32_t> ids;
  {
    absl::StatusOr<TextAssets> assets = LoadTextAssets(kTokenizerDir);
    ASSERT_TRUE(assets.ok());
    absl::StatusOr<std::vector<int32_t>> e = assets->tokenizer->Encode("The quick brown fox");
    ASSERT_TRUE(e.ok());
    ids = *e;
  }
  Json by_ids = Completion("", 24);
  by_ids["prompt"] = ids;
  const HttpResponse r = Post("/v1/completions", by_ids);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["text"], text);
}

TEST_F(OpenAIHttpTest, LogprobsSeedsAndStopStrings) {
  Json request = Completion("Hello", 8);
  request["logprobs"] = 3;
  HttpResponse r = Post("/v1/completions", request);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json lp = r.json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 8u);
  ASSERT_EQ(lp["token_logprobs"].size(), 8u);
  ASSERT_EQ(lp["top_logprobs"].size(), 8u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 3u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);

  // Sampling with a seed is repeatable; the text differs from greedy's (random weights).
  Json seeded = Completion("Hello", 16);
  seeded["temperature"] = 1.0;
  seeded["seed"] = 1234;
  const HttpResponse a = Post("/v1/completions", seeded);
  const HttpResponse b = Post("/v1/completions", seeded);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]);

  // A stop string taken from the middle of the greedy text ends it there.
  const HttpResponse greedy = Post("/v1/completions", Completion("Hello", 32));
  const std::string full = greedy.json()["choices"][0]["text"];
  ASSERT_GT(full.size(), 12u) << full;
  size_t cut = full.size() / 2;
  while (cut < full.size() && (static_cast<unsigned char>(full[cut]) & 0xC0) == 0x80) ++cut;
  std::string stop = full.substr(cut, 1);
  while ((static_cast<unsigned char>(full[cut + stop.size()]) & 0xC0) == 0x80) {
    stop = full.substr(cut, stop.size() + 1);
  }
  Json stopping = Completion("Hello", 32);
  stopping["stop"] = {stop};
  r = Post("/v1/completions", stopping);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.json()["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(Counter("glmserve_stop_string_stops_total"), 1);
  EXPECT_EQ(Counter("glmserve_generate_input_total{input=\"prompt_text\"}"), 5);
}

TEST_F(OpenAIHttpTest, ChatStreamedAndNotAgree) {
  const Json chat = {{"model", "tiny"},
                     {"messages",
                      {{{"role", "system"}, {"content", "Be brief."}},
                       {{"role", "user"}, {"content", "Hi there"}}}},
                     {"max_tokens", 20},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"logprobs", true},
                     {"top_logprobs", 2},
                     {"tools",
                      {{{"type", "function"},
                        {"function",
                         {{"name", "get_weather"},
                          {"parameters", {{"type", "object"}, {"properties", Json::object()}}}}}}}},
                     {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const HttpResponse r = Post("/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  const Json& message = j["choices"][0]["message"];
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_TRUE(message.contains("reasoning_content"));
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"].size(), 20u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);

  Json streamed = chat;
  streamed["stream"] = true;
  const HttpResponse s = Post("/v1/chat/completions", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string content, reasoning, finish;
  bool role = false;
  for (const std::string& e : s.events()) {
    if (e == "[DONE]") continue;
    const Json c = Json::parse(e);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const Json& d = c["choices"][0]["delta"];
    role |= d.contains("role");
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(role);
  EXPECT_EQ(content, message["content"].is_null() ? "" : message["content"].get<std::string>());
  EXPECT_EQ(reasoning, message["reasoning_content"].is_null()
                           ? ""
                           : message["reasoning_content"].get<std::string>());
  EXPECT_EQ(finish, j["choices"][0]["finish_reason"]);
}

// A chat about the weather with two tools, greedy, thinking off, with logprobs (each token's
// text) so that a test can see the forced tokens.
Json ToolChat(const Json& tool_choice, int max_tokens = 12) {
  Json chat = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
               {"max_tokens", max_tokens},
               {"temperature", 0},
               {"ignore_eos", true},
               {"logprobs", true},
               {"tools", {Tool("get_weather"), Tool("get_time")}},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  if (!tool_choice.is_null()) chat["tool_choice"] = tool_choice;
  return chat;
}

// What a chat stream delivered: content, tool calls (name each) and the finish reason.
struct StreamedChat {
  std::string content, finish;
  std::vector<std::string> tool_names;
};
StreamedChat ReadChatStream(const HttpResponse& r) {
  StreamedChat out;
  for (const std::string& e : r.events()) {
    if (e == "[DONE]") continue;
    const Json c = Json::parse(e);
    if (c["choices"].empty()) continue;
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("content")) out.content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const Json& call : d["tool_calls"]) out.tool_names.push_back(call["function"]["name"]);
    }
    if (!c["choices"][0]["finish_reason"].is_null()) out.finish = c["choices"][0]["finish_reason"];
  }
  return out;
}

TEST_F(OpenAIHttpTest, NamedAndRequiredToolChoiceForceTheToolCallsStart) {
  const Json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const HttpResponse r = Post("/v1/chat/completions", ToolChat(named));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  const Json& logprobs = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(logprobs.size(), 12u);
  // The forced tokens, as the chat template writes a call: "\n<tool_call>get_weather\n".
  std::string text;
  size_t forced = 0;
  while (forced < logprobs.size() && text != "\n<tool_call>get_weather\n") {
    text += logprobs[forced++]["token"].get<std::string>();
  }
  ASSERT_EQ(text, "\n<tool_call>get_weather\n") << r.body;
  EXPECT_EQ(logprobs[1]["token"], "<tool_call>");
  EXPECT_LT(logprobs[1]["logprob"].get<double>(), 0.0);  // the model's own logprob, reported
  // The random model never closes the call: cut by max_tokens, it is still the reply's tool
  // call (OpenAI's "length" for a truncated reply).
  const Json& message = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  ASSERT_EQ(message["tool_calls"].size(), 1u) << r.body;
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  // Streamed: the same call and finish reason.
  Json streamed = ToolChat(named);
  streamed["stream"] = true;
  const StreamedChat s = ReadChatStream(Post("/v1/chat/completions", streamed));
  EXPECT_EQ(s.tool_names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(s.finish, "length");
  EXPECT_EQ(s.content, message["content"].is_null() ? "" : message["content"].get<std::string>());

  // A reply that stops (here at a stop string: the first later token's text that does not
  // occur earlier) while in the forced call finishes with "tool_calls".
  std::string stop;
  for (size_t i = forced; i < logprobs.size() && stop.empty(); ++i) {
    const std::string token = logprobs[i]["token"];
    const bool whole = token.find("\xEF\xBF\xBD") == std::string::npos;  // no U+FFFD
    if (!token.empty() && whole && (text + token).find(token) == text.size()) stop = token;
    text += token;
  }
  ASSERT_FALSE(stop.empty()) << r.body;
  Json stopped = ToolChat(named);
  stopped["stop"] = stop;
  const HttpResponse t = Post("/v1/chat/completions", stopped);
  ASSERT_EQ(t.status, 200) << t.body;
  const Json tj = t.json();
  EXPECT_EQ(tj["choices"][0]["finish_reason"], "tool_calls") << t.body;
  ASSERT_EQ(tj["choices"][0]["message"]["tool_calls"].size(), 1u) << t.body;
  EXPECT_EQ(tj["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  stopped["stream"] = true;
  const StreamedChat st = ReadChatStream(Post("/v1/chat/completions", stopped));
  EXPECT_EQ(st.tool_names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(st.finish, "tool_calls");

  // "required": the call's start is forced, the model names the function (junk here).
  const HttpResponse q = Post("/v1/chat/completions", ToolChat("required"));
  ASSERT_EQ(q.status, 200) << q.body;
  const Json qj = q.json();
  EXPECT_EQ(qj["choices"][0]["logprobs"]["content"][0]["token"], "\n");
  EXPECT_EQ(qj["choices"][0]["logprobs"]["content"][1]["token"], "<tool_call>");
  EXPECT_EQ(qj["choices"][0]["message"]["tool_calls"].size(), 1u) << q.body;
}

TEST_F(OpenAIHttpTest, AutoAndNoneToolChoiceBehaveAsBefore) {
  // "auto" is the default; "none" is the same request without the tools in the prompt.
  const Json plain = Post("/v1/chat/completions", ToolChat(nullptr)).json();
  const Json autos = Post("/v1/chat/completions", ToolChat("auto")).json();
  EXPECT_EQ(autos["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"]);
  EXPECT_EQ(autos["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);
  EXPECT_EQ(autos["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]);  // every token
  const Json none = Post("/v1/chat/completions", ToolChat("none")).json();
  Json no_tools = ToolChat(nullptr);
  no_tools.erase("tools");
  const Json bare = Post("/v1/chat/completions", no_tools).json();
  EXPECT_EQ(none["choices"][0]["message"]["content"], bare["choices"][0]["message"]["content"]);
  EXPECT_EQ(none["usage"]["prompt_tokens"], bare["usage"]["prompt_tokens"]);
  EXPECT_EQ(none["choices"][0]["logprobs"], bare["choices"][0]["logprobs"]);
  EXPECT_LT(none["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);
}

TEST_F(OpenAIHttpTest, EveryBadRequestGetsItsStatusAndChangesNothing) {
  const int64_t steps = server_->engine()->Stats().steps;
  const Json ok = Completion("hi", 4);
  const auto with = [&](const char* key, Json value) {
    Json j = ok;
    j[key] = std::move(value);
    return j.dump();
  };
  Json stops = Json::array();
  for (int i = 0; i < 100000; ++i) stops.push_back(absl::StrCat("s", i));
  Json few_stops = Json::array();
  for (int i = 0; i < 40; ++i) few_stops.push_back(absl::StrCat("s", i));
  Json no_model = ok;
  no_model.erase("model");
  struct Case {
    std::string what, route, body;
    long status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"invalid JSON", "/v1/completions", "{\"model\": \"tiny\",", 400, "invalid JSON"},
      {"not an object", "/v1/completions", "[1, 2]", 400, "must be a JSON object"},
      {"invalid UTF-8", "/v1/completions",
       "{\"model\": \"tiny\", \"prompt\": \"a\xff\xfe\", \"max_tokens\": 2}", 400, "invalid JSON"},
      {"too deep", "/v1/completions", std::string(100, '[') + std::string(100, ']'), 400,
       "nested deeper than 64"},
      {"wrong type", "/v1/completions", with("max_tokens", "4"), 400,
       "'max_tokens' must be an integer, not a string"},
      {"unknown field", "/v1/completions", with("temprature", 1), 400,
       "unknown field 'temprature'"},
      {"no model", "/v1/completions", no_model.dump(), 400, "'model' is required"},
      {"unknown model", "/v1/completions", with("model", "gpt-4"), 404,
       "the model 'gpt-4' does not exist"},
      {"10^5 stop strings", "/v1/completions", with("stop", stops), 400,
       "has 100000 strings; at most 64"},
      {"too many stop strings for the engine", "/v1/completions", with("stop", few_stops), 400,
       "stop"},
      {"n > 1", "/v1/completions", with("n", 2), 400, "'n' must be in [1, 1]"},
      {"batch of prompts", "/v1/completions", with("prompt", {"a", "b"}), 400,
       "batch of 2 prompts"},
      {"out of vocabulary", "/v1/completions", with("prompt", {1, 999999}), 400, "999999"},
      {"max_tokens over the limit", "/v1/completions", with("max_tokens", 70000), 400,
       "'max_tokens' = 70000 must be in [1, 65536]"},
      // The sampling bounds are the engine's (core/request/sampling_params.h), the same for every
      // API.
      {"top_p 0", "/v1/completions", with("top_p", 0), 400, "top_p must be in (0, 1]"},
      {"min_p 1", "/v1/completions", with("min_p", 1), 400, "min_p must be in [0, 1)"},
      {"repetition_penalty 0", "/v1/completions", with("repetition_penalty", 0), 400,
       "repetition_penalty must be finite and > 0"},
      {"21 alternatives", "/v1/completions", with("logprobs", 21), 400,
       "'logprobs' must be in [0, 20]"},
      {"negative mtp_draft_tokens", "/v1/completions", with("mtp_draft_tokens", -1), 400,
       "'mtp_draft_tokens' must be in [0, "},
      {"mtp_draft_tokens over the bound", "/v1/completions", with("mtp_draft_tokens", 9), 400,
       "mtp_draft_tokens must be in [0, 8]"},
      {"mtp_draft_tokens without an MTP layer", "/v1/completions", with("mtp_draft_tokens", 2), 422,
       "does not run the MTP layer"},
      {"duplicate key", "/v1/completions",
       R"({"model": "tiny", "prompt": "a", "max_tokens": 2, "max_tokens": 3})", 400,
       "duplicate key 'max_tokens'"},
      {"bytes after the value", "/v1/completions", ok.dump() + " {}", 400, "invalid JSON"},
      {"message without content", "/v1/chat/completions",
       Json{{"model", "tiny"}, {"messages", {{{"role", "user"}}}}}.dump(), 400,
       "messages[0]' has no 'content'"},
      {"parameters not an object", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}}}}
           .dump(),
       400, "'tools[0].function.parameters' must be an object"},
      {"4,097 messages", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", Json(std::vector<Json>(4097, Json{{"role", "user"}, {"content", "x"}}))}}
           .dump(),
       400, "has 4097 messages; at most 4096"},
      {"257 tools", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tools", Json(std::vector<Json>(257, Tool("f")))}}
           .dump(),
       400, "has 257 tools; at most 256"},
      {"temperature", "/v1/completions", with("temperature", 3), 400,
       "'temperature' must be in [0, 2]"},
      {"penalty", "/v1/completions", with("presence_penalty", 0.5), 400, "not supported"},
      {"no messages", "/v1/chat/completions", Json{{"model", "tiny"}}.dump(), 400,
       "'messages' is required"},
      {"bad role", "/v1/chat/completions",
       Json{{"model", "tiny"}, {"messages", {{{"role", "robot"}, {"content", "x"}}}}}.dump(), 400,
       "messages[0].role"},
      {"image part", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}
           .dump(),
       400, "text only"},
      {"tool_choice required without tools", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tool_choice", "required"}}
           .dump(),
       400, "tool_choice \"required\" needs tools"},
      {"tool_choice names a function not in tools", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tools", {Tool("get_weather")}},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}}
           .dump(),
       400, "'get_time', which is not in tools (get_weather)"},
      {"tool_choice of another kind", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tool_choice", "sometimes"}}
           .dump(),
       400, "tool_choice"},
      {"tool_choice without a name", "/v1/chat/completions",
       Json{{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tools", {Tool("get_weather")}},
            {"tool_choice", {{"type", "function"}, {"function", Json::object()}}}}
           .dump(),
       400, "has no 'name'"},
      {"huge body", "/v1/completions", std::string(17 << 20, ' '), 413, "over the server's limit"},
  };
  for (const Case& c : cases) {
    const HttpResponse r = Call("POST", base_ + c.route, c.body);
    EXPECT_EQ(r.status, c.status) << c.what << ": " << r.body;
    const Json j = r.json();
    ASSERT_TRUE(j.contains("error")) << c.what << ": " << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.message), std::string::npos)
        << c.what << ": " << r.body;
    EXPECT_TRUE(j["error"].contains("type")) << c.what;
  }
  EXPECT_EQ(Call("GET", base_ + "/v1/completions", "").status, 405);
  EXPECT_EQ(Call("POST", base_ + "/v1/models", "").status, 405);
  const HttpResponse missing = Call("GET", base_ + "/v2/models", "");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(server_->engine()->Stats().steps, steps);  // nothing reached the engine
  // And the server still serves.
  EXPECT_EQ(Post("/v1/completions", ok).status, 200);
  // The call is counted once its handler returns, just after the client has its answer.
  EXPECT_TRUE(WaitUntil([&] {
    return Counter("glmserve_requests_total{api=\"openai\",code=\"OK\",rpc=\"/v1/completions\"}") ==
           1;
  }));
  EXPECT_TRUE(WaitUntil([&] {
    return Counter(
               "glmserve_requests_total{api=\"openai\",code=\"INVALID_ARGUMENT\",rpc=\"/v1/"
               "completions\"}") == 24;
  }));
}

TEST_F(OpenAIHttpTest, StreamingClientDisconnectCancelsTheEngineRequest) {
  Json request = Completion("Once upon a time", 30000);
  request["stream"] = true;
  const int64_t before = server_->engine()->Stats().tokens_generated;
  int chunks = 0;
  RequestOptions o;
  o.on_data = [&](const std::string&) { return ++chunks < 3; };
  const HttpResponse r = Post("/v1/completions", request, o);
  EXPECT_EQ(r.curl, CURLE_WRITE_ERROR);
  ASSERT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
  EXPECT_LT(server_->engine()->Stats().tokens_generated - before, 20000);
  ASSERT_TRUE(WaitUntil([&] {
    return Counter(
               "glmserve_requests_total{api=\"openai\",code=\"CANCELLED\",rpc=\"/v1/"
               "completions\"}") == 1;
  }));
}

TEST_F(OpenAIHttpTest, NonStreamingClientDisconnectCancelsTheEngineRequest) {
  const int64_t before = server_->engine()->Stats().tokens_generated;
  RequestOptions o;
  o.timeout_ms = 300;  // the client gives up (and closes) long before 30000 tokens
  const HttpResponse r = Post("/v1/completions", Completion("Once upon a time", 30000), o);
  EXPECT_EQ(r.curl, CURLE_OPERATION_TIMEDOUT);
  ASSERT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
  EXPECT_LT(server_->engine()->Stats().tokens_generated - before, 20000);
  ASSERT_TRUE(WaitUntil([&] {
    return Counter(
               "glmserve_requests_total{api=\"openai\",code=\"CANCELLED\",rpc=\"/v1/"
               "completions\"}") == 1;
  }));
}

// A raw TCP client that sends one request and then reads nothing (a stalled reader).
int SendAndStall(int port, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string request = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\n\r\n", body);
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  return fd;
}

TEST_F(OpenAIHttpTest, AStalledClientDoesNotHoldUpOthers) {
  // Two clients that stream a long generation and never read: their workers block on full
  // socket buffers, nobody else's.
  Json request = Completion("Once upon a time", 30000);
  request["stream"] = true;
  request["logprobs"] = 5;  // large events fill the socket buffers sooner
  const int a = SendAndStall(server_->http_port(), request.dump());
  const int b = SendAndStall(server_->http_port(), request.dump());
  ASSERT_TRUE(WaitUntil([&] { return server_->engine()->Stats().running == 2; }));
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    const HttpResponse r = Post("/v1/completions", Completion("Hello", 8));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  EXPECT_EQ(Call("GET", base_ + "/v1/models", "").status, 200);
  // Closing the stalled connections cancels their generations.
  close(a);
  close(b);
  ASSERT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
  ASSERT_TRUE(WaitUntil([&] {
    return Counter(
               "glmserve_requests_total{api=\"openai\",code=\"CANCELLED\",rpc=\"/v1/"
               "completions\"}") == 2;
  }));
}

TEST(OpenAIHttpDrainTest, DrainEndsStreamsInFlightAndRefusesNewRequests) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  std::unique_ptr<GlmServer> server = StartHttpServer();
  ASSERT_NE(server, nullptr);
  const std::string url = absl::StrCat("http://127.0.0.1:", server->http_port());
  Json request = Completion("Once upon a time", 30000);
  request["stream"] = true;
  HttpResponse streamed;
  std::thread client([&] { streamed = Call("POST", url + "/v1/completions", request.dump()); });
  ASSERT_TRUE(WaitUntil([&] { return server->engine()->Stats().running == 1; }));
  server->Drain(absl::Milliseconds(100));
  client.join();
  // The stream had started (200); the drain's abort ends it with an error event (the
  // retryable 503 kind), then [DONE].
  EXPECT_EQ(streamed.status, 200);
  const std::vector<std::string> events = streamed.events();
  ASSERT_GE(events.size(), 2u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const Json error = Json::parse(events[events.size() - 2]);
  ASSERT_TRUE(error.contains("error")) << error;
  EXPECT_EQ(error["error"]["code"], "unavailable") << error;
  // After the drain the port is closed.
  EXPECT_NE(Call("GET", url + "/v1/models", "").curl, CURLE_OK);
}

TEST(OpenAIHttpAuthTest, BearerTokensAsOnTheGrpcApi) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const std::string path = ::testing::TempDir() + "/openai_tokens";
  std::ofstream(path) << "sesame\n";
  ServerOptions options = HttpOptions();
  options.auth_token_file = path;
  std::unique_ptr<GlmServer> server = StartHttpServer(options);
  ASSERT_NE(server, nullptr);
  const std::string url = absl::StrCat("http://127.0.0.1:", server->http_port());
  const std::string body = Completion("hi", 2).dump();
  const int64_t steps = server->engine()->Stats().steps;
  for (const char* token : {"", "wrong"}) {
    RequestOptions o;
    o.token = token;
    HttpResponse r = Call("POST", url + "/v1/completions", body, o);
    EXPECT_EQ(r.status, 401) << r.body;
    EXPECT_EQ(r.json()["error"]["type"], "authentication_error");
    EXPECT_EQ(Call("GET", url + "/v1/models", "", o).status, 401);
  }
  EXPECT_EQ(server->engine()->Stats().steps, steps);
  RequestOptions o;
  o.token = "sesame";
  EXPECT_EQ(Call("POST", url + "/v1/completions", body, o).status, 200);
  EXPECT_EQ(Call("GET", url + "/v1/models", "", o).status, 200);
  // The scheme is case-insensitive (RFC 9110 11.1); the token is not.
  EXPECT_TRUE(BearerAuthorized({"sesame"}, "bearer sesame"));
  EXPECT_TRUE(BearerAuthorized({"sesame"}, "BEARER  sesame"));
  EXPECT_FALSE(BearerAuthorized({"sesame"}, "bearer Sesame"));
  EXPECT_FALSE(BearerAuthorized({"sesame"}, "Basic sesame"));
  EXPECT_FALSE(BearerAuthorized({"sesame"}, "Bearersesame"));
  RequestOptions lower;
  lower.header = "Authorization: bearer sesame";
  EXPECT_EQ(Call("GET", url + "/v1/models", "", lower).status, 200);
}

TEST(OpenAIHttpAccessLogTest, OneLinePerCall) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const std::string path = ::testing::TempDir() + "/openai_access_log";
  std::remove(path.c_str());
  ServerOptions options = HttpOptions();
  options.access_log = path;
  options.log_format = LogFormat::kJson;
  std::unique_ptr<GlmServer> server = StartHttpServer(options);
  ASSERT_NE(server, nullptr);
  const std::string url = absl::StrCat("http://127.0.0.1:", server->http_port());
  const HttpResponse ok = Call("POST", url + "/v1/completions", Completion("hi", 3).dump());
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Call("POST", url + "/v1/chat/completions", "{}").status, 400);
  ASSERT_TRUE(WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  server->access_log()->Flush();
  std::ifstream in(path);
  std::vector<Json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(Json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  // Each call is logged after its answer is out: the two lines may come in either order.
  if (lines[0]["rpc"] != "/v1/completions") std::swap(lines[0], lines[1]);
  EXPECT_EQ(lines[0]["rpc"], "/v1/completions");
  EXPECT_EQ(lines[0]["code"], "OK");
  EXPECT_EQ(lines[0]["request_id"], ok.json()["id"]);
  EXPECT_EQ(lines[0]["generated_tokens"], 3);
  EXPECT_EQ(lines[1]["rpc"], "/v1/chat/completions");
  EXPECT_EQ(lines[1]["code"], "INVALID_ARGUMENT");
}

TEST(OpenAIHttpNoTokenizerTest, TextNeedsATokenizer) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  std::unique_ptr<GlmServer> server = StartHttpServer(HttpOptions(), /*tokenizer=*/false);
  ASSERT_NE(server, nullptr);
  const std::string url = absl::StrCat("http://127.0.0.1:", server->http_port());
  Json request = Completion("", 2);
  request["prompt"] = {1, 2, 3};
  const HttpResponse r = Call("POST", url + "/v1/completions", request.dump());
  EXPECT_EQ(r.status, 422) << r.body;
  EXPECT_NE(r.body.find("tokenizer"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace glmserve
