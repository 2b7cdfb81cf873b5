// Attention in the kBf16 arithmetic (CpuMath "bf16", core/cpu/ops/linear.h): QK^T and PV as
// AVX512_BF16's vdpbf16ps on bf16 operands with fp32 accumulation, the softmax in fp32 between
// them, as the reference's bf16 forward runs attention (bf16 q, k, v and probabilities). It
// replaces PagedAttention's fp32 path for GLM-4.5 models with bf16 weights in that mode (also
// with int8 weights, whose mode computes in bf16: CpuModel::AttentionBlock); the fp32 path's
// loops take a mul and an add per product, one vdpbf16ps takes 32 products.
//
// Arithmetic, per query row (token t, head h; keys and values of its KV head, positions 0 ..
// pos of its sequence). bf16(x) is FloatToBf16 (round to nearest even, NaN quiet); a "pair" is
// two bf16 in one dword, element 2i in the low half; DpBf16Lane (bf16_math.h) is one lane of
// vdpbf16ps: acc + hi * hi, then + lo * lo, each one rounding, bf16 subnormals read as zero and
// subnormal results flushed.
//  * q, every key and every value are rounded to bf16; an odd head_dim is padded with +0.
//  * s_p = (acc over the head-dim pairs i = 0, 1, ... in order, acc = DpBf16Lane(acc, q pair i,
//    key p's pair i), from +0) * scale, for p = 0 .. pos.
//  * e_p = exp(s_p - max) and their sum, as the fp32 path's softmax has them before its
//    division (SoftmaxExpInPlace, softmax.h), each e_p rounded to bf16 (the largest is 1, and
//    those near it round with half the relative error of normalized probabilities: the
//    outputs' error measured 0.5e-3 .. 0.8e-3 against 1.0e-3 .. 1.7e-3, attention_bf16_test);
//    an e past pos reads as +0.
//  * out[d] = (acc over the position pairs j = 0, 1, ... in order (positions 2j, 2j + 1),
//    acc = DpBf16Lane(acc, (e_2j, e_2j+1), (v_2j[d], v_2j+1[d])), from +0) / sum: where pos is
//    even, its last pair's second position reads as e +0 and value +0.
// A row's bits depend only on its own q, its position and its sequence's K/V: never on which
// rows share its work item, the chunk it came in or the thread (the invariance suites hold).
// Where the CPU lacks AVX512_BF16 the same arithmetic runs on AVX2 + FMA, bit for bit (an FMA
// per product and the DAZ/FTZ masks: slower than vdpbf16ps, faster than the fp32 path's mul and
// add), or in portable code without AVX2.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "core/cpu/ops/attention_items.h"
#include "core/cpu/ops/attention_simd.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve {

// PagedAttention's contract (attention.h) in the arithmetic above, on a host fp32 or bf16 cache
// (whose stored bits are the operands' rounding above: the same results bit for bit). q, out:
// [total_tokens, heads, head_dim].
void PagedAttentionBf16(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                        int64_t layer, int64_t heads, float scale, float* out);

namespace internal {

// "avx512_bf16" where vdpbf16ps runs it, "avx2_bf16" where AVX2 + FMA emulate it (portable
// packing), "generic_bf16" for the portable code.
const char* AttentionBf16KernelName();

// One position block's operands (positions p0 .. p0 + kPositionBlock - 1, attention_items.h) as
// pairs, and the positions [p0, end) that a run of rows reads.
struct Bf16Block {
  int64_t head_dim = 0;
  int64_t key_pairs = 0;    // ceil(head_dim / 2)
  int64_t value_width = 0;  // head_dim rounded up to 16
  // [key_pairs][kPositionBlock]: dword (i, j) = dims 2i, 2i + 1 of key p0 + j (lanes along
  // positions: one vdpbf16ps takes a q pair against 16 keys, no sum across lanes).
  const uint32_t* keys = nullptr;
  // [kPositionBlock / 2][value_width]: dword (j, d) = dim d of values p0 + 2j (low) and
  // p0 + 2j + 1 (high); dims past head_dim +0.
  const uint32_t* values = nullptr;
  int64_t p0 = 0, end = 0;
  // The AVX2 form's: the smallest biased exponent among the nonzero bf16 of the packed keys and
  // of the packed values (0: unknown, or a subnormal among them), MinExponentOfPairs.
  int key_exp_min = 0, value_exp_min = 0;
  // The AVX-512 weighted sums' alternative to `values` on a bf16 cache with head_dim a multiple
  // of 32, for runs of at most kRunRows rows: position p0 + i's value row at [i] (the values are
  // then not packed: the loops interleave each pair's rows in registers). Other forms ignore it.
  const uint16_t* const* value_rows = nullptr;
  // Where set, the SIMD loops prefetch a line or two of it per step and advance it (the next
  // block's rows).
  LinesAhead* ahead = nullptr;
};

// The packing of `rows`' positions [begin, context) (at most kPositionBlock, begin their p0)
// into a Bf16Block's keys or values; positions past context are left as they were, except the
// second half of a last, unfinished value pair (+0). Data movement and rounding only: every
// form gives the same bits.
void PackKeysBf16Generic(const AttentionRows& rows, uint32_t* keys);
void PackValuesBf16Generic(const AttentionRows& rows, uint32_t* values);
void PackKeysBf16Avx512(const AttentionRows& rows, uint32_t* keys);
void PackValuesBf16Avx512(const AttentionRows& rows, uint32_t* values);
void PackKeysBf16Avx2(const AttentionRows& rows, uint32_t* keys);
void PackValuesBf16Avx2(const AttentionRows& rows, uint32_t* values);
// out[j] = Bf16Pair(x[2j], x[2j + 1]) for j < ceil(n / 2), x[n] read as +0 when n is odd.
void RoundPairsGeneric(const float* x, int64_t n, uint32_t* out);
void RoundPairsAvx512(const float* x, int64_t n, uint32_t* out);
// For n rows reading b's positions [p0, end): scores[r][p] = s_p of q[r] (key_pairs pairs), and
// out[r][d] (d < head_dim) continued over the block's position pairs from probs[r][0] (the
// pair of positions p0, p0 + 1), as defined above. A row's whole sum may be taken block by
// block: the same bits.
void AttentionScoresBf16Generic(const Bf16Block& b, int64_t n, const uint32_t* const* q,
                                float scale, float* const* scores);
void AttentionWeightedSumBf16Generic(const Bf16Block& b, int64_t n, const uint32_t* const* probs,
                                     float* const* out);
void AttentionScoresBf16Avx512Bf16(const Bf16Block& b, int64_t n, const uint32_t* const* q,
                                   float scale, float* const* scores);
void AttentionWeightedSumBf16Avx512Bf16(const Bf16Block& b, int64_t n, const uint32_t* const* probs,
                                        float* const* out);
// The smallest biased exponent among the nonzero bf16 halves of pairs[0, n) (AVX2): 0 where one
// is subnormal, 255 where all are zero.
int MinExponentOfPairs(const uint32_t* pairs, int64_t n);
// The same loops on AVX2 + FMA (attention_bf16_avx2.cc): where AVX512_BF16 is missing but AVX2
// is not (the int8 mode on AMD Zen 2/3 and Intel client CPUs).
void AttentionScoresBf16Avx2(const Bf16Block& b, int64_t n, const uint32_t* const* q, float scale,
                             float* const* scores);
void AttentionWeightedSumBf16Avx2(const Bf16Block& b, int64_t n, const uint32_t* const* probs,
                                  float* const* out);

}  // namespace internal
}  // namespace glmserve
