// The prefill GEMMs of glm-4.5-air alone, in one CPU math mode, as fractions of the same-run
// peak of the arithmetic the mode runs and of the read bandwidth: a dense projection at m =
// --tokens (q_proj's shape, or --dense=NxK) and the routed experts' gate/up/down as one LinearMany
// with m =
// --tokens * top-8 / 128 rows per expert (what a 128-token prefill gives each expert on
// average). Interleaved rounds, medians: the machine is shared, so only same-run ratios mean
// anything. Run by hand while tuning a kernel (not in CI):
//   build/bench/linear_bench --threads=2 --modes=bf16_amx,bf16 --rounds=5
// int8 and int8_amx quantize the same matrices (core/cpu/quantize.h) and run the same int8
// kernel (AMX, AVX512-VNNI or AVX2: one arithmetic).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/cpu_modes.h"
#include "bench/machine_limits.h"
#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

ABSL_FLAG(std::string, modes, "bf16_amx",
          "CPU math modes (exact, bf16, bf16_amx, int8, int8_amx, int8_row_major, exact_portable), "
          "interleaved");
ABSL_FLAG(std::string, dense, "12288x4096",
          "the dense matrix's shape, N x K (out x in features); q_proj's by default");
ABSL_FLAG(int, tokens, 128, "prefill tokens (dense m; experts get tokens * 8 / 128 rows each)");
ABSL_FLAG(int, experts, 128, "routed experts (each gate/up [1408, 4096], down [4096, 1408])");
ABSL_FLAG(int, rounds, 5, "interleaved rounds; medians are printed");
ABSL_FLAG(int, threads, 0, "threads (0: all cores)");

namespace {

using glmserve::bench::Clock;
using glmserve::bench::Median;
using glmserve::bench::Since;

glmserve::AlignedVector<uint16_t> RandomBf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.02f);
  glmserve::AlignedVector<uint16_t> v(n);
  for (uint16_t& x : v) x = glmserve::FloatToBf16(dist(rng));
  return v;
}

glmserve::Matrix Bf16Matrix(const glmserve::AlignedVector<uint16_t>& data, int64_t rows,
                            int64_t cols) {
  glmserve::Matrix m;
  m.dtype = glmserve::DType::kBF16;
  m.rows = rows;
  m.cols = cols;
  m.data = data.data();
  return m;
}

// An int8 copy of m (WeightFormat::kInt8Groups) in `layout`, its codes and scales kept in
// `store`.
struct Int8Store {
  std::vector<std::vector<int8_t>> q;
  std::vector<std::vector<uint16_t>> scales;
};
glmserve::Matrix Int8Matrix(const glmserve::Matrix& m, glmserve::Int8Layout layout,
                            Int8Store* store) {
  glmserve::Matrix out = m;
  out.format = glmserve::WeightFormat::kInt8Groups;
  std::vector<int8_t> q(m.rows * m.cols);
  std::vector<uint16_t> scales(m.rows * out.scale_cols());
  glmserve::QuantizeMatrixInt8(m, q.data(), scales.data());
  if (layout == glmserve::Int8Layout::kRows16) {
    const int64_t blocks = (m.rows + glmserve::kInt8BlockRows - 1) / glmserve::kInt8BlockRows;
    std::vector<int8_t> q16(blocks * out.scale_cols() * glmserve::kInt8BlockGroupBytes);
    std::vector<uint16_t> scales16(blocks * out.scale_cols() * glmserve::kInt8BlockRows);
    glmserve::InterleaveInt8Rows16(q.data(), scales.data(), m.rows, m.cols, q16.data(),
                                   scales16.data());
    q = std::move(q16);
    scales = std::move(scales16);
  }
  store->q.push_back(std::move(q));
  store->scales.push_back(std::move(scales));
  out.data = store->q.back().data();
  out.group_scales = store->scales.back().data();
  out.int8_layout = layout;
  return out;
}

