// Helpers for the CUDA backend's tests: the skip-without-GPU guard and bf16 vectors.
//
// Tests that need a GPU start with GLM_REQUIRE_CUDA_DEVICE(): without a usable device they
// are skipped with the reason ("no CUDA device: ..."), unless GLMSERVE_REQUIRE_CUDA=1 is set
// (tools/gpu_check.sh sets it), which turns the skip into a failure so that a GPU run cannot
// pass by skipping.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/base/dtype.h"
#include "core/cuda/runner.h"

#define GLM_REQUIRE_CUDA_DEVICE()                                                        \
  do {                                                                                   \
    if (!::glmserve::CudaDeviceAvailable()) {                                            \
      const char* glm_require_ = std::getenv("GLMSERVE_REQUIRE_CUDA");                   \
      if (glm_require_ != nullptr && glm_require_[0] == '1') {                           \
        FAIL() << "GLMSERVE_REQUIRE_CUDA=1 but " << ::glmserve::CudaDeviceDescription(); \
      }                                                                                  \
      GTEST_SKIP() << ::glmserve::CudaDeviceDescription();                               \
    }                                                                                    \
  } while (false)

namespace glmserve::testing {

// Whether this binary runs under tools/cuda_emu (exact single-loop cuBLAS; a cuBLASLt that
// honours EMU_CUBLASLT_*) rather than on a real device.
inline bool Emulated() {
#ifdef GLMSERVE_CUDA_EMU
  return true;
#else
  return false;
#endif
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

inline std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(v[i]);
  return out;
}

// v rounded to bf16 and back.
inline std::vector<float> RoundBf16(const std::vector<float>& v) { return FromBf16(ToBf16(v)); }

}  // namespace glmserve::testing
