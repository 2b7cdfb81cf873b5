// config.json from a checkpoint: any text either parses into a config that validates and
// survives a write-and-parse round trip, or is an error naming what is wrong.
#include "core/model/checkpoint.h"
#include "core/model/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<glmserve::ModelConfig> config = glmserve::ParseConfigJson(text);
  if (!config.ok()) {
    GLM_FUZZ_CHECK(!config.status().message().empty());
    return 0;
  }
  GLM_FUZZ_CHECK(glmserve::ValidateConfig(*config).ok());
  absl::StatusOr<glmserve::ModelConfig> again =
      glmserve::ParseConfigJson(glmserve::ConfigToJson(*config));
  GLM_FUZZ_CHECK(again.ok());
  GLM_FUZZ_CHECK(again->hidden_size == config->hidden_size &&
                 again->num_hidden_layers == config->num_hidden_layers &&
                 again->vocab_size == config->vocab_size);
  return 0;
}
