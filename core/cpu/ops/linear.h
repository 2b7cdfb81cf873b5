// Linear layers: y[m, N] = x[m, K] W^T (+ bias), for W [N, K] in its stored dtype.
//
// Three arithmetic modes (CpuMath), chosen once per model at load:
//  * kExact: activations are fp32; bf16/f16 weights are widened exactly to fp32 on the fly
//    and every product is accumulated in fp32 (16 lanes strided over k, a fixed lane tree,
//    fixed 512-wide K blocks whose sums are added in order).
//  * kBf16: for bf16 weights, the activations are rounded to bf16 (round-to-nearest-even, as
//    Transformers' bf16 forward does) and multiplied in pairs into fp32 lanes, the arithmetic
//    of AVX512_BF16's vdpbf16ps: lane j (of 16) takes k = 32s + 2j + 1, then 32s + 2j, for
//    s = 0, 1, ... over all of K, each step one fp32 rounding; then the same lane tree. fp32
//    and f16 weights, which vdpbf16ps cannot take, run the exact arithmetic in this mode too.
//  * kBf16Amx: for bf16 weights, the activations rounded to bf16 as in kBf16 and multiplied
//    by Intel AMX's TDPBF16PS (core/cpu/ops/linear_amx.h has the layout and the arithmetic, which
//    sums in a different order than kBf16, so the two give different bits); a portable
//    emulation gives the same bits where the CPU or the OS lacks AMX (much slower). Other
//    weight dtypes run the exact arithmetic, as in kBf16.
// Int8 weights (WeightFormat::kInt8Groups, core/cpu/quantize.h) take their own arithmetic in every
// mode (linear_int8.cc), the scheme of llama.cpp's Q8_0 dot product: each activation row is
// quantized per 32-wide group exactly as the weights are (int8, scale amax / 127), and the
// products of the two int8 vectors are summed exactly in int32. Lane l (of 16) takes, for
// s = 0, 1, ..., the 4 products k = 64 s + 4 l .. + 3 as one exact integer d, then
// lane += float(d) * (x_scale * w_scale) as one FMA (the scales' product one rounding), over
// all of K (past-the-end elements and groups read as zero); same lane tree, then the bias.
// On AVX512-VNNI that is vpdpbusd (weights biased to unsigned in registers, the bias taken
// back by a per-lane correction of the activation), a conversion and an FMA per 64 weights.
// In kBf16Amx, int8 weights take the group-serial form of that arithmetic instead (one exact
// int32 dot per 32-wide group, one FMA per group, groups in order: linear_int8_amx.h), the one
// AMX's TDPBSSD can run; a portable emulation gives its bits where AMX-INT8 is missing.
// FP8 weights (WeightFormat::kFp8Scaled, core/model/fp8.h) take the exact arithmetic in both modes:
// each K block of 512 of a task's rows is widened from one byte per weight to fp32 (e4m3 x
// its block's scale, one rounding) into an L2-resident panel, then the exact tiles run over it.
// In both modes each output element is reduced in one fixed order that depends only on K,
// never on m or on the element's position in a tile: so a sequence's result is bit-identical
// whether it runs alone or inside a batch of any size. This is why the engine uses its own
// GEMM rather than a BLAS library, whose blocking (and small-matrix paths) change with m.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/model/weights.h"

