// Host-side launchers of the CUDA kernels, one .cu file per op family. Plain C++ types only
// (bf16 device data travels as uint16_t*), so that the .cu files need neither absl nor the
// rest of the engine, and so that the runner and the tests call them the same way.
//
// Every launcher enqueues work on `stream` and returns the launch status (cudaGetLastError
// after the launch); it never synchronises. Shapes are validated by the caller
// (core/cuda/model.cc); the limits kernels rely on are listed here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/model/mla_shape.h"
#include "core/model/row_math.h"
#include "core/model/sample_math.h"

namespace glmserve::cuda {

// Limits of the kernels (checked once when a model is created).
inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kMaxGqaGroup = 32;  // query heads per kv head

// Per-device kernel attributes (the attention kernel's shared-memory opt-in). Call once per
// process and device before the first launch (and outside any graph capture).
cudaError_t PrepareKernels();

// ---- fp8_linear.cu -------------------------------------------------------------------
// An FP8 weight matrix on the device (core/model/weights.h's kFp8Scaled): codes [rows, cols] e4m3,
// scales [ceil(rows / block_rows), ceil(cols / block_cols)] fp32; element (r, c) is
// e4m3 x scales[r / block_rows][c / block_cols]. Per output channel: block_rows 1,
// block_cols = cols.
struct Fp8DeviceMatrix {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_rows = 1;
  int64_t block_cols = 1;
};
// Up to this many activation rows take the GEMV kernel (one read of each weight byte).
inline constexpr int64_t kFp8GemvMaxRows = 8;
// y [m, w.rows] = x [m, w.cols] W^T, fp32 in and out.
cudaError_t LaunchFp8Linear(const float* x, int64_t m, const Fp8DeviceMatrix& w, float* y,
                            cudaStream_t stream);
// The CUDA runner's form: bf16 activations x [m, w.cols] (its GEMM inputs), fp32 results at
// y[i * y_ld + n] (y_ld >= w.rows: q, k and v write their columns of the fused qkv rows,
// gate and up theirs of gate_up).
cudaError_t LaunchFp8LinearBf16(const uint16_t* x, int64_t m, const Fp8DeviceMatrix& w, float* y,
                                int64_t y_ld, cudaStream_t stream);
// Routed experts driven by device-side offsets (moe.cu's LaunchMoeSort): for every expert e and
// row i in [offsets[e], offsets[e + 1]): out[i * out_ld + n] = in[i, :] . W_e[n, :], n <
// expert0.rows; in: [pairs, expert0.cols] bf16. W_e's codes and scales follow expert0's at e
// times their sizes (the device weights stack a layer's experts so). No host synchronisation:
// capturable in a CUDA graph.
cudaError_t LaunchFp8ExpertGemv(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                const int32_t* offsets, const uint16_t* in, float* out,
                                int64_t out_ld, cudaStream_t stream);
// Routed experts: rows [row_offsets[e], row_offsets[e + 1]) of x (sorted by expert) through
// experts[e] into the same rows of y. row_offsets (num_experts + 1) and experts are host
// arrays; every expert has the same shape.
cudaError_t LaunchFp8Experts(const float* x, const int64_t* row_offsets,
                             const Fp8DeviceMatrix* experts, int64_t num_experts, float* y,
                             cudaStream_t stream);

// codes[i] for i < n: the e4m3 values RandomWeights gives an FP8 preset's matrix
// (core/model/checkpoint.h's RandomFp8Stream: key, value_scale), bit for bit, generated on the
// device so that a big preset needs no host copy.
cudaError_t LaunchRandomFp8(uint8_t* codes, int64_t n, uint64_t key, float value_scale,
                            cudaStream_t stream);

// ---- fp8_moe_gemm_tc.cu --------------------------------------------------------------
// LaunchFp8ExpertGemv's result for steps of any size on bf16 tensor cores (e4m3 codes widened
// exactly to bf16, WMMA with fp32 accumulation; 64 x 64 output tiles): for every expert e and
// row i in [offsets[e], offsets[e + 1]), out[i * out_ld + n] = in[i, :] . W_e[n, :],
// n < expert0.rows; in: [pairs, expert0.cols] bf16; experts stacked as for LaunchFp8ExpertGemv.
// `pairs` (offsets[n_experts], known to the host without reading the offsets) sizes the grid;
// no host synchronisation, CUDA-graph capturable. Scales constant along k (per output
// channel) or in blocks of the 128x128 form (block_rows a multiple of 64, block_cols of 32):
// Fp8ExpertGemmTcSupported; cudaErrorNotSupported for other block shapes.
bool Fp8ExpertGemmTcSupported(const Fp8DeviceMatrix& w);
cudaError_t LaunchFp8ExpertGemmTc(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                  const int32_t* offsets, int64_t pairs, const uint16_t* in,
                                  float* out, int64_t out_ld, cudaStream_t stream);
// The same GEMM on quantized activations (FP8 tensor cores on; docs/cuda.md "One activation
// arithmetic"): x_codes [pairs, expert0.cols] e4m3 and x_scales from LaunchQuantizeFp8Groups of
// the expert-sorted rows (row i's group g at x_scales[g * scale_ld + i], scale_ld >= pairs):
// LaunchFp8ExpertGemvVecQ's result for every row, up to the fp32 summation order,
//   out[i * out_ld + n] = (sum_g x_scale[i, g] * sB[n, g] * (W_e codes[n, g] . x_codes[i, g]))
//                         * ws[n]
// (128x128 form: sB the block scale, ws 1; per channel: sB 1, ws the row scale), the codes'
// products on bf16 tensor cores with fp32 sums per 128-wide group. The same weight forms as
// LaunchFp8ExpertGemmTc (cudaErrorNotSupported otherwise); no host synchronisation.
cudaError_t LaunchFp8ExpertGemmTcQ(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                   const int32_t* offsets, int64_t pairs, const uint8_t* x_codes,
                                   const float* x_scales, int64_t scale_ld, float* out,
                                   int64_t out_ld, cudaStream_t stream);

// ---- fp8_gemv_vec.cu (the decode GEMVs with 16-byte loads) ----------------------------
// LaunchFp8LinearBf16's GEMV (m <= kFp8GemvMaxRows) and LaunchFp8ExpertGemv with vectorised
// weight and activation loads, several rows per warp, the scale once per row (per channel) or
// per 16-code chunk (blocks). Supported when w.cols and block_cols are multiples of 16 (or one
// block per row) and codes and activations are 16-byte aligned (Fp8GemvVecSupported);
// cudaErrorNotSupported otherwise.
bool Fp8GemvVecSupported(const Fp8DeviceMatrix& w, const uint16_t* x);
cudaError_t LaunchFp8GemvVec(const uint16_t* x, int64_t m, const Fp8DeviceMatrix& w, float* y,
                             int64_t y_ld, cudaStream_t stream);
cudaError_t LaunchFp8ExpertGemvVec(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                   const int32_t* offsets, const uint16_t* in, float* out,
                                   int64_t out_ld, cudaStream_t stream);
// The same GEMVs on quantized activations (FP8 tensor cores on; docs/cuda.md): x_codes
// [m, w.cols] e4m3 and x_scales from LaunchQuantizeFp8Groups (row i's group g at
// x_scales[g * scale_ld + i]; the expert form indexes rows globally, as `in_codes`):
//   y[i * y_ld + n] = (sum_g x_scale[i, g] * sum_{c in g} e4m3(x[i, c]) * W[n, c]) * ws[n]
// with W[n, c] the e4m3 code (per-channel form, ws its row scale) or code x block scale (128x128
// form, ws 1): the tensor-core GEMM's arithmetic up to the fp32 summation order. Supported when
// Fp8GemvVecQSupported(w) and the codes are 16-byte aligned; cudaErrorNotSupported otherwise.
bool Fp8GemvVecQSupported(const Fp8DeviceMatrix& w);
cudaError_t LaunchFp8GemvVecQ(const uint8_t* x_codes, const float* x_scales, int64_t scale_ld,
                              int64_t m, const Fp8DeviceMatrix& w, float* y, int64_t y_ld,
                              cudaStream_t stream);
cudaError_t LaunchFp8ExpertGemvVecQ(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                    const int32_t* offsets, const uint8_t* in_codes,
                                    const float* in_scales, int64_t scale_ld, float* out,
                                    int64_t out_ld, cudaStream_t stream);

// ---- fp8_quant.cu (around the tensor-core FP8 GEMM, core/cuda/fp8_gemm.h) ----------------
// Activations are quantized per token and per 1x128 group along k (the last group of a row
// cut short when k is not a multiple of 128): the granularity of cuBLASLt's VEC128_32F scale
// mode, and DeepSeek-V3's / Transformers' fine-grained FP8 activation scheme.
inline constexpr int64_t kFp8ActGroup = 128;
inline constexpr int64_t Fp8ActGroups(int64_t k) { return (k + kFp8ActGroup - 1) / kFp8ActGroup; }
// x [m, k] bf16 -> codes [m, k] e4m3 and scales[g * scale_ld + i] (scale_ld >= m): per group,
// scale = amax of its finite values / 448 (at least FLT_MIN; 1 for an all-zero group), code =
// e4m3(x / scale) (round to nearest even, saturating; core/base/dtype.h's FloatToE4m3). Group-major
// scales with the tokens contiguous: cuBLASLt's VEC128_32F layout for B ("N-major, N x L").
cudaError_t LaunchQuantizeFp8Groups(const uint16_t* x, int64_t m, int64_t k, uint8_t* codes,
                                    float* scales, int64_t scale_ld, cudaStream_t stream);
// The per-channel GEMM's epilogue: y[i * y_ld + n] *= col_scales[n] for i < m, n < cols.
cudaError_t LaunchScaleCols(float* y, int64_t m, int64_t cols, int64_t y_ld,
                            const float* col_scales, cudaStream_t stream);
// dst [rows, ld] = src [rows, cols] (row-major) with columns [cols, ld) set to 1: 128x128
// block scales with their k-block stride rounded up to a multiple of 4, as cuBLASLt's
// BLK128x128_32F mode requires.
cudaError_t LaunchPadBlockScales(const float* src, int64_t rows, int64_t cols, float* dst,
                                 int64_t ld, cudaStream_t stream);

// ---- norm.cu --------------------------------------------------------------------------
// For each output row r (source row i = row_index ? row_index[r] : r):
//   if delta: h[i] += delta[i] (written back, fp32)
//   out_bf16[r] = bf16(gain * (h[i] * rsqrt(mean(h[i]^2) + eps)))   (fp32 math)
//   out_f32[r]  = the same value unrounded, when out_f32 is not null.
// row_index and delta must not both be set (a gathered add would update only some rows).
cudaError_t LaunchAddRmsNorm(float* h, const float* delta, const float* gain, int64_t rows,
                             int64_t width, float eps, const int32_t* row_index, uint16_t* out_bf16,
                             float* out_f32, cudaStream_t stream);
// h[i] += delta[i] for i < n.
cudaError_t LaunchAdd(float* h, const float* delta, int64_t n, cudaStream_t stream);

// ---- rope.cu --------------------------------------------------------------------------
struct QkvShape {
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  GLM_HD int64_t row_stride() const { return (heads + 2 * kv_heads) * head_dim; }
};
// qkv: [tokens, (heads + 2 kv_heads) * head_dim] fp32, the fused q|k|v projection output.
// For each token: adds bias (if set: [row_stride]); RMSNorms every q head with q_norm and every
// k head with k_norm (if set, [head_dim], eps); applies partial NeoX RoPE at positions[t] with
// inv_freq [rotary_dim / 2]; writes q back in place (fp32) and k, v as bf16 into the cache slot
// slots[t] (block * block_size + offset; < 0: not stored) of `cache_layer`, the layer's part
// of a KvCache storage ([num_blocks, 2, block_size, kv_heads * head_dim] bf16).
cudaError_t LaunchQkNormRopeKv(float* qkv, int64_t tokens, const QkvShape& shape, const float* bias,
                               const float* q_norm, const float* k_norm, float eps,
                               const float* inv_freq, const int32_t* positions,
                               const int32_t* slots, uint16_t* cache_layer, int64_t block_size,
                               cudaStream_t stream);

// The FP8 KV cache (--kv_cache_dtype=fp8_e4m3; core/model/kv_fp8.h, docs/kv_cache.md) of one layer:
// codes [num_blocks, 2, block_size, kv_heads * head_dim] e4m3 (the bf16 cache's layout, a
// byte per value) and scales [num_blocks, 2, block_size, kv_heads] fp32, one per token slot,
// kind (K, V) and KV head: amax / 448 of that head's row (the CPU's codec, bit for bit).
struct Fp8KvLayer {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};
// LaunchQkNormRopeKv writing k and v into an FP8 cache: each (token, KV head) row of fp32 k
// (after norm and RoPE) and v is encoded from its own values (EncodeKvRow's arithmetic).
cudaError_t LaunchQkNormRopeKvFp8(float* qkv, int64_t tokens, const QkvShape& shape,
                                  const float* bias, const float* q_norm, const float* k_norm,
                                  float eps, const float* inv_freq, const int32_t* positions,
                                  const int32_t* slots, Fp8KvLayer cache_layer, int64_t block_size,
                                  cudaStream_t stream);

// ---- attention.cu ---------------------------------------------------------------------
// A tile of consecutive query tokens of one sequence, as 5 int32 in device memory:
// row0 (first batch row), num_q, pos0 (position of row0), bt_offset (start of the sequence's
// block table in the block-table array), kv_len (keys visible: pos0 + num_q; 0 makes the tile
// write zeros, for padding rows).
inline constexpr int kTileInts = 5;
// Query tokens per tile for a GQA group size: tiles hold num_q * group <= 32 query rows.
int AttentionTileTokens(int64_t group);
// Floats of one (tile, kv head, split) partial in the split scratch: acc [rows_cap, head_dim],
// then m [rows_cap] and l [rows_cap] (rows_cap: AttentionTileTokens(group) x group).
GLM_HD inline int64_t AttentionPartialFloats(int64_t rows_cap, int64_t head_dim) {
  return rows_cap * (head_dim + 2);
}
// Floats of split scratch LaunchPagedAttention needs for `num_tiles` tiles with `num_splits`.
int64_t AttentionScratchFloats(int64_t num_tiles, int64_t kv_heads, int64_t group, int64_t head_dim,
                               int num_splits);
struct AttentionShape {
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  int64_t q_stride = 0;  // floats between consecutive tokens' q rows
  float scale = 1.0f;    // softmax scale (head_dim^-0.5)
};
// Causal paged attention: out[t, h, :] (bf16, [tokens, heads * head_dim]) from q (fp32,
// q + t * q_stride + h * head_dim) and the layer's K/V in the cache. Each tile's KV range is
// cut into num_splits parts (flash-decoding); with num_splits > 1 the parts go through
// `scratch` (AttentionScratchFloats) and a combine kernel. Softmax in fp32, online.
cudaError_t LaunchPagedAttention(const float* q, const int32_t* tiles, int num_tiles,
                                 const int32_t* block_tables, const uint16_t* cache_layer,
                                 const AttentionShape& shape, int num_splits, float* scratch,
                                 uint16_t* out, cudaStream_t stream);
// The same over an FP8 cache: each key and value is decoded as e4m3 x its head's scale (the
// CPU's DecodeKvHead values) when its chunk is staged in shared memory.
cudaError_t LaunchPagedAttentionFp8(const float* q, const int32_t* tiles, int num_tiles,
                                    const int32_t* block_tables, Fp8KvLayer cache_layer,
                                    const AttentionShape& shape, int num_splits, float* scratch,
                                    uint16_t* out, cudaStream_t stream);

// Merges the num_splits partials of every (tile, kv head) in `scratch` into `out` (bf16):
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). Both attention kernels end with it.
cudaError_t LaunchAttentionCombine(const float* scratch, const int32_t* tiles, int num_tiles,
                                   const AttentionShape& shape, int num_splits, uint16_t* out,
                                   cudaStream_t stream);

