// The model's parameters as per-layer structs, in their stored precision.
//
// Matrices are views (pointer + dtype + shape) into memory owned elsewhere: the mmap of a
// safetensors file or a buffer of seeded random values, kept alive by ModelWeights::storage.
// Small 1-D parameters (norm gains, biases, router correction bias) are widened to fp32 at
// load time: they are a rounding error of the model's size and every kernel wants them fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/base/dtype.h"
#include "core/model/config.h"

namespace glmserve {

// How a Matrix's elements are stored. kDense: rows x cols elements of `dtype`, as in the
// checkpoint. kInt8Groups: quantized at load (core/cpu/quantize.h): int8 q [rows, cols] at `data`
// and one bf16 scale per kInt8Group consecutive elements of a row at `group_scales`
// [rows, ceil(cols / kInt8Group)] (34 bytes per 32 weights, as llama.cpp's Q8_0); the element
// is q * scale, and `dtype` is the dtype it was quantized from.
// kFp8Scaled: an FP8 checkpoint's matrix as stored (docs/fp8.md): e4m3 codes [rows, cols] at
// `data` (dtype kF8E4M3, one byte per weight) and fp32 scales at `scales`, one per block of
// scale_block_rows x scale_block_cols elements, blocks cut short at the right and bottom edges:
// [ceil((rows + scale_row_phase) / br), ceil(cols / bc)]. The element (r, c) is the fp32 product
// e4m3(r, c) * scale((r + phase) / br, c / bc), rounded once. Per-output-channel scales are
// br = 1, bc = cols; 128x128 blocks are br = bc = 128.
// The kernels dispatch on the format first (core/cpu/ops/linear.cc).
enum class WeightFormat : uint8_t { kDense, kInt8Groups, kFp8Scaled };
inline constexpr int64_t kInt8Group = 32;  // one vdpbf16ps step of K

// Where kInt8Groups keeps each code and scale (the values are the same in either layout).
// kRowMajor: q [rows, cols], scales [rows, groups], as above.
// kRows16: the rows in blocks of 16, a block's codes group after group, 512 bytes a group:
// byte 64 p + 4 r + j of block b's group g is q[16 b + r][32 g + 4 p + j], so one 64-byte
// vector holds 4 codes of 16 rows, what one vpdpbusd multiplies by 4 broadcast activation codes
// (core/cpu/ops/linear_int8_rows16_avx512vnni.cc: decode reads it as one stream with no
// reduction across lanes); scales [blocks][groups][16]. The last block's rows past the matrix
// and the last group's codes past cols are zero (codes and scales). Row 0 is lane
// `int8_row_phase` of block 0 (non-zero only for a RowSlice that starts inside a block).
// QuantizeWeights picks the layout the CPU's kernels read fastest (core/cpu/quantize.h).
enum class Int8Layout : uint8_t { kRowMajor, kRows16 };
inline constexpr int64_t kInt8BlockRows = 16;  // kRows16: rows per block
inline constexpr int64_t kInt8BlockGroupBytes = kInt8BlockRows * kInt8Group;  // 512

// A row-major weight matrix [rows = out_features, cols = in_features]; y = x W^T.
struct Matrix {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  WeightFormat format = WeightFormat::kDense;
  const float* scales = nullptr;  // kFp8Scaled: see above
  // kFp8Scaled only: the scale block's shape, and the offset of row 0 inside its block row
  // (non-zero only for a RowSlice that starts inside a block).
  int32_t scale_block_rows = 0;
  int32_t scale_block_cols = 0;
  int32_t scale_row_phase = 0;
  const uint16_t* group_scales = nullptr;          // kInt8Groups: bf16 bits [rows, scale_cols()]
  Int8Layout int8_layout = Int8Layout::kRowMajor;  // kInt8Groups: see Int8Layout
  int32_t int8_row_phase = 0;                      // kRows16: the lane of row 0 in block 0