namespace glmserve {

enum class CpuMath { kExact, kBf16, kBf16Amx };
const char* CpuMathName(CpuMath math);  // "exact", "bf16" or "bf16_amx"
// "exact", "bf16" or "bf16_amx"; INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<CpuMath> ParseCpuMath(absl::string_view name);

// x: [m, w.cols] row-major; y: [m, w.rows]; bias: [w.rows] or nullptr. Uses the thread
// pool (core/base/parallel.h).
void Linear(const float* x, int64_t m, const Matrix& w, const float* bias, float* y,
            CpuMath math = CpuMath::kExact);

// Several independent linear layers in one parallel loop (q/k/v; every expert's gate and up):
// one dispatch instead of many, and small matrices share the threads. Each job's result is
// exactly what Linear gives for it.
struct LinearJob {
  const float* x = nullptr;  // [m, w->cols]
  int64_t m = 0;
  const Matrix* w = nullptr;
  const float* bias = nullptr;  // [w->rows] or nullptr
  float* y = nullptr;           // [m, w->rows]
};
void LinearMany(absl::Span<const LinearJob> jobs, CpuMath math = CpuMath::kExact);

// Which kernel Linear dispatches bf16 weights to on this machine in `math`: "avx512", "avx2"
// (the same bits) or "generic" (kExact); "avx512_bf16" or "generic_bf16" (kBf16, the latter an
// exact emulation of the former, bit for bit, and much slower); "amx_bf16" or "generic_amx_bf16"
// (kBf16Amx, likewise).
const char* LinearKernelName(CpuMath math = CpuMath::kExact);
// The kernel int8 weights run on in `math`: "avx512_vnni", "avx2_int8" or "generic_int8" (all
// three give the same bits) in kExact and kBf16; "amx_int8" or "generic_amx_int8" in kBf16Amx
// (the group-serial arithmetic, on the tile unit or emulated, the same bits).
const char* LinearInt8KernelName(CpuMath math = CpuMath::kBf16);

namespace internal {
// The portable kernel, exposed for tests that compare it with the dispatched one.
void LinearGeneric(const float* x, int64_t m, const Matrix& w, const float* bias, float* y);
// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job; `panel` is scratch.
void LinearBlockGeneric(const LinearJob& job, int64_t nb, std::vector<float>* panel);
void LinearBlockAvx512(const LinearJob& job, int64_t nb, std::vector<float>* panel);
// The AVX2 + FMA kernel: the AVX-512 kernel's arithmetic (same bits) in 8-wide registers.
void LinearBlockAvx2(const LinearJob& job, int64_t nb, std::vector<float>* panel);
bool CpuHasAvx512();
bool CpuHasAvx2Fma();
bool CpuHasAvx512Bf16();  // AVX-512 F/BW/VL/DQ plus AVX512_BF16
// Tests and benches: force the portable kernels even where the CPU has AVX-512.
void ForceGenericKernels(bool force);

// kBf16 on one bf16 matrix: xb is the activation already rounded to bf16, [m, w->cols].
struct Bf16Job {
  const uint16_t* xb = nullptr;
  int64_t m = 0;
  const Matrix* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};
// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job.
void Bf16BlockGeneric(const Bf16Job& job, int64_t nb);
void Bf16BlockAvx512(const Bf16Job& job, int64_t nb);
// Rounds n floats to bf16 (FloatToBf16: round to nearest even).
void RoundToBf16(const float* x, int64_t n, uint16_t* out);
// Widens rows [row_begin, row_begin + rows) x columns [k_begin, k_begin + k_len) of w to
// fp32 into out [rows, k_len]; FP8 weights are multiplied by their scales (one rounding).
void WidenPanel(const Matrix& w, int64_t row_begin, int64_t rows, int64_t k_begin, int64_t k_len,
                float* out);
// The 256 values of e4m3 (E4m3ToFloat), for table lookups.
const float* E4m3Table();
// Int8 weights: the activation rows quantized once per LinearMany (shared by every job that
// reads the same activation). kp = k rounded up to 64; past-the-end values are zero.
// Every kernel reads q and group_scale; the rest is filled only for the kernel that reads it
// (a 2,048-token MoE call's lane arrays alone were 150 MB of writes that the AVX2 and AMX
// kernels never read).
struct Int8Activation {
  int64_t m = 0, k = 0, kp = 0;
  std::vector<int8_t> q;           // [m, kp]: round(x / scale) per 32-wide group
  std::vector<float> group_scale;  // [m, kp / 32]: each group's scale (0 past the last)
  // The AVX512-VNNI kernel's operands (Int8Operands::kVnniLanes): per 4-wide lane slot l, its
  // group's scale [m, kp / 4] and -128 * (the sum of its 4 values of q) [m, kp / 4].
  std::vector<float> lane_scale;
  std::vector<int32_t> lane_minus;
  // The AMX int8 kernel's operands (linear_int8_amx.h; Int8Operands::kAmxTiles): q packed as B
  // tiles [ceil(m/16)][kp/32][8][16] words, and the group scales [ceil(m/16)][kp/32][16].
  std::vector<int32_t> tiles;
  std::vector<float> tile_scale;
};
// What QuantizeActivationInt8 fills beyond q and group_scale.
enum class Int8Operands { kGroups, kVnniLanes, kAmxTiles };
// Sizes `a` for m rows of k and quantizes them (rows in parallel when there are many). Each
// group as QuantizeGroupInt8 (core/cpu/quantize.h) defines it; on AVX2 eight at a time, the
// same bits.
void QuantizeActivationInt8(const float* x, int64_t m, int64_t k, Int8Activation* a,
                            Int8Operands operands = Int8Operands::kGroups);
// One row of k: q [k] and group_scale [ceil(k / 32)], as QuantizeGroupInt8 per group.
void QuantizeRowInt8Avx2(const float* x, int64_t k, int8_t* q, float* group_scale);
struct Int8Job {
  const Int8Activation* x = nullptr;
  const Matrix* w = nullptr;  // WeightFormat::kInt8Groups, w->cols == x->k
  const float* bias = nullptr;
  float* y = nullptr;  // [x->m, w->rows]
};
// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job: the portable kernel and the
// AVX512-VNNI one, bit-identical.
void Int8BlockGeneric(const Int8Job& job, int64_t nb);
void Int8BlockAvx512Vnni(const Int8Job& job, int64_t nb);
void Int8BlockAvx2(const Int8Job& job, int64_t nb);  // the same bits on AVX2
bool CpuHasAvx512Vnni();                             // AVX-512 F/BW/VL/DQ plus AVX512_VNNI
// Block sizes shared by both kernels: the fixed K blocking is part of the numerics.
inline constexpr int64_t kBlockK = 512;  // K block: partial sums are added per block
inline constexpr int64_t kBlockN = 32;   // weight rows per parallel task
}  // namespace internal

}  // namespace glmserve
