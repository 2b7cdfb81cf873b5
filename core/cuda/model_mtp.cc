// CudaModel's MTP-layer step (docs/mtp.md; the CPU's: core/cpu/cpu_model_mtp.cc), for pairs
// (t[i+1], h[i]) at positions i:
//
//   h (fp32 residual) = eh_proj[:, :H] enorm(embed(t[i+1]))   (zero embedding at position 0)
//                     + eh_proj[:, H:] hnorm(h[i])            (two GEMMs over eh_proj's halves)
//   the MTP block: one more decoder layer (DeviceWeights::layers' last), its K/V in the cache's
//   extra layer; logits = shared_head.norm(h) head^T; head inputs = shared_head.norm(h) in fp32.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "core/cuda/model.h"

namespace glmserve::cuda {

absl::Status CudaModel::ForwardMtp(const ForwardBatch& batch, KvCache* cache,
                                   const ForwardOptions& options, ForwardResult* result) {
  if (!mtp_enabled_) {
    return absl::FailedPreconditionError("the MTP layer is not enabled (ModelRunner::EnableMtp)");
  }
  if (options.return_hidden || options.return_layer_hidden) {
    return absl::InvalidArgumentError("an MTP step returns logits and head inputs only");
  }
  const ModelConfig& c = config_;
  const int64_t real = batch.total_tokens(), hidden = c.hidden_size;
  if (static_cast<int64_t>(batch.hidden_in.size()) != real * hidden) {
    return absl::InvalidArgumentError(absl::StrCat("an MTP step takes the head inputs h [", real,
                                                   ", ", hidden, "] beside its tokens"));
  }
  ForwardBatch tokens_only = batch;  // the shared checks: tokens, positions, block tables
  tokens_only.hidden_in = {};
  RETURN_IF_ERROR(CheckBatch(tokens_only, *cache));
  GLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  BuildStepPlan(tokens_only, options.logits, cache->shape().block_size, tile_tokens_, StepPadding{},
                /*has_embedding=*/true, &plan_);
  RETURN_IF_ERROR(EnsureCapacity(plan_.tokens, static_cast<int64_t>(plan_.block_tables.size())));
  num_splits_ = ChooseSplits(plan_.num_tiles, plan_.max_kv_len, /*for_graph=*/false);
  RETURN_IF_ERROR(UploadPlan());
  RETURN_IF_ERROR(EnsureIndexScores(/*graph=*/false));
  last_step_valid_ = false;
  head_rows_ = -1;
  const DeviceMtp& m = weights_.mtp;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t stream = stream_.get();

  // The embedding half: delta = eh_proj[:, :H] enorm(e), e zero where the position is 0.
  RETURN_IF_ERROR(EnqueueEmbedding());
  int64_t row = 0;
  for (const SequenceSlice& s : batch.sequences) {
    if (s.start_position == 0) {
      GLM_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(a_.h + row * hidden, 0, sizeof(float) * hidden, stream));
    }
    row += s.num_tokens;
  }
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(a_.h, nullptr, m.enorm, plan_.tokens, hidden, eps,
                                            nullptr, a_.x, nullptr, stream));
  const GemmOperand x{a_.x, CUDA_R_16BF, hidden};
  RETURN_IF_ERROR(Gemm(cublas_.get(), GemmOperand{m.eh_proj, CUDA_R_16BF, 2 * hidden}, hidden,
                       hidden, x, plan_.tokens, a_.delta, CUDA_R_32F, hidden));
  // The hidden half: h = eh_proj[:, H:] hnorm(h_in); the block's input norm adds delta.
  RETURN_IF_ERROR(UploadHiddenIn(batch.hidden_in, real));
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(a_.h, nullptr, m.hnorm, plan_.tokens, hidden, eps,
                                            nullptr, a_.x, nullptr, stream));
  RETURN_IF_ERROR(Gemm(cublas_.get(), GemmOperand{m.eh_proj + hidden, CUDA_R_16BF, 2 * hidden},
                       hidden, hidden, x, plan_.tokens, a_.h, CUDA_R_32F, hidden));
  bool pending = true;
  RETURN_IF_ERROR(EnqueueLayer(layer_end_ - layer_begin_, cache, &pending));
  RETURN_IF_ERROR(EnqueueResolve(&pending));

  result->logits.clear();
  result->hidden.clear();
  result->layer_hidden.clear();
  result->head_input.clear();
  result->expert_choices.clear();
  step_head_norm_ = m.head_norm;
  step_head_ = m.head;
  if (options.logits != LogitsRows::kNone) {
    RETURN_IF_ERROR(ReadLogits(/*graph=*/false, nullptr, {}, result));
  }
  if (options.return_head_input) {
    RETURN_IF_ERROR(CopyHeadInput(m.head_norm, real, &result->head_input));
  }
  step_head_norm_ = weights_.final_norm;
  step_head_ = weights_.lm_head;
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  GLM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  last_step_valid_ = true;
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
