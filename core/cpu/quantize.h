// 8-bit weights for the CPU backend, quantized at load from the checkpoint's bf16/f16/fp32
// matrices: per row, each group of kInt8Group (32) consecutive elements gets one bf16 scale
// (amax / 127 rounded up) and int8 values round(w / scale) (ties to even), so |error| <=
// scale / 2 per element. The kernels widen them in registers (core/cpu/ops/linear.h); their
// accuracy against bf16 on the Transformers goldens is measured in tests/core/cpu/quantize_test.cc
// and docs/performance.md.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/cpu/ops/linear.h"
#include "core/model/weights.h"

namespace glmserve {

// kFp8Channel / kFp8Block: the released FP8 checkpoints' two forms made at load from a bf16
// checkpoint (e4m3 codes, one fp32 scale amax / 448 per output row, or per 128x128 block), so
// that a model released only in bf16 can be measured as its FP8 form would run; both runners
// take them as they take an FP8 checkpoint (docs/fp8.md).
enum class WeightQuant { kStored, kInt8, kFp8Channel, kFp8Block };
const char* WeightQuantName(WeightQuant q);  // "stored", "int8", "fp8_channel", "fp8_block"
// One of those names; INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<WeightQuant> ParseWeightQuant(absl::string_view name);
// The one rule for combining the two flags: int8 weights are a choice within the approximate
// arithmetic (--cpu_math=bf16 or bf16_amx; the int8 matrices run their own int32-dot arithmetic
// in either, the unquantized ones the mode's), never a silent change of the exact mode.
// INVALID_ARGUMENT naming the fix otherwise.
absl::Status CheckWeightQuantMath(WeightQuant quant, CpuMath math);

// kInt8: quantizes every linear layer's matrix (q/k/v/o, dense FFN, experts, shared expert;
// and lm_head unless it is a view of the embedding) to WeightFormat::kInt8Groups, in parallel;
// the router and the embedding stay as stored (the router's math is fp32 by definition; the
// embedding is a row gather). The new buffers join weights->storage; the originals stay
// owned there too (a checkpoint's mapping is then only page cache). kStored: nothing.
// kFp8Channel / kFp8Block: the same matrices except lm_head (kept as stored, as the released
// FP8 checkpoints keep it) become WeightFormat::kFp8Scaled: scale = amax / 448 over the
// scale block (1 for an all-zero block), code = e4m3(w / scale) rounded to nearest even.
// FAILED_PRECONDITION if the matrices are already quantized. `layout`: where kInt8 keeps its
// codes (core/model/weights.h, Int8Layout): by default the one this CPU's kernels read fastest;
// every layout gives the same bits.
absl::Status QuantizeWeights(ModelWeights* weights, WeightQuant quant,
                             Int8Layout layout = Int8LayoutForThisCpu());

// One group of n (<= kInt8Group) activations: q[i] = round(v[i] / scale) (ties to even),
// returns scale = amax / 127 (0 for an all-zero group). A non-finite value makes the scale NaN
// and q zero, so that the NaN reaches every product of the group instead of vanishing.
// linear_int8.cc quantizes the activations of the int8 arithmetic by this rule.
float QuantizeGroupInt8(const float* v, int64_t n, int8_t* q);

// One group of n weights, by the same rule except that the scale is amax / 127 rounded up to
// bf16 (returned as its bits) and q is rounded against that stored scale: 34 bytes per 32
// weights, as llama.cpp's Q8_0 (fp16 scales), and bf16 keeps fp32's range, so no group's scale
// underflows or overflows. Rounding up keeps |q| <= 127; the element error is still at most
// half the (stored) scale, which is at most 1 + 2^-7 times amax / 127.
uint16_t QuantizeWeightGroupInt8(const float* v, int64_t n, int8_t* q);

// One matrix: q [rows, cols] and bf16 scales [rows, ceil(cols / kInt8Group)] (exposed for
// tests).
void QuantizeMatrixInt8(const Matrix& m, int8_t* q, uint16_t* scales);

// Row-major codes q [rows, cols] and scales [rows, ceil(cols / 32)] (rows: the first at a block's
// lane 0) rearranged into Int8Layout::kRows16: out_q [blocks][groups][512], out_scales
// [blocks][groups][16], blocks = ceil(rows / 16), with zeros past the rows and the columns.
void InterleaveInt8Rows16(const int8_t* q, const uint16_t* scales, int64_t rows, int64_t cols,
                          int8_t* out_q, uint16_t* out_scales);

// One matrix to e4m3 codes [rows, cols] and fp32 scales [ceil(rows / br), ceil(cols / bc)]
// (exposed for tests).
void QuantizeMatrixFp8(const Matrix& m, int64_t br, int64_t bc, uint8_t* codes, float* scales);

}  // namespace glmserve
