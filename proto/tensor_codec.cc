#include "proto/tensor_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/dtype.h"

namespace glmserve {

// The wire format is little-endian; a big-endian host would need byte swaps here.
static_assert(std::endian::native == std::endian::little, "glmserve assumes a little-endian host");

int64_t WireDTypeSize(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FP32:
      return 4;
    case v1::DATA_TYPE_BF16:
    case v1::DATA_TYPE_FP16:
      return 2;
    default:
      return 0;
  }
}

const char* WireDTypeName(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FP32:
      return "FP32";
    case v1::DATA_TYPE_BF16:
      return "BF16";
    case v1::DATA_TYPE_FP16:
      return "FP16";
    default:
      return "UNSPECIFIED";
  }
}

void EncodeTensor(absl::Span<const float> values, absl::Span<const int64_t> shape,
                  v1::DataType dtype, v1::Tensor* out) {
  if (dtype == v1::DATA_TYPE_UNSPECIFIED) dtype = v1::DATA_TYPE_FP32;
  out->set_dtype(dtype);
  out->clear_shape();
  for (int64_t d : shape) out->add_shape(d);
  std::string* raw = out->mutable_raw_data();
  const size_t n = values.size();
  if (dtype == v1::DATA_TYPE_FP32) {
    raw->assign(reinterpret_cast<const char*>(values.data()), n * sizeof(float));
    return;
  }
  raw->resize(n * 2);
  auto* dst = reinterpret_cast<uint16_t*>(raw->data());
  if (dtype == v1::DATA_TYPE_BF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = glmserve::FloatToBf16(values[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = glmserve::FloatToF16(values[i]);
  }
}

absl::StatusOr<std::vector<float>> DecodeTensor(const v1::Tensor& tensor, const char* what,
                                                bool require_finite) {
  const int64_t size = WireDTypeSize(tensor.dtype());
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype must be DATA_TYPE_FP32, DATA_TYPE_BF16 or DATA_TYPE_FP16 (got ",
                     static_cast<int>(tensor.dtype()), ")"));
  }
  int64_t count = 1;
  for (int64_t d : tensor.shape()) {
    // Bounded so that the product cannot overflow before the byte-count check rejects it.
    if (d < 0 || d > (int64_t{1} << 40) || (d != 0 && count > (int64_t{1} << 40) / d)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": bad shape [", absl::StrJoin(tensor.shape(), ", "), "]"));
    }
    count *= d;
  }
  const std::string& raw = tensor.raw_data();
  if (static_cast<int64_t>(raw.size()) != count * size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": raw_data holds ", raw.size(), " bytes; shape [",
                     absl::StrJoin(tensor.shape(), ", "), "] of ", WireDTypeName(tensor.dtype()),
                     " needs ", count * size));
  }
  std::vector<float> values(static_cast<size_t>(count));
  if (tensor.dtype() == v1::DATA_TYPE_FP32) {
    // An empty tensor's vector has no storage: memcpy must not see its null pointer
    // (found by tests/fuzz/tensor_codec_fuzz.cc).
    if (!raw.empty()) std::memcpy(values.data(), raw.data(), raw.size());
  } else {
    // memcpy per element: raw_data carries no alignment guarantee.
    const bool bf16 = tensor.dtype() == v1::DATA_TYPE_BF16;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, raw.data() + 2 * i, 2);
      values[i] = bf16 ? glmserve::Bf16ToFloat(bits) : glmserve::F16ToFloat(bits);
    }
  }
  if (require_finite) {
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(values[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": element ", i, " is ", values[i], " (values must be finite)"));
      }
    }
  }
  return values;
}

}  // namespace glmserve
