// The step runner, on the engine thread: gathers the selected sequences' inputs into one
// ForwardBatch, runs the model once, and scatters the outputs back: sampled tokens for
// Generate, hidden states and logits rows for Forward, and their events.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/base/parallel.h"
#include "core/engine/engine_impl.h"

namespace glmserve {
namespace {

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// NaN or Inf in a model output means broken weights or an overflow: no token may be made up
// from it. (A branch-free scan; ~0.1 ms for a 151552-wide row.)
bool AllFinite(const float* values, int64_t n) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(values[i]);
  return finite;
}

// A sequence's head-input rows of the step starting at batch row `row` (null: not returned).
const float* HeadRows(const ForwardResult& result, int64_t row, int64_t hidden) {
  return result.head_input.empty() ? nullptr : result.head_input.data() + row * hidden;
}

absl::Status NonFiniteError(const char* what) {
  return absl::InternalError(absl::StrCat(
      "non-finite ", what, " (NaN or Inf): the model's weights or activations are broken"));
}

// Which logits rows a Forward call gets from a step that computes `completes` (its last
// inputs) or not: every row, its last row once complete, or none.
LogitsRows ForwardLogitsRows(const ForwardRequest& f, bool completes) {
  if (f.logits == LogitsRows::kAll && !f.last_position_only) return LogitsRows::kAll;
  if (f.logits != LogitsRows::kNone && completes) return LogitsRows::kLast;
  return LogitsRows::kNone;
}

// What a runner that samples does with a generation's next-token row: choose the token where
// the logits are (or take the forced one) and compute the logprobs the request wants there
// too; the row itself never comes back. Appends the row's penalised ids.
// `ahead`: the row is one token past gen.tokens (a token still being sampled comes before it;
// the executor adds it to the penalised ids).
RowSampleRequest DeviceSampleRequest(Generation& gen, int64_t vocab, int64_t ahead,
                                     std::vector<int32_t>* penalised_ids) {
  const GenerateRequest& g = gen.request;
  RowSampleRequest r;
  r.sample = true;
  r.keep_logits = false;
  r.params = RowSamplingFor(g.sampling, static_cast<uint64_t>(gen.generated + ahead));
  r.params.forced = gen.ForcedAt(gen.generated + ahead);
  r.params.logprob = g.logprobs || g.top_logprobs > 0;
  r.params.top_logprobs = g.top_logprobs;
  const int64_t limit =
      g.sample_vocab_limit > 0 ? std::min<int64_t>(g.sample_vocab_limit, vocab) : vocab;
  if (static_cast<double>(g.sampling.repetition_penalty) != 1.0) {
    // PenalisedIds(g.sampling, gen.tokens, limit), kept incrementally (a sorted insert per
    // new token; tokens only grow, preemption included).
    for (; gen.penalised_upto < static_cast<int64_t>(gen.tokens.size()); ++gen.penalised_upto) {
      const int32_t id = gen.tokens[gen.penalised_upto];
      if (id < 0 || id >= limit) continue;
      const auto at = std::lower_bound(gen.penalised.begin(), gen.penalised.end(), id);
      if (at == gen.penalised.end() || *at != id) gen.penalised.insert(at, id);
    }
  }
  const std::vector<int32_t>& ids = gen.penalised;
  samplemath::RowSampling& p = r.params;
  p.columns = static_cast<int32_t>(limit);
  p.penalised_begin = static_cast<int32_t>(penalised_ids->size());
  p.penalised_count = static_cast<int32_t>(ids.size());
  penalised_ids->insert(penalised_ids->end(), ids.begin(), ids.end());
  return r;
}

// A returned row the host needs whole: drafts to verify, a Forward call's logits.
constexpr RowSampleRequest kKeepRow{false, {}, true};

}  // namespace

// Request `entry`'s token as the runner returned it, with its logprobs where asked.
Engine::Impl::DeviceToken Engine::Impl::DeviceTokenOf(const ForwardOptions& options,
                                                      const ForwardResult& result, int64_t entry) {
  DeviceToken d;
  d.token = result.tokens[entry];
  d.finite = result.row_finite[entry] != 0;
  const samplemath::RowSampling& p = options.sample[entry].params;
  if (!(p.logprob || p.top_logprobs > 0) || result.token_logprobs.empty()) return d;
  d.logprob = result.token_logprobs[entry];
  const int64_t k = samplemath::kMaxRowTopLogprobs;
  for (int32_t j = 0; j < p.top_logprobs; ++j) {
    d.top.push_back({result.top_ids[entry * k + j], result.top_logprobs[entry * k + j]});
  }
  return d;
}

