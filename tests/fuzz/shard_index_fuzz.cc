// model.safetensors.index.json: any text either names shards that are plain files inside the
// checkpoint directory, or is an error. A hostile index never points the loader elsewhere.
#include "core/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<glmserve::ShardIndex> index = glmserve::ParseShardIndex(text, "fuzz");
  if (!index.ok()) return 0;
  for (const auto& [file, names] : *index) {
    GLM_FUZZ_CHECK(!file.empty() && file.find('/') == std::string::npos &&
                   file.find("..") == std::string::npos && file.find('\0') == std::string::npos);
    GLM_FUZZ_CHECK(!names.empty());
  }
  return 0;
}
