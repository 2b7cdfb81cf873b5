// A safetensors image from a checkpoint: any bytes either parse into tensors that lie inside
// the image and tile its data section, or are an error. Never a crash or an out-of-bounds read
// (the target reads every byte of every tensor it is handed).
#include "core/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* image = reinterpret_cast<const char*>(data);
  absl::StatusOr<std::vector<glmserve::TensorInfo>> tensors =
      glmserve::ParseSafetensors(image, size, "fuzz");
  if (!tensors.ok()) return 0;
  int64_t covered = 0;
  unsigned checksum = 0;
  for (const glmserve::TensorInfo& t : *tensors) {
    const char* begin = static_cast<const char*>(t.data);
    GLM_FUZZ_CHECK(begin >= image && begin + t.bytes <= image + size);
    for (int64_t i = 0; i < t.bytes; ++i) checksum += static_cast<unsigned char>(begin[i]);
    covered += t.bytes;
  }
  GLM_FUZZ_CHECK(covered <= static_cast<int64_t>(size));
  return static_cast<int>(checksum & 0);
}