// ---- attention_tc.cu ------------------------------------------------------------------
// LaunchPagedAttention's result over the bf16 cache on tensor cores (WMMA, flash-attention
// style; same tiles, splits and scratch; q and P as hi + lo bf16 pairs, so within the same
// bound of the CPU as the CUDA-core kernel, not bit-equal to it). The runner's default for
// GLM-4.5 (CudaModelOptions::attention_tensor_cores); the FP8 cache keeps the kernel above.
cudaError_t LaunchPagedAttentionTc(const float* q, const int32_t* tiles, int num_tiles,
                                   const int32_t* block_tables, const uint16_t* cache_layer,
                                   const AttentionShape& shape, int num_splits, float* scratch,
                                   uint16_t* out, cudaStream_t stream);
// Dynamic shared memory of one tensor-core attention block (80 KiB at head_dim 128, 144 KiB
// at 256), and the opt-in beyond 48 KiB (PrepareKernels calls it).
size_t AttentionTcSmemBytes(int64_t head_dim);
cudaError_t PrepareAttentionTc(int max_dynamic_smem);

// ---- mla.cu (GLM-5's multi-head latent attention; docs/glm5.md) ---------------------------
// The latent cache layer (KvCacheShape::latent): [num_blocks, block_size, row_width] bf16,
// row = [ latent (R) | k_rot (dr) | indexer key (Di, full layers) ].
// The shapes: core/model/mla_shape.h (MlaShape with block_size set, IndexerShape).
// Per token t: rotates the last dr channels of every head of q ([tokens, H, dn + dr] fp32, in
// place; RoPE_interleaved: pair (2i, 2i + 1) -> (i, i + dr / 2)); RMSNorms the latent
// kv_a[t, :R] (gain [R], eps) and rotates k_rot = kv_a[t, R:R + dr] (kv_a: [tokens, R + dr]
// fp32) and stores both as bf16 at [0, R + dr) of cache slot slots[t] (< 0: not stored).
cudaError_t LaunchMlaRopeLatentWrite(float* q, const float* kv_a, int64_t tokens,
                                     const MlaShape& shape, const float* kv_norm, float eps,
                                     const float* inv_freq, const int32_t* positions,
                                     const int32_t* slots, uint16_t* cache_layer,
                                     cudaStream_t stream);
