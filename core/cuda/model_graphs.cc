// CudaModel's CUDA graphs (docs/cuda.md "CUDA graphs"): which steps run as graphs and the
// shape each is padded to, capture, replay, and the attention's split count (fixed per graph).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels.h"
#include "core/cuda/model.h"

namespace glmserve::cuda {
namespace {

constexpr int64_t kMaxSplits = 16;
constexpr int64_t kMinSplitKeys = 256;

// Graph buckets: powers of two up to 128, then multiples of 64 (so at most a third of a
// step above 128 rows is padding; 14 buckets up to kMaxGraphTokens).
int64_t Bucket(int64_t tokens) {
  if (tokens > 128) return (tokens + 63) / 64 * 64;
  int64_t b = 1;
  while (b < tokens) b *= 2;
  return b;
}

}  // namespace

bool CudaModel::GraphPadding(const ForwardBatch& batch, const ForwardOptions& options,
                             StepPadding* pad) const {
  if (!options_.cuda_graphs || options.return_hidden || options.return_layer_hidden ||
      options.return_head_input || options.mtp) {
    return false;
  }
  // GLM-5 decode steps are graphs too: the indexer's score rows take a fixed stride
  // (max_position_embeddings, Forward), its selection and the attention's key counts are
  // device data, nothing waits for the host.
  const int64_t tokens = batch.total_tokens();
  if (tokens > (is_mla_ ? kMaxMlaGraphTokens : kMaxGraphTokens)) return false;
  if (is_mla_) {
    for (const SequenceSlice& s : batch.sequences) {
      if (s.num_tokens != 1) return false;
    }
  }
  // What the launches bake in: rows, tiles (at most one per row) and logits rows, each padded
  // to its bucket; the tiles' contents, positions, slots and block tables are device data.
  pad->tokens = Bucket(tokens);
  pad->tiles = pad->tokens;
  pad->logit_rows = 0;
  if (options.logits != LogitsRows::kNone) {
    const int64_t rows = static_cast<int64_t>(ReturnedLogitRows(batch, options).size());
    pad->logit_rows = std::min(Bucket(rows), pad->tokens);
    // The graph computes every logits row in one lm_head GEMM.
    if (pad->logit_rows > kLogitChunk) return false;
  }
  // The graph body must not wait for the host: no MoE layer may read its counts back.
  const int64_t last_rows =
      FinishOnlyHeadRows(options, pad->logit_rows, pad->tokens) ? pad->logit_rows : pad->tokens;
  return !has_moe_ || !MoeWaitsForHost(pad->tokens, last_rows);
}

int CudaModel::ChooseSplits(int64_t num_tiles, int64_t max_kv_len, bool for_graph) const {
  // Split the KV range only when the tiles alone leave SMs idle. Graphs keep their split
  // count while contexts grow, so for them it ignores the current length (the kernel cuts
  // each tile's range by its own length; surplus splits are empty).
  const int64_t blocks = num_tiles * config_.num_key_value_heads;
  if (blocks <= 0 || blocks >= 2 * sm_count_) return 1;
  int64_t splits = std::min<int64_t>((2 * sm_count_ + blocks - 1) / blocks, kMaxSplits);
  if (!for_graph) {
    splits =
        std::min(splits, std::max<int64_t>(1, (max_kv_len + kMinSplitKeys - 1) / kMinSplitKeys));
  }
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

absl::Status CudaModel::EnqueueStepBody(KvCache* cache, bool logits) {
  if (has_embedding_) RETURN_IF_ERROR(EnqueueEmbedding());
  bool pending = false;
  for (int64_t i = 0; i < layer_end_ - layer_begin_; ++i) {
    RETURN_IF_ERROR(EnqueueLayer(i, cache, &pending));
  }
  RETURN_IF_ERROR(EnqueueResolve(&pending));
  if (logits) RETURN_IF_ERROR(EnqueueLogits(0, plan_.logit_rows));
  return absl::OkStatus();
}

absl::Status CudaModel::Capture(KvCache* cache, bool logits, GraphExec* exec) {
  // Capture from an idle stream: nothing queued before can be mistaken for part of the step.
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
  const absl::Status body = EnqueueStepBody(cache, logits);
  cudaGraph_t raw = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_.get(), &raw);  // always leave capture
  const Graph graph(raw);
  RETURN_IF_ERROR(body);
  GLM_CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t instance = nullptr;
  GLM_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&instance, graph.get(), 0));
  *exec = GraphExec(instance);
  return absl::OkStatus();
}

absl::Status CudaModel::RunGraph(KvCache* cache, bool logits) {
  const GraphKey key{plan_.tokens, plan_.logit_rows};
  auto it = graphs_.find(key);
  // A graph bakes in the cache's address and block geometry.
  if (it != graphs_.end() && (it->second.cache_storage != cache->storage() ||
                              it->second.block_size != cache->shape().block_size ||
                              it->second.num_blocks != cache->shape().num_blocks)) {
    graphs_.erase(it);
    it = graphs_.end();
  }
  if (it == graphs_.end()) {
    GraphEntry entry;
    // The FP8 GEMM counters count enqueued GEMMs: a capture enqueues none, each launch the
    // captured ones.
    const int64_t tc_before = fp8_tc_gemms_, fallback_before = fp8_fallback_gemms_;
    const absl::Status s = Capture(cache, logits, &entry.exec);
    entry.fp8_tc_gemms = fp8_tc_gemms_ - tc_before;
    entry.fp8_fallback_gemms = fp8_fallback_gemms_ - fallback_before;
    fp8_tc_gemms_ = tc_before;
    fp8_fallback_gemms_ = fallback_before;
    if (!s.ok()) {
      // Run this step (padded plan and all) eagerly and stay eager from now on.
      cudaGetLastError();
      graph_error_ = s.ToString();
      options_.cuda_graphs = false;
      graphs_.clear();
      return EnqueueStepBody(cache, logits);
    }
    entry.cache_storage = cache->storage();
    entry.block_size = cache->shape().block_size;
    entry.num_blocks = cache->shape().num_blocks;
    it = graphs_.emplace(key, std::move(entry)).first;
    ++graphs_captured_;
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.exec.get(), stream_.get()));
  ++graph_launches_;
  fp8_tc_gemms_ += it->second.fp8_tc_gemms;
  fp8_fallback_gemms_ += it->second.fp8_fallback_gemms;
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
