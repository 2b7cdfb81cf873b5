// InstantRunner: a ModelRunner with no model. Its Forward returns logits at once, so that
// what a benchmark measures through the engine (or the whole server) is the host's own cost
// per token and per step: scheduling, the KV bookkeeping, sampling, events and RPCs, which a
// GPU step of a few milliseconds would otherwise hide (bench/host_bench.cc).
//
// The logits are rows of a fixed pool shaped like a language model's (a Gaussian bulk, a
// few dozen strong tokens, one favourite at a random id). The row for a position is chosen
// by a hash of that position's token id and index, so a sequence's logits depend only on
// its own tokens: outputs are deterministic and batch invariant, as with a real model.
// Forward copies each requested row into the result, which is the host work the CUDA
// runner does for it too (pinned staging buffer to the result); forward_seconds() reports
// the time spent there, so a benchmark can separate it from the engine's.
//
// With set_device_sampling(true) it answers ForwardOptions::sample as the CUDA runner does:
// a token per sampled row (SampleToken on the pool row, standing in for the device's
// kernel: the same token) and only the rows a request keeps. That work is the device's, not
// the host's: forward_seconds() counts it, and a benchmark leaves it out of host time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/model_runner.h"

namespace glmserve {

class InstantRunner final : public ModelRunner {
 public:
  // `pool_rows` distinct logits rows (>= 1) from `seed`.
  InstantRunner(const ModelConfig& config, int pool_rows = 32, uint32_t seed = 1);

  const ModelConfig& config() const override { return config_; }
  int64_t layer_begin() const override { return 0; }
  int64_t layer_end() const override { return config_.num_hidden_layers; }
  bool supports_sub_spans() const override { return false; }
  bool samples_tokens() const override { return device_sampling_; }
  void set_device_sampling(bool on) { device_sampling_ = on; }
  // Each Forward takes at least this long (it sleeps the rest): a device's step time, for the
  // overlapped-steps table of bench/host_bench.cc. 0 (the default): no wait.
  void set_step_time(std::chrono::microseconds t) { step_time_ = t; }
  std::string device_name() const override { return "instant"; }
  int64_t weight_bytes() const override { return 0; }
  // As a bf16 cache of this config would take, so that sizing figures stay realistic.
  int64_t kv_bytes_per_token() const override;

  // A cache with block bookkeeping and no storage: nothing reads keys or values.
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                       int64_t block_size) override;

  // Token input only; INVALID_ARGUMENT for hidden-state input or output, and for what
  // ValidateForwardBatch refuses.
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override;

  // The pool row a position of token `token` at `position` gets.
  const std::vector<float>& RowFor(int32_t token, int64_t position) const;
  // Seconds spent inside Forward so far (all threads).
  double forward_seconds() const { return forward_nanos_.load() * 1e-9; }

 private:
  ModelConfig config_;
  std::vector<std::vector<float>> pool_;
  bool device_sampling_ = false;
  std::chrono::microseconds step_time_{0};
  std::atomic<int64_t> forward_nanos_{0};
};

}  // namespace glmserve
