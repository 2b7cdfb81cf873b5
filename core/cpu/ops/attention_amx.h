// Attention in the kBf16Amx arithmetic (CpuMath "bf16_amx", core/cpu/ops/linear.h): flash-style
// (online softmax over blocks of 32 keys), with QK^T and PV as Intel AMX tile products on bf16
// operands, the way the reference's bf16 forward runs attention (bf16 q, k, v and
// probabilities, fp32 accumulation). It replaces PagedAttention for GLM-4.5 models with bf16
// weights in that mode (CpuModel::AttentionBlock); prefill of long prompts is where it pays: at
// 2,048 tokens the fp32 path was most of the prefill time (docs/performance.md).
//
// Arithmetic, per query row (token t, head h) with keys 0..pos of its sequence:
//  * q, K and V are rounded to bf16 (nearest even); head_dim is padded with +0 to a multiple of
//    32 and the keys to a multiple of 32 (padding keys are masked).
//  * Keys are taken in blocks of 32 from key 0 (absolute positions, never the chunk's): for
//    each block b <= pos / 32, s_k = (one TDPBF16PS chain over the head-dim chunks in order,
//    from +0) * scale, masked to -inf for k > pos; m' = max(m, max_k s_k) (m = -inf before
//    the first block); alpha = exp(m - m'); p_k = exp(s_k - m'); l = l alpha + sum_k p_k (the
//    sum in key order from +0); O = O alpha + (one TDPBF16PS of bf16(p) against bf16 V, from
//    +0); m = m'. exp is ExpNonPositive (softmax_row.h: a fixed polynomial, within 2 ulp).
//  * out = O / l.
// Everything a row computes depends only on its own q, its position and its sequence's K/V,
// never on which rows share its tile, the chunk it came in or the thread: results are
// bit-identical whatever the batch, and a prompt gives the same bits in one chunk or many
// (the invariance suites hold). Where the CPU or the OS lacks AMX, the same arithmetic runs
// with the portable emulation of TDPBF16PS (linear_amx.h), bit for bit, much slower.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve {

// PagedAttention's contract (attention.h) in the arithmetic above, on a host fp32 or bf16 cache
// (whose stored bits are the operands' rounding above: the same results bit for bit). q, out:
// [total_tokens, heads, head_dim].
void PagedAttentionAmx(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                       int64_t layer, int64_t heads, float scale, float* out);

namespace internal {
// "amx_bf16" where the tile unit runs it, "generic_amx_bf16" for the emulation.
const char* AttentionAmxKernelName();
}  // namespace internal

}  // namespace glmserve
