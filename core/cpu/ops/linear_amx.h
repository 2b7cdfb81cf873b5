// The kBf16Amx Linear kernel (CpuMath "bf16_amx"): Intel AMX's TDPBF16PS on bf16 weights,
// activations rounded to bf16 (nearest even), products accumulated in fp32 by the tile unit.
//
// Layout. The weights stay as stored, row-major bf16 [N, K], and are the tile multiply's A
// operand: one A tile is 16 weight rows x 32 k (64 bytes of each row, loaded with the row
// stride, so nothing is repacked at load). The activations are rounded and packed once per
// call as the B operand in the "VNNI" pair layout: B tile (mb, kc) holds activation rows
// [16 mb, 16 mb + 16) x k in [32 kc, 32 kc + 32), its row p (of 16) the pairs
// (x[i][32 kc + 2p], x[i][32 kc + 2p + 1]) of the 16 rows i side by side. C = [16 outputs x 16
// activation rows] fp32, transposed into y when stored. Missing rows/columns read as +0.
//
// Arithmetic of one TDPBF16PS, per C element (measured on an Intel Xeon of family 6 model 207,
// Emerald Rapids, bit for bit, on millions of random tiles incl. subnormals, signed zeros,
// infinities, NaNs and extreme exponents; docs/cpu_math.md; the emulation below defines the
// mode, and linear_amx_test checks any AMX CPU it runs on against it): two fp32 chains over the 16
// pairs in k order, the even one e over products a[2p] b[2p] and the odd one o over a[2p+1]
// b[2p+1], each step one fused multiply-add (one rounding, to nearest even) starting from +0; then
// c + (e + o), two more roundings. bf16 subnormal inputs and a subnormal c read as zero (DAZ);
// every result is flushed to zero when subnormal (FTZ), whatever MXCSR says. NaN payloads are not
// specified.
//
// Order per output element: C starts at +0 and takes the 32-wide K chunks kc = 0, 1, ... in
// order (the last padded with +0), then the bias is added. That depends only on K: never on
// m, the tile the element falls in, or the thread, so results are bit-identical whatever the
// batch (linear.h). This is a different order than "bf16" (vdpbf16ps lanes), so the two modes
// give different (equally well-defined) bits.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu/ops/amx_tiles.h"
#include "core/model/weights.h"

namespace glmserve::internal {

// CPUID says AMX-TILE and AMX-BF16, and Linux granted this process the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once, process-wide); false
// under ForceGenericKernels. Where false, kBf16Amx runs the portable emulation below.
bool CpuHasAmx();
// The CPUID and arch_prctl part of CpuHasAmx (asked once), without the override.
bool AmxPermitted();

inline constexpr int64_t kAmxTileRows = 16;  // C/A tile rows; B tile columns (activations)
inline constexpr int64_t kAmxTileK = 32;     // bf16 k per A tile row / B tile pair rows x 2
inline constexpr int64_t kAmxTileElems = kAmxTileRows * kAmxTileK;  // 512 bf16 = 1 KiB

// Elements of the packed B operand for m activation rows of width k: one 1 KiB tile per
// (16-row block, 32-wide K chunk).
int64_t AmxPackedSize(int64_t m, int64_t k);
// Rounds x [m, k] to bf16 (FloatToBf16) and packs the 16-row block `block` (rows
// [16 block, 16 block + 16)) into out [ceil(m/16)][ceil(k/32)][16 pairs][16 rows][2], padding
// included: rows past m and columns past k are written as +0. Elementwise, so any split of
// blocks gives the same bits.
void PackAmxActivations(const float* x, int64_t m, int64_t k, int64_t block, uint16_t* out);

// PackAmxActivations and one C tile's store (c [16 outputs][16 activation rows] to
// y[col * ld + r] for r < rows, col < cols, plus bias[r] where given) in AVX-512, with the
// portable code's bits (linear_amx_avx512.cc): only where CpuHasAvx512(), out 64-byte aligned.
void PackAmxActivationsAvx512(const float* x, int64_t m, int64_t k, int64_t block, uint16_t* out);
void StoreAmxTileAvx512(const float* ct, int64_t rows, int64_t cols, const float* bias, float* y,
                        int64_t ld);

// kBf16Amx on one bf16 matrix. xp: the packed activations (PackAmxActivations).
struct AmxJob {
  const uint16_t* xp = nullptr;
  int64_t m = 0;
  const Matrix* w = nullptr;
  const float* bias = nullptr;  // [w->rows] or nullptr
  float* y = nullptr;           // [m, w->rows]
};
// The job's parallel units: groups of consecutive kBlockN-row output blocks (AmxGroupBlocks
// of them), each over all m rows and all of K. A group's weights (its blocks' rows, read in
// place) fit about 1 MiB of L2, and the activations go through in slabs sized to stay in L2
// beside them: a slab read once from L3 serves every block of the group. Every element still
// takes the chunks 0, 1, ... in order, so the cut cannot change a bit. The hardware kernel must
// run between AmxThreadBegin and AmxThreadEnd on the same thread.
int64_t AmxGroupBlocks(const AmxJob& job);
int64_t AmxUnits(const AmxJob& job);
void AmxUnitHardware(const AmxJob& job, int64_t unit);
// The portable emulation: the kernel's arithmetic, element by element, in the same chunk order.
void AmxUnitEmulated(const AmxJob& job, int64_t unit);
// AmxUnitHardware's own code on the software tile unit (amx_tiles.h), on any CPU and with the
// same bits; it configures the model's tiles itself. The tests compare it with the emulation,
// so the hardware kernel's tiling is checked where there is no AMX.
void AmxUnitTileModel(const AmxJob& job, int64_t unit);
// Tests: kBf16Amx (Linear, LinearMany) and PagedAttentionAmx run their tile unit code on the
// software model, on any CPU (on an AMX one too, instead of the tile unit).
void ForceAmxTileModel(bool force);
bool AmxTileModelForced();
// The bf16 kernels' tile configuration (this one and PagedAttentionAmx's): eight tiles of 16
// rows x 64 bytes.
const AmxTileConfig& AmxBf16TileConfig();
// Loads the tile configuration on this thread (it is per-thread state) / releases the tiles,
// so the kernel need not save them at a context switch. No-ops without AMX.
void AmxThreadBegin();
void AmxThreadEnd();

// One TDPBF16PS, for the tests that compare hardware and emulation: c [16][16] fp32 in and
// out, a [16][32] bf16 (rows of C), b [16][32] bf16 (pair rows of the VNNI layout). The
// hardware one returns false (and leaves c alone) without AMX.
bool AmxTileDpHardware(float* c, const uint16_t* a, const uint16_t* b);
void AmxTileDpEmulated(float* c, const uint16_t* a, const uint16_t* b);

}  // namespace glmserve::internal