// Absorbed attention over the latent cache, per tile (kTileInts, tile_tokens 1 or more) and
// head: q_lat = W_uk[h]^T q_nope (kv_b: [H * (dn + dv), R] bf16; per head dn key rows then dv
// value rows; or, FP8 GLM-5, kv_b null and kv_b8 that matrix's codes and block scales), score[p] =
// (q_lat . latent[p] + q_rot . k_rot[p]) * scale over the token's positions (every p <= pos when
// sel_count[t] < 0, else sel_pos[t * sel_stride + i], i < sel_count[t], ascending), online softmax
// in fp32, o_lat = sum_p w_p latent[p], out[t, h] = W_uv[h] o_lat as bf16 ([tokens, H * dv]).
// sel_count null: every causal key. A tile with kv_len 0 (padding) writes zeros.
cudaError_t LaunchMlaAttention(const float* q, const int32_t* tiles, int num_tiles,
                               const int32_t* block_tables, const uint16_t* cache_layer,
                               const uint16_t* kv_b, const Fp8DeviceMatrix& kv_b8,
                               const MlaShape& shape, const int32_t* sel_count,
                               const int32_t* sel_pos, int64_t sel_stride, uint16_t* out,
                               cudaStream_t stream);

// ---- mla_tc.cu (the same attention on tensor cores: WMMA bf16, flash-decoding splits) -----
// Attended keys per split block (a multiple of 16).
inline constexpr int64_t kMlaTcChunk = 64;
// The tensor-core path's padded widths and per-token scratch sizes for a shape and a bound on
// the keys any token attends (index_topk with an indexer; else the longest context). Not
// `supported`: the shape needs mla.cu's kernel (latent > 512, or Kp's tiles beyond 48 KiB of
// shared memory).
struct MlaTcLayout {
  bool supported = false;
  int64_t kp = 0;      // R + dr rounded up to 16: the score MMAs' K
  int64_t rp = 0;      // R rounded up to 16: the value MMAs' N
  int64_t hp = 0;      // H rounded up to 16: the MMAs' M, in head tiles
  int64_t splits = 0;  // ceil(max_keys / kMlaTcChunk)
  // Per token: q_cat bf16 elements (hi and lo rows per padded head), partial O floats,
  // (m, l) floats.
  int64_t q_cat_elems = 0, o_part_floats = 0, ml_part_floats = 0;
};
MlaTcLayout MlaTcLayoutFor(const MlaShape& shape, int64_t max_keys);
// Device scratch for `tokens` tokens: q_cat [tokens, q_cat_elems], o_part [tokens,
// o_part_floats], ml_part [tokens, ml_part_floats] (256-bit aligned).
struct MlaTcScratch {
  uint16_t* q_cat = nullptr;
  float* o_part = nullptr;
  float* ml_part = nullptr;
};
// LaunchMlaAttention's result on tensor cores, for tiles of ONE token each (the runner's MLA
// plan) over `tokens` rows of q: each token attends to at most layout's splits x
// kMlaTcChunk keys. Scores and P x V in WMMA bf16 x bf16 -> fp32 (q_lat and P each as a bf16
// hi + lo pair), softmax, split merge and W_uv in fp32. Nothing waits for the host.
cudaError_t LaunchMlaAttentionTc(const float* q, int64_t tokens, const int32_t* tiles,
                                 int num_tiles, const int32_t* block_tables,
                                 const uint16_t* cache_layer, const uint16_t* kv_b,
                                 const Fp8DeviceMatrix& kv_b8, const MlaShape& shape,
                                 const int32_t* sel_count, const int32_t* sel_pos,
                                 int64_t sel_stride, const MlaTcLayout& layout,
                                 const MlaTcScratch& scratch, uint16_t* out, cudaStream_t stream);

