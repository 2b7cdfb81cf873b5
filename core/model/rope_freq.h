// RoPE's inverse frequencies, the one formula both backends use: the CPU's RotaryEmbedding
// (core/cpu/ops/rope.h) and the CUDA backend's uploaded table (core/cuda/device_weights.cc).
#pragma once

#include <cstdint>
#include <vector>

namespace glmserve {

// [rotary_dim / 2]: theta^(-2i / rotary_dim), the exponent rounded to fp32 first as the
// reference's arange(0, r, 2).float() / r, the power taken in double, the result in fp32.
std::vector<float> RopeInvFreq(int64_t rotary_dim, double theta);

}  // namespace glmserve
