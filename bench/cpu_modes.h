// The CPU arithmetic modes the CPU benches compare (--modes=exact,bf16,bf16_amx,int8), parsed
// and applied in one place: exact (fp32 activations), bf16 (--cpu_math=bf16), bf16_amx
// (--cpu_math=bf16_amx), int8 (weights quantized at load, --weight_dtype=int8, with
// --cpu_math=bf16; the int8 arithmetic, core/cpu/ops/linear.h) and int8_amx (the same weights
// with --cpu_math=bf16_amx: the same int8 arithmetic and kernel, the rest in bf16_amx),
// int8_row_major (int8 with its codes row-major whatever layout this CPU's kernels prefer,
// Int8Layout in core/model/weights.h: the same bits, what the layout gains in the same run), plus
// exact_portable: the exact arithmetic on the portable kernels,
// whatever SIMD the CPU has (what the SIMD kernels gain, measured in the same run), and
// exact_avx2 / int8_avx2: exact and int8 on the kernels a CPU without AVX-512 runs (AVX2 + FMA;
// internal::ForceAvx2Kernels), timed on an AVX-512 machine, and int8_avx_vnni: int8 on those of
// a CPU with AVX2 and AVX-VNNI but no AVX-512 (internal::ForceAvxVnniKernels).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"
#include "core/model/weights.h"

namespace glmserve::bench {

inline absl::StatusOr<std::vector<std::string>> ParseModes(const std::string& list) {
  std::vector<std::string> modes;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    if (name != "exact" && name != "bf16" && name != "bf16_amx" && name != "int8" &&
        name != "int8_amx" && name != "int8_row_major" && name != "exact_portable" &&
        name != "exact_avx2" && name != "int8_avx2" && name != "int8_avx_vnni") {
      return absl::InvalidArgumentError(
          absl::StrCat("--modes: '", name,
                       "' is not one of exact, bf16, bf16_amx, int8, int8_amx, int8_row_major, "
                       "exact_portable, exact_avx2, int8_avx2, int8_avx_vnni"));
    }
    modes.emplace_back(name);
  }
  return modes;
}

inline CpuMath MathOf(const std::string& mode) {
  if (mode == "exact" || mode == "exact_portable" || mode == "exact_avx2") return CpuMath::kExact;
  return mode == "bf16_amx" || mode == "int8_amx" ? CpuMath::kBf16Amx : CpuMath::kBf16;
}

// Whether `mode` quantizes the linear layers to int8 at load.
inline bool Int8Weights(const std::string& mode) {
  return mode == "int8" || mode == "int8_amx" || mode == "int8_row_major" || mode == "int8_avx2" ||
         mode == "int8_avx_vnni";
}

// Whether `mode` runs on the portable kernels (internal::ForceGenericKernels while it runs).
inline bool PortableKernels(const std::string& mode) { return mode == "exact_portable"; }
// Whether `mode` runs on what a CPU without AVX-512 runs (internal::ForceAvx2Kernels).
inline bool Avx2Kernels(const std::string& mode) {
  return mode == "exact_avx2" || mode == "int8_avx2";
}
// Sets the kernels `mode` runs on; before WeightsForMode, whose int8 layout follows them.
inline void UseKernelsOf(const std::string& mode) {
  internal::ForceGenericKernels(PortableKernels(mode));
  internal::ForceAvx2Kernels(Avx2Kernels(mode));
  internal::ForceAvxVnniKernels(mode == "int8_avx_vnni");
}

// `base` as `mode` runs it. The copy shares the weights' memory (ModelWeights holds views and
// shared owners); int8 and int8_amx add its quantized copy of the linear layers for as long as it
// lives.
inline absl::StatusOr<ModelWeights> WeightsForMode(const ModelWeights& base,
                                                   const std::string& mode) {
  ModelWeights weights = base;
  if (Int8Weights(mode)) {
    const Int8Layout layout =
        mode == "int8_row_major" ? Int8Layout::kRowMajor : Int8LayoutForThisCpu();
    RETURN_IF_ERROR(QuantizeWeights(&weights, WeightQuant::kInt8, layout));
  }
  return weights;
}

}  // namespace glmserve::bench