void Engine::Impl::GatherInputs(EngineStep* step) {
  const std::vector<Sequence*>& selected = step->selected;
  const std::vector<int64_t>& counts = step->counts;
  const int64_t hidden_size = model_->config().hidden_size;
  ForwardOptions& options = step->options;
  StepReport& report = step->report;
  options.layer_begin = selected[0]->run_begin;
  options.layer_end = selected[0]->run_end;
  report.sequences = static_cast<int64_t>(selected.size());
  const bool device_sampling = model_->samples_tokens();
  const int64_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < selected.size(); ++i) {
    Sequence* seq = selected[i];
    const int64_t n = counts[i], from = seq->scheduled();
    step->batch.sequences.push_back({n, seq->base_position + from, nullptr});
    step->tables.push_back(seq->blocks());
    if (Generation* gen = seq->generation()) {
      // Known tokens (the last possibly one the running step samples), then (a decode only)
      // the MTP drafts to verify: a logits row for each.
      const int64_t have = static_cast<int64_t>(gen->tokens.size());
      const int64_t known = std::min(n, seq->known_inputs() - from);
      const int64_t drafts = n - known;
      const int64_t stored = std::min(known, std::max<int64_t>(0, have - from));
      step->ids.insert(step->ids.end(), gen->tokens.begin() + from,
                       gen->tokens.begin() + from + stored);
      if (stored < known) {  // the pending token: written in when the running step is done
        step->pending.push_back({static_cast<int64_t>(step->ids.size()), seq->pending_entry, -1});
        step->ids.push_back(0);
      }
      step->ids.insert(step->ids.end(), gen->drafts.begin(), gen->drafts.begin() + drafts);
      const bool done = from + known == seq->known_inputs();
      options.sequence_logits.push_back(drafts > 0 ? LogitsRows::kAll
                                        : done     ? LogitsRows::kLast
                                                   : LogitsRows::kNone);
      if (device_sampling && drafts > 0) {
        options.sample.insert(options.sample.end(), n, kKeepRow);
      } else if (device_sampling && done) {
        const int64_t entry = static_cast<int64_t>(options.sample.size());
        const int64_t ahead = stored < known ? 1 : 0;
        options.sample.push_back(DeviceSampleRequest(*gen, vocab, ahead, &options.penalised_ids));
        if (ahead) {
          EngineStep::PendingToken& p = step->pending.back();
          const GenerateRequest& g = gen->request;
          p.entry = entry;
          p.penalise = static_cast<double>(g.sampling.repetition_penalty) != 1.0;
          if (gen->forced_from < 0 && !g.forced.tokens.empty()) {
            // Not started yet: it starts at this row if the pending token is the trigger.
            p.force_after = g.forced.after_token;
            p.force = g.forced.tokens[0];
          }
        }
        if (overlap_) {
          seq->pending_step = step->id;
          seq->pending_entry = entry;
        }
      }
      options.return_head_input |= gen->draft_k > 0;
      (from >= gen->prompt_tokens ? report.decode_tokens : report.prefill_tokens) += n;
      report.draft_tokens += drafts;
    } else {
      const ForwardRequest& f = seq->forward_call()->request;
      if (seq->run_begin == 0) {
        step->ids.insert(step->ids.end(), f.token_ids.begin() + from,
                         f.token_ids.begin() + from + n);
      } else {
        step->hidden.insert(step->hidden.end(), f.hidden.begin() + from * hidden_size,
                            f.hidden.begin() + (from + n) * hidden_size);
      }
      const LogitsRows rows = ForwardLogitsRows(f, from + n == seq->total_inputs());
      options.sequence_logits.push_back(rows);
      if (device_sampling && rows != LogitsRows::kNone) {
        options.sample.insert(options.sample.end(), rows == LogitsRows::kAll ? n : 1, kKeepRow);
      }
      options.return_hidden |= f.return_hidden;
      report.forward_tokens += n;
    }
    seq->in_flight += n;
    ++seq->steps_in_flight;
  }
  for (size_t i = 0; i < selected.size(); ++i) step->batch.sequences[i].blocks = &step->tables[i];
  step->batch.token_ids = step->ids;
  step->batch.hidden_in = step->hidden;
}

