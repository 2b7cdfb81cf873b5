#include "core/engine/step_executor.h"

#include <algorithm>
#include <chrono>

namespace glmserve {

void EngineStep::Clear() {
  selected.clear();
  counts.clear();
  batch = ForwardBatch{};
  options = ForwardOptions{};
  ids.clear();
  hidden.clear();
  tables.clear();
  pending.clear();
  report = StepReport{};
  result.logits.clear();
  result.tokens.clear();
  result.row_finite.clear();
  result.token_logprobs.clear();
  result.top_ids.clear();
  result.top_logprobs.clear();
  result.hidden.clear();
  result.head_input.clear();
  result.layer_hidden.clear();
  result.expert_choices.clear();
  status = absl::OkStatus();
  overlapped = false;
  ran = false;
}

void AddPenalisedId(ForwardOptions* options, int64_t entry, int32_t token, int64_t vocab) {
  samplemath::RowSampling& p = options->sample[entry].params;
  const int64_t columns = p.columns > 0 ? p.columns : vocab;
  if (token < 0 || token >= columns) return;
  std::vector<int32_t>& ids = options->penalised_ids;
  const auto begin = ids.begin() + p.penalised_begin;
  const auto end = begin + p.penalised_count;
  const auto at = std::lower_bound(begin, end, token);
  if (at != end && *at == token) return;
  ids.insert(at, token);
  ++p.penalised_count;
  // The requests are laid out in order: every later one's range moved up by one.
  for (size_t f = entry + 1; f < options->sample.size(); ++f) {
    if (options->sample[f].sample) ++options->sample[f].params.penalised_begin;
  }
}

StepExecutor::StepExecutor(ModelRunner* model, KvCache* cache)
    : model_(model), cache_(cache), thread_([this] { Work(); }) {}

StepExecutor::~StepExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepExecutor::Launch(std::unique_ptr<EngineStep> step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back(std::move(step));
  }
  cv_.notify_all();
}

std::unique_ptr<EngineStep> StepExecutor::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !done_.empty(); });
  std::unique_ptr<EngineStep> step = std::move(done_.front());
  done_.pop_front();
  return step;
}

void StepExecutor::Work() {
  for (;;) {
    std::unique_ptr<EngineStep> step;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queued_.empty(); });
      if (queued_.empty()) return;  // stopping, and everything launched has run
      step = std::move(queued_.front());
      queued_.pop_front();
    }
    Run(step.get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(step));
    }
    cv_.notify_all();
  }
}

void StepExecutor::Run(EngineStep* step) {
  if (step->overlapped && !last_ok_) {
    // Built on the failed step's outcome: the engine waits for this one before it builds
    // again, so the next step it launches starts from what is really computed.
    step->ran = false;
    step->status = absl::AbortedError("not run: the step before it failed");
    last_tokens_.clear();
    return;
  }
  step->started = std::chrono::steady_clock::now();
  const int64_t vocab = model_->config().vocab_size;
  for (const EngineStep::PendingToken& p : step->pending) {
    // A row that was not finite has no token (-1): its sequence ends when the engine reads
    // that step, and whatever this step computes for it is never read. 0 keeps the input valid.
    int32_t token = p.source_entry < static_cast<int64_t>(last_tokens_.size())
                        ? last_tokens_[p.source_entry]
                        : -1;
    if (token < 0) token = 0;
    step->ids[p.index] = token;
    if (p.entry >= 0 && p.penalise) AddPenalisedId(&step->options, p.entry, token, vocab);
    if (p.entry >= 0 && p.force_after >= 0 && token == p.force_after) {
      step->options.sample[p.entry].params.forced = p.force;
    }
  }
  step->status = model_->Forward(step->batch, cache_, step->options, &step->result);
  step->ran = true;
  last_ok_ = step->status.ok();
  last_tokens_ = step->result.tokens;
}

}  // namespace glmserve
