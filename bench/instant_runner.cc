#include "bench/instant_runner.h"

#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/dtype.h"
#include "core/base/status_macros.h"
#include "core/engine/host_sampling_runner.h"

namespace glmserve {
namespace {

// splitmix64's output function: consecutive positions map to unrelated pool rows.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<float> LanguageModelRow(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(-2.0f, 2.5f);
  std::vector<float> row(vocab);
  for (float& x : row) x = bulk(rng);
  std::uniform_int_distribution<int64_t> id(0, vocab - 1);
  std::uniform_real_distribution<float> strong(6.0f, 14.0f);
  for (int i = 0; i < 40; ++i) row[id(rng)] = strong(rng);
  row[id(rng)] = 17.0f;
  return row;
}

}  // namespace

InstantRunner::InstantRunner(const ModelConfig& config, int pool_rows, uint32_t seed)
    : config_(config) {
  for (int r = 0; r < std::max(1, pool_rows); ++r) {
    pool_.push_back(LanguageModelRow(config_.vocab_size, seed * 1000003u + r));
  }
}

int64_t InstantRunner::kv_bytes_per_token() const {
  return config_.num_hidden_layers * config_.cache_values_per_token_layer() *
         DTypeSize(DType::kBF16);
}

absl::StatusOr<std::unique_ptr<KvCache>> InstantRunner::CreateCache(int64_t num_blocks,
                                                                    int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a cache needs blocks > 0 and block_size > 0, got ", num_blocks, " and ", block_size));
  }
  const KvCacheShape shape =
      CacheShapeFor(config_, config_.num_hidden_layers, num_blocks, block_size);
  return std::make_unique<KvCache>(shape, nullptr, DType::kBF16, [](void*) {});
}

const std::vector<float>& InstantRunner::RowFor(int32_t token, int64_t position) const {
  const uint64_t key = Mix(static_cast<uint64_t>(static_cast<uint32_t>(token)) ^
                           Mix(static_cast<uint64_t>(position)));
  return pool_[key % pool_.size()];
}

absl::Status InstantRunner::Forward(const ForwardBatch& batch, KvCache* cache,
                                    const ForwardOptions& options, ForwardResult* result) {
  const auto start = std::chrono::steady_clock::now();
  if (cache == nullptr) return absl::InvalidArgumentError("Forward needs a KV cache");
  if (options.return_hidden || options.return_layer_hidden || !batch.hidden_in.empty()) {
    return absl::InvalidArgumentError("the instant runner has no hidden states");
  }
  if (absl::Status s = ValidateForwardBatch(batch, config_, cache->shape(), /*token_input=*/true);
      !s.ok()) {
    return s;
  }
  if (!options.sequence_logits.empty() &&
      options.sequence_logits.size() != batch.sequences.size()) {
    return absl::InvalidArgumentError("sequence_logits must have one entry per sequence");
  }
  if (!options.sample.empty() && !device_sampling_) {
    return absl::UnimplementedError("this instant runner returns rows (set_device_sampling)");
  }
  RETURN_IF_ERROR(ValidateSampleRequests(batch, options, config_.vocab_size));
  result->logits.clear();
  result->hidden.clear();
  result->layer_hidden.clear();
  int64_t token = 0;  // index into batch.token_ids of the sequence's first new token
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& s = batch.sequences[i];
    const LogitsRows want =
        options.sequence_logits.empty() ? options.logits : options.sequence_logits[i];
    const int64_t first = want == LogitsRows::kAll ? 0 : s.num_tokens - 1;
    const int64_t end = want == LogitsRows::kNone ? 0 : s.num_tokens;
    for (int64_t r = first; r < end; ++r) {
      const std::vector<float>& row = RowFor(batch.token_ids[token + r], s.start_position + r);
      result->logits.insert(result->logits.end(), row.begin(), row.end());
    }
    token += s.num_tokens;
  }
  if (!options.sample.empty()) {
    // The device's work: a token per sampled row, only the kept rows back.
    RETURN_IF_ERROR(SampleReturnedRows(options, config_.vocab_size, result));
  } else {
    result->tokens.clear();
    result->row_finite.clear();
    result->token_logprobs.clear();
    result->top_ids.clear();
    result->top_logprobs.clear();
  }
  if (step_time_.count() > 0) std::this_thread::sleep_until(start + step_time_);
  forward_nanos_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  return absl::OkStatus();
}

}  // namespace glmserve
