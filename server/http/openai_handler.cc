#include "server/http/openai_handler.h"

#include <chrono>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/base/status_macros.h"
#include "core/request/sampling_params.h"
#include "core/text/text_generation.h"
#include "nlohmann/json.hpp"
#include "server/convert.h"
#include "server/http/openai_error.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// How often a handler waiting for the engine checks that its client is still connected.
constexpr absl::Duration kDisconnectPoll = absl::Milliseconds(50);

double Seconds(glmserve::SteadyTime from, glmserve::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string Dump(const Json& j) {
  // Generated text may hold U+FFFD already; anything else invalid is replaced, not thrown.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A token's text for logprobs: its decoded bytes (a lone part of a character decodes to
// U+FFFD, as Hugging Face's decode does).
std::string TokenText(const TextAssets& text, int32_t id) {
  absl::StatusOr<std::string> s = DetokenizeIds(text, {id}, /*skip_special_tokens=*/false);
  return s.ok() ? *s : absl::StrCat("token_id:", id);
}

Json Bytes(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// The logprobs of one token, in the route's format.
Json ChatLogprob(const TextAssets& text, const glmserve::TokenEvent& t) {
  const std::string token = TokenText(text, t.token);
  Json top = Json::array();
  for (const glmserve::TokenLogprob& alt : t.top) {
    const std::string s = TokenText(text, alt.token);
    top.push_back({{"token", s}, {"logprob", alt.logprob}, {"bytes", Bytes(s)}});
  }
  return {{"token", token}, {"logprob", t.logprob}, {"bytes", Bytes(token)}, {"top_logprobs", top}};
}

struct CompletionLogprobs {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  void Add(const TextAssets& text, const glmserve::TokenEvent& t, int32_t top_n, int64_t offset) {
    tokens.push_back(TokenText(text, t.token));
    token_logprobs.push_back(t.logprob);
    Json alts = Json::object();
    for (const glmserve::TokenLogprob& alt : t.top) alts[TokenText(text, alt.token)] = alt.logprob;
    top.push_back(top_n > 0 ? alts : Json(nullptr));
    offsets.push_back(offset);
  }
  Json ToJson() const {
    return {{"tokens", tokens},
            {"token_logprobs", token_logprobs},
            {"top_logprobs", top},
            {"text_offset", offsets}};
  }
};

// The engine request and the text stream of an admitted request (the wire checks of the
// native API, then the text rules of core/text).
struct Prepared {
  glmserve::GenerateRequest engine;
  std::unique_ptr<TextStream> stream;
};

absl::StatusOr<Prepared> Prepare(const OpenAIRequest& r, const Backend& backend, Metrics* metrics) {
  const TextAssets& text = *backend.text;
  // The endpoint answers in text, whatever the prompt: it needs the tokenizer.
  RETURN_IF_ERROR(MissingTextError(text, r.chat, r.chat ? "messages" : "the OpenAI endpoint"));
  std::vector<int32_t> ids;
  bool starts_in_reasoning = false;
  ForcedTokens forced;  // tool_choice's
  if (r.chat || r.prompt_text.has_value()) {
    TextInput input;
    input.prompt_text = r.prompt_text;
    input.messages = r.messages;
    input.chat = r.chat_options;
    input.tool_choice = r.tool_choice;
    const auto start = Clock::now();
    absl::StatusOr<TextPrompt> built =
        BuildTextPrompt(text, input, static_cast<size_t>(backend.limits.max_prompt_tokens));
    metrics->RecordTokenizer(r.chat ? "chat" : "encode", Seconds(start, Clock::now()));
    if (absl::IsResourceExhausted(built.status())) {
      // The chat's structural bounds (messages, tools, bytes): the request's shape, a 400,
      // never 429 (which clients retry).
      return absl::InvalidArgumentError(built.status().message());
    }
    ASSIGN_OR_RETURN(TextPrompt prompt, std::move(built));
    ids = std::move(prompt.ids);
    starts_in_reasoning = prompt.starts_in_reasoning;
    forced = std::move(prompt.forced);
  } else {
    ids = r.prompt_ids;
  }
  Prepared p;
  ASSIGN_OR_RETURN(p.engine, ToEngineRequest(r, std::move(ids), backend));
  ApplyTextDefaults(text, &p.engine);
  TextStreamOptions options;
  options.forced_tool_call = !forced.tokens.empty();
  p.engine.forced = std::move(forced);
  options.chat = r.chat;
  options.starts_in_reasoning = starts_in_reasoning;
  options.stop = r.stop;
  options.skip_special_tokens = r.skip_special_tokens;
  ASSIGN_OR_RETURN(p.stream, TextStream::Create(text, std::move(options)));
  // The same input-kind count as glmserve.v1's Generate.
  metrics->RecordGenerateInput(r.chat ? "messages" : r.prompt_text ? "prompt_text" : "token_ids");
  return p;
}

// Builds and sends the route's objects (chunks while streaming, one object at the end).
class Responder {
 public:
  Responder(const OpenAIRequest& r, const TextAssets& text, HttpExchange& exchange,
            std::string model)
      : r_(r),
        text_(text),
        ex_(exchange),
        model_(std::move(model)),
        id_(absl::StrCat(r.chat ? "chatcmpl-" : "cmpl-", RandomHex(24))),
        created_(absl::ToUnixSeconds(absl::Now())) {}

  const std::string& id() const { return id_; }

  // False once the client is gone.
  bool Start() {
    if (!r_.stream) return true;
    if (!ex_.StartEventStream()) return false;
    if (r_.chat) return Send(Chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
    return true;
  }

  bool Token(const glmserve::TokenEvent& t, const TextDelta& delta) {
    Json logprobs = nullptr;
    if (r_.logprobs) {
      if (r_.chat) {
        Json entry = ChatLogprob(text_, t);
        chat_logprobs_.push_back(entry);
        logprobs = {{"content", Json::array({entry})}};
      } else {
        CompletionLogprobs one;
        one.Add(text_, t, r_.top_logprobs, static_cast<int64_t>(text_so_far_));
        completion_logprobs_.Add(text_, t, r_.top_logprobs, static_cast<int64_t>(text_so_far_));
        logprobs = one.ToJson();
      }
    }
    text_so_far_ += delta.text.size();
    if (!r_.stream) return true;
    if (delta.empty() && logprobs.is_null()) return true;
    if (!r_.chat) return Send(Chunk(delta.text, logprobs, nullptr));
    Json d = ChatDeltaJson(delta, &tool_calls_sent_);
    if (d.empty() && logprobs.is_null()) return true;
    return Send(Chunk(d, logprobs, nullptr));
  }

  // The end of a successful generation.
  void Finish(const TextResult& result, const glmserve::FinishEvent& finish) {
    const char* reason = TextFinishReasonName(result.reason);
    if (r_.stream) {
      // What Finish released (held bytes, a tail that could have begun a stop string).
      if (!result.last.empty()) {
        if (!r_.chat) {
          Send(Chunk(result.last.text, nullptr, nullptr));
        } else {
          Json d = ChatDeltaJson(result.last, &tool_calls_sent_);
          if (!d.empty()) Send(Chunk(d, nullptr, nullptr));
        }
      }
      Send(Chunk(r_.chat ? Json::object() : Json(""), nullptr, reason));
      if (r_.include_usage) {
        Json usage = Envelope();
        usage["choices"] = Json::array();
        usage["usage"] = UsageJson(finish);
        Send(usage);
      }
      ex_.SendEvent("[DONE]");
      ex_.EndEventStream();
      return;
    }
    Json out = Envelope();
    out["object"] = r_.chat ? "chat.completion" : "text_completion";
    Json choice = {{"index", 0}, {"finish_reason", reason}};
    if (r_.chat) {
      choice["message"] = ChatMessageJson(result);
      choice["logprobs"] = r_.logprobs ? Json{{"content", chat_logprobs_}} : Json(nullptr);
    } else {
      choice["text"] = result.text;
      choice["logprobs"] = r_.logprobs ? completion_logprobs_.ToJson() : Json(nullptr);
    }
    out["choices"] = Json::array({choice});
    out["usage"] = UsageJson(finish);
    ex_.SendJson(200, Dump(out));
  }

  // A failure after the engine accepted the request.
  void Fail(const absl::Status& status) {
    if (!r_.stream || ex_.http_status() == 0) {
      ex_.SendError(status);
      return;
    }
    // Headers (200) are out: the error travels as an event, as vLLM and OpenAI do.
    ex_.SendEvent(ToHttpError(status).body);
    ex_.SendEvent("[DONE]");
    ex_.EndEventStream();
  }

 private:
  Json Envelope() const {
    return {{"id", id_},
            {"object", r_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_}};
  }
  Json Chunk(Json delta, Json logprobs, const char* finish_reason) const {
    Json c = Envelope();
    Json choice = {{"index", 0},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", finish_reason ? Json(finish_reason) : Json(nullptr)}};
    choice[r_.chat ? "delta" : "text"] = std::move(delta);
    c["choices"] = Json::array({choice});
    return c;
  }
  bool Send(const Json& j) { return ex_.SendEvent(Dump(j)); }

  const OpenAIRequest& r_;
  const TextAssets& text_;
  HttpExchange& ex_;
  const std::string model_;
  const std::string id_;
  const int64_t created_;
  size_t text_so_far_ = 0;
  int tool_calls_sent_ = 0;
  Json chat_logprobs_ = Json::array();
  CompletionLogprobs completion_logprobs_;
};

}  // namespace

namespace {

Json ModelObject(const Backend& backend) {
  static const int64_t kStarted = absl::ToUnixSeconds(absl::Now());
  return {{"id", backend.info.model()},
          {"object", "model"},
          {"created", kStarted},
          {"owned_by", "glmserve"},
          {"max_model_len", backend.info.config().max_position_embeddings()}};
}

absl::Status UnknownModel(const Backend& backend, const std::string& model) {
  return absl::NotFoundError(absl::StrCat("the model '", model.substr(0, 128),
                                          "' does not exist; this server serves '",
                                          backend.info.model(), "'"));
}

}  // namespace

std::string ModelsJson(const Backend& backend) {
  return Dump({{"object", "list"}, {"data", Json::array({ModelObject(backend)})}});
}

absl::StatusOr<std::string> ModelJson(const Backend& backend, const std::string& id) {
  if (id != backend.info.model()) return UnknownModel(backend, id);
  return Dump(ModelObject(backend));
}

absl::StatusOr<GenerateRequest> ToEngineRequest(const OpenAIRequest& r, std::vector<int32_t> prompt,
                                                const Backend& backend) {
  const ServingLimits& limits = backend.limits;
  const int64_t positions = backend.engine->model().config().max_position_embeddings;
  const char* prompt_field = r.chat ? "messages" : "prompt";
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len == 0)
    return absl::InvalidArgumentError(absl::StrCat("'", prompt_field, "' is empty"));
  if (prompt_len > limits.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("'", prompt_field, "' has ", prompt_len,
                                                   " tokens; the limit is ",
                                                   limits.max_prompt_tokens));
  }
  GenerateRequest out;
  out.prompt = std::move(prompt);
  int64_t max_new = limits.default_max_new_tokens;
  if (r.max_tokens) {
    max_new = *r.max_tokens;
    if (max_new < 1 || max_new > limits.max_new_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("'max_tokens' = ", max_new, " must be in [1, ", limits.max_new_tokens, "]"));
    }
    if (prompt_len + max_new > positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prompt (", prompt_len, " tokens) + 'max_tokens' (", max_new,
                       ") exceeds the model's ", positions, " positions"));
    }
  } else if (prompt_len + max_new > positions) {
    // The default shrinks to fit rather than failing a request that asked for nothing.
    max_new = positions - prompt_len;
    if (max_new < 1) {
      return absl::InvalidArgumentError(absl::StrCat("the prompt (", prompt_len,
                                                     " tokens) leaves no room in the model's ",
                                                     positions, " positions"));
    }
  }
  out.stop.max_new_tokens = static_cast<int32_t>(max_new);
  out.stop.stop_token_ids = r.stop_token_ids;
  out.stop.ignore_eos = r.ignore_eos;
  out.sampling.temperature = r.temperature;
  out.sampling.top_p = r.top_p;
  out.sampling.top_k = r.top_k;
  out.sampling.min_p = r.min_p;
  out.sampling.repetition_penalty = r.repetition_penalty;
  // OpenAI's requests without a seed sample differently each time; with one, glmserve's
  // determinism contract applies (same seed, same tokens, whatever the batch).
  out.sampling.seed =
      r.seed ? *r.seed : std::random_device{}() * uint64_t{0x100000001} + std::random_device{}();
  // The engine's own rules, checked here so that a bad value is refused before admission;
  // their messages name the fields by the names OpenAI's requests use too.
  RETURN_IF_ERROR(ValidateSamplingParams(out.sampling));
  out.logprobs = r.logprobs || r.top_logprobs > 0;
  if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("'", r.chat ? "top_logprobs" : "logprobs",
                                                   "' must be in [0, ", kMaxTopLogprobs, "]"));
  }
  out.top_logprobs = r.top_logprobs;
  out.mtp_draft_tokens = r.mtp_draft_tokens.value_or(-1);
  return out;
}

