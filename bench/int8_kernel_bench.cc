// The int8-weight kernels called directly, on one thread, at several activation row counts: what
// each costs where LinearMany would pick another (the AVX2 kernel on a VNNI machine, the choice
// of kInt8VnniMinRows, kInt8Rows16TileMinRows and, on AMX, kInt8AmxRows16MinRows). linear_bench
// and cpu_bench measure only the dispatched kernel.
//   build/bench/int8_kernel_bench --rows=1,4,8,16,64,256 --n=4096 --k=4096
// Both int8 layouts (Int8Layout, core/model/weights.h) where a kernel reads them.
// Each row: best of --reps over the whole matrix (N / 32 tasks in a row), GOP/s against the
// one-thread vpdpbusd peak measured in the same run, and the weight bytes read per second (the
// matrix, 17 MB at the default shape, is read once per call).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/int_list.h"
#include "bench/machine_limits.h"
#include "core/base/aligned_vector.h"
#include "core/base/huge_pages.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"
#include "core/cpu/quantize.h"

ABSL_FLAG(std::string, rows, "1,2,4,8,16,64,256", "activation row counts");
ABSL_FLAG(int, n, 4096, "weight rows");
ABSL_FLAG(int, k, 4096, "weight columns");
ABSL_FLAG(int, reps, 5, "repetitions per row; the best is printed");