  bool empty() const { return data == nullptr; }
  int64_t scale_cols() const {
    if (format == WeightFormat::kFp8Scaled) {
      return (cols + scale_block_cols - 1) / scale_block_cols;
    }
    return (cols + kInt8Group - 1) / kInt8Group;
  }
  int64_t scale_rows() const {
    if (format == WeightFormat::kFp8Scaled) {
      return (rows + scale_row_phase + scale_block_rows - 1) / scale_block_rows;
    }
    return rows;
  }
  // kFp8Scaled: the scales of row r ([scale_cols()]).
  const float* Fp8RowScales(int64_t r) const {
    return scales + (r + scale_row_phase) / scale_block_rows * scale_cols();
  }
  // kRows16: the 16-row blocks that hold rows [0, rows), the phase included; the block that
  // holds row r, and r's lane in it; the row in lane 0 of block b (negative in block 0 when
  // the phase is not 0).
  int64_t int8_blocks() const {
    return (rows + int8_row_phase + kInt8BlockRows - 1) / kInt8BlockRows;
  }
  int64_t int8_block(int64_t r) const { return (r + int8_row_phase) / kInt8BlockRows; }
  int64_t int8_lane(int64_t r) const { return (r + int8_row_phase) % kInt8BlockRows; }
  int64_t int8_block_row0(int64_t b) const { return b * kInt8BlockRows - int8_row_phase; }
  // kInt8Groups, either layout: the code of element (r, c) and the bf16 bits of row r's group g
  // scale (for reference code and tests; the kernels address the layout directly).
  int8_t Int8Code(int64_t r, int64_t c) const {
    const int8_t* q = static_cast<const int8_t*>(data);
    if (int8_layout == Int8Layout::kRowMajor) return q[r * cols + c];
    const int64_t g = c / kInt8Group, in = c % kInt8Group;
    return q[(int8_block(r) * scale_cols() + g) * kInt8BlockGroupBytes + in / 4 * 64 +
             int8_lane(r) * 4 + in % 4];
  }
  uint16_t Int8Scale(int64_t r, int64_t g) const {
    if (int8_layout == Int8Layout::kRowMajor) return group_scales[r * scale_cols() + g];
    return group_scales[(int8_block(r) * scale_cols() + g) * kInt8BlockRows + int8_lane(r)];
  }
  int64_t bytes() const {
    if (format == WeightFormat::kInt8Groups && int8_layout == Int8Layout::kRows16) {
      return int8_blocks() * scale_cols() *
             (kInt8BlockGroupBytes + kInt8BlockRows * static_cast<int64_t>(sizeof(uint16_t)));
    }
    if (format == WeightFormat::kInt8Groups) {
      return rows * cols + scale_rows() * scale_cols() * static_cast<int64_t>(sizeof(uint16_t));
    }
    if (format == WeightFormat::kFp8Scaled) {
      return rows * cols + scale_rows() * scale_cols() * static_cast<int64_t>(sizeof(float));
    }
    return rows * cols * DTypeSize(dtype);
  }
  // Rows [begin, begin + count) as a matrix of their own.
  Matrix RowSlice(int64_t begin, int64_t count) const {
    Matrix m = *this;
    m.rows = count;
    if (format == WeightFormat::kInt8Groups && int8_layout == Int8Layout::kRows16) {
      const int64_t block = int8_block(begin);
      m.data = static_cast<const int8_t*>(data) + block * scale_cols() * kInt8BlockGroupBytes;
      m.group_scales = group_scales + block * scale_cols() * kInt8BlockRows;
      m.int8_row_phase = static_cast<int32_t>(int8_lane(begin));
    } else if (format == WeightFormat::kInt8Groups) {
      m.data = static_cast<const int8_t*>(data) + begin * cols;
      m.group_scales = group_scales + begin * scale_cols();
    } else if (format == WeightFormat::kFp8Scaled) {
      m.data = static_cast<const uint8_t*>(data) + begin * cols;
      m.scales = Fp8RowScales(begin);
      m.scale_row_phase = static_cast<int32_t>((begin + scale_row_phase) % scale_block_rows);
    } else {
      m.data = static_cast<const char*>(data) + begin * cols * DTypeSize(dtype);
    }
    return m;
  }
};

// A SwiGLU feed-forward block: down(silu(gate(x)) * up(x)).
struct FfnWeights {
  Matrix gate;  // [width, hidden]
  Matrix up;    // [width, hidden]
  Matrix down;  // [hidden, width]
};

struct AttentionWeights {
  Matrix q_proj;              // [heads * head_dim, hidden]
  Matrix k_proj;              // [kv_heads * head_dim, hidden]
  Matrix v_proj;              // [kv_heads * head_dim, hidden]
  Matrix o_proj;              // [hidden, heads * head_dim]
  std::vector<float> q_bias;  // [heads * head_dim], empty without attention_bias
  std::vector<float> k_bias;  // [kv_heads * head_dim], empty without attention_bias
  std::vector<float> v_bias;  // [kv_heads * head_dim], empty without attention_bias
  std::vector<float> q_norm;  // [head_dim], empty without use_qk_norm
  std::vector<float> k_norm;  // [head_dim], empty without use_qk_norm
};

// The DSA indexer of a GLM-5 "full" layer (core/cpu/ops/dsa_indexer.h).
struct IndexerWeights {
  Matrix wq_b;                     // [index_heads * index_dim, q_lora_rank]
  Matrix wk;                       // [index_dim, hidden]
  std::vector<float> k_norm;       // [index_dim] LayerNorm gain
  std::vector<float> k_norm_bias;  // [index_dim] LayerNorm bias
  Matrix weights_proj;             // [index_heads, hidden] (F32 in released checkpoints)
  bool empty() const { return wq_b.empty(); }
};

// GLM-5's multi-head latent attention (core/cpu/ops/mla.h); used instead of AttentionWeights.
struct MlaWeights {
  Matrix q_a_proj;               // [q_lora_rank, hidden]
  std::vector<float> q_a_norm;   // [q_lora_rank] RMSNorm gain (eps 1e-6)
  Matrix q_b_proj;               // [heads * (nope + rope), q_lora_rank]
  Matrix kv_a_proj;              // [kv_lora_rank + rope, hidden] (kv_a_proj_with_mqa)
  std::vector<float> kv_a_norm;  // [kv_lora_rank] RMSNorm gain (eps 1e-6)
  Matrix kv_b_proj;              // [heads * (nope + v), kv_lora_rank]
  Matrix o_proj;                 // [hidden, heads * v]
  IndexerWeights indexer;        // empty on "shared" indexer layers
};

struct MoeWeights {
  Matrix router;                    // [n_routed_experts, hidden] (math in fp32)
  std::vector<float> router_bias;   // [n_routed_experts] e_score_correction_bias
  std::vector<FfnWeights> experts;  // [n_routed_experts], width moe_intermediate_size
  FfnWeights shared;                // width moe_intermediate_size * n_shared_experts
  bool has_shared() const { return !shared.gate.empty(); }
};

struct LayerWeights {
  int64_t layer_index = 0;                 // index in the full model
  std::vector<float> input_norm;           // [hidden]
  std::vector<float> post_attention_norm;  // [hidden]
  AttentionWeights attn;                   // GLM-4.5 (grouped-query attention)
  MlaWeights mla;                          // GLM-5 (multi-head latent attention)
  bool is_moe = false;
  FfnWeights dense;  // width intermediate_size, when !is_moe
  MoeWeights moe;    // when is_moe
};

// GLM's multi-token-prediction layer (docs/mtp.md), stored as model.layers.<N>.* with N =
// num_hidden_layers: one more decoder layer whose input is
// eh_proj(concat(enorm(embed(next token)), hnorm(h))), read by head(head_norm(output)).
struct MtpWeights {
  LayerWeights layer;            // the decoder layer (its own attention, MoE or dense FFN)
  std::vector<float> enorm;      // [hidden]
  std::vector<float> hnorm;      // [hidden]
  Matrix eh_proj;                // [hidden, 2 hidden]: the embedding half's columns first
  std::vector<float> head_norm;  // [hidden] shared_head.norm
  Matrix head;                   // [vocab, hidden] shared_head.head, or a view of lm_head
};

// A span [layer_begin, layer_end) of the model. The embedding is present only when
// layer_begin == 0; the final norm and lm_head only when layer_end == num_hidden_layers.
struct ModelWeights {
  ModelConfig config;
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  Matrix embed_tokens;               // [vocab, hidden] or empty
  std::vector<LayerWeights> layers;  // layers[i] is model layer layer_begin + i
  std::vector<float> final_norm;     // [hidden] or empty
  Matrix lm_head;                    // [vocab, hidden] or empty (a view of embed when tied)
  DType weight_dtype = DType::kF32;  // dtype of the large matrices as stored
  // kInt8Groups once core/cpu/quantize.h quantized the linear layers at load; kFp8Scaled when an
  // FP8 checkpoint or preset supplied them (some matrices may still be kDense: the modules the
  // checkpoint keeps unquantized); else kDense.
  WeightFormat linear_format = WeightFormat::kDense;
  Int8Layout int8_layout = Int8Layout::kRowMajor;  // kInt8Groups: every linear matrix's layout
  // The MTP layer, loaded with a whole model whose checkpoint stores it (or a preset asked
  // for it); empty otherwise.
  std::optional<MtpWeights> mtp;
  bool mtp_head_stored =
      false;  // the checkpoint stores shared_head.head (else mtp->head = lm_head)
  // tie_word_embeddings is set but the checkpoint stores its own lm_head.weight, which is
  // used (Transformers 5.x): lm_head is then not a view of the embedding.
  bool head_stored_despite_tie = false;

  // FP8 preset matrices whose codes the device generates (RandomWeightOptions::
  // fp8_codes_on_device): `matrix` (a layer's, so its address survives moves of this struct)
  // has null data; element i of its codes is core/model/checkpoint.h's RandomFp8Stream (key,
  // value_scale). Empty for every other source of weights.
  struct DeviceGeneratedFp8 {
    const Matrix* matrix = nullptr;
    uint64_t key = 0;
    float value_scale = 0;
  };
  std::vector<DeviceGeneratedFp8> device_generated_fp8;

  // Owners of the memory the matrices point into (file mappings, random-weight buffers).
  std::vector<std::shared_ptr<const void>> storage;

  bool has_embedding() const { return !embed_tokens.empty(); }
  bool has_head() const { return !lm_head.empty(); }
  // Bytes of every matrix and vector this span holds (tied lm_head counted once).
  int64_t ParameterBytes() const;
  // The linear layers' matrices: q/k/v/o, the dense FFN, every expert and the shared one, and
  // lm_head unless it is a view of the embedding; empty ones (another attention form's) left out.
  std::vector<Matrix*> LinearMatrices();
};

}  // namespace glmserve