// Streams a generation's events to its client until the FinishEvent, which it returns; the
// engine request is cancelled when the client leaves (*gone) or a stop string matched. *status:
// INTERNAL for a token the tokenizer cannot decode.
glmserve::FinishEvent StreamEvents(glmserve::EventQueue& queue, glmserve::Engine& engine,
                                   glmserve::RequestId id, Responder& responder, TextStream& stream,
                                   HttpExchange& exchange, Metrics* metrics,
                                   glmserve::SteadyTime arrival, bool* gone, absl::Status* status) {
  bool cancelled = false;
  std::optional<glmserve::SteadyTime> last_token;
  const auto cancel = [&] {
    if (!cancelled) engine.Cancel(id);
    cancelled = true;
  };
  if (*gone) cancel();
  glmserve::FinishEvent finish;
  // Checked every kDisconnectPoll whether events flow or not (a busy generation that
  // writes nothing until the end must still notice its client leaving).
  absl::Time next_check = absl::Now() + kDisconnectPoll;
  for (;;) {
    std::optional<glmserve::Event> event = queue.Pop(kDisconnectPoll);
    if (!*gone && absl::Now() >= next_check) {
      next_check = absl::Now() + kDisconnectPoll;
      if (exchange.PeerClosed()) {
        *gone = true;
        cancel();
      }
    }
    if (!event) continue;
    if (auto* token = std::get_if<glmserve::TokenEvent>(&event->body)) {
      if (!last_token) {
        metrics->RecordTimeToFirstToken(Seconds(arrival, token->time));
      } else {
        metrics->RecordInterToken(Seconds(*last_token, token->time));
      }
      last_token = token->time;
      if (*gone || stream.stopped()) continue;  // tokens still in flight after a cancel
      absl::StatusOr<TextDelta> delta = stream.Push(token->token);
      if (!delta.ok()) {
        // An id the tokenizer cannot decode: ApplyTextDefaults keeps sampling away from them,
        // so this is a bug, reported as such.
        *status = absl::InternalError(delta.status().message());
        cancel();
        continue;
      }
      if (!responder.Token(*token, *delta)) {
        *gone = true;
        cancel();
      } else if (delta->stopped) {
        cancel();  // a stop string matched: no more steps for this request
        metrics->RecordStopString();
      }
      continue;
    }
    if (auto* f = std::get_if<glmserve::FinishEvent>(&event->body)) {
      finish = std::move(*f);
      break;
    }
  }
  return finish;
}

