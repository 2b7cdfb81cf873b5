// The inputs and outputs of one forward step over a ragged batch, shared by every backend.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/config.h"
#include "core/model/kv_cache.h"
#include "core/model/sample_math.h"

namespace glmserve {

// One sequence's slice of a ragged batch: its new tokens occupy positions
// [start_position, start_position + num_tokens) and its block table covers them.
struct SequenceSlice {
  int64_t num_tokens = 0;
  int64_t start_position = 0;
  const BlockTable* blocks = nullptr;
};

// All new tokens of all scheduled sequences, concatenated in sequence order.
struct ForwardBatch {
  std::vector<SequenceSlice> sequences;
  absl::Span<const int32_t> token_ids;  // [total_tokens]: when the span starts at layer 0
  absl::Span<const float> hidden_in;    // [total_tokens, hidden]: when it starts later

  int64_t total_tokens() const;
};

enum class LogitsRows {
  kNone,  // no logits
  kLast,  // one row per sequence: its last new token
  kAll,   // one row per new token
};

// What a runner that samples (ModelRunner::samples_tokens) does with one logits row of a step.
struct RowSampleRequest {
  // Choose the row's token where the logits are (core/model/sample_math.h: the host
  // sampler's token, bit for bit): ForwardResult::tokens.
  bool sample = false;
  samplemath::RowSampling params;  // read when `sample`
  // Return the row itself in ForwardResult::logits (a request that wants logprobs, a
  // forced token's logprob, drafts to verify, a Forward call's logits).
  bool keep_logits = true;
};

struct ForwardOptions {
  LogitsRows logits = LogitsRows::kLast;
  // When non-empty, one entry per batch sequence, overriding `logits` for that sequence
  // (e.g. decodes want their last row, a prefill chunk mid-prompt wants none). Logits rows
  // come out in batch order.
  std::vector<LogitsRows> sequence_logits;
  bool return_hidden = false;        // residual stream after the run's last layer
  bool return_layer_hidden = false;  // residual stream after the embedding and each layer
  // Each MoE layer's routing choices for every token of the run (the CPU runner; the CUDA
  // runner refuses it): the expert-load statistics of bench/moe_routing_bench.
  bool return_expert_choices = false;
  // The vectors the LM head reads (after the final norm; the MTP layer's shared_head.norm),
  // one per token of the step: what the MTP layer takes as `h` (docs/mtp.md). Every row then
  // runs to the end, as with return_hidden.
  bool return_head_input = false;
  // Run the MTP layer (ModelRunner::EnableMtp) instead of the model: token_ids are the next
  // tokens t[i+1] and hidden_in the head inputs h[i] [total_tokens, hidden], each pair at its
  // position i, with the slices' block tables; its K/V go to the cache's extra layer. Logits
  // rows as for the model; layer_begin / layer_end must stay -1.
  bool mtp = false;
  // Sampling where the logits are, for a runner whose samples_tokens() is true (others
  // refuse a non-empty list): one entry per logits row the step returns (ReturnedLogitRows
  // order). penalised_ids holds every sampled row's penalised ids (RowSampling::
  // penalised_begin / penalised_count: ascending, distinct, below the row's columns).
  std::vector<RowSampleRequest> sample;
  std::vector<int32_t> penalised_ids;
  // Run only model layers [layer_begin, layer_end) of the loaded span (-1: the span's own
  // bounds). Token input iff layer_begin == 0; logits iff layer_end is the model's last layer.
  int64_t layer_begin = -1;
  int64_t layer_end = -1;
};

struct ForwardResult {
  // [rows, vocab], rows per ForwardOptions::logits; with ForwardOptions::sample only the rows
  // whose request has keep_logits, in order.
  std::vector<float> logits;
  // With ForwardOptions::sample, one entry per request: the chosen token (-1 where not
  // sampled), and whether every value of the row was finite (1) or not (0: no token may be
  // made from it; the engine fails the request).
  std::vector<int32_t> tokens;
  std::vector<uint8_t> row_finite;
  // With ForwardOptions::sample, for the requests that asked (RowSampling::logprob,
  // top_logprobs; empty when none did): the token's logprob per request, and
  // [requests, kMaxRowTopLogprobs] alternatives, best first, the first top_logprobs of each
  // request valid.
  std::vector<float> token_logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::vector<float> hidden;      // [total_tokens, hidden] (pre final norm), if requested
  std::vector<float> head_input;  // [total_tokens, hidden] with return_head_input
  // [span layers + 1][total_tokens * hidden]: entry 0 is the span's input (the embedding
  // output when the span starts at 0), entry i + 1 the output of the span's i-th layer.
  std::vector<std::vector<float>> layer_hidden;
  // With return_expert_choices: [MoE layers of the run][total_tokens * top_k], each token's
  // chosen experts, best first.
  std::vector<std::vector<int32_t>> expert_choices;
};

// The checks of ForwardOptions::sample against the step: one request per returned logits row,
// each sampled row's penalised ids a valid range of penalised_ids, ascending, distinct and
// within its columns (RowSampling::columns, 0 for all of `vocab`), its forced token -1 or
// within them, its top_logprobs in [0, kMaxRowTopLogprobs]. INVALID_ARGUMENT naming what is
// wrong.
absl::Status ValidateSampleRequests(const ForwardBatch& batch, const ForwardOptions& options,
                                    int64_t vocab);

// Each token's absolute position, in batch order.
std::vector<int32_t> BatchPositions(const ForwardBatch& batch);

// The KV cache geometry `config` needs for `layers` layers: kv_heads x head_dim key and value
// rows (GLM-4.5), or one latent row of cache_values_per_token_layer() values (GLM-5).
KvCacheShape CacheShapeFor(const ModelConfig& config, int64_t layers, int64_t num_blocks,
                           int64_t block_size);

// The checks every backend makes before a step: the cache matches the model's KV shape, every
// sequence has new tokens within the model's context and a block table covering them with
// valid block ids, and the input is token ids in the vocabulary (a run from layer 0) or
// hidden states [total_tokens, hidden]. INVALID_ARGUMENT naming what is wrong.
absl::Status ValidateForwardBatch(const ForwardBatch& batch, const ModelConfig& config,
                                  const KvCacheShape& cache, bool token_input);

// The one rule for a run's layers, shared by the engine and every backend: [run_begin,
// run_end) is a non-empty part of the served span [served_begin, served_end), and a run that
// produces logits ends at the model's last layer. INVALID_ARGUMENT otherwise.
absl::Status ValidateRunSpan(int64_t run_begin, int64_t run_end, int64_t served_begin,
                             int64_t served_end, int64_t num_layers, bool wants_logits);

// Whether a step asks for any logits rows (options.sequence_logits, one entry per sequence,
// or else options.logits); INVALID_ARGUMENT if sequence_logits has the wrong length.
absl::StatusOr<bool> StepWantsLogits(const ForwardBatch& batch, const ForwardOptions& options);

// The rule "which rows get logits", written once for every backend: the batch rows (indices
// into the step's [total_tokens] rows) whose logits a step returns, ascending, which is the
// order of ForwardResult::logits. Per sequence, options.sequence_logits[i] (or options.logits
// for all): kLast its last new row, kAll each of its rows, kNone none. Expects options that
// StepWantsLogits accepted.
std::vector<int64_t> ReturnedLogitRows(const ForwardBatch& batch, const ForwardOptions& options);

}  // namespace glmserve
