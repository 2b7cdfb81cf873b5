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
//    (GLM-4.5's attention in this mode, on bf16 weights: attention_bf16.h.)
//  * kBf16Amx: for bf16 weights, the activations rounded to bf16 as in kBf16 and multiplied
//    by Intel AMX's TDPBF16PS (core/cpu/ops/linear_amx.h has the layout and the arithmetic, which
//    sums in a different order than kBf16, so the two give different bits); a portable
//    emulation gives the same bits where the CPU or the OS lacks AMX (much slower). Other
//    weight dtypes run the exact arithmetic, as in kBf16.
// Int8 weights (WeightFormat::kInt8Groups, core/cpu/quantize.h) take their own arithmetic in every
// mode, the scheme of llama.cpp's Q8_0 dot product summed "group-serially": each activation row
// is quantized per 32-wide group exactly as the weights are (int8, scale amax / 127), and per
// output element y[i][n], over the groups g = 0 .. ceil(K/32) - 1 in order,
//   d   = sum over the group's 32 k of xq[i][k] * wq[n][k]     (exact int32; past K both are 0)
//   acc = fma(float(d), xs[i][g] * ws[n][g], acc)              (acc starts at +0)
// then y = acc + bias[n]. |d| <= 32 * 127 * 127 < 2^24, so float(d) is exact; the scales'
// product is one rounding and the FMA one more. Every int8 kernel gives these bits: AMX's
// TDPBSSD (one 32-wide K tile is one group's dot: linear_int8_amx.h), AVX512-VNNI's vpdpbusd
// (linear_int8_avx512vnni.cc; linear_int8_rows16_avx512vnni.cc for decode on weights stored in
// Int8Layout::kRows16), AVX2 (linear_int8_avx2.cc) and the portable reference
// (Int8BlockGeneric); they differ only in how they find d, which is exact whatever the order.
// (Until 2026-12 kExact and kBf16 summed 16 lanes of 4 products and a tree instead, which cost
// AVX-512 four vector operations per vpdpbusd; the two arithmetics gave different bits.)
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
#include "core/base/aligned_vector.h"
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
// The kernel int8 weights run on (any mode; all give the same bits): "amx_int8" (on kRows16
// weights: activations of kInt8AmxRows16MinRows rows or more; fewer take VNNI's decode kernel),
// "avx512_vnni" (kRows16: lanes along the weight rows below kInt8Rows16TileMinRows activation
// rows, along the activation rows from there), "avx_vnni_int8" (AVX2 with AVX-VNNI: kRows16
// weights on it, row-major on AVX2), "avx2_int8" or "generic_int8".
const char* LinearInt8KernelName();
// Where QuantizeWeights keeps int8 codes by default (Int8Layout, core/model/weights.h):
// kRows16 on AVX512-VNNI, with or without AMX int8 (its decode kernel streams 16 rows per
// vector, about 2.3x the rate of row-major rows on a Zen 4 core: docs/performance.md; AMX reads
// a block's group as a B tile in place), and on AVX2 (Int8BlockAvx2Rows16, or with AVX-VNNI
// Int8BlockAvxVnniRows16: no reduction across lanes; 1.5-1.6x the row-major AVX2 kernel in the
// model); kRowMajor on other CPUs.
Int8Layout Int8LayoutForThisCpu();