namespace glmserve::bench {
namespace {

int Main() {
  SetNumThreads(1);
  const int64_t n = absl::GetFlag(FLAGS_n), k = absl::GetFlag(FLAGS_k);
  absl::StatusOr<std::vector<int>> rows = ParseIntList("rows", absl::GetFlag(FLAGS_rows), 1, 65536);
  if (!rows.ok() || n < 1 || k < 1) {
    std::fprintf(stderr, "bad flags: %s\n", rows.status().ToString().c_str());
    return 2;
  }
  const int64_t max_m = *std::max_element(rows->begin(), rows->end());
  if (n > 65536 || k > 65536) {
    std::fprintf(stderr, "--n and --k: at most 65536\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> wb(n * k);
  for (uint16_t& v : wb) v = FloatToBf16(0.05f * normal(rng));
  glmserve::AlignedVector<float> x(max_m * k);
  for (float& v : x) v = normal(rng);
  // On transparent huge pages, as the engine's int8 weights (core/cpu/quantize.cc): on 4 KiB
  // pages the hardware prefetchers stop at every page, and a decode-sized call reads at about
  // half the rate (a Zen 4 VM, one thread).
  std::vector<int8_t, HugePageAllocator<int8_t>> q(n * k);
  std::vector<uint16_t, HugePageAllocator<uint16_t>> scales(n *
                                                            ((k + kInt8Group - 1) / kInt8Group));
  QuantizeMatrixInt8(Matrix{DType::kBF16, n, k, wb.data()}, q.data(), scales.data());
  Matrix w{DType::kBF16, n, k, q.data()};
  w.format = WeightFormat::kInt8Groups;
  w.group_scales = scales.data();
  // The same weights in Int8Layout::kRows16, for the kernels that read that layout.
  const int64_t groups = w.scale_cols(), blocks = (n + kInt8BlockRows - 1) / kInt8BlockRows;
  std::vector<int8_t, HugePageAllocator<int8_t>> q16(blocks * groups * kInt8BlockGroupBytes);
  std::vector<uint16_t, HugePageAllocator<uint16_t>> scales16(blocks * groups * kInt8BlockRows);
  InterleaveInt8Rows16(q.data(), scales.data(), n, k, q16.data(), scales16.data());
  Matrix w16 = w;
  w16.data = q16.data();
  w16.group_scales = scales16.data();
  w16.int8_layout = Int8Layout::kRows16;

  struct Kernel {
    const char* name;
    bool available;
    internal::Int8Operands operands;
    void (*block)(const internal::Int8Job&, int64_t);
    const Matrix* w;
  };
  const bool vnni = internal::CpuHasAvx512Vnni(), amx = internal::CpuHasAmxInt8();
  const Kernel kernels[] = {
      {"amx_int8", amx, internal::Int8Operands::kAmxTiles, internal::Int8AmxBlockHardware, &w},
      {"amx_int8 (rows16)", amx, internal::Int8Operands::kAmxRows,
       internal::Int8AmxRows16BlockHardware, &w16},
      {"avx512_vnni", vnni, internal::Int8Operands::kVnniTiles, internal::Int8BlockAvx512Vnni, &w},
      {"avx512_vnni (rows16)", vnni, internal::Int8Operands::kVnniTiles,
       internal::Int8BlockAvx512Vnni, &w16},
      {"avx512_vnni_rows", vnni, internal::Int8Operands::kGroups, internal::Int8BlockAvx512VnniRows,
       &w},
      {"avx512_vnni_rows16", vnni, internal::Int8Operands::kGroups,
       internal::Int8BlockAvx512VnniRows16, &w16},
      {"avx2_int8", internal::CpuHasAvx2Fma(), internal::Int8Operands::kGroups,
       internal::Int8BlockAvx2, &w},
      {"avx2_int8_rows16", internal::CpuHasAvx2Fma(), internal::Int8Operands::kGroups,
       internal::Int8BlockAvx2Rows16, &w16},
      {"avx_vnni_int8_rows16", internal::CpuHasAvxVnni(), internal::Int8Operands::kGroups,
       internal::Int8BlockAvxVnniRows16, &w16},
      {"generic_int8", true, internal::Int8Operands::kGroups, internal::Int8BlockGeneric, &w},
  };
  const double peak = Int8DotPeakGops();
  std::printf("one thread; %ld x %ld int8 weights (%.1f MB); vpdpbusd peak %.0f GOP/s%s\n",
              static_cast<long>(n), static_cast<long>(k), n * k * (1 + 2.0 / 32) / 1e6, peak,
              peak > 0 ? "" : " (no AVX512-VNNI)");
  std::printf(
      "LinearMany picks on VNNI: for the kRows16 layout (QuantizeWeights' choice there) "
      "avx512_vnni_rows16 below %ld rows, avx512_vnni (rows16) from there, but amx_int8 "
      "(rows16) from %ld rows where AMX-INT8 is present; for row-major weights amx_int8 on AMX, "
      "else avx512_vnni_rows (lanes along K) below %ld rows, avx512_vnni from there; without "
      "VNNI avx_vnni_int8_rows16 or avx2_int8_rows16 (kRows16, QuantizeWeights' choice there "
      "too), avx2_int8 for row-major weights\n\n",
      static_cast<long>(internal::kInt8Rows16TileMinRows),
      static_cast<long>(internal::kInt8AmxRows16MinRows),
      static_cast<long>(internal::kInt8VnniMinRows));
  std::printf(
      "| kernel | rows | ms | GOP/s | of vpdpbusd peak | weight GB/s "
      "|\n|---|---|---|---|---|---|\n");
  for (const int64_t m : *rows) {
    glmserve::AlignedVector<float> y(m * n);
    for (const Kernel& kernel : kernels) {
      if (!kernel.available) continue;
      // The portable kernel is a reference: one small size only.
      if (kernel.block == internal::Int8BlockGeneric && m > 1) continue;
      internal::Int8Activation a;
      internal::QuantizeActivationInt8(x.data(), m, k, &a, kernel.operands);
      const bool tiles = kernel.operands == internal::Int8Operands::kAmxTiles ||
                         kernel.operands == internal::Int8Operands::kAmxRows;
      if (tiles) internal::Int8AmxThreadBegin();
      const double s = BestOf(absl::GetFlag(FLAGS_reps), [&] {
        for (int64_t nb = 0; nb * internal::kBlockN < n; ++nb) {
          kernel.block({&a, kernel.w, nullptr, y.data()}, nb);
        }
      });
      if (tiles) internal::AmxThreadEnd();
      const double gops = 2.0 * m * n * k / s / 1e9;
      std::printf("| %s | %ld | %.3f | %.1f | %s | %.1f |\n", kernel.name, static_cast<long>(m),
                  s * 1e3, gops, peak > 0 ? std::to_string(gops / peak).substr(0, 4).c_str() : "-",
                  n * k * (1 + 2.0 / 32) / s / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace glmserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return glmserve::bench::Main();
}