// ---- dsa_indexer.cu (GLM-5's DSA indexer; core/cpu/ops/dsa_indexer.h) ------------------------
// Per token t: iq [tokens, Hi * Di] fp32 gets RoPE_interleaved on each head's first dr
// channels (in place); ik [tokens, Di] fp32 is LayerNormed (gain, bias, eps; in place), its
// first dr channels rotated, and stored as bf16 at key_offset of cache slot slots[t];
// w [tokens, Hi] is scaled by Hi^-0.5 (in place).
cudaError_t LaunchIndexerPrepare(float* iq, float* ik, float* w, int64_t tokens,
                                 const IndexerShape& shape, const MlaShape& mla,
                                 const float* ln_gain, const float* ln_bias, float eps,
                                 const float* inv_freq, const int32_t* positions,
                                 const int32_t* slots, uint16_t* cache_layer, cudaStream_t stream);
// Selection of tiles [tile_begin, tile_end): for each token at position pos with pos + 1 >
// topk, s[p] = sum_h w[t, h] relu(iq[t, h] . ik[p] * Di^-0.5) over p <= pos (heads ascending)
// and the topk largest (ties to the lower position) written ascending to sel_pos[t * topk ..],
// sel_count[t] = topk; otherwise sel_count[t] = -1 (every causal key). `scores`: scratch of
// (tile_end - tile_begin) * max_kv_len floats.
cudaError_t LaunchIndexerTopk(const float* iq, const float* w, const int32_t* tiles, int tile_begin,
                              int tile_end, int64_t max_kv_len, const int32_t* block_tables,
                              const uint16_t* cache_layer, const IndexerShape& shape,
                              const MlaShape& mla, float* scores, int32_t* sel_count,
                              int32_t* sel_pos, cudaStream_t stream);

