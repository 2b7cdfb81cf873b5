// Sampling where the logits are, done on the host: what a runner that samples
// (ModelRunner::samples_tokens, ForwardOptions::sample) returns, computed from whole rows with
// the host sampler (SampleToken / ForcedToken on the row's columns, the penalised ids as the
// history: they are distinct, so as a history they penalise exactly themselves). The device
// kernel (core/cuda/row_sample.cu) gives the same tokens bit for bit; this is the form the
// CPU tests and benchmarks use to run the engine's device-sampling and overlap paths without a
// device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/model/model_runner.h"

namespace glmserve {

// `result->logits` holds every row the step returns (ReturnedLogitRows order, `vocab` wide),
// one per options.sample entry. Fills result->tokens, row_finite and (where a request asked)
// token_logprobs / top_ids / top_logprobs as ForwardResult documents, and keeps in
// result->logits only the rows whose request keeps them. A row that is not all finite gets
// token -1 and row_finite 0. INVALID_ARGUMENT when the rows and requests do not match.
absl::Status SampleReturnedRows(const ForwardOptions& options, int64_t vocab,
                                ForwardResult* result);

// Makes any runner a sampling runner: Forward asks `inner` for the whole rows and samples them
// with SampleReturnedRows. Everything else is `inner`'s.
class HostSamplingRunner final : public ModelRunner {
 public:
  explicit HostSamplingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  int64_t layer_begin() const override { return inner_->layer_begin(); }
  int64_t layer_end() const override { return inner_->layer_end(); }
  bool supports_sub_spans() const override { return inner_->supports_sub_spans(); }
  bool samples_tokens() const override { return true; }
  std::string device_name() const override { return inner_->device_name(); }
  std::string compute_description() const override {
    return inner_->compute_description() + " (sampling after the step)";
  }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  absl::Status SetKvCacheDType(KvCacheDType dtype) override {
    return inner_->SetKvCacheDType(dtype);
  }
  bool has_mtp() const override { return inner_->has_mtp(); }
  absl::Status EnableMtp() override { return inner_->EnableMtp(); }
  bool mtp_enabled() const override { return inner_->mtp_enabled(); }
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                       int64_t block_size) override {
    return inner_->CreateCache(num_blocks, block_size);
  }
  absl::Status health() const override { return inner_->health(); }
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override;

 private:
  std::unique_ptr<ModelRunner> inner_;
};

}  // namespace glmserve
