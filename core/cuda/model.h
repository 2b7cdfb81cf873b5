// CudaModel: the GLM-4.5 stack on one NVIDIA GPU, behind the same ModelRunner interface as
// the CpuModel (core/cpu/cpu_model.h) and computing the same forward (see there and
// docs/model.md), in bf16 weights and activations with fp32 accumulation:
//
//   h (fp32 residual) = embed(tokens)
//   per layer:  x = RMSNorm_in(h [+= previous FFN output])          (norm.cu, fused add)
//               qkv = x Wqkv^T (cuBLAS), + bias, QK-norm, RoPE, KV write  (rope.cu)
//               attn = paged causal attention (attention.cu); delta = attn Wo^T
//               x = RMSNorm_post(h += delta)  (+ an fp32 copy for the router)
//               delta = dense SwiGLU FFN, or MoE: router (fp32) -> group by expert ->
//                       expert GEMMs -> weighted fp32 combine + shared expert   (moe.cu)
//   logits = RMSNorm_final(h[rows]) lm_head^T -> host fp32
//
// Memory: weights uploaded once (core/cuda/device_weights.h); an activation arena sized for
// the largest step seen (it grows, never shrinks); the paged KV cache in device memory (bf16,
// the host cache's layout; block ids index it directly); one int32 metadata transfer per
// step through pinned memory; logits back through pinned memory.
//
// Steps of up to 512 rows (GLM-4.5: decodes and prefill chunks in any mix; GLM-5: decode
// steps of up to 128) run as CUDA graphs, captured per (rows, logits rows) bucket: rows
// padded to 1, 2, 4, ..., 128, then multiples of 64; attention tiles to one per row; logits
// rows (at most 128) to their own bucket. Not steps that return hidden states, the MTP
// layer's, or ones whose MoE would read counts back to the host. Set
// CudaModelOptions::cuda_graphs = false or GLMSERVE_CUDA_GRAPHS=0 to disable (docs/cuda.md).
//
// Tensor parallel (CreateRank; docs/parallel.md): a rank holds its slice of the weights
// (core/model/weight_shard.h: its query and KV heads, FFN widths, routed experts under EP or
// their width, vocabulary rows) on its own GPU and runs every step of the group's batch.
// Partial outputs are summed on the device through the group's Communicator (NCCL, enqueued
// on the model's stream, so graphs capture them): the embedding (zeros outside the rank's
// vocabulary), each layer's o_proj and FFN outputs. The head's vocabulary slices are gathered
// on rank 0, the only one that samples or returns logits.
//
// Not thread-safe: one engine thread owns a CudaModel and its caches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/cuda/cudnn_attention.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/device_weights.h"
#include "core/cuda/fp8_gemm.h"
#include "core/cuda/kernels.h"
#include "core/cuda/step_plan.h"
#include "core/model/communicator.h"
#include "core/model/model_runner.h"
#include "core/model/parallel_layout.h"
#include "core/model/row_math.h"

