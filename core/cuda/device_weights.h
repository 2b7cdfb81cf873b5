// The model's parameters in GPU memory, uploaded once: matrices as bf16 (whatever their
// stored dtype), norms, biases, the router and its correction bias as fp32 (the router runs
// in fp32, as the reference). Projections that read the same input are fused at upload:
// q|k|v into one [q_dim + 2 kv_dim, hidden] matrix, gate|up into one [2 width, hidden], and
// the routed experts of a layer into contiguous [E, 2I, hidden] and [E, hidden, I] arrays.
//
// FP8 matrices (WeightFormat::kFp8Scaled, docs/fp8.md) stay FP8: their e4m3 codes (one byte
// per weight) and fp32 block scales are copied as they are, each matrix on its own (a 128x128
// block never straddles q and k, or gate and up, when a width is not a multiple of 128); the
// routed experts' codes of a layer are stacked [E, rows, cols] and their scales
// [E, scale_rows, scale_cols]. Projections run FP8 or bf16 by group: q/k/v, o, each FFN's
// gate/up/down, a layer's routed experts; a group mixing FP8 and unquantized matrices is
// refused (no released checkpoint does that), as is an FP8 lm_head. GLM-5's attention
// projections run FP8 by group likewise (DeviceMla).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels.h"
#include "core/model/checkpoint.h"
#include "core/model/parallel_layout.h"
#include "core/model/weights.h"

namespace glmserve::cuda {

struct DeviceFfn {
  const uint16_t* gate_up = nullptr;  // [2 width, hidden]: gate rows, then up rows
  const uint16_t* down = nullptr;     // [hidden, width]
  int64_t width = 0;
  // FP8 instead of gate_up / down (codes set): gate, up [width, hidden], down [hidden, width].
  Fp8DeviceMatrix gate8, up8, down8;
  bool fp8() const { return gate8.codes != nullptr; }
  bool present() const { return gate_up != nullptr || fp8(); }
};

// GLM-5's attention (docs/glm5.md); the indexer pointers are null on "shared" layers.
struct DeviceMla {
  const uint16_t* q_a = nullptr;        // [Q, hidden]
  const float* q_a_norm = nullptr;      // [Q]
  const uint16_t* q_b = nullptr;        // [H * (dn + dr), Q]
  const uint16_t* kv_a = nullptr;       // [R + dr, hidden]
  const float* kv_a_norm = nullptr;     // [R]
  const uint16_t* kv_b = nullptr;       // [H * (dn + dv), R]
  const uint16_t* o = nullptr;          // [hidden, H * dv]
  const uint16_t* wq_b = nullptr;       // [Hi * Di, Q]
  const uint16_t* wk = nullptr;         // [Di, hidden]
  const float* k_norm = nullptr;        // [Di] LayerNorm gain
  const float* k_norm_bias = nullptr;   // [Di]
  const float* weights_proj = nullptr;  // [Hi, hidden] fp32 (kept fp32, as the reference)
  // FP8 GLM-5 (codes set) instead of the bf16 matrices above, same shapes, 128x128 block
  // scales: q_a, q_b, kv_a, kv_b, o as one group; the indexer's wq_b, wk as another.
  // kv_b stays FP8 too: the attention kernel widens its codes where it reads them.
  Fp8DeviceMatrix q_a8, q_b8, kv_a8, kv_b8, o8, wq_b8, wk8;
  bool fp8() const { return q_a8.codes != nullptr; }
  bool has_indexer() const { return wq_b != nullptr || wq_b8.codes != nullptr; }
};

struct DeviceLayer {
  DeviceMla mla;                      // GLM-5 layers (qkv, o, q_norm, k_norm then null)
  const float* input_norm = nullptr;  // [hidden]
  const float* post_norm = nullptr;   // [hidden]
  const uint16_t* qkv = nullptr;      // [q_dim + 2 kv_dim, hidden]
  const float* qkv_bias = nullptr;    // [q_dim + 2 kv_dim] or null
  const uint16_t* o = nullptr;        // [hidden, q_dim]
  const float* q_norm = nullptr;      // [head_dim] or null
  const float* k_norm = nullptr;      // [head_dim] or null
  // FP8 attention instead of qkv / o (codes set): q [q_dim, hidden], k and v [kv_dim, hidden],
  // o [hidden, q_dim].
  Fp8DeviceMatrix q8, k8, v8, o8;
  bool is_moe = false;
  DeviceFfn dense;                            // !is_moe
  const float* router = nullptr;              // [E, hidden] fp32
  const float* router_bias = nullptr;         // [E] fp32
  const uint16_t* experts_gate_up = nullptr;  // [E, 2 I, hidden]
  const uint16_t* experts_down = nullptr;     // [E, hidden, I]
  // FP8 routed experts instead (codes set): expert 0's gate, up [I, hidden] and down
  // [hidden, I]; expert e's follow at e times the codes' and the scales' sizes.
  Fp8DeviceMatrix experts_gate8, experts_up8, experts_down8;
  DeviceFfn shared;  // width 0 without a shared expert
};

// The MTP layer (docs/mtp.md) beside its decoder block, which is DeviceWeights::layers' last
// entry (one past the span's layers) when present.
struct DeviceMtp {
  const float* enorm = nullptr;       // [hidden]
  const float* hnorm = nullptr;       // [hidden]
  const uint16_t* eh_proj = nullptr;  // [hidden, 2 hidden]: the embedding half's columns first
  const float* head_norm = nullptr;   // [hidden] shared_head.norm
  const uint16_t* head = nullptr;     // [vocab, hidden]: shared_head.head, or the model's lm_head
  bool present() const { return eh_proj != nullptr; }
};

struct DeviceWeights {
  DeviceBuffer memory;                // one allocation holding everything below
  const uint16_t* embed = nullptr;    // [vocab, hidden] or null
  const float* final_norm = nullptr;  // [hidden] or null
  const uint16_t* lm_head = nullptr;  // [vocab, hidden] or null (aliases embed when tied)
  const float* inv_freq = nullptr;    // [rotary_dim / 2], RotaryEmbedding's values
  std::vector<DeviceLayer> layers;    // the span's, then the MTP layer's block if mtp.present()
  DeviceMtp mtp;

  int64_t bytes = 0;
  // What one decode step reads besides embedding rows and routed experts: every other matrix
  // and vector of the span. And the bytes of one routed expert (gate, up, down; FP8: codes
  // and fp32 scales).
  int64_t dense_step_bytes = 0;  // the MTP layer not counted
  int64_t routed_expert_bytes = 0;
};

// What a tensor-parallel rank's weights hold of the whole model's vocabulary and routed
// experts (core/model/parallel_layout.h; its other slices are in the matrices' shapes):
// embedding and lm_head rows, and the experts stacked on the device (the others are empty
// matrices in `w`). A model on its own: whole.
struct DeviceSlice {
  bool whole = true;
  int64_t vocab_rows = 0;
  IndexRange experts;
};

// Uploads `w` through two pinned staging buffers on `stream` (the host converts or copies the
// next chunk, from the checkpoint's file mapping or memory, while the previous chunk's async
// copy runs) and waits for the copies. `progress` (may be null) gets the bytes copied so far:
// at the start, about every 256 MiB and at the end; `seconds` counts from the start.
// A rank's slice (`slice`) uploads its experts only (the MTP layer's too).
absl::StatusOr<DeviceWeights> UploadWeights(const ModelWeights& w, cudaStream_t stream,
                                            const LoadProgressCallback& progress = nullptr,
                                            const DeviceSlice& slice = {});

}  // namespace glmserve::cuda
