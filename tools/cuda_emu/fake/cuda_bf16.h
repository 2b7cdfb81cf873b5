// Emulation stand-in for <cuda_bf16.h>: only the storage type, which the kernels use through
// pointers (WMMA fragments' element type); values are converted by bit operations
// (core/cuda/device_util.cuh), never by this type's operators.
#pragma once
#include <cstdint>

struct __nv_bfloat16 {
  uint16_t bits;
};