std::unique_ptr<EngineStep> Engine::Impl::NewStep() {
  std::unique_ptr<EngineStep> step;
  if (spare_steps_.empty()) {
    step = std::make_unique<EngineStep>();
  } else {
    step = std::move(spare_steps_.back());
    spare_steps_.pop_back();
    step->Clear();
  }
  step->id = next_step_id_++;
  step->built = std::chrono::steady_clock::now();
  return step;
}

void Engine::Impl::RunStep(const std::vector<Sequence*>& selected,
                           const std::vector<int64_t>& counts) {
  std::unique_ptr<EngineStep> step = NewStep();
  step->selected = selected;
  step->counts = counts;
  GatherInputs(step.get());
  step->started = step->built;
  step->status = model_->Forward(step->batch, cache_.get(), step->options, &step->result);
  step->ran = true;
  CompleteStep(std::move(step));
}

void Engine::Impl::StepOverlapped() {
  // The next step, built while the last launched one runs (when one does).
  const bool running = step_in_flight_;
  std::vector<Sequence*> selected;
  std::vector<int64_t> counts;
  bool blocked = false;
  BuildStep(&selected, &counts, running ? &blocked : nullptr);
  std::unique_ptr<EngineStep> next;
  if (!selected.empty()) {
    next = NewStep();
    next->selected = std::move(selected);
    next->counts = std::move(counts);
    next->overlapped = running;
    GatherInputs(next.get());
    overlapped_steps_ += running;
  }
  const bool launched = next != nullptr;
  if (launched) executor_->Launch(std::move(next));
  if (running) {
    std::unique_ptr<EngineStep> done = executor_->Wait();
    const bool failed = !done->ran || !done->status.ok();
    CompleteStep(std::move(done));
    if (failed && launched) {
      // The step just launched was built on this one's outcome: it is skipped; read it now so
      // that its sequences are scheduled again from what is really computed.
      CompleteStep(executor_->Wait());
      step_in_flight_ = false;
      return;
    }
  }
  step_in_flight_ = launched;
  if (!launched && !running && (!waiting_.empty() || !running_.empty())) {
    // Work exists but none can run now (e.g. a session waits for its previous call): wait
    // briefly rather than spin.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(2),
                 [this] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
  }
  if (!launched && !running) UpdateStats(0);
}

void Engine::Impl::Unmark(const EngineStep& step) {
  for (size_t i = 0; i < step.selected.size(); ++i) {
    Sequence* seq = step.selected[i];
    seq->in_flight -= step.counts[i];
    --seq->steps_in_flight;
    if (seq->pending_entry >= 0 && seq->pending_step == step.id) seq->pending_entry = -1;
  }
}

void Engine::Impl::FailStep(const EngineStep& step) {
  // A runner that can no longer run steps (a tensor-parallel rank died) fails its requests
  // as UNAVAILABLE (retryable elsewhere) and is reported once; any other failure is this
  // step's.
  const absl::Status health = model_->health();
  for (Sequence* seq : step.selected) {
    if (seq->finished) continue;
    Finish(seq, FinishReason::kError,
           health.ok()
               ? absl::InternalError(absl::StrCat("forward step failed: ", step.status.message()))
               : health);
  }
  UpdateStats(1);
  if (!health.ok() && !reported_unhealthy_) {
    reported_unhealthy_ = true;
    std::function<void(const absl::Status&)> observer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      observer = unhealthy_observer_;
    }
    if (observer) observer(health);
  }
}

void Engine::Impl::CompleteStep(std::unique_ptr<EngineStep> step) {
  Unmark(*step);
  if (!step->ran) {
    // Skipped (the step before it failed): its sequences are scheduled again from what is
    // computed; a sequence that step ended is finished already.
  } else if (!step->status.ok()) {
    FailStep(*step);
  } else {
    ScatterOutputs(*step);
    if (!overlap_) RunMtp(step->selected, &step->report);
    // From the start of its run to its outputs read (overlapped: not the time it waited
    // behind the step before it).
    step->report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step->started).count();
    UpdateStats(1);
    std::function<void(const StepReport&)> observer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      observer = observer_;
    }
    if (observer) observer(step->report);
  }
  spare_steps_.push_back(std::move(step));
}

