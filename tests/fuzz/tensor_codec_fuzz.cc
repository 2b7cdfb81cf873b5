// glmserve.v1.Tensor from a client: any message either decodes into exactly product(shape)
// finite values that re-encode to the same bytes, or is INVALID_ARGUMENT.
#include "proto/tensor_codec.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  glmserve::v1::Tensor tensor;
  if (!tensor.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<std::vector<float>> values = glmserve::DecodeTensor(tensor, "fuzz");
  if (!values.ok()) {
    GLM_FUZZ_CHECK(values.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  int64_t count = 1;
  for (int64_t d : tensor.shape()) count *= d;
  GLM_FUZZ_CHECK(static_cast<int64_t>(values->size()) == count);
  glmserve::v1::Tensor again;
  const std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  glmserve::EncodeTensor(*values, shape, tensor.dtype(), &again);
  // fp32 copies exactly; 16-bit values widened to fp32 narrow back to the same bits (NaN and
  // Inf were refused), except that -0 and +0 may both be written as their own sign: exact.
  GLM_FUZZ_CHECK(again.raw_data() == tensor.raw_data());
  return 0;
}
