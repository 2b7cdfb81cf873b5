// Tensors on the wire (glmserve.v1.Tensor: dtype + shape + raw little-endian row-major
// bytes, as KServe v2's raw contents) to and from fp32, shared by the server and the client
// so that both sides agree on every bit.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "glmserve/v1/glmserve.pb.h"

namespace glmserve {

// Bytes per element of a wire dtype; 0 for DATA_TYPE_UNSPECIFIED or an unknown value.
int64_t WireDTypeSize(v1::DataType dtype);
const char* WireDTypeName(v1::DataType dtype);

// Writes `values` (row-major, product(shape) elements) as `dtype` (FP32 is an exact copy;
// BF16 and FP16 round to nearest even). UNSPECIFIED means FP32.
void EncodeTensor(absl::Span<const float> values, absl::Span<const int64_t> shape,
                  v1::DataType dtype, v1::Tensor* out);

// Reads a tensor as fp32 after checking it: a known dtype, non-negative dims, raw_data of
// exactly product(shape) * sizeof(dtype) bytes, and (when require_finite) no NaN or Inf.
// INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<std::vector<float>> DecodeTensor(const v1::Tensor& tensor, const char* what,
                                                bool require_finite = true);

}  // namespace glmserve
