// Helpers shared by the tests: fixture paths, error norms, float64 reference utilities.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace glmserve::testing {

// <dir>/<name>, where dir is $GLMSERVE_GOLDEN_DIR when set and non-empty, else the source
// tree's tests/golden (an absolute path compiled in).
std::string GoldenDir(const std::string& name);

// <dir>/<name> for a model shipped in models/: dir is $GLMSERVE_MODELS_DIR when set and
// non-empty (a GPU bundle's copy), else the source tree's models/.
std::string ModelDir(const std::string& name);

// The names of the golden fixtures in GoldenDir("") (folders holding an expected.json), sorted.
std::vector<std::string> GoldenCases();

// A fixture's expected.json: the prompt, the reference's greedy tokens, the weights' dtype,
// and the generator's smallest router and DSA-indexer selection margins (infinity when the
// fixture records none: no MoE layer or no sparse query).
struct GoldenExpected {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::string weights_dtype;
  bool fp8 = false;  // an FP8 checkpoint (tools/make_goldens_fp8.py): weights stay e4m3
  double min_route_gap = 0;
  double min_index_gap = 0;
};
GoldenExpected ReadGoldenExpected(const std::string& dir);

// ||a - b|| / ||b|| over n elements (0 when both are zero).
double RelativeError(const float* a, const float* b, int64_t n);
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

// n values ~ N(0, stddev^2) from a seeded generator.
std::vector<float> RandomVector(int64_t n, uint32_t seed, float stddev = 1.0f);

// A fresh directory under $TMPDIR (default /tmp), removed with its contents when this process
// exits normally (not when a forked child does); GLMSERVE_KEEP_TEST_DIRS=1 keeps it for a look
// after a failure.
std::string MakeTempDir(const std::string& prefix);

// A TCP port p such that p and p + 1 are both free on every interface (a multi-process leader
// listens on its port and on port + 1 for the collectives). It is drawn below the kernel's
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): an ephemeral port, such as
// Listen(host, 0) gives, can be taken between this check and the server's bind by any
// process's outgoing connection, and Linux's connect() favours exactly the even neighbours of
// the odd ports bind(0) favours. 0 when no pair was found.
int FreePortPair();

}  // namespace glmserve::testing