// ---- moe.cu ---------------------------------------------------------------------------
// Router rows (rowmath::RouteRow): logits [tokens, n_experts] fp32 -> experts, weights
// [tokens, top_k].
cudaError_t LaunchRouter(const float* logits, int64_t tokens, const float* bias,
                         const rowmath::RouterRowParams& params, int32_t* experts, float* weights,
                         cudaStream_t stream);
// Groups the pairs p = token * top_k + k by expert, stably (ascending p within an expert):
// offsets [n_experts + 1], sorted [pairs] (pair ids by expert), pair_pos [pairs] (inverse).
cudaError_t LaunchMoeSort(const int32_t* experts, int64_t pairs, int64_t n_experts,
                          int32_t* offsets, int32_t* sorted, int32_t* pair_pos,
                          cudaStream_t stream);
// out[i] = x[sorted[i] / top_k] for i < pairs (bf16 rows of `width`).
cudaError_t LaunchGatherRows(const uint16_t* x, int64_t width, const int32_t* sorted, int64_t pairs,
                             int64_t top_k, uint16_t* out, cudaStream_t stream);
// For every expert e and row i in [offsets[e], offsets[e + 1]):
//   out[i, :n] = in[i, :k] . w[e]^T, w: [n_experts, n, k] bf16, in bf16, out fp32.
// A GEMV-style kernel for small per-expert row counts, driven entirely by device-side
// offsets: no host synchronisation, so it can be captured in a CUDA graph.
cudaError_t LaunchExpertGemv(const uint16_t* w, int64_t n, int64_t k, int64_t n_experts,
                             const int32_t* offsets, const uint16_t* in, float* out,
                             cudaStream_t stream);