namespace internal {
// The portable kernel, exposed for tests that compare it with the dispatched one.
void LinearGeneric(const float* x, int64_t m, const Matrix& w, const float* bias, float* y);
// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job; `panel` is scratch.
void LinearBlockGeneric(const LinearJob& job, int64_t nb, AlignedVector<float>* panel);
void LinearBlockAvx512(const LinearJob& job, int64_t nb, AlignedVector<float>* panel);
// The AVX2 + FMA kernel: the AVX-512 kernel's arithmetic (same bits) in 8-wide registers.
void LinearBlockAvx2(const LinearJob& job, int64_t nb, AlignedVector<float>* panel);
bool CpuHasAvx512();
bool CpuHasAvx2Fma();
bool CpuHasAvx512Bf16();  // AVX-512 F/BW/VL/DQ plus AVX512_BF16
// Tests and benches: force the portable kernels even where the CPU has AVX-512.
void ForceGenericKernels(bool force);
// Tests and benches: run as a CPU without AVX-512 (and AMX) would, AVX2 where the CPU has it:
// the kernels an AVX2-only machine runs, timed and checked on an AVX-512 one.
void ForceAvx2Kernels(bool force);
// Tests and benches: run as a CPU with AVX2 and AVX-VNNI but no AVX-512 (or AMX) would, where
// the CPU has AVX-VNNI.
void ForceAvxVnniKernels(bool force);
// AVX2 + FMA plus AVX-VNNI (vpdpbusd on 256 bits; off under ForceAvx2Kernels).
bool CpuHasAvxVnni();

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
// The AVX512_BF16 kernel's chunk of activation rows (linear_avx512bf16.cc).
inline constexpr int64_t kBf16ChunkRows = 96;
// kBf16, exact and int8 jobs on the VNNI tiles run in units of kBlockN output rows by a part
// of the activation rows: a prefill's activation is cut into parts of about kPartBytes, and the
// units run part by part (units are handed out in order), so while the threads take the blocks
// of one part, that part stays in L3, where the whole activation (48 MiB of bf16 at 2,048
// tokens and K = 12,288; 27 MiB of int8 codes and scales) would stream from memory once per
// block. Each output is one unit's, whole: how rows are cut cannot change a bit. Parts are
// whole chunks of the bf16 kernel (and so whole 3-, 4- and 6-row tiles, and whole 16-row
// vectors of the int8 tiles).
inline constexpr int64_t kPartBytes = int64_t{8} << 20;
// Activation rows per part for activation rows of row_bytes each.
int64_t ActivationPartRows(int64_t row_bytes);
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
// Every kernel reads q and group_scale but AMX's and VNNI's on tiles, which read the tiles,
// packed only for them.
enum class Int8Operands {
  kGroups,     // q and group_scale
  kAmxTiles,   // and the tiles, for AMX on row-major weights (linear_int8_amx.h)
  kVnniTiles,  // and the tiles with each code biased by 128, for AVX512-VNNI's vpdpbusd
  // q with zero rows up to a multiple of 16 (AMX on kRows16 weights reads the activation rows
  // in place as A tiles, 16 at a time: linear_int8_amx.h), and group_scale.
  kAmxRows,
};
// Its buffers start on cache lines, as every kernel reads them as whole vectors.
struct Int8Activation {
  int64_t m = 0, k = 0, kp = 0;
  Int8Operands operands = Int8Operands::kGroups;
  AlignedVector<int8_t> q;           // [m, kp] (kAmxRows: [ceil(m/16) * 16, kp]): round(x /
                                     // scale) per 32-wide group
  AlignedVector<float> group_scale;  // [m, kp / 32]: each group's scale (0 past the last)
  // kGroups on AVX512-VNNI only: [m, kp / 32] each group's sum of codes (the VNNI decode
  // kernels, its only readers, bias the weights by 128 and take 128 x this back out).
  AlignedVector<int32_t> group_sum;
  // The codes packed per 16 rows and group [ceil(m/16)][kp/32][8][16] words, word (p, i) = the 4
  // codes q[16 u + i][32 g + 4 p .. + 3] (as unsigned bytes + 128 for kVnniTiles; rows past m
  // are codes 0), and the group scales [ceil(m/16)][kp/32][16] (0 past m).
  AlignedVector<int32_t> tiles;
  AlignedVector<float> tile_scale;
};
// The VNNI kernel's lanes lie along activation rows; below this many rows (decode) its kernel
// whose lanes lie along K (Int8BlockAvx512VnniRows) is faster, and LinearMany packs no tiles.
inline constexpr int64_t kInt8VnniMinRows = 4;
// For Int8Layout::kRows16 weights the decode kernel (lanes along the weight rows,
// Int8BlockAvx512VnniRows16) stays ahead of the tiles up to about this many rows (a Zen 4 core:
// 1.6x at 8 rows, even at 64, behind by 10% from 256: bench/int8_kernel_bench).
inline constexpr int64_t kInt8Rows16TileMinRows = 64;
// On AMX, kRows16 weights meet activations of this many rows or more on the tiles
// (Int8AmxRows16Block), fewer on Int8BlockAvx512VnniRows16, which takes up to 4 rows per pass.
// Measured on an AMX Xeon (bench/int8_kernel_bench, one thread, 4096 x 4096): the tiles win
// from 5 rows (1.15x) though 11 of the A tile's 16 rows are padding (1.15x at 8, 1.47x at 12),
// the VNNI kernel at 4 rows and fewer (1.1-1.2x); a decode step of 8 sequences 1.06-1.27x.
inline constexpr int64_t kInt8AmxRows16MinRows = 5;
// What LinearMany packs for an activation of m rows against weights in `layout` on this
// machine.
Int8Operands Int8OperandsFor(int64_t m, Int8Layout layout = Int8Layout::kRowMajor);
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
  // Only the activation rows [row_begin, RowEnd()): a part of a prefill's rows (kPartBytes; a
  // multiple of 16 rows from the start). The VNNI tile kernel and the portable one read it; the
  // other kernels are handed whole jobs (LinearMany cuts only kVnniTiles jobs into parts).
  int64_t row_begin = 0, row_end = -1;
  int64_t RowEnd() const { return row_end < 0 ? x->m : row_end; }
};
// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job, the same bits from each: the
// portable reference (either layout), the VNNI kernel (needs kVnniTiles; either layout), VNNI's
// kernel for fewer rows (lanes along K; reads q, group_scale and group_sum; row-major) and the
// AVX2 ones (row-major, and kRows16 below). AMX's (linear_int8_amx.h): row-major weights with
// kAmxTiles, kRows16 with kAmxRows.
void Int8BlockGeneric(const Int8Job& job, int64_t nb);
void Int8BlockAvx512Vnni(const Int8Job& job, int64_t nb);
void Int8BlockAvx512VnniRows(const Int8Job& job, int64_t nb);
// Int8Layout::kRows16 weights and fewer than kInt8Rows16TileMinRows activation rows (kGroups):
// lanes along the weight rows (linear_int8_rows16_avx512vnni.cc).
void Int8BlockAvx512VnniRows16(const Int8Job& job, int64_t nb);
void Int8BlockAvx2(const Int8Job& job, int64_t nb);
// Int8Layout::kRows16 weights on AVX2 without AVX512-VNNI, every row count (kGroups):
// lanes along the weight rows (linear_int8_rows16_avx2.cc).
void Int8BlockAvx2Rows16(const Int8Job& job, int64_t nb);
// The same on AVX-VNNI (linear_int8_rows16_avxvnni.cc; reads group_sum too).
void Int8BlockAvxVnniRows16(const Int8Job& job, int64_t nb);
bool CpuHasAvx512Vnni();  // AVX-512 F/BW/VL/DQ plus AVX512_VNNI
// Block sizes shared by both kernels: the fixed K blocking is part of the numerics.
inline constexpr int64_t kBlockK = 512;  // K block: partial sums are added per block
inline constexpr int64_t kBlockN = 32;   // weight rows per parallel task

// The exact kernels' direct path (decode) reads bf16 weight rows in place, from memory, at
// three instructions per 32 bytes: too many for the out-of-order window alone to keep enough
// loads in flight. Each of its tiles calls this every 16 columns: at every other call (a cache
// line of bf16) it asks for each of the `nr` rows' next K block. Past a row's end that is the
// next row, which a later tile reads anyway (a prefetch never faults).
inline void PrefetchNextKBlock(const uint16_t* w, int64_t ldw, int nr, int64_t k) {
  if (k % 32 != 0) return;
  for (int n = 0; n < nr; ++n) __builtin_prefetch(w + n * ldw + k + kBlockK, 0, 3);
}
}  // namespace internal

}  // namespace glmserve
