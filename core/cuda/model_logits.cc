// CudaModel's logits: the head's rows chunk by chunk (a tensor-parallel rank's vocabulary slice
// gathered on rank 0), sampled on the device where the engine asks, and the rows a request
// keeps copied back.
#include <algorithm>
#include <utility>

#include "core/base/status_macros.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels.h"
#include "core/cuda/model.h"

namespace glmserve::cuda {

CudaModel::SampleOut CudaModel::SampleOutLayout(int64_t rows) const {
  int32_t* base = sample_out_.as<int32_t>();
  const int64_t k = samplemath::kMaxRowTopLogprobs;
  return {base, base + rows, reinterpret_cast<float*>(base + 2 * rows), base + 3 * rows,
          reinterpret_cast<float*>(base + (3 + k) * rows)};
}

absl::Status CudaModel::UploadSampleRequests(const std::vector<RowSampleRequest>& sample,
                                             const std::vector<int32_t>& penalised_ids) {
  std::vector<samplemath::RowSampling> params;
  params.reserve(sample.size());
  for (const RowSampleRequest& r : sample) {
    // A row nobody samples still gets its finite flag; greedy is the cheapest way there.
    params.push_back(r.sample ? r.params : samplemath::RowSampling{});
  }
  const size_t rows = sample.size();
  const size_t params_bytes = sizeof(samplemath::RowSampling) * rows;
  const size_t ids_bytes = sizeof(int32_t) * std::max<size_t>(1, penalised_ids.size());
  const size_t out_bytes = sizeof(int32_t) * kSampleOutPerRow * rows;
  for (auto [buffer, bytes] :
       {std::pair{&sample_params_, params_bytes}, std::pair{&sample_ids_, ids_bytes},
        std::pair{&sample_out_, out_bytes}}) {
    if (buffer->bytes() < bytes) {
      // Nothing queued reads the old buffer: the previous step ended with a synchronize.
      buffer->Reset();
      ASSIGN_OR_RETURN(DeviceBuffer grown, DeviceBuffer::Create(bytes));
      *buffer = std::move(grown);
    }
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_params_.get(), params.data(), params_bytes,
                                           cudaMemcpyHostToDevice, stream_.get()));
  if (!penalised_ids.empty()) {
    GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_ids_.get(), penalised_ids.data(),
                                             sizeof(int32_t) * penalised_ids.size(),
                                             cudaMemcpyHostToDevice, stream_.get()));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::ReadLogits(bool graph, const std::vector<RowSampleRequest>* sample,
                                   const std::vector<int32_t>& penalised_ids,
                                   ForwardResult* result) {
  const int64_t vocab = config_.vocab_size;
  const int64_t rows_total = plan_.real_logit_rows;
  if (!head_root()) {
    // Another rank of a group: its head slices go to rank 0 (eagerly, chunk by chunk, or
    // inside the step's graph), which samples and returns the logits; nothing comes back here.
    for (int64_t begin = 0; !graph && begin < rows_total; begin += kLogitChunk) {
      RETURN_IF_ERROR(EnqueueLogits(begin, std::min(kLogitChunk, rows_total - begin)));
    }
    return absl::OkStatus();
  }
  if (sample != nullptr) RETURN_IF_ERROR(UploadSampleRequests(*sample, penalised_ids));
  int64_t kept_total = rows_total;
  if (sample != nullptr) {
    kept_total = 0;
    for (const RowSampleRequest& r : *sample) kept_total += r.keep_logits ? 1 : 0;
  }
  // Appended chunk by chunk from the pinned staging buffer: no zero-filled resize first.
  result->logits.reserve(kept_total * vocab);
  for (int64_t begin = 0; begin < rows_total; begin += kLogitChunk) {
    const int64_t rows = std::min(kLogitChunk, rows_total - begin);
    // A graph step computed all its (<= kLogitChunk) rows already.
    if (!graph) RETURN_IF_ERROR(EnqueueLogits(begin, rows));
    int64_t copied = 0;
    if (sample == nullptr) {
      GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits_host_.get(), logits_,
                                               sizeof(float) * rows * vocab, cudaMemcpyDeviceToHost,
                                               stream_.get()));
      copied = rows;
    } else {
      const SampleOut out = SampleOutLayout(rows_total);
      GLM_CUDA_RETURN_IF_ERROR(LaunchRowSample(
          logits_, rows, vocab, sample_params_.as<samplemath::RowSampling>() + begin,
          sample_ids_.as<int32_t>(), out.tokens + begin, out.finite + begin, out.logprobs + begin,
          out.top_ids + begin * samplemath::kMaxRowTopLogprobs,
          out.top_logprobs + begin * samplemath::kMaxRowTopLogprobs, stream_.get()));
      // Only the rows a request keeps cross to the host (next to each other in staging).
      for (int64_t r = 0; r < rows; ++r) {
        if (!(*sample)[begin + r].keep_logits) continue;
        GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits_host_.as<float>() + copied * vocab,
                                                 logits_ + r * vocab, sizeof(float) * vocab,
                                                 cudaMemcpyDeviceToHost, stream_.get()));
        ++copied;
      }
    }
    if (copied == 0) continue;  // the next chunk's GEMM may overwrite logits_: same stream
    GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    const float* staged = logits_host_.as<float>();
    result->logits.insert(result->logits.end(), staged, staged + copied * vocab);
  }
  if (sample != nullptr) {
    // Tokens and flags; the logprob arrays only when a request asked (they are 43x larger).
    bool logprobs = false;
    for (const RowSampleRequest& r : *sample) {
      logprobs |= r.sample && (r.params.logprob || r.params.top_logprobs > 0);
    }
    std::vector<int32_t> out((logprobs ? kSampleOutPerRow : 2) * rows_total);
    GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), sample_out_.get(),
                                             sizeof(int32_t) * out.size(), cudaMemcpyDeviceToHost,
                                             stream_.get()));
    GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    result->tokens.resize(rows_total);
    result->row_finite.resize(rows_total);
    for (int64_t r = 0; r < rows_total; ++r) {
      result->tokens[r] = (*sample)[r].sample ? out[r] : -1;
      result->row_finite[r] = out[rows_total + r] != 0 ? 1 : 0;
    }
    if (logprobs) {
      // The same layout as SampleOutLayout, in host memory.
      const int64_t k = samplemath::kMaxRowTopLogprobs;
      const float* lp = reinterpret_cast<const float*>(out.data() + 2 * rows_total);
      const int32_t* ids = out.data() + 3 * rows_total;
      const float* top = reinterpret_cast<const float*>(out.data() + (3 + k) * rows_total);
      result->token_logprobs.assign(lp, lp + rows_total);
      result->top_ids.assign(ids, ids + k * rows_total);
      result->top_logprobs.assign(top, top + k * rows_total);
    }
  }
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
