// The device side of the tensor-parallel sums (core/cuda/nccl_communicator.h): the ranks'
// partials arrive side by side (an all-gather) and one kernel adds them in rank order.
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

__global__ void RankOrderSumKernel(const float* __restrict__ parts, int ranks, int64_t count,
                                   float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = parts[i];
    for (int r = 1; r < ranks; ++r) sum += parts[r * count + i];  // adds only: nothing to fuse
    out[i] = sum;
  }
}

// Rank r's block of a gathered head, [rows, V_r] row-major at rows * begin(r), becomes
// columns [begin(r), begin(r + 1)) of out [rows, vocab]; begin(r) = r * vocab / ranks, the
// vocabulary split of core/model/parallel_layout.h (SplitRange with unit 1).
__global__ void InterleaveVocabKernel(const float* __restrict__ blocks, int64_t rows,
                                      int64_t vocab, int ranks, float* __restrict__ out) {
  const int64_t n = rows * vocab;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / vocab, v = i % vocab;
    int r = static_cast<int>(v * ranks / vocab);  // a guess within one of the owner
    while (r > 0 && r * vocab / ranks > v) --r;
    while (r + 1 < ranks && (r + 1) * vocab / ranks <= v) ++r;
    const int64_t begin = r * vocab / ranks, width = (r + 1) * vocab / ranks - begin;
    out[i] = blocks[rows * begin + row * width + (v - begin)];
  }
}

}  // namespace

cudaError_t LaunchInterleaveVocab(const float* blocks, int64_t rows, int64_t vocab, int ranks,
                                  float* out, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0 || ranks <= 0) return cudaSuccess;
  InterleaveVocabKernel<<<GridStrideBlocks(rows * vocab, 256), 256, 0, stream>>>(blocks, rows,
                                                                                 vocab, ranks, out);
  return cudaGetLastError();
}

cudaError_t LaunchRankOrderSum(const float* parts, int ranks, int64_t count, float* out,
                               cudaStream_t stream) {
  if (count <= 0 || ranks <= 0) return cudaSuccess;
  RankOrderSumKernel<<<GridStrideBlocks(count, 256), 256, 0, stream>>>(parts, ranks, count, out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
