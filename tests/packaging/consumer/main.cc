// Uses the installed client library: the tensor codec round trip, and a call to a target
// where nothing listens, which must come back UNAVAILABLE (not crash, not hang).
#include <cstdio>

#include "client/client.h"

int main(int argc, char** argv) {
  glmserve::v1::Tensor tensor;
  glmserve::EncodeTensor({1.0f, -2.5f, 3.25f, 0.0f}, {2, 2}, glmserve::v1::DATA_TYPE_BF16, &tensor);
  absl::StatusOr<std::vector<float>> values = glmserve::DecodeTensor(tensor, "t");
  if (!values.ok() || values->size() != 4 || (*values)[1] != -2.5f) {
    std::fprintf(stderr, "codec round trip failed\n");
    return 1;
  }
  glmserve::ClientOptions options;
  options.target = argc > 1 ? argv[1] : "127.0.0.1:1";
  options.max_attempts = 1;
  options.timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<glmserve::Client>> client = glmserve::Client::Create(options);
  if (!client.ok()) return 1;
  absl::StatusOr<glmserve::v1::ModelInfo> info = (*client)->Info();
  std::printf("Info: %s\n", info.ok() ? info->model().c_str() : info.status().ToString().c_str());
  return info.ok() || info.status().code() == absl::StatusCode::kUnavailable ? 0 : 1;
}