OpenAICallResult ServeCompletion(GlmServiceImpl& glm, const Backend& backend, std::string body,
                                 bool chat, HttpExchange& exchange, glmserve::SteadyTime arrival) {
  OpenAICallResult result;
  const Rpc rpc = chat ? Rpc::kOpenAIChatCompletions : Rpc::kOpenAICompletions;
  absl::StatusOr<OpenAIRequest> request = ParseOpenAIBody(body, chat);
  body = std::string();  // the parsed request holds what is needed
  if (!request.ok()) {
    result.status = request.status();
    return result;
  }
  const OpenAIRequest& r = *request;
  if (r.model != backend.info.model()) {
    result.status = UnknownModel(backend, r.model);
    return result;
  }
  absl::StatusOr<Prepared> prepared = Prepare(r, backend, glm.metrics());
  if (!prepared.ok()) {
    result.status = prepared.status();
    return result;
  }
  if (!glm.AcquireStream()) {
    result.status = absl::ResourceExhaustedError(absl::StrCat(
        "too many concurrent generations (limit ", glm.options().max_concurrent_streams, ")"));
    return result;
  }
  struct StreamSlot {
    GlmServiceImpl& glm;
    ~StreamSlot() { glm.ReleaseStream(); }
  } slot{glm};

  Responder responder(r, *backend.text, exchange, backend.info.model());
  result.request_id = responder.id();
  glmserve::Request engine_request(std::move(prepared->engine));
  // The deadline caps of the gRPC APIs (HTTP has no deadline of its own to carry).
  const ServiceOptions& o = glm.options();
  absl::Duration limit = o.default_deadline;
  if (o.max_deadline > absl::ZeroDuration() &&
      (limit == absl::ZeroDuration() || limit > o.max_deadline)) {
    limit = o.max_deadline;
  }
  if (limit > absl::ZeroDuration()) {
    engine_request.deadline = arrival + absl::ToChronoNanoseconds(limit);
  }
  engine_request.client_request_id = result.request_id;
  // Shared with the callback: the engine may still be inside it when the handler returns.
  auto queue = std::make_shared<glmserve::EventQueue>();
  glmserve::Engine* engine = backend.engine;
  absl::StatusOr<glmserve::RequestId> id = engine->Submit(
      std::move(engine_request), [queue](glmserve::Event&& e) { queue->Callback()(std::move(e)); });
  if (!id.ok()) {
    result.status = id.status();
    return result;
  }

  Metrics* metrics = glm.metrics();
  TextStream& stream = *prepared->stream;
  bool gone = !responder.Start();  // the client left before the first byte
  const glmserve::FinishEvent finish = StreamEvents(
      *queue, *engine, *id, responder, stream, exchange, metrics, arrival, &gone, &result.status);
  if (finish.times.first_scheduled) {
    metrics->RecordQueue(rpc, Seconds(arrival, *finish.times.first_scheduled));
  }
  metrics->RecordTokens(finish.prompt_tokens, finish.generated_tokens);
  result.finish = finish;
  if (gone) {
    result.status = absl::CancelledError("the client disconnected");
    return result;
  }
  if (!result.status.ok()) {
    responder.Fail(result.status);
    return result;
  }
  // Ended by a stop string: the engine reports the cancel; the call itself ended OK.
  if (!finish.status.ok() && !stream.stopped()) {
    result.status = finish.status;
    responder.Fail(finish.status);
    return result;
  }
  if (stream.stopped()) {
    result.finish->reason = glmserve::FinishReason::kStop;
    result.finish->status = absl::OkStatus();
  }
  const TextResult text =
      stream.Finish(stream.stopped() ? glmserve::FinishReason::kStop : finish.reason);
  responder.Finish(text, finish);
  result.status = absl::OkStatus();
  return result;
}

}  // namespace glmserve