void Engine::Impl::ScatterOutputs(const EngineStep& step) {
  const std::vector<Sequence*>& selected = step.selected;
  const std::vector<int64_t>& counts = step.counts;
  const ForwardOptions& options = step.options;
  const ForwardResult& result = step.result;
  const std::vector<LogitsRows>& wants = options.sequence_logits;
  const int64_t vocab = model_->config().vocab_size;
  const int64_t hidden_size = model_->config().hidden_size;
  // `logits_row` counts the rows in result.logits; with device sampling that is the kept
  // rows only, and `entry` counts every returned row (options.sample, result.tokens).
  const bool device_sampling = !options.sample.empty();
  int64_t row = 0, logits_row = 0, entry = 0;
  std::vector<Sequence*> finished_forwards, failed, to_sample;
  std::vector<const float*> sample_rows;
  std::vector<DeviceToken> device_tokens;
  struct Verify {
    Sequence* seq;
    const float* logits;      // [rows, vocab]
    const float* head_input;  // [rows, hidden] or null
    int64_t rows;
  };
  std::vector<Verify> to_verify;
  for (size_t i = 0; i < selected.size(); ++i) {
    Sequence* seq = selected[i];
    const int64_t n = counts[i];
    const LogitsRows want = wants[i];
    const float* logits = result.logits.data() + logits_row * vocab;
    const int64_t returned = want == LogitsRows::kAll ? n : (want == LogitsRows::kLast ? 1 : 0);
    DeviceToken device_token;
    if (device_sampling && returned > 0) {
      const bool kept = options.sample[entry].keep_logits;
      device_token = DeviceTokenOf(options, result, entry);
      if (!kept) logits = nullptr;
      for (int64_t r = 0; r < returned; ++r) logits_row += options.sample[entry + r].keep_logits;
      entry += returned;
    } else {
      logits_row += returned;
    }
    if (seq->finished) {  // ended while this step ran (cancelled, or by the step before)
      row += n;
      continue;
    }
    if (Generation* gen = seq->generation()) {
      const int64_t from = seq->computed;
      seq->computed += want == LogitsRows::kAll ? 1 : n;  // a verify step: its first row
      prompt_computed_ += std::max<int64_t>(0, std::min(seq->computed, gen->prompt_tokens) - from);
      if (want == LogitsRows::kLast) {
        to_sample.push_back(seq);
        sample_rows.push_back(logits);
        device_tokens.push_back(device_token);
        if (gen->draft_k > 0) KeepHeadInputs(seq, HeadRows(result, row, hidden_size), n);
      } else if (want == LogitsRows::kAll) {
        to_verify.push_back({seq, logits, HeadRows(result, row, hidden_size), n});
      } else if (gen->draft_k > 0) {
        KeepHeadInputs(seq, HeadRows(result, row, hidden_size), n);
      }
      row += n;
      continue;
    }
    seq->computed += n;
    ForwardCall& call = *seq->forward_call();
    const ForwardRequest& f = call.request;
    ForwardOutput& out = call.output;
    bool finite = true;
    if (f.return_hidden) {
      const int64_t first = f.last_position_only ? n - 1 : 0;
      if (!f.last_position_only || seq->computed == call.num_inputs) {
        const float* rows_begin = result.hidden.data() + (row + first) * hidden_size;
        const int64_t count = (n - first) * hidden_size;
        finite &= AllFinite(rows_begin, count);
        out.hidden.insert(out.hidden.end(), rows_begin, rows_begin + count);
      }
    }
    if (want != LogitsRows::kNone) {
      const int64_t rows = want == LogitsRows::kAll ? n : 1;
      finite &= AllFinite(logits, rows * vocab);
      out.logits.insert(out.logits.end(), logits, logits + rows * vocab);
    }
    if (!finite) {
      ++nonfinite_outputs_;
      failed.push_back(seq);
    } else if (seq->computed == call.num_inputs) {
      finished_forwards.push_back(seq);
    }
    row += n;
  }
  // Generated tokens go out in batch order, before the forwards' outcomes.
  SampleTokens(to_sample, sample_rows, device_sampling ? &device_tokens : nullptr);
  for (size_t i = 0; i < to_sample.size(); ++i) {
    AfterGenerateStep(to_sample[i], std::move(sampled_[i]), sampled_finite_[i] != 0);
  }
  for (const Verify& v : to_verify) {
    const int64_t valid = VerifyDrafts(v.seq, v.logits, v.rows);
    if (!v.seq->finished) KeepHeadInputs(v.seq, v.head_input, valid);
  }
  for (Sequence* seq : failed) {
    Finish(seq, FinishReason::kError, NonFiniteError("hidden states or logits"));
  }
  for (Sequence* seq : finished_forwards) {
    ForwardCall& call = *seq->forward_call();
    ForwardOutput out = std::move(call.output);
    out.rows = call.request.last_position_only ? 1 : call.num_inputs;
    out.start_position = seq->base_position;
    if (!seq->times.first_token) seq->times.first_token = std::chrono::steady_clock::now();
    Emit(seq, std::move(out));
    Finish(seq, FinishReason::kForwardDone, absl::OkStatus());
  }
}