namespace glmserve::cuda {

struct CudaModelOptions {
  int device = 0;
  // Capture steps as CUDA graphs (see above). GLMSERVE_CUDA_GRAPHS=0 overrides.
  bool cuda_graphs = true;
  // MoE layers of steps with at most this many (token, expert) pairs run the device-driven
  // expert GEMV (graph-capturable); larger steps run grouped tensor-core GEMMs over the same
  // device-side offsets (moe_gemm_tc.cu, fp8_moe_gemm_tc.cu). Neither synchronises with the
  // host, except FP8 experts with FP8 tensor cores on or an unserved scale block shape, which
  // read the per-expert row counts back and run one FP8 GEMM per active expert.
  int64_t device_moe_max_pairs = 1024;
  // FP8 prefill GEMMs (more than kFp8GemvMaxRows rows; per-channel or 128x128 weights) on FP8
  // tensor cores through cuBLASLt's block-scaled matmul, activations quantized per token and
  // 1x128 group (core/cuda/fp8_gemm.h), and the decode GEMVs then quantize their activations
  // the same way (fp8_gemv_vec.cu's Q form), so prefill and decode share one activation
  // arithmetic (docs/cuda.md). Off by default: with it on, fp8_channel_fp32's greedy token
  // after the prompt differs from the reference (the e4m3 activation rounding exceeds that
  // step's margin; per-token scales flipped decode step 3 instead; docs/cuda.md). Used
  // where the device supports it (compute capability 8.9+, libcublasLt), else the CUDA-core
  // kernels with bf16 activations (logged once). glm-server --fp8_tensor_cores;
  // GLMSERVE_FP8_TENSOR_CORES=1 turns it on, =0 off, overriding this.
  bool fp8_tensor_cores = false;
  // With FP8 weights: FAILED_PRECONDITION from Create when tensor cores are unavailable
  // (glm-server --fp8_tensor_cores=on) instead of the fallback.
  bool fp8_tensor_cores_required = false;
  // Called while the weights stream to the device (UploadWeights), or null.
  LoadProgressCallback upload_progress;
  // GLM-5: steps of at most mla_tc_tokens() tokens run the tensor-core absorbed attention
  // (mla_tc.cu), larger ones mla.cu's CUDA-core kernel. GLMSERVE_MLA_TC=0 overrides.
  bool mla_tensor_cores = true;
  // GLM-4.5: attention over the bf16 cache on tensor cores (attention_tc.cu, flash-attention
  // style), else attention.cu's CUDA-core kernel (which the FP8 cache always uses). Both are
  // within the same bound of the CPU. GLMSERVE_ATTN_TC=0 overrides.
  bool attention_tensor_cores = true;
  // GLM-4.5 with tensor-core attention over the bf16 cache: cuDNN's fused SDPA (libcudnn
  // loaded at run time; core/cuda/cudnn_attention.h) for the steps not captured as CUDA
  // graphs, self-checked against attention_tc.cu's kernel on first use. Missing or too old a
  // cuDNN, a plan it cannot build or a failed check: attention_tc.cu for good, logged once.
  // Off by default: on the first real GPU it met (an H200, cuDNN 9.14, driver 580; 2026-12-04)
  // its first step faulted with an illegal address, which poisons the CUDA context, so the
  // self-check could not fall back and every later kernel failed (docs/cuda.md, "The GPU
  // check on an H200"). With it off, the model, golden, conformance and MTP suites pass there.
  // GLMSERVE_CUDNN_ATTN=1 turns it on (=0 off), for working on it.
  bool cudnn_attention = false;
};

class CudaModel final : public ModelRunner {
 public:
  // Uploads `weights` to GPU `options.device` (host copies are released afterwards).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(ModelWeights weights,
                                                           const CudaModelOptions& options = {});
  // Rank `layout.rank` of a tensor-parallel group: `weights` are its slice (ShardWeights, with
  // the rank's config), `comm` the group's communicator for this rank (outlives the model; its
  // collectives are enqueued on the model's stream). A rank runs no MTP layer.
  static absl::StatusOr<std::unique_ptr<CudaModel>> CreateRank(ModelWeights weights,
                                                               const CudaModelOptions& options,
                                                               const RankLayout& layout,
                                                               Communicator* comm);
  ~CudaModel() override;

