#include "core/model/forward_types.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace glmserve {

int64_t ForwardBatch::total_tokens() const {
  int64_t total = 0;
  for (const SequenceSlice& s : sequences) total += s.num_tokens;
  return total;
}

KvCacheShape CacheShapeFor(const ModelConfig& config, int64_t layers, int64_t num_blocks,
                           int64_t block_size) {
  KvCacheShape shape;
  shape.num_layers = layers;
  shape.block_size = block_size;
  shape.num_blocks = num_blocks;
  if (config.is_mla()) {
    shape.latent = true;
    shape.kv_heads = 1;
    shape.head_dim = config.cache_values_per_token_layer();
  } else {
    shape.kv_heads = config.num_key_value_heads;
    shape.head_dim = config.head_dim;
  }
  return shape;
}

std::vector<int32_t> BatchPositions(const ForwardBatch& batch) {
  std::vector<int32_t> positions;
  positions.reserve(static_cast<size_t>(batch.total_tokens()));
  for (const SequenceSlice& s : batch.sequences) {
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      positions.push_back(static_cast<int32_t>(s.start_position + i));
    }
  }
  return positions;
}

absl::Status ValidateForwardBatch(const ForwardBatch& batch, const ModelConfig& c,
                                  const KvCacheShape& cache, bool token_input) {
  const KvCacheShape want = CacheShapeFor(c, cache.num_layers, cache.num_blocks, cache.block_size);
  if (cache.kv_heads != want.kv_heads || cache.head_dim != want.head_dim ||
      cache.latent != want.latent) {
    return absl::InvalidArgumentError("KV cache shape does not match the model");
  }
  const int64_t total = batch.total_tokens();
  if (total == 0) return absl::InvalidArgumentError("empty batch");
  for (const SequenceSlice& s : batch.sequences) {
    if (s.num_tokens <= 0 || s.start_position < 0) {
      return absl::InvalidArgumentError("each sequence needs at least one new token");
    }
    const int64_t end = s.start_position + s.num_tokens;
    if (end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "position ", end - 1, " is past max_position_embeddings ", c.max_position_embeddings));
    }
    if (s.blocks == nullptr || static_cast<int64_t>(s.blocks->size()) * cache.block_size < end) {
      return absl::InvalidArgumentError("a block table does not cover its sequence's positions");
    }
    for (int32_t b : *s.blocks) {
      if (b < 0 || b >= cache.num_blocks) return absl::InvalidArgumentError("bad block id");
    }
  }
  if (token_input) {
    if (static_cast<int64_t>(batch.token_ids.size()) != total || !batch.hidden_in.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a run from layer 0 takes token ids: expected ", total));
    }
    for (int32_t id : batch.token_ids) {
      if (id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
  } else if (static_cast<int64_t>(batch.hidden_in.size()) != total * c.hidden_size ||
             !batch.token_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a run from a later layer takes hidden states [",
                                                   total, ", ", c.hidden_size, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRunSpan(int64_t run_begin, int64_t run_end, int64_t served_begin,
                             int64_t served_end, int64_t num_layers, bool wants_logits) {
  if (run_begin < served_begin || run_end > served_end || run_begin >= run_end) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", run_begin, ", ", run_end,
                                                   ") are not served; this server serves [",
                                                   served_begin, ", ", served_end, ")"));
  }
  if (wants_logits && run_end != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits need the last layer (", num_layers, "); this call ends at ", run_end));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> StepWantsLogits(const ForwardBatch& batch, const ForwardOptions& options) {
  if (options.sequence_logits.empty()) return options.logits != LogitsRows::kNone;
  if (options.sequence_logits.size() != batch.sequences.size()) {
    return absl::InvalidArgumentError("sequence_logits must have one entry per sequence");
  }
  bool any = false;
  for (LogitsRows r : options.sequence_logits) any |= r != LogitsRows::kNone;
  return any;
}

std::vector<int64_t> ReturnedLogitRows(const ForwardBatch& batch, const ForwardOptions& options) {
  std::vector<int64_t> rows;
  int64_t first = 0;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const LogitsRows want =
        options.sequence_logits.empty() ? options.logits : options.sequence_logits[i];
    const int64_t count = batch.sequences[i].num_tokens;
    if (want == LogitsRows::kAll) {
      for (int64_t r = 0; r < count; ++r) rows.push_back(first + r);
    } else if (want == LogitsRows::kLast && count > 0) {
      rows.push_back(first + count - 1);
    }
    first += count;
  }
  return rows;
}

absl::Status ValidateSampleRequests(const ForwardBatch& batch, const ForwardOptions& options,
                                    int64_t vocab) {
  if (options.sample.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool any, StepWantsLogits(batch, options));
  const size_t rows = any ? ReturnedLogitRows(batch, options).size() : 0;
  if (options.sample.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample has ", options.sample.size(), " requests for ", rows, " logits rows"));
  }
  const int64_t pool = static_cast<int64_t>(options.penalised_ids.size());
  for (size_t i = 0; i < options.sample.size(); ++i) {
    const RowSampleRequest& r = options.sample[i];
    if (!r.sample) continue;
    const samplemath::RowSampling& p = r.params;
    const int64_t columns = p.columns > 0 ? std::min<int64_t>(p.columns, vocab) : vocab;
    if (p.columns < 0 || p.penalised_begin < 0 || p.penalised_count < 0 ||
        p.penalised_begin + int64_t{p.penalised_count} > pool) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample request ", i, ": columns or penalised id range out of bounds"));
    }
    if (p.forced < -1 || p.forced >= columns || p.top_logprobs < 0 ||
        p.top_logprobs > samplemath::kMaxRowTopLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample request ", i, ": forced token or top_logprobs out of range"));
    }
    const int32_t* ids = options.penalised_ids.data() + p.penalised_begin;
    for (int32_t j = 0; j < p.penalised_count; ++j) {
      if (ids[j] < 0 || ids[j] >= columns || (j > 0 && ids[j] <= ids[j - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sample request ", i, ": penalised ids must ascend, be distinct and below ", columns));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace glmserve
