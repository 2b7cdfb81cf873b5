#include "core/model/model_runner.h"

#include "absl/strings/str_cat.h"

namespace glmserve {

absl::StatusOr<Fp8TensorCores> ParseFp8TensorCores(absl::string_view name) {
  if (name == "auto") return Fp8TensorCores::kAuto;
  if (name == "on") return Fp8TensorCores::kOn;
  if (name == "off") return Fp8TensorCores::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("--fp8_tensor_cores '", name, "' is not one of auto, on, off"));
}

absl::Status ModelRunner::SetKvCacheDType(KvCacheDType dtype) {
  if (dtype == KvCacheDType::kAuto) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--kv_cache_dtype=", KvCacheDTypeName(dtype), " is served by the CPU backend only; the ",
      device_name(), " backend keeps its KV cache in its own format (docs/kv_cache.md)"));
}

absl::Status ModelRunner::EnableMtp() {
  return absl::UnimplementedError(
      absl::StrCat("the ", device_name(),
                   " backend does not run the MTP layer yet (docs/mtp.md); serve "
                   "with --mtp_draft_tokens=0 or on the CPU"));
}

}  // namespace glmserve
