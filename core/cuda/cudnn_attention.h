// cuDNN 9's fused scaled-dot-product attention over the paged bf16 KV cache: GLM-4.5's
// attention fast path on the device, with attention_tc.cu's tensor-core kernel as the
// fallback and as the reference it is checked against.
//
// libcudnn is loaded at run time with dlopen, like cuBLAS (cublas_api.h says why; no link-time
// dependency, and a host without cuDNN simply runs the fallback). The operation graph is the
// one cuDNN's fused flash-attention engines recognise for SDPA forward in inference: paged
// cache loads of K and V through a dense [batch, pages] page table, Q K^T, scale, a padding
// mask from per-sequence lengths, a bottom-right-aligned causal mask (a sequence's last query
// row sees its whole context: the step's new K/V are already in the cache), softmax, P V; Q and
// O packed [tokens, heads, head_dim] with ragged per-sequence offsets (THD).
//
// Per step (the first layer's call; later layers reuse it): the step's tiles regrouped per
// sequence (cudnn_attention_plan.h) and uploaded with one cudaMemcpyAsync on the model's stream;
// per layer: q (fp32, rows of q_stride) converted to bf16 in a scratch buffer, then the cached
// execution plan for the step's bucketed shape. Plans are built lazily; the first use runs a
// self-check (a prefill chunk over cached context, a decode row and an empty bucket entry, GQA,
// through both cuDNN and LaunchPagedAttentionTc on random data). Any failure to load, build,
// finalize or match turns the path off for good with one logged line, and the caller runs its
// own kernel; a request never sees an error from here except CUDA errors on the stream.
//
// Steps being captured as CUDA graphs (padded decode steps) are refused (Enqueue returns false
// while the stream captures, and for padding rows): the caller's kernel reads device-side tiles
// a replay refreshes, while a replay would reuse this path's per-step upload as captured.
// Needs cuDNN 9.10.2+ and compute capability 8.0+.
//
// Without cuDNN's headers at build time, and under the CUDA emulation (tools/cuda_emu), the
// same interface reports "cuDNN not available in this build".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cudnn_attention_plan.h"
#include "core/cuda/kernels.h"
#include "core/cuda/step_plan.h"

namespace glmserve::cuda {

// |cuDNN - tensor-core kernel| <= kCudnnCheckAbs + kCudnnCheckRel * |kernel| per output in the
// self-check and the GPU tests. Both outputs are rounded to bf16 (2^-9 relative), cuDNN's q is
// rounded to bf16 where the kernel keeps it as a hi + lo pair, and both accumulate in fp32 in
// different orders: a few bf16 ulps of outputs that are averages of values in [-1, 1]. A wrong
// layout, mask or page is off by O(0.1) or more.
inline constexpr float kCudnnCheckAbs = 1.5e-2f;
inline constexpr float kCudnnCheckRel = 1.5e-2f;

// False in a build without cuDNN's headers and under the emulation (Create always fails there).
bool CudnnAttentionBuilt();

// For tests on machines with libcudnn but no GPU: loads cuDNN and creates and finalizes every
// tensor and operation of the SDPA graph for `shape` over a cache of `num_blocks` blocks of
// `block_size`, bucketed as `key`; stops before the operation graph (that needs a device).
absl::Status CudnnAttentionOpsForTest(const AttentionShape& shape, int64_t block_size,
                                      int64_t num_blocks, const CudnnPlanKey& key);

class CudnnAttention {
 public:
  // cuDNN on `stream` for attention of `shape` (heads, kv_heads, head_dim, scale; q_stride and
  // block_size are per call). FAILED_PRECONDITION saying why when cuDNN cannot be used at all
  // (not in this build, library missing or too old, handle creation failed).
  static absl::StatusOr<std::unique_ptr<CudnnAttention>> Create(const AttentionShape& shape,
                                                                cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Attention of `plan`'s rows over one cache layer (bf16 [num_blocks, 2, block_size,
  // kv_heads * head_dim], K then V per block) into out (bf16 [tokens, heads * head_dim]), from
  // q (fp32, q + t * shape.q_stride + h * head_dim). True when enqueued on the stream; false
  // when the caller must run its kernel for this call (the step's shape is not served, or
  // the path is off: see status()). Errors: CUDA errors only.
  absl::StatusOr<bool> Enqueue(const StepPlan& plan, const float* q, const uint16_t* cache_layer,
                               int64_t num_blocks, const AttentionShape& shape, uint16_t* out);

  // Off for good (a failed build, finalize or self-check; logged once).
  bool disabled() const { return disabled_; }
  // "cuDNN 9.19.0, self-checked" / why it is off / "not used yet".
  std::string status() const;
  int64_t layer_calls() const { return layer_calls_; }
  int64_t plans_built() const { return plans_built_; }

  // For tests: the self-check's verdict (runs it now if it has not run), and turning it off
  // (the GPU tests compare against the kernel themselves).
  absl::Status SelfCheckForTest(int64_t block_size);
  void set_self_check(bool on) { self_check_ = on; }

  struct Impl;

 private:
  CudnnAttention() = default;
  void Disable(const std::string& why);

  std::unique_ptr<Impl> impl_;
  bool disabled_ = false;
  bool self_check_ = true;
  std::string why_off_;
  int64_t layer_calls_ = 0;
  int64_t plans_built_ = 0;
};

}  // namespace glmserve::cuda