bool Engine::Impl::SampleOne(const Sequence& seq, const float* logits, const DeviceToken* device,
                             SampledToken* out) const {
  const int64_t vocab = model_->config().vocab_size;
  // No token may be made up from NaN or Inf logits (checked here, in parallel too, or by the
  // device over the row it sampled).
  if (device != nullptr ? !device->finite : !AllFinite(logits, vocab)) return false;
  const Generation& gen = *seq.generation();
  const GenerateRequest& g = gen.request;
  // The logprobs are a full pass over the row each: only when the request asked.
  const LogprobRequest want{g.logprobs || g.top_logprobs > 0, g.top_logprobs};
  const int64_t limit = g.sample_vocab_limit > 0 ? g.sample_vocab_limit : vocab;
  const int32_t forced = gen.ForcedNext();
  if (device != nullptr) {
    // The device chose the token (the forced one where forced) and computed its logprobs.
    *out = SampledToken{device->token, want.chosen ? device->logprob : 0.0f, device->top};
    return true;
  }
  const absl::Span<const float> row = absl::MakeConstSpan(logits, limit);
  *out = forced >= 0
             ? ForcedToken(row, forced, want)
             : SampleToken(row, g.sampling, gen.tokens, static_cast<uint64_t>(gen.generated), want);
  return true;
}

void Engine::Impl::SampleTokens(const std::vector<Sequence*>& seqs,
                                const std::vector<const float*>& rows,
                                const std::vector<DeviceToken>* device) {
  sampled_.resize(seqs.size());
  sampled_finite_.assign(seqs.size(), 0);
  auto sample = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      sampled_finite_[i] =
          SampleOne(*seqs[i], rows[i], device ? &(*device)[i] : nullptr, &sampled_[i]);
    }
  };
  const int64_t n = static_cast<int64_t>(seqs.size());
  // Rows to scan (host sampling, or logprobs of device tokens) are worth the pool.
  bool row_work = device == nullptr;
  for (int64_t i = 0; i < n && !row_work; ++i) row_work = rows[i] != nullptr;
  if (n > 1 && row_work) {
    ParallelFor(n, 1, sample);
  } else {
    sample(0, n);
  }
}

void Engine::Impl::AfterGenerateStep(Sequence* seq, SampledToken sampled, bool finite) {
  const ModelConfig& c = model_->config();
  Generation& gen = *seq->generation();
  if (gen.generated == 0 && options_.prefix_caching) {
    // The prompt's full blocks are now valid: let concurrent requests share them.
    prefix_.Insert(gen.tokens, seq->computed, seq->own_blocks);
  }
  if (!finite) {
    ++nonfinite_outputs_;
    Finish(seq, FinishReason::kError, NonFiniteError("logits"));
    return;
  }
  const GenerateRequest& g = gen.request;
  gen.tokens.push_back(sampled.token);
  ++gen.generated;
  gen.NoteGenerated(sampled.token);
  ++generated_total_;
  TokenEvent event;
  event.token = sampled.token;
  event.index = gen.generated - 1;
  event.time = std::chrono::steady_clock::now();
  if (g.logprobs || g.top_logprobs > 0) {
    event.logprob = sampled.logprob;
    event.top = std::move(sampled.top);
  }
  if (!seq->times.first_token) seq->times.first_token = event.time;
  Emit(seq, std::move(event));

  const bool stop = Contains(g.stop.stop_token_ids, sampled.token) ||
                    (!g.stop.ignore_eos && Contains(c.eos_token_ids, sampled.token));
  if (stop) {
    Finish(seq, FinishReason::kStop, absl::OkStatus());
  } else if (gen.generated >= g.stop.max_new_tokens ||
             static_cast<int64_t>(gen.tokens.size()) >= c.max_position_embeddings) {
    Finish(seq, FinishReason::kLength, absl::OkStatus());
  }
}

}  // namespace glmserve
