// The attention softmax of the CPU ops (GLM-4.5's fp32 attention, its FP8-cache form and GLM-5's
// MLA): portable code (softmax_row.h) and the same arithmetic in AVX2 and AVX-512 intrinsics,
// chosen at run time.
#pragma once

#include <cstdint>

namespace glmserve {

// scores[0, n) -> probabilities in place, n >= 1: exp(s - max) with this repository's exp
// (internal::ExpNonPositive), summed in LaneSum<8> order (one fixed order, like every
// reduction here), each times 1 / sum. The same bits on every x86-64 CPU and C library.
void SoftmaxInPlace(float* scores, int64_t n);
// Its first part: scores[0, n) -> exp(s - max) in place, returning their sum (both with
// SoftmaxInPlace's bits before its division). For a caller that scales by 1 / sum later
// (PagedAttentionBf16, which rounds the exps to bf16 and divides its outputs).
float SoftmaxExpInPlace(float* scores, int64_t n);

namespace internal {
// The portable code (softmax_row.h) and its SIMD forms, exposed for tests that compare them.
void SoftmaxGeneric(float* scores, int64_t n);
void SoftmaxAvx2(float* scores, int64_t n);    // AVX2 intrinsics (softmax_avx2.cc)
void SoftmaxAvx512(float* scores, int64_t n);  // AVX-512 intrinsics (softmax_avx512.cc)
float SoftmaxExpGeneric(float* scores, int64_t n);
float SoftmaxExpAvx2(float* scores, int64_t n);
float SoftmaxExpAvx512(float* scores, int64_t n);
}  // namespace internal

}  // namespace glmserve