// ---- moe_gemm_tc.cu ------------------------------------------------------------------
// LaunchExpertGemv's result for steps of any size on tensor cores (WMMA bf16, fp32
// accumulation; 64 x 64 output tiles): for every expert e and row i in
// [offsets[e], offsets[e + 1]), out[i, :n] = in[i, :k] . w[e]^T. `pairs` (offsets[n_experts],
// known to the host without reading the offsets) sizes the grid; the counts stay on the
// device, so no host synchronisation and CUDA-graph capturable.
cudaError_t LaunchExpertGemmTc(const uint16_t* w, int64_t n, int64_t k, int64_t n_experts,
                               const int32_t* offsets, int64_t pairs, const uint16_t* in,
                               float* out, cudaStream_t stream);
// out[t] = sum_k weights[t, k] * expert_out[pair_pos[t * top_k + k]] (fp32)
//          (+ out[t] when accumulate: the shared expert's output already there).
// The k terms are added in ascending expert id (experts [tokens, top_k]), as the CPU backend.
// Only terms of experts in [expert_begin, expert_end) count (an expert-parallel rank's; the
// others' expert_out rows are never computed there, and never read).
cudaError_t LaunchMoeCombine(const float* expert_out, const int32_t* pair_pos,
                             const int32_t* experts, const float* weights, int64_t tokens,
                             int64_t top_k, int64_t width, bool accumulate, float* out,
                             cudaStream_t stream, int expert_begin = 0,
                             int expert_end = INT32_MAX);