  const ModelConfig& config() const override { return config_; }
  bool supports_sub_spans() const override { return false; }
  // ForwardOptions::sample: tokens chosen on the device (core/cuda/row_sample.cu); only the
  // rows a request keeps cross to the host.
  bool samples_tokens() const override { return has_head_; }
  int64_t layer_begin() const override { return layer_begin_; }
  int64_t layer_end() const override { return layer_end_; }
  std::string device_name() const override { return device_name_; }
  // The arithmetic and kernel choices, with how many FP8 GEMMs each path has run so far
  // (glm-run prints it after a run, so a user sees whether tensor cores took part).
  std::string compute_description() const override;
  int64_t weight_bytes() const override { return weights_.bytes; }
  int64_t kv_bytes_per_token() const override;
  // kFp8E4M3: GLM-4.5's K/V as e4m3 codes with one fp32 scale per token, kind and KV head, the
  // CPU's format (core/model/kv_fp8.h); GLM-5's latent cache stays bf16 (FAILED_PRECONDITION).
  absl::Status SetKvCacheDType(KvCacheDType dtype) override;
  // The MTP layer (docs/mtp.md), uploaded with a whole model whose weights have it (its
  // eh_proj and head unquantized): EnableMtp before CreateCache adds its cache layer, and
  // Forward then takes ForwardOptions::mtp (model_mtp.cc).
  bool has_mtp() const override { return weights_.mtp.present(); }
  absl::Status EnableMtp() override;
  bool mtp_enabled() const override { return mtp_enabled_; }
  // A cache in device memory (bf16, or FP8 codes then scales after SetKvCacheDType; zero-filled).
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                       int64_t block_size) override;
  // As CpuModel::Forward; `cache` must come from a CudaModel's CreateCache.
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override;

  // For tests and the benchmark.
  void set_cuda_graphs(bool on) { options_.cuda_graphs = on; }
  void set_device_moe_max_pairs(int64_t pairs) { options_.device_moe_max_pairs = pairs; }
  int64_t graphs_captured() const { return graphs_captured_; }
  int64_t graph_launches() const { return graph_launches_; }
  // Graph steps with some sequence of more than one token (prefill chunks, mixed or alone).
  int64_t mixed_graph_launches() const { return mixed_graph_launches_; }
  // GLM-5's attention kernel choice (CudaModelOptions::mla_tensor_cores); captured graphs are
  // dropped. mla_tc_tokens(): the largest step that takes the tensor cores (0: none).
  void set_mla_tensor_cores(bool on);
  int64_t mla_tc_tokens() const { return options_.mla_tensor_cores ? mla_tc_tokens_ : 0; }
  // Why graphs were switched off after a failed capture (empty if they were not).
  const std::string& graph_error() const { return graph_error_; }
  // cuDNN's fused attention (CudaModelOptions::cudnn_attention), or null when it is not used
  // at all (cudnn_attention_status() says why).
  const CudnnAttention* cudnn_attention() const { return cudnn_attn_.get(); }
  std::string cudnn_attention_status() const {
    return cudnn_attn_ != nullptr ? cudnn_attn_->status() : cudnn_attn_status_;
  }
  const DeviceWeights& device_weights() const { return weights_; }
  // FP8 GEMMs beyond the GEMV's rows: tensor cores (cuBLASLt) when turned on
  // (CudaModelOptions::fp8_tensor_cores) and available, else the CUDA-core kernel; and how
  // many each path enqueued (layers_fp8.cc).
  void set_fp8_tensor_cores(bool on) { fp8_tensor_cores_ = on; }
  // The decode GEMVs with 16-byte loads (fp8_gemv_vec.cu) where supported; false: byte loads.
  void set_fp8_vec_gemv(bool on) { fp8_vec_gemv_ = on; }
  const std::string& fp8_tensor_core_status() const { return fp8_tc_status_; }
  int64_t fp8_tensor_core_gemms() const { return fp8_tc_gemms_; }
  int64_t fp8_cuda_core_gemms() const { return fp8_fallback_gemms_; }
  // MoE layers that read their per-expert row counts back to the host (cudaStreamSynchronize):
  // only large steps of FP8 experts with FP8 tensor cores on or a scale block shape the
  // grouped FP8 GEMM does not serve (layers.cc, EnqueueMoe).
  int64_t moe_host_round_trips() const { return moe_host_round_trips_; }
  // Distinct (MoE layer, routed expert) pairs the last Forward ran. Synchronises.
  absl::StatusOr<int64_t> LastStepActiveExperts();
  // Runs only the FFN block of span layer `layer` on x ([tokens, hidden], the block's normed
  // input: rounded to bf16 for the GEMMs, fp32 for the router), with the MoE expert path
  // chosen by `device_moe`; y: [tokens, hidden].
  absl::Status RunFfnForTest(int64_t layer, absl::Span<const float> x, int64_t tokens,
                             bool device_moe, std::vector<float>* y);

 private:
  // Device pointers into the activation arena, sized for token_cap_ rows.
  struct Arena {
    float* h = nullptr;              // [T, hidden] residual stream
    float* delta = nullptr;          // [T, hidden] sub-block output, added at the next norm
    uint16_t* x = nullptr;           // [T, hidden] normed input (bf16)
    float* x32 = nullptr;            // [T, hidden] normed input (fp32, router)
    float* qkv = nullptr;            // [T, q_dim + 2 kv_dim]; q rotated in place
    uint16_t* attn = nullptr;        // [T, q_dim]
    float* gate_up = nullptr;        // [rows, 2 width] (dense, shared or routed rows)
    uint16_t* act = nullptr;         // [rows, width]
    float* router_logits = nullptr;  // [T, E]
    int32_t* topk_ids = nullptr;     // [T * K]
    float* topk_w = nullptr;         // [T * K]
    int32_t* sorted = nullptr;       // [T * K]
    int32_t* pair_pos = nullptr;     // [T * K]
    uint16_t* xp = nullptr;          // [T * K, hidden] expert inputs, grouped by expert
    float* yp = nullptr;             // [T * K, hidden] expert outputs
    // GLM-5 (layers_mla.cc)
    float* q_a = nullptr;          // [T, Q] q_a_proj output
    uint16_t* q_resid = nullptr;   // [T, Q] after q_a_layernorm (bf16 GEMM input)
    float* mla_q = nullptr;        // [T, H, dn + dr]; rotary part rotated in place
    float* kv_a = nullptr;         // [T, R + dr]
    float* iq = nullptr;           // [T, Hi * Di] indexer queries
    float* ik = nullptr;           // [T, Di] indexer keys (before the cache write)
    float* iw = nullptr;           // [T, Hi] indexer head weights
    int32_t* sel_count = nullptr;  // [T] selected positions (-1: every causal key)
    int32_t* sel_pos = nullptr;    // [T, index_topk] ascending
  };
  // Logits rows per lm_head GEMM, and the most a graph step computes.
  static constexpr int64_t kLogitChunk = 128;
  // The largest steps captured as CUDA graphs: GLM-4.5 steps of any mix of prefill chunks and
  // decodes; GLM-5 decode steps (its prefill attention and indexer launches follow the step's
  // shape). Above a few hundred rows the launches are a small part of a step.
  static constexpr int64_t kMaxGraphTokens = 512;
  static constexpr int64_t kMaxMlaGraphTokens = 128;
  using GraphKey = std::pair<int64_t, int64_t>;  // (padded rows, padded logits rows)
  struct GraphEntry {
    GraphExec exec;
    int64_t fp8_tc_gemms = 0;  // FP8 GEMMs each launch enqueues, per path
    int64_t fp8_fallback_gemms = 0;
    const void* cache_storage = nullptr;
    int64_t block_size = 0;
    int64_t num_blocks = 0;
  };

  CudaModel() = default;
  absl::Status Init(ModelWeights weights, const CudaModelOptions& options);
  absl::Status ForwardSelectingLogits(const ForwardBatch& batch, KvCache* cache,
                                      const ForwardOptions& options, ForwardResult* result);
  absl::Status CheckBatch(const ForwardBatch& batch, const KvCache& cache) const;
  absl::Status EnsureCapacity(int64_t tokens, int64_t block_table_entries);
  absl::Status UploadPlan();
  // Whether the step runs as a CUDA graph, and then the shape it is padded to (its key).
  bool GraphPadding(const ForwardBatch& batch, const ForwardOptions& options,
                    StepPadding* pad) const;
  int ChooseSplits(int64_t num_tiles, int64_t max_kv_len, bool for_graph) const;
  absl::Status CopyHidden(int64_t rows, std::vector<float>* out);
  // The step's head inputs: RMSNorm(h, norm) of every row in fp32 (ForwardOptions::
  // return_head_input), read back. Clobbers the normed-input buffers.
  absl::Status CopyHeadInput(const float* norm, int64_t rows, std::vector<float>* out);
  // hidden_in [rows, hidden] into the residual stream (padding rows zero).
  absl::Status UploadHiddenIn(absl::Span<const float> hidden_in, int64_t rows);
  // The indexer's score buffer for this step's contexts (GLM-5).
  absl::Status EnsureIndexScores(bool graph);
  // The logits rows of the step through `norm` and `head` (the model's, or the MTP layer's),
  // chunk by chunk into result->logits; with `sample` (one request per row, or null) each
  // chunk's tokens are chosen on the device and only the kept rows are copied.
  absl::Status ReadLogits(bool graph, const std::vector<RowSampleRequest>* sample,
                          const std::vector<int32_t>& penalised_ids, ForwardResult* result);
  // sample_out_ for a step of `rows` sampled rows: tokens, finite flags and logprobs [rows],
  // then top ids and top logprobs [rows, kMaxRowTopLogprobs] (kSampleOutPerRow words a row).
  static constexpr int64_t kSampleOutPerRow = 3 + 2 * samplemath::kMaxRowTopLogprobs;
  struct SampleOut {
    int32_t* tokens;
    int32_t* finite;
    float* logprobs;
    int32_t* top_ids;
    float* top_logprobs;
  };
  SampleOut SampleOutLayout(int64_t rows) const;
  // Uploads a step's sample requests and penalised ids (sample_params_, sample_ids_).
  absl::Status UploadSampleRequests(const std::vector<RowSampleRequest>& sample,
                                    const std::vector<int32_t>& penalised_ids);
  // The MTP layer's step (model_mtp.cc).
  absl::Status ForwardMtp(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                          ForwardResult* result);
  int64_t cache_layers() const { return layer_end_ - layer_begin_ + (mtp_enabled_ ? 1 : 0); }

  // Enqueue only; nothing here waits for the device except the host-grouped MoE path.
  absl::Status EnqueueStepBody(KvCache* cache, bool logits);
  absl::Status EnqueueEmbedding();
  absl::Status EnqueueLayer(int64_t layer, KvCache* cache, bool* pending);
  // Attention of every row (its K/V enter the cache), then o_proj into delta: of every row, or
  // (head_rows_ >= 0, the run's last layer) of the head rows only, gathered first.
  absl::Status EnqueueAttention(int64_t layer, KvCache* cache);
  // The run's last layer, when it finishes only the rows whose logits are read (head_rows_ >= 0,
  // the CPU runner's rule): after attention and o_proj of those rows, h's rows are gathered
  // into head_h() ([head_rows_, hidden]) and the post-norm and FFN run on them alone.
  absl::Status EnqueueHeadRows(int64_t layer);
  // With `logit_rows` of `tokens` rows read (a graph step: both padded).
  bool FinishOnlyHeadRows(const ForwardOptions& options, int64_t logit_rows, int64_t tokens) const;
  // The span's `layer` is the one that finishes only the head rows in this step.
  bool IsHeadRowsLayer(int64_t layer) const {
    return head_rows_ >= 0 && layer + 1 == layer_end_ - layer_begin_;
  }
  // The head rows' residual, compacted: a view of a_.qkv, free once the last layer's attention
  // is done (FinishOnlyHeadRows checks it holds hidden floats per row).
  float* head_h() const { return reinterpret_cast<float*>(a_.qkv); }
  absl::Status EnqueueMla(int64_t layer, KvCache* cache);  // GLM-5 (layers_mla.cc)
  // Tiles scored per indexer launch (bounds index_scores_ to kIndexerTiles x max_kv_len).
  static constexpr int64_t kIndexerTiles = 64;
  absl::Status EnqueueIndexer(int64_t layer, uint16_t* cache_layer, const MlaShape& mla);
  absl::Status EnqueueDenseFfn(const DeviceFfn& ffn, int64_t rows);
  // FP8 linear layers (layers_fp8.cc): y[i * y_ld + c] = x[i] . W[c] through the GEMV, the
  // tensor-core GEMM or the tiled kernel.
  absl::Status InitFp8TensorCores();
  absl::Status EnsureFp8Scratch(int64_t tokens);
  absl::Status Fp8Linear(const uint16_t* x, int64_t rows, const Fp8DeviceMatrix& w, float* y,
                         int64_t y_ld);
  // The routed experts' device-offset GEMV (graph-capturable), vectorised where supported.
  // in: [rows, expert0.cols] bf16 (rows: the step's (token, expert) pairs).
  absl::Status Fp8ExpertGemv(const Fp8DeviceMatrix& expert0, const int32_t* offsets,
                             const uint16_t* in, int64_t rows, float* out, int64_t out_ld);
  // Whether w's GEMV takes quantized activations (tensor cores on, per-channel weights the
  // quantizing GEMV supports, `rows` within the scratch): the prefill GEMM's arithmetic.
  bool Fp8QuantizedActs(const Fp8DeviceMatrix& w, int64_t rows) const;
  // How EnqueueMoe runs a layer's routed experts: the device-offset GEMVs (small steps), the
  // grouped tensor-core GEMMs (bf16; FP8 codes widened; FP8 with quantized activations), or
  // the one path that reads the per-expert counts back to the host.
  enum class MoePath {
    kDeviceGemv,
    kDeviceGemvFp8,
    kGroupedTc,
    kGroupedFp8Tc,
    kGroupedFp8TcQ,
    kHostGrouped
  };
  MoePath ChooseMoePath(int64_t layer, int64_t tokens, bool device_path) const;
  // Some MoE layer of a step of `tokens` rows (the span's last layer: `last_layer_tokens`)
  // would wait for the host: such a step cannot be a graph.
  bool MoeWaitsForHost(int64_t tokens, int64_t last_layer_tokens) const;
  absl::Status EnqueueMoe(int64_t layer, int64_t tokens, bool device_path);
  absl::Status EnqueueResolve(bool* pending);
  // Tensor parallel: data [count] (device) becomes the group's rank-order sum; nothing on a
  // model on its own.
  absl::Status EnqueueAllReduce(float* data, int64_t count);
  bool tensor_parallel() const { return comm_ != nullptr && layout_.size > 1; }
  // Rank 0 of a group (or a model on its own): the rank whose head holds the whole logits.
  bool head_root() const { return layout_.rank == 0; }
  absl::Status EnqueueLogits(int64_t row_begin, int64_t rows);
  absl::Status RunGraph(KvCache* cache, bool logits);
  absl::Status Capture(KvCache* cache, bool logits, GraphExec* exec);

  const int32_t* meta(int64_t offset) const { return meta_device_.as<int32_t>() + offset; }
  // An FP8 cache's storage: codes [num_elements] bytes, then the fp32 scales
  // [num_elements / head_dim] from this byte offset (256-aligned).
  static int64_t Fp8KvScalesOffset(const KvCacheShape& shape) {
    const int64_t codes = shape.num_layers * shape.num_blocks * shape.kinds() * shape.block_size *
                          shape.kv_heads * shape.head_dim;
    return (codes + 255) / 256 * 256;
  }
  // Layer `layer` (of the span) of an FP8 cache (cache->dtype() kF8E4M3).
  static Fp8KvLayer Fp8Layer(KvCache* cache, int64_t layer);

  // Model facts.
  ModelConfig config_;  // a rank's: its head counts and routed expert width
  // What this model holds of the whole (whole on its own), and the group's collectives.
  RankLayout layout_;
  Communicator* comm_ = nullptr;
  int64_t layer_begin_ = 0;
  int64_t layer_end_ = 0;
  bool has_embedding_ = false;
  bool has_head_ = false;
  bool has_moe_ = false;
  bool is_mla_ = false;       // GLM-5: latent cache, MLA and the DSA indexer
  bool has_indexer_ = false;  // some span layer is a "full" indexer layer
  bool kv_fp8_ = false;       // SetKvCacheDType(kFp8E4M3): caches created from now on are FP8
  bool mtp_enabled_ = false;  // EnableMtp(): caches hold one more layer, the MTP layer's
  rowmath::RouterRowParams router_;
  int tile_tokens_ = 1;

  // Device and resources.
  CudaModelOptions options_;
  std::string device_name_;
  int sm_count_ = 1;
  Stream stream_;
  DeviceBuffer cublas_workspace_;
  CublasHandle cublas_;  // declared after its workspace and stream: destroyed before them
  // cuDNN attention (after the stream: destroyed before it), or why there is none.
  std::unique_ptr<CudnnAttention> cudnn_attn_;
  std::string cudnn_attn_status_;
  DeviceWeights weights_;

  // Step state.
  StepPlan plan_;
  int num_splits_ = 1;
  int64_t token_cap_ = 0;
  DeviceBuffer arena_memory_;
  Arena a_;
  MetaLayout meta_layout_;
  DeviceBuffer meta_device_;
  PinnedBuffer meta_host_;
  DeviceBuffer fixed_memory_;  // attention split scratch, expert offsets, logits chunk
  float* attn_scratch_ = nullptr;
  int32_t* expert_offsets_ = nullptr;  // [span layers, E + 1], kept for LastStepActiveExperts
  uint16_t* head_x_ = nullptr;         // [kLogitChunk, hidden]
  // What EnqueueLogits reads this step: the model's final norm and lm_head, or the MTP
  // layer's shared_head.norm and head.
  const float* step_head_norm_ = nullptr;
  const uint16_t* step_head_ = nullptr;
  // The step's last layer finishes only its logits rows (-1: every row; 0: none, a prefill
  // chunk whose logits nobody reads); their residual rows go to head_h().
  int64_t head_rows_ = -1;
  float* logits_ = nullptr;  // [kLogitChunk, vocab]
  // Tensor parallel: this rank's vocabulary slice of a logits chunk [kLogitChunk, V_r], and
  // on rank 0 the gathered slices [kLogitChunk * vocab] before they are interleaved.
  float* head_part_ = nullptr;
  float* head_gather_ = nullptr;
  PinnedBuffer logits_host_;  // [kLogitChunk, vocab]
  // Device sampling: a step's RowSampling per logits row, its penalised ids, and the chosen
  // outputs (SampleOutLayout); each grows to the largest step seen.
  DeviceBuffer sample_params_;
  DeviceBuffer sample_ids_;
  DeviceBuffer sample_out_;
  PinnedBuffer offsets_host_;  // [span layers, E + 1]
  PinnedBuffer io_host_;       // hidden states in and out (grows)
  bool last_step_valid_ = false;
  DeviceBuffer index_scores_;  // indexer scores, kIndexerTiles * index_stride_ floats (grows)
  // The step's score row stride: its longest context eagerly, max_position_embeddings in a
  // graph step (a graph replays one value).
  int64_t index_stride_ = 0;
  // GLM-5's tensor-core attention: its layout and fixed scratch for mla_tc_tokens_ tokens.
  MlaTcLayout mla_tc_layout_;
  MlaTcScratch mla_tc_scratch_;
  int64_t mla_tc_tokens_ = 0;

  // FP8 on tensor cores (layers_fp8.cc).
  std::unique_ptr<Fp8TensorCoreGemm> fp8_tc_;
  std::string fp8_tc_status_ = "no FP8 weights";
  bool fp8_tensor_cores_ = false;  // options_.fp8_tensor_cores or the environment
  bool fp8_vec_gemv_ = true;
  bool fp8_fallback_logged_ = false;
  int64_t fp8_max_cols_ = 0;      // widest FP8 matrix (k of its GEMMs)
  int64_t fp8_scratch_rows_ = 0;  // activation rows the scratch holds
  DeviceBuffer fp8_scratch_;      // x codes [rows, fp8_max_cols_], then x scales [G, rows]
  uint8_t* fp8_x_codes_ = nullptr;
  float* fp8_x_scales_ = nullptr;
  int64_t fp8_tc_gemms_ = 0;
  int64_t fp8_fallback_gemms_ = 0;
  int64_t moe_host_round_trips_ = 0;

  // CUDA graphs.
  std::map<GraphKey, GraphEntry> graphs_;
  int64_t graphs_captured_ = 0;
  int64_t graph_launches_ = 0;
  int64_t mixed_graph_launches_ = 0;
  std::string graph_error_;
};

}  // namespace glmserve::cuda
