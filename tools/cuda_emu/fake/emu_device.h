// Included first by the emulated kernel translation units.
#pragma once
#include "cuda_runtime.h"
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Per thread: ranks of a tensor-parallel group run kernels concurrently on their own threads,
// and a block's fibers all run on the thread that launched it.
#define __shared__ static thread_local
struct EmuDim {
  unsigned x, y, z;
};
// Per thread (__thread, not thread_local: a plain TLS load at every use in a kernel, with no
// dynamic-initialisation check).
extern __thread EmuDim threadIdx, blockIdx, blockDim, gridDim;
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p += v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p += v;
  return old;
}
using std::max;
using std::min;