// ---- sampling.cu ---------------------------------------------------------------------
// Row scans with the CPU sampler's semantics (core/engine/sampler_scan.h): values compared as
// floats, NaN read as -inf, ties to the lower id. logits: [rows, vocab] fp32. finite[r] (when not
// null): 1 when every value of row r is finite, else 0 (the engine fails a request whose logits
// hold NaN or Inf rather than sample from them). ids[r], values[r]: row r's maximum and its lowest
// id.
cudaError_t LaunchRowArgMax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids,
                            float* values, int32_t* finite, cudaStream_t stream);
// ids[r * k ..], values[r * k ..]: row r's k largest (1 <= k <= min(vocab, kMaxDeviceTopK)),
// in ascending id order; cudaErrorInvalidValue for another k.
inline constexpr int kMaxDeviceTopK = 1024;
cudaError_t LaunchRowTopK(const float* logits, int64_t rows, int64_t vocab, int k, int32_t* ids,
                          float* values, int32_t* finite, cudaStream_t stream);

// ---- row_sample.cu --------------------------------------------------------------------
// Each row's token, chosen on the device exactly as core/engine/sampler.cc's SampleToken
// chooses it from the same row (core/model/sample_math.h: the same arithmetic, exact integer
// sums): logits [rows, vocab] fp32; params[r] row r's sampling (its penalised ids at
// penalised_ids[params[r].penalised_begin ..], ascending); tokens[r] the choice (or the
// forced token); finite[r] (when not null) as LaunchRowArgMax. Where params[r] asks:
// logprobs[r] the token's logprob, top_ids / top_logprobs [rows, kMaxRowTopLogprobs] the
// first top_logprobs entries of row r, best first (ties to the lower id), as the host's
// SampleToken computes them (ids exact, values to float64 rounding). No scratch memory.
cudaError_t LaunchRowSample(const float* logits, int64_t rows, int64_t vocab,
                            const samplemath::RowSampling* params, const int32_t* penalised_ids,
                            int32_t* tokens, int32_t* finite, float* logprobs, int32_t* top_ids,
                            float* top_logprobs, cudaStream_t stream);

