#include "tests/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "core/base/socket.h"
#include "nlohmann/json.hpp"

namespace glmserve::testing {

std::string GoldenDir(const std::string& name) {
  // A bundle run on another machine (tools/gpu_bundle.sh) carries the fixtures to a path of
  // its own: the environment names it there. The compiled-in source tree path is the
  // default, so that ctest in a build directory needs nothing set.
  const char* dir = std::getenv("GLMSERVE_GOLDEN_DIR");
  if (dir == nullptr || dir[0] == '\0') dir = GLMSERVE_GOLDEN_DIR;
  return std::string(dir) + "/" + name;
}

std::string ModelDir(const std::string& name) {
  const char* dir = std::getenv("GLMSERVE_MODELS_DIR");
  if (dir == nullptr || dir[0] == '\0') return std::string(GLMSERVE_SOURCE_DIR "/models/") + name;
  return std::string(dir) + "/" + name;
}

std::vector<std::string> GoldenCases() {
  std::vector<std::string> cases;
  for (const auto& entry : std::filesystem::directory_iterator(GoldenDir(""))) {
    if (std::filesystem::exists(entry.path() / "expected.json")) {
      cases.push_back(entry.path().filename());
    }
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

GoldenExpected ReadGoldenExpected(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str());
  return {j["prompt"].get<std::vector<int32_t>>(),    j["greedy"].get<std::vector<int32_t>>(),
          j["weights_dtype"].get<std::string>(),      j.contains("fp8"),
          j.value("min_route_gap", double{INFINITY}), j.value("min_index_gap", double{INFINITY})};
}

double RelativeError(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (ref == 0) return diff == 0 ? 0 : INFINITY;
  return std::sqrt(diff / ref);
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  return RelativeError(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

std::vector<float> RandomVector(int64_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

namespace {

// The directories MakeTempDir made, each removed when the process that made it exits normally
// (a forked child inherits the list: it removes only its own).
class TempDirs {
 public:
  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back({getpid(), dir});
  }
  ~TempDirs() {
    const char* keep = std::getenv("GLMSERVE_KEEP_TEST_DIRS");
    if (keep != nullptr && keep[0] != '\0' && keep[0] != '0') return;
    for (const auto& [maker, dir] : dirs_) {
      std::error_code ignored;
      if (maker == getpid()) std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<pid_t, std::string>> dirs_;
};

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmpdir != nullptr && tmpdir[0] != '\0' ? tmpdir : "/tmp") + "/" +
                     prefix + "XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  static TempDirs dirs;  // destroyed, removing them, at exit
  dirs.Add(tmpl);
  return tmpl;
}

int FreePortPair() {
  int ephemeral_low = 32768;  // Linux's default, if the range cannot be read
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> ephemeral_low;
  // Below the ephemeral range and above the well-known ports; a process-dependent start keeps
  // tests running in parallel apart.
  const int low = 10000, high = std::max(low + 2, ephemeral_low - 2);
  std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = low + static_cast<int>(rng() % static_cast<uint32_t>(high - low));
    absl::StatusOr<Socket> first = Listen("", port);
    if (!first.ok()) continue;
    absl::StatusOr<Socket> second = Listen("", port + 1);
    if (second.ok()) return port;
  }
  return 0;
}

}  // namespace glmserve::testing
