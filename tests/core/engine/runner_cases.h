// The model runners the conformance suites run against (runner_conformance_test.cc,
// golden_test.cc): the CPU always; the CUDA runner when the build has it and a GPU is
// present, skipped with the reason otherwise and a failure under GLMSERVE_REQUIRE_CUDA=1
// (GLM_REQUIRE_CUDA_DEVICE), so that a GPU run cannot pass by skipping.
#pragma once

#include <memory>
#include <ostream>

#include "core/cpu/ops/linear.h"
#include "core/engine/runner_factory.h"
#include "tests/core/cuda/cuda_test_util.h"

namespace glmserve::testing {

struct RunnerCase {
  const char* name;  // the test-name suffix
  DeviceKind device;
  DType dtype;  // the weights' precision (the CUDA runner computes in bf16 either way)
  const char* preset = "tiny";  // the random model: GLM-4.5's block, or GLM-5's ("tiny-glm5")
  CpuMath cpu_math = CpuMath::kExact;  // the CPU runner's linear arithmetic (core/cpu/ops/linear.h)
  // --kv_cache_dtype (docs/kv_cache.md): auto (the CPU's bf16 and bf16_amx cases: bf16), fp32,
  // bf16, fp8_e4m3 (core/model/kv_fp8.h; GLM-4.5 only).
  KvCacheDType kv_cache = KvCacheDType::kAuto;
  // --fp8_tensor_cores=auto: FP8 GEMMs on tensor cores, activations quantized per token and
  // 1x128 group in prefill and decode alike (docs/cuda.md "One activation arithmetic").
  bool fp8_tensor_cores = false;
  // The runner wrapped in HostSamplingRunner (core/engine/host_sampling_runner.h): it samples
  // where the logits are, as the CUDA runner does, so the engine overlaps its steps.
  bool host_sampling = false;
  // Whether this runner's results must be bit-identical across batch composition and
  // chunking (the CPU kernels' fixed reduction order); otherwise they agree to a tolerance.
  bool exact() const { return device == DeviceKind::kCpu; }
};

inline constexpr RunnerCase kRunnerCases[] = {
    {"cpu_f32", DeviceKind::kCpu, DType::kF32},
    {"cpu_bf16", DeviceKind::kCpu, DType::kBF16},
    {"cuda_bf16", DeviceKind::kCuda, DType::kBF16},
    {"cuda_f32", DeviceKind::kCuda, DType::kF32},
    {"cpu_f32_glm5", DeviceKind::kCpu, DType::kF32, "tiny-glm5"},
    {"cpu_bf16_glm5", DeviceKind::kCpu, DType::kBF16, "tiny-glm5"},
    {"cuda_bf16_glm5", DeviceKind::kCuda, DType::kBF16, "tiny-glm5"},
    {"cuda_f32_glm5", DeviceKind::kCuda, DType::kF32, "tiny-glm5"},
    // FP8 weights (e4m3, per-channel scales; docs/fp8.md): the CPU's exact FP8 path and the
    // CUDA runner's FP8 kernels (bf16 activations, as its bf16 GEMMs).
    {"cpu_fp8", DeviceKind::kCpu, DType::kF8E4M3},
    {"cuda_fp8", DeviceKind::kCuda, DType::kF8E4M3},
    {"cuda_fp8_tc", DeviceKind::kCuda, DType::kF8E4M3, "tiny", CpuMath::kExact, KvCacheDType::kAuto,
     true},
    // FP8 GLM-5 (e4m3, 128x128 block scales, the GLM-5-FP8 form): MLA with an FP8 kv_b_proj.
    {"cpu_fp8_glm5", DeviceKind::kCpu, DType::kF8E4M3, "tiny-glm5"},
    {"cuda_fp8_glm5", DeviceKind::kCuda, DType::kF8E4M3, "tiny-glm5"},
    // The same with tensor cores on: 128x128 block weights, quantized activations in its FFN
    // and experts (cuBLASLt's block-scaled matmul, or quantized GEMV passes where it declines,
    // e.g. unaligned MoE output slices); MLA's projections keep fp8_linear.cu's kernels.
    {"cuda_fp8_glm5_tc", DeviceKind::kCuda, DType::kF8E4M3, "tiny-glm5", CpuMath::kExact,
     KvCacheDType::kAuto, true},
    // The bf16 mode (docs/cpu_math.md): vdpbf16ps's order in its linear layers and attention
    // (attention_bf16.h), the same bit-identity contract; its cache is bf16 (auto), or fp32.
    {"cpu_bf16_math", DeviceKind::kCpu, DType::kBF16, "tiny", CpuMath::kBf16},
    {"cpu_bf16_math_kvfp32", DeviceKind::kCpu, DType::kBF16, "tiny", CpuMath::kBf16,
     KvCacheDType::kFp32},
    // The AMX mode (docs/cpu_math.md): its own fixed order, so the same bit-identity contract.
    {"cpu_bf16_amx", DeviceKind::kCpu, DType::kBF16, "tiny", CpuMath::kBf16Amx},
    {"cpu_bf16_amx_glm5", DeviceKind::kCpu, DType::kBF16, "tiny-glm5", CpuMath::kBf16Amx},
    // The FP8 KV cache (docs/kv_cache.md) on both backends, in the same format.
    {"cpu_f32_kvfp8", DeviceKind::kCpu, DType::kF32, "tiny", CpuMath::kExact,
     KvCacheDType::kFp8E4M3},
    {"cuda_bf16_kvfp8", DeviceKind::kCuda, DType::kBF16, "tiny", CpuMath::kExact,
     KvCacheDType::kFp8E4M3},
    // A bf16 cache read by the fp32 path (rows widened, attention.h).
    {"cpu_f32_kvbf16", DeviceKind::kCpu, DType::kF32, "tiny", CpuMath::kExact, KvCacheDType::kBf16},
    // The CPU runner sampling after each step: the sampling contract on the CPU.
    {"cpu_bf16_sampling", DeviceKind::kCpu, DType::kBF16, "tiny", CpuMath::kExact,
     KvCacheDType::kAuto, false, true}};

// Test names and ctest entries show the case's name rather than its bytes.
inline void PrintTo(const RunnerCase& r, std::ostream* os) { *os << r.name; }

}  // namespace glmserve::testing

// In a test (or SetUp): skips a CUDA case without a usable GPU, fails it under
// GLMSERVE_REQUIRE_CUDA=1.
#define GLM_REQUIRE_RUNNER(runner_case)                          \
  do {                                                           \
    if ((runner_case).device == ::glmserve::DeviceKind::kCuda) { \
      GLM_REQUIRE_CUDA_DEVICE();                                 \
    }                                                            \
  } while (false)