// ---- elementwise.cu -------------------------------------------------------------------
// h[t] = float(table[ids[t]]) (bf16 table [vocab, width]).
cudaError_t LaunchEmbedding(const uint16_t* table, const int32_t* ids, int64_t tokens,
                            int64_t width, float* h, cudaStream_t stream);
// A tensor-parallel rank's slice: table holds vocabulary rows [first, first + count);
// h[t] = float(table[ids[t] - first]) for ids inside it, zeros for the others.
cudaError_t LaunchEmbeddingSlice(const uint16_t* table, const int32_t* ids, int64_t tokens,
                                 int64_t first, int64_t count, int64_t width, float* h,
                                 cudaStream_t stream);
// out[r, c] = bf16(silu(gu[r, c]) * gu[r, width + c]): gu [rows, 2 width] fp32 (gate | up).
cudaError_t LaunchSwiGlu(const float* gate_up, int64_t rows, int64_t width, uint16_t* out,
                         cudaStream_t stream);
// Conversions (tests, uploads).
cudaError_t LaunchFloatToBf16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream);
cudaError_t LaunchBf16ToFloat(const uint16_t* in, int64_t n, float* out, cudaStream_t stream);
// out[r, c] (bf16, [rows, cols]) = in[r * in_stride + c]: the first cols of strided fp32 rows
// (cuDNN attention's packed bf16 q from the qkv rows).
cudaError_t LaunchRowsToBf16(const float* in, int64_t rows, int64_t cols, int64_t in_stride,
                             uint16_t* out, cudaStream_t stream);

// ---- collective.cu --------------------------------------------------------------------
// out[i] = parts[0][i] + parts[1][i] + ... + parts[ranks - 1][i], added in that order (parts
// [ranks, count], the ranks' partials as an all-gather leaves them): the fixed reduction
// order of core/model/communicator.h, so the bits match the CPU group's. out may be parts.
cudaError_t LaunchRankOrderSum(const float* parts, int ranks, int64_t count, float* out,
                               cudaStream_t stream);
// The head's vocabulary slices gathered in rank order (blocks: rank r's [rows, V_r] logits,
// one block after another) into out [rows, vocab]: rank r holds vocabulary
// [r * vocab / ranks, (r + 1) * vocab / ranks) (core/model/parallel_layout.h).
cudaError_t LaunchInterleaveVocab(const float* blocks, int64_t rows, int64_t vocab, int ranks,
                                  float* out, cudaStream_t stream);

}  // namespace glmserve::cuda
