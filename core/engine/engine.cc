#include "core/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/engine/engine_impl.h"

namespace glmserve {

// ---- EventQueue ----------------------------------------------------------------------------

EventCallback EventQueue::Callback() {
  return [this](Event&& event) {
    // Notify under the lock: a waiter that pops the final event may destroy the queue as soon
    // as it can take the mutex, so nothing here may touch the queue after unlocking.
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
    cv_.notify_one();
  };
}

// GCC 12 reports a false -Wmaybe-uninitialized on moving a std::variant of these events.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
std::optional<Event> EventQueue::Pop(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [this] { return !events_.empty(); };
  if (timeout == absl::InfiniteDuration()) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), ready)) {
    return std::nullopt;
  }
  std::optional<Event> event(std::in_place, std::move(events_.front()));
  events_.pop_front();
  return event;
}
#pragma GCC diagnostic pop

// ---- Engine ----------------------------------------------------------------------------------

namespace {

constexpr int64_t kDefaultKvCapacityTokens = 32768;

}  // namespace

absl::Status ValidateSessionId(const std::string& session_id) {
  if (session_id.empty()) return absl::InvalidArgumentError("session_id is empty");
  if (session_id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("session_id is ", session_id.size(),
                                                   " bytes; the limit is ", kMaxSessionIdBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateEngineOptions(const EngineOptions& o) {
  // Upper bounds keep products such as blocks x block size x layers far from overflow and
  // catch typos (a block of 2^40 tokens) with a message instead of a crash.
  const struct {
    const char* name;
    int64_t value, min, max;
  } ranges[] = {
      {"max_batch_tokens", o.max_batch_tokens, 1, int64_t{1} << 16},
      {"max_running", o.max_running, 1, int64_t{1} << 16},
      {"max_waiting", o.max_waiting, 0, int64_t{1} << 20},
      {"block_size", o.block_size, 1, 1024},
      {"kv_capacity_tokens", o.kv_capacity_tokens, 0, int64_t{1} << 36},
      {"max_sessions", o.max_sessions, 0, int64_t{1} << 16},
      {"max_session_tokens", o.max_session_tokens, 0, int64_t{1} << 36},
      {"max_prompt_tokens", o.limits.max_prompt_tokens, 0, int64_t{1} << 31},
      {"max_new_tokens", o.limits.max_new_tokens, 0, int64_t{1} << 31},
      {"default_max_new_tokens", o.limits.default_max_new_tokens, 1, int64_t{1} << 31},
      {"mtp_draft_tokens", o.mtp_draft_tokens, 0, kMaxMtpDraftTokens},
      {"mtp_max_batch", o.mtp_max_batch, 0, int64_t{1} << 16},
  };
  for (const auto& r : ranges) {
    if (r.value < r.min || r.value > r.max) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.name, " must be in [", r.min, ", ", r.max, "], got ", r.value));
    }
  }
  if (o.limits.max_new_tokens > 0 && o.limits.default_max_new_tokens > o.limits.max_new_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_max_new_tokens=", o.limits.default_max_new_tokens,
                     " is above max_new_tokens=", o.limits.max_new_tokens));
  }
  if (!(o.session_kv_fraction >= 0.0 && o.session_kv_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_kv_fraction must be in [0, 1], got ", o.session_kv_fraction));
  }
  if (o.session_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("session_idle_timeout must be > 0");
  }
  if (o.session_eviction_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("session_eviction_grace must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ModelRunner> model,
                                                       const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("no model");
  RETURN_IF_ERROR(ValidateEngineOptions(options));
  EngineOptions o = options;
  const int64_t max_positions = model->config().max_position_embeddings;
  if (o.kv_capacity_tokens == 0) o.kv_capacity_tokens = kDefaultKvCapacityTokens;
  // A limit above the model's positions could never be reached; 0 means "the model's".
  RequestLimits& l = o.limits;
  l.max_prompt_tokens =
      l.max_prompt_tokens > 0 ? std::min(l.max_prompt_tokens, max_positions) : max_positions;
  l.max_new_tokens =
      l.max_new_tokens > 0 ? std::min(l.max_new_tokens, max_positions) : max_positions;
  l.default_max_new_tokens = std::min(l.default_max_new_tokens, l.max_new_tokens);
  RETURN_IF_ERROR(model->SetKvCacheDType(o.kv_cache_dtype));
  if (o.mtp_draft_tokens > 0) RETURN_IF_ERROR(model->EnableMtp());  // before the cache
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                   model->CreateCache(BlocksFor(o.kv_capacity_tokens, o.block_size), o.block_size));
  std::unique_ptr<Engine> engine(new Engine(std::move(model), o));
  engine->impl_ = std::make_unique<Impl>(engine->model_.get(), o, std::move(cache));
  return engine;
}

Engine::Engine(std::unique_ptr<ModelRunner> model, const EngineOptions& options)
    : model_(std::move(model)), options_(options) {}

Engine::~Engine() { impl_.reset(); }

int64_t Engine::kv_capacity_tokens() const { return impl_->cache().capacity_tokens(); }
// A tensor-parallel group: every rank's cache (each holds its KV heads, or the whole latent row).
int64_t Engine::kv_bytes_per_token() const { return impl_->cache().group_bytes_per_token(); }
DType Engine::kv_cache_dtype() const { return impl_->cache().dtype(); }

namespace {

absl::Status ValidateGenerate(const GenerateRequest& g, const ModelRunner& model,
                              const EngineOptions& o, int64_t total_blocks) {
  const ModelConfig& c = model.config();
  if (!model.has_embedding() || !model.has_head()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Generate needs the whole model; this server serves layers [", model.layer_begin(), ", ",
        model.layer_end(), ") of ", c.num_hidden_layers, " (use Forward)"));
  }
  if (g.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (static_cast<int64_t>(g.prompt.size()) > o.limits.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt has ", g.prompt.size(), " tokens; the limit is ", o.limits.max_prompt_tokens));
  }
  for (size_t i = 0; i < g.prompt.size(); ++i) {
    if (g.prompt[i] < 0 || g.prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " (", g.prompt[i],
                                                     ") is outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  if (g.stop.max_new_tokens <= 0 || g.stop.max_new_tokens > o.limits.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must be in [1, ",
                                                   o.limits.max_new_tokens, "], got ",
                                                   g.stop.max_new_tokens));
  }
  for (int32_t id : g.stop.stop_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", id, " is outside the vocabulary"));
    }
  }
  RETURN_IF_ERROR(ValidateSamplingParams(g.sampling));
  if (g.sample_vocab_limit < 0 || g.sample_vocab_limit > c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("sample_vocab_limit must be in [0, ",
                                                   c.vocab_size, "], got ", g.sample_vocab_limit));
  }
  if (g.top_logprobs < 0 || g.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "]"));
  }
  if (g.forced.tokens.size() > kMaxForcedTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("forced tokens: ", g.forced.tokens.size(), "; at most ", kMaxForcedTokens));
  }
  // A forced token must be one the request could have sampled.
  const int32_t forced_limit = g.sample_vocab_limit > 0 ? g.sample_vocab_limit : c.vocab_size;
  for (size_t i = 0; i < g.forced.tokens.size(); ++i) {
    if (g.forced.tokens[i] < 0 || g.forced.tokens[i] >= forced_limit) {
      return absl::InvalidArgumentError(absl::StrCat("forced token ", i, " (", g.forced.tokens[i],
                                                     ") is outside the sampled ids [0, ",
                                                     forced_limit, ")"));
    }
  }
  if (g.forced.after_token < -1 || g.forced.after_token >= c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("forced after_token ", g.forced.after_token,
                                                   " is neither -1 nor in the vocabulary"));
  }
  if (g.mtp_draft_tokens < -1 || g.mtp_draft_tokens > kMaxMtpDraftTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("mtp_draft_tokens must be in [0, ", kMaxMtpDraftTokens,
                     "] (or -1: the server's), got ", g.mtp_draft_tokens));
  }
  if (g.mtp_draft_tokens > 0 && o.mtp_draft_tokens == 0) {
    return absl::FailedPreconditionError(
        "mtp_draft_tokens > 0, but this server does not run the MTP layer (start it with "
        "--mtp_draft_tokens; docs/mtp.md)");
  }
  const int64_t total = static_cast<int64_t>(g.prompt.size()) + g.stop.max_new_tokens;
  if (static_cast<int64_t>(g.prompt.size()) >= c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", g.prompt.size(),
                                                   " tokens; the model's context is ",
                                                   c.max_position_embeddings));
  }
  const int64_t capped = std::min<int64_t>(total, c.max_position_embeddings);
  if (BlocksFor(capped, o.block_size) > total_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat("prompt plus max_new_tokens (", capped,
                                                     " tokens) exceeds the KV cache capacity of ",
                                                     total_blocks * o.block_size, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status ValidateForward(const ForwardRequest& f, const ModelRunner& model, int64_t run_begin,
                             int64_t run_end) {
  const ModelConfig& c = model.config();
  RETURN_IF_ERROR(ValidateRunSpan(run_begin, run_end, model.layer_begin(), model.layer_end(),
                                  c.num_hidden_layers, f.logits != LogitsRows::kNone));
  if ((run_begin != model.layer_begin() || run_end != model.layer_end()) &&
      !model.supports_sub_spans()) {
    return absl::UnimplementedError(
        absl::StrCat("this server's ", model.device_name(), " backend runs only its whole span [",
                     model.layer_begin(), ", ", model.layer_end(),
                     "); start a server with --layers for [", run_begin, ", ", run_end, ")"));
  }
  if (!f.return_hidden && f.logits == LogitsRows::kNone) {
    return absl::InvalidArgumentError("the request asks for neither hidden states nor logits");
  }
  if (run_begin == 0) {
    if (!f.hidden.empty()) {
      return absl::InvalidArgumentError(
          "a call starting at layer 0 takes token ids, not hidden "
          "states");
    }
    if (f.token_ids.empty()) return absl::InvalidArgumentError("token_ids is empty");
    for (size_t i = 0; i < f.token_ids.size(); ++i) {
      if (f.token_ids[i] < 0 || f.token_ids[i] >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token ", i, " (", f.token_ids[i],
                                                       ") is outside the vocabulary [0, ",
                                                       c.vocab_size, ")"));
      }
    }
  } else {
    if (!f.token_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("a call starting at layer ", run_begin,
                                                     " takes hidden states, not token ids"));
    }
    if (f.num_tokens <= 0) return absl::InvalidArgumentError("hidden states have no rows");
    if (static_cast<int64_t>(f.hidden.size()) != f.num_tokens * c.hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat("hidden states have ", f.hidden.size(),
                                                     " values; expected [", f.num_tokens, ", ",
                                                     c.hidden_size, "]"));
    }
    for (size_t i = 0; i < f.hidden.size(); ++i) {
      if (!std::isfinite(f.hidden[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("hidden states hold a non-finite value at row ", i / c.hidden_size,
                         ", column ", i % c.hidden_size));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::Validate(const GenerateRequest& request) const {
  return ValidateGenerate(request, *model_, options_, impl_->cache().shape().num_blocks);
}

absl::StatusOr<RequestId> Engine::Submit(Request request, EventCallback callback) {
  if (draining_.load()) {
    return absl::UnavailableError("the server is draining and accepts no new requests");
  }
  if (!callback) return absl::InvalidArgumentError("no event callback");
  if (absl::Status health = model_->health(); !health.ok()) return health;
  if (impl_->QueuedCount() >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (", options_.max_waiting, " requests)"));
  }
  const int64_t total_blocks = impl_->cache().shape().num_blocks;
  auto seq = std::make_unique<Sequence>();
  seq->callback = std::move(callback);
  seq->deadline = request.deadline;
  seq->times.arrived = std::chrono::steady_clock::now();
  if (auto* g = std::get_if<GenerateRequest>(&request.body)) {
    RETURN_IF_ERROR(ValidateGenerate(*g, *model_, options_, total_blocks));
    Generation& gen = seq->work.emplace<Generation>();
    gen.request = std::move(*g);
    gen.tokens = gen.request.prompt;
    gen.prompt_tokens = static_cast<int64_t>(gen.tokens.size());
    if (!gen.request.forced.tokens.empty() && gen.request.forced.after_token < 0) {
      gen.forced_from = 0;
    }
    gen.draft_k =
        gen.request.mtp_draft_tokens < 0 ? options_.mtp_draft_tokens : gen.request.mtp_draft_tokens;
    seq->run_begin = 0;
    seq->run_end = model_->config().num_hidden_layers;
  } else {
    ForwardRequest& f = std::get<ForwardRequest>(request.body);
    const int64_t run_begin = f.layer_begin < 0 ? model_->layer_begin() : f.layer_begin;
    const int64_t run_end = f.layer_end < 0 ? model_->layer_end() : f.layer_end;
    RETURN_IF_ERROR(ValidateForward(f, *model_, run_begin, run_end));
    ForwardCall& call = seq->work.emplace<ForwardCall>();
    seq->run_begin = run_begin;
    seq->run_end = run_end;
    call.num_inputs = run_begin == 0 ? static_cast<int64_t>(f.token_ids.size()) : f.num_tokens;
    if (f.session_id.empty()) {
      if (BlocksFor(call.num_inputs, options_.block_size) > total_blocks) {
        return absl::ResourceExhaustedError(
            absl::StrCat(call.num_inputs, " positions exceed the KV cache capacity of ",
                         total_blocks * options_.block_size, " tokens"));
      }
    } else {
      RETURN_IF_ERROR(ValidateSessionId(f.session_id));
      ASSIGN_OR_RETURN(seq->session, impl_->sessions().Acquire(
                                         f.session_owner, f.session_id, f.create_session,
                                         call.num_inputs, run_begin, run_end, seq->times.arrived));
    }
    call.request = std::move(f);
  }
  return impl_->Enqueue(std::move(seq));
}

void Engine::Cancel(RequestId id) { impl_->Cancel(id); }

absl::Status Engine::CloseSession(const std::string& session_id, const std::string& owner) {
  RETURN_IF_ERROR(ValidateSessionId(session_id));
  RETURN_IF_ERROR(impl_->sessions().Close(owner, session_id));
  impl_->WakeLoop();  // the engine thread frees the blocks
  return absl::OkStatus();
}

void Engine::StartDraining() { draining_.store(true); }

void Engine::AbortAll(absl::Status status) { impl_->AbortAll(std::move(status)); }

bool Engine::Idle() const { return impl_->Idle(); }

EngineStats Engine::Stats() const { return impl_->Stats(); }

void Engine::SetStepObserver(std::function<void(const StepReport&)> observer) {
  impl_->SetStepObserver(std::move(observer));
}

void Engine::SetUnhealthyObserver(std::function<void(const absl::Status&)> observer) {
  impl_->SetUnhealthyObserver(std::move(observer));
}

}  // namespace glmserve
