// The GPU side of the tensor-parallel collectives: the rank-order sum kernel gives the CPU
// group's bits (under the emulation and on a device), and NCCL (real devices only: the
// emulation has none) gathers and sums in rank order through the Communicator interface.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "core/cuda/kernels.h"
#include "core/model/communicator.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"
#ifndef GLMSERVE_CUDA_EMU
#include "core/cuda/nccl_communicator.h"
#endif

namespace glmserve::cuda {
namespace {

// Values whose fp32 sum depends on the order of the additions.
float Value(int r, int64_t i) {
  const float v[] = {1e8f, 3.f, -1e8f, 0.25f, 7e7f, -5.f, 1.f, -7e7f};
  return v[(r + i) % 8] * (1.f + 0.001f * static_cast<float>(i % 13));
}

TEST(CollectiveCudaTest, RankOrderSumMatchesTheCpuGroupBitForBit) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const int ranks : {1, 2, 3, 8}) {
    const int64_t count = 1000;
    std::vector<float> parts(ranks * count);
    std::vector<std::vector<float>> host(ranks, std::vector<float>(count));
    for (int r = 0; r < ranks; ++r) {
      for (int64_t i = 0; i < count; ++i) parts[r * count + i] = host[r][i] = Value(r, i);
    }
    DeviceBuffer d_parts = Upload(parts);
    DeviceBuffer d_out = Poisoned<float>(count);
    ASSERT_EQ(LaunchRankOrderSum(static_cast<float*>(d_parts.get()), ranks, count,
                                 static_cast<float*>(d_out.get()), nullptr),
              cudaSuccess);
    const std::vector<float> got = Download<float>(d_out, count);
    // The CPU group's sums of the same partials.
    auto comms = CreateThreadGroup(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back(
          [&, r] { EXPECT_TRUE(comms[r]->AllReduceSum(host[r].data(), count).ok()); });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_EQ(std::memcmp(got.data(), host[0].data(), count * sizeof(float)), 0) << ranks;
  }
}

#ifndef GLMSERVE_CUDA_EMU
// One rank per device, up to 2 (a single-GPU host runs a group of one: NCCL loads, joins and
// runs the same calls; the sums are then the rank's own values, the kernel's order checked by
// the case above).
TEST(CollectiveCudaTest, NcclGroupSumsInRankOrderAndGathersUnevenBlocks) {
  GLM_REQUIRE_CUDA_DEVICE();
  // NCCL comes from the host's CUDA installation (the GPU bundle does not carry it: too large);
  // a GPU host without it skips this case with the loader's reason.
  if (const absl::Status nccl = LoadNccl(); !nccl.ok()) GTEST_SKIP() << nccl;
  std::printf("NCCL %s\n", NcclVersion().c_str());
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  const int n = devices >= 2 ? 2 : 1;
  absl::StatusOr<NcclGroupId> id = NcclNewGroupId();
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t count = 4096;
  std::vector<std::vector<float>> sums(n), gathered(n), rooted(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      auto comm = CreateNcclCommunicator(*id, r, n, r, nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> mine(count);
      for (int64_t i = 0; i < count; ++i) mine[i] = Value(r, i);
      DeviceBuffer d = Upload(mine);
      ASSERT_TRUE((*comm)->AllReduceSum(static_cast<float*>(d.get()), count).ok());
      sums[r] = Download<float>(d, count);
      const std::vector<int64_t> counts =
          n == 2 ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{3};
      DeviceBuffer in = Upload(std::vector<float>(counts[r], 10.f * (r + 1)));
      DeviceBuffer out = Poisoned<float>(8);
      ASSERT_TRUE(
          (*comm)
              ->AllGather(static_cast<float*>(in.get()), counts, static_cast<float*>(out.get()))
              .ok());
      gathered[r] = Download<float>(out, n == 2 ? 8 : 3);
      // The same blocks on the last rank only.
      DeviceBuffer at_root = Poisoned<float>(8);
      ASSERT_TRUE((*comm)
                      ->Gather(static_cast<float*>(in.get()), counts,
                               r == n - 1 ? static_cast<float*>(at_root.get()) : nullptr, n - 1)
                      .ok());
      if (r == n - 1) rooted[r] = Download<float>(at_root, n == 2 ? 8 : 3);
      EXPECT_TRUE((*comm)->health().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      float want = Value(0, i);
      for (int q = 1; q < n; ++q) want += Value(q, i);
      ASSERT_EQ(sums[r][i], want) << "rank " << r << " element " << i;
    }
    const std::vector<float> want = n == 2 ? std::vector<float>{10, 10, 10, 20, 20, 20, 20, 20}
                                           : std::vector<float>{10, 10, 10};
    EXPECT_EQ(gathered[r], want);
    if (r == n - 1) EXPECT_EQ(rooted[r], want);
  }
}
#endif

}  // namespace
}  // namespace glmserve::cuda