// Mode i's int8 copies: int8_row_major's row-major, the other int8 modes' in this CPU's layout.
struct Int8Set {
  glmserve::Matrix q;
  std::vector<glmserve::Matrix> experts;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) glmserve::SetNumThreads(absl::GetFlag(FLAGS_threads));
  absl::StatusOr<std::vector<std::string>> modes =
      glmserve::bench::ParseModes(absl::GetFlag(FLAGS_modes));
  if (!modes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(modes.status().message()).c_str());
    return 1;
  }
  const int64_t hidden = 4096, inter = 1408;
  long long dense_n = 0, dense_k = 0;
  if (std::sscanf(absl::GetFlag(FLAGS_dense).c_str(), "%lldx%lld", &dense_n, &dense_k) != 2 ||
      dense_n <= 0 || dense_k <= 0 || dense_n * dense_k > (int64_t{1} << 31)) {
    std::fprintf(stderr, "--dense wants N x K, such as 12288x4096 (at most 2^31 weights)\n");
    return 1;
  }
  const int64_t q_dim = dense_n, dense_in = dense_k;
  const int64_t tokens = absl::GetFlag(FLAGS_tokens), n_experts = absl::GetFlag(FLAGS_experts);
  const int64_t m_expert = std::max<int64_t>(1, tokens * 8 / 128);

  const glmserve::AlignedVector<uint16_t> q_data = RandomBf16(q_dim * dense_in, 1);
  const glmserve::Matrix q = Bf16Matrix(q_data, q_dim, dense_in);
  std::vector<glmserve::AlignedVector<uint16_t>> expert_data;
  std::vector<glmserve::Matrix> expert_w;
  expert_data.reserve(3 * n_experts);
  for (int64_t e = 0; e < n_experts; ++e) {
    expert_data.push_back(RandomBf16(inter * hidden, 10 + 3 * e));
    expert_data.push_back(RandomBf16(inter * hidden, 11 + 3 * e));
    expert_data.push_back(RandomBf16(hidden * inter, 12 + 3 * e));
  }
  for (int64_t e = 0; e < n_experts; ++e) {
    expert_w.push_back(Bf16Matrix(expert_data[3 * e], inter, hidden));
    expert_w.push_back(Bf16Matrix(expert_data[3 * e + 1], inter, hidden));
    expert_w.push_back(Bf16Matrix(expert_data[3 * e + 2], hidden, inter));
  }
  Int8Store int8_store;
  std::vector<Int8Set> int8_sets(modes->size());
  for (size_t i = 0; i < modes->size(); ++i) {
    if (!glmserve::bench::Int8Weights((*modes)[i])) continue;
    // The layout the CPU the mode runs as picks (int8_avx2: one without AVX-512).
    glmserve::bench::UseKernelsOf((*modes)[i]);
    const glmserve::Int8Layout layout = (*modes)[i] == "int8_row_major"
                                            ? glmserve::Int8Layout::kRowMajor
                                            : glmserve::Int8LayoutForThisCpu();
    glmserve::bench::UseKernelsOf("");
    int8_sets[i].q = Int8Matrix(q, layout, &int8_store);
    for (const glmserve::Matrix& w : expert_w) {
      int8_sets[i].experts.push_back(Int8Matrix(w, layout, &int8_store));
    }
  }
  glmserve::AlignedVector<float> x(tokens * dense_in), y(tokens * q_dim);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (float& v : x) v = dist(rng);
  // Each expert its own activations (gate/up share theirs, down takes its own), as in MoeFfn.
  glmserve::AlignedVector<float> xe(n_experts * m_expert * hidden),
      he(n_experts * m_expert * inter);
  for (float& v : xe) v = dist(rng);
  for (float& v : he) v = dist(rng);
  glmserve::AlignedVector<float> ye(n_experts * 3 * m_expert * hidden);

  const glmserve::bench::MachineLimits limits = glmserve::bench::MeasureMachine();
  std::printf(
      "threads %d; peaks: fp32 FMA %.0f, bf16 dot %.0f, AMX bf16 %.0f GFLOP/s, int8 dot %.0f, "
      "AMX int8 %.0f GOP/s; read %.1f GB/s\n",
      glmserve::NumThreads(), limits.fma_gflops, limits.bf16_gflops, limits.amx_gflops,
      limits.int8_gops, limits.amx_int8_gops, limits.read_gbs);
  std::printf("dense [%lld x %lld] at m = %lld; %lld experts x 3 matrices at m = %lld\n",
              static_cast<long long>(q_dim), static_cast<long long>(dense_in),
              static_cast<long long>(tokens), static_cast<long long>(n_experts),
              static_cast<long long>(m_expert));

  const size_t n_modes = modes->size();
  std::vector<std::vector<double>> dense_s(n_modes), moe_s(n_modes);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t i = 0; i < n_modes; ++i) {
      const glmserve::CpuMath math = glmserve::bench::MathOf((*modes)[i]);
      const bool int8 = glmserve::bench::Int8Weights((*modes)[i]);
      glmserve::bench::UseKernelsOf((*modes)[i]);
      auto t = Clock::now();
      glmserve::Linear(x.data(), tokens, int8 ? int8_sets[i].q : q, nullptr, y.data(), math);
      dense_s[i].push_back(Since(t));
      std::vector<glmserve::LinearJob> jobs;
      for (int64_t j = 0; j < 3 * n_experts; ++j) {
        const int64_t e = j / 3;
        const float* xj =
            j % 3 == 2 ? he.data() + e * m_expert * inter : xe.data() + e * m_expert * hidden;
        jobs.push_back({xj, m_expert, int8 ? &int8_sets[i].experts[j] : &expert_w[j], nullptr,
                        ye.data() + j * m_expert * hidden});
      }
      t = Clock::now();
      glmserve::LinearMany(jobs, math);
      moe_s[i].push_back(Since(t));
    }
  }
  const double dense_flops = 2.0 * tokens * q_dim * dense_in;
  const double moe_flops = 2.0 * m_expert * 3 * inter * hidden * n_experts;
  const double moe_elems = 3.0 * inter * hidden * n_experts;
  std::printf(
      "\n| mode | dense GFLOP/s | of peak | experts GFLOP/s | of peak | experts GB/s | of "
      "read |\n|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < n_modes; ++i) {
    const glmserve::CpuMath math = glmserve::bench::MathOf((*modes)[i]);
    const bool int8 = glmserve::bench::Int8Weights((*modes)[i]);
    // The peak of the arithmetic the mode runs, as cpu_bench takes it (int8 without
    // AVX512-VNNI or AMX-INT8, or bf16 without its units: the FMA peak).
    const bool amx = math == glmserve::CpuMath::kBf16Amx;
    const double peak =
        int8 && amx ? (limits.amx_int8_gops > 0 ? limits.amx_int8_gops : limits.fma_gflops)
        : int8      ? (limits.int8_gops > 0 ? limits.int8_gops : limits.fma_gflops)
        : math == glmserve::CpuMath::kBf16Amx && limits.amx_gflops > 0 ? limits.amx_gflops
        : math == glmserve::CpuMath::kBf16 && limits.bf16_gflops > 0   ? limits.bf16_gflops
                                                                       : limits.fma_gflops;
    // int8 reads a byte per weight and a bf16 scale per 32 (bf16 modes two bytes).
    const double moe_bytes = moe_elems * (int8 ? 1.0 + 2.0 / glmserve::kInt8Group : 2.0);
    const double d = dense_flops / Median(dense_s[i]) / 1e9;
    const double e = moe_flops / Median(moe_s[i]) / 1e9;
    const double gbs = moe_bytes / Median(moe_s[i]) / 1e9;
    glmserve::bench::UseKernelsOf((*modes)[i]);  // the kernel names of the CPU it ran as
    std::printf("| %s (%s) | %.0f | %.2f | %.0f | %.2f | %.1f | %.2f |\n", (*modes)[i].c_str(),
                int8 ? glmserve::LinearInt8KernelName() : glmserve::LinearKernelName(math), d,
                d / peak, e, e / peak, gbs, gbs / limits.read_gbs);
  }
  glmserve::bench::UseKernelsOf("");
  return 0;
}
