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

}  // namespace

cudaError_t LaunchRankOrderSum(const float* parts, int ranks, int64_t count, float* out,
                               cudaStream_t stream) {
  if (count <= 0 || ranks <= 0) return cudaSuccess;
  RankOrderSumKernel<<<GridStrideBlocks(count, 256), 256, 0, stream>>>(parts, ranks, count, out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
