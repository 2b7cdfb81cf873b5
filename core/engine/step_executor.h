// StepExecutor: runs the engine's steps on a thread of their own, so that the engine thread
// can build step N + 1 (and finish step N - 1's outputs: tokens, stop checks, events) while
// step N runs: overlap scheduling (docs/engine.md, "Overlapped steps").
//
// Steps run one at a time, in launch order. A step may take as inputs the tokens the step
// before it samples (EngineStep::pending): the executor writes them into the step's inputs
// once that step has finished, before the runner sees them, so a sequence can decode in
// consecutive steps without the host ever waiting for its token. A step built while one that
// failed ran does not run (EngineStep::ran stays false): its inputs may rest on tokens that
// never came, and the engine schedules its sequences again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/engine/engine.h"
#include "core/model/forward_types.h"
#include "core/model/model_runner.h"

namespace glmserve {

struct Sequence;

// One step: what the engine chose, the runner's inputs, and what came back.
struct EngineStep {
  uint64_t id = 0;  // launch order
  std::vector<Sequence*> selected;
  std::vector<int64_t> counts;  // new inputs per selected sequence
  ForwardBatch batch;           // views into ids / hidden / tables
  // The sequences' block tables as the step was built: the engine grows and frees the live
  // ones while the step runs.
  std::vector<BlockTable> tables;
  ForwardOptions options;
  std::vector<int32_t> ids;   // [tokens] of the sequences starting at layer 0
  std::vector<float> hidden;  // [tokens, hidden_size] of the others
  // An input that is a token the previous step samples: ids[index] = that step's
  // result.tokens[source_entry]. When entry >= 0, this step's sample request `entry` (the row
  // after it) depends on it too: with `penalise` its penalised ids include it (its history
  // grew by that token), and when it equals `force_after` the row is forced to `force` (the
  // forced part of a request starts after that token: GenerateRequest::forced).
  struct PendingToken {
    int64_t index = 0;
    int64_t source_entry = 0;
    int64_t entry = -1;
    bool penalise = false;
    int32_t force_after = -1;
    int32_t force = -1;
  };
  std::vector<PendingToken> pending;
  // Built while the step before it ran (on its expected outcome): skipped if that one failed.
  bool overlapped = false;
  StepReport report;
  SteadyTime built;    // when the engine began building it
  SteadyTime started;  // when it began to run: once built, or once the step before it ran

  ForwardResult result;
  absl::Status status;
  bool ran = false;  // false: skipped (an earlier step failed)

  // Empties the step for reuse, keeping its buffers' capacity (logits rows are megabytes).
  void Clear();
};

// Adds `token` to sample request `entry`'s penalised ids in `options` (ascending, distinct,
// below the request's columns, `vocab` when 0) unless it is there or out of range, shifting
// the later requests' ranges.
void AddPenalisedId(ForwardOptions* options, int64_t entry, int32_t token, int64_t vocab);

class StepExecutor {
 public:
  StepExecutor(ModelRunner* model, KvCache* cache);
  // Runs what was launched, then stops.
  ~StepExecutor();
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Queues `step` behind those launched before it.
  void Launch(std::unique_ptr<EngineStep> step);
  // The oldest launched step once it has run (or been skipped). Only after a Launch.
  std::unique_ptr<EngineStep> Wait();

 private:
  void Work();
  void Run(EngineStep* step);

  ModelRunner* const model_;
  KvCache* const cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<EngineStep>> queued_;
  std::deque<std::unique_ptr<EngineStep>> done_;
  bool stop_ = false;
  // The worker's own: the last step's sampled tokens (copied, as the engine reuses the step),
  // and whether it succeeded.
  std::vector<int32_t> last_tokens_;
  bool last_ok_ = true;
  std::thread thread_;
};

}  // namespace glmserve
