// The GPU side of the tensor-parallel collectives: the rank-order sum kernel gives the CPU
// group's bits, and NCCL gathers and sums in rank order through the Communicator interface,
// with ranks as threads on their own devices, directly and replayed from CUDA graphs. On a
// device NCCL is the host's; under the emulation (tools/cuda_emu) it is the in-process
// stand-in on EMU_DEVICES emulated devices, which also checks that ranks agree and that a
// group whose rank never comes can be aborted.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "core/cuda/device_memory.h"
#include "core/cuda/kernels.h"
#include "core/cuda/nccl_communicator.h"
#include "core/model/communicator.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"

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
    if (r == n - 1) {
      EXPECT_EQ(rooted[r], want);
    }
  }
}
int Devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<int> FirstDevices(int n) {
  std::vector<int> d(n);
  for (int r = 0; r < n; ++r) d[r] = r;
  return d;
}

// fn(r) on n threads at once, thread r on device r (how the model's ranks run).
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&fn, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      fn(r);
    });
  }
  for (std::thread& t : threads) t.join();
}

Stream NewStream() {
  absl::StatusOr<Stream> s = CreateStream();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Stream();
}

// Rank r's block of a gather: uneven, one of them empty.
std::vector<int64_t> Blocks(int n) {
  const int64_t sizes[] = {3, 0, 5, 2};
  return std::vector<int64_t>(sizes, sizes + n);
}
std::vector<float> Block(int r, int64_t count, int salt) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = 100.f * (r + 1) + static_cast<float>(i) + 0.5f * salt;
  return v;
}
std::vector<float> AllBlocks(int n, int salt) {
  std::vector<float> all;
  for (int r = 0; r < n; ++r) {
    const std::vector<float> b = Block(r, Blocks(n)[r], salt);
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

// The fp32 sum of the ranks' values in rank order, as the CPU group adds them.
float RankOrderSum(int n, int64_t i, int salt) {
  float sum = Value(salt, i);
  for (int q = 1; q < n; ++q) sum += Value(q + salt, i);
  return sum;
}

#define GLM_REQUIRE_NCCL()                                                      \
  do {                                                                          \
    GLM_REQUIRE_CUDA_DEVICE();                                                  \
    if (const absl::Status nccl = LoadNccl(); !nccl.ok()) GTEST_SKIP() << nccl; \
  } while (false)

// N = 2, 3, 4 ranks from one ncclCommInitAll, each on its own thread, device and stream: the
// sums are the CPU group's bits (and the order matters for these values), the gathers place
// uneven blocks, an empty one included, on every rank or on the root only.
TEST(CollectiveCudaTest, NcclGroupOfThreadsMatchesTheCpuGroupBitForBit) {
  GLM_REQUIRE_NCCL();
  for (const int n : {2, 3, 4}) {
    if (Devices() < n) {
      std::printf("%d ranks need %d devices; this host has %d\n", n, n, Devices());
      continue;
    }
    SCOPED_TRACE(n);
    const int64_t count = 1000;
    // The CPU group's sums of the same values.
    std::vector<std::vector<float>> want(n, std::vector<float>(count));
    {
      auto cpu = CreateThreadGroup(n);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < count; ++i) want[r][i] = Value(r, i);
        threads.emplace_back(
            [&, r] { EXPECT_TRUE(cpu[r]->AllReduceSum(want[r].data(), count).ok()); });
      }
      for (std::thread& t : threads) t.join();
    }
    // The order matters from three ranks on (two addends commute): adding in reverse gives
    // other bits somewhere.
    int64_t reordered = 0;
    for (int64_t i = 0; i < count; ++i) {
      float reverse = Value(n - 1, i);
      for (int q = n - 2; q >= 0; --q) reverse += Value(q, i);
      if (std::memcmp(&reverse, &want[0][i], sizeof(float)) != 0) ++reordered;
    }
    if (n >= 3) {
      EXPECT_GT(reordered, 0);
    }

    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> group =
        CreateNcclGroup(FirstDevices(n));
    ASSERT_TRUE(group.ok()) << group.status();
    ASSERT_EQ(static_cast<int>(group->size()), n);
    const std::vector<int64_t> counts = Blocks(n);
    const std::vector<float> blocks = AllBlocks(n, 0);
    const int root = n - 1;
    std::vector<std::vector<float>> sums(n), gathered(n), rooted(n);
    OnRanks(n, [&](int r) {
      Communicator& comm = *(*group)[r];
      EXPECT_EQ(comm.rank(), r);
      EXPECT_EQ(comm.size(), n);
      Stream stream = NewStream();
      comm.SetStream(stream.get());
      std::vector<float> mine(count);
      for (int64_t i = 0; i < count; ++i) mine[i] = Value(r, i);
      DeviceBuffer d = Upload(mine);
      ASSERT_TRUE(comm.AllReduceSum(d.as<float>(), count).ok());
      DeviceBuffer in = Upload(Block(r, counts[r], 0));
      DeviceBuffer out = Poisoned<float>(blocks.size());
      ASSERT_TRUE(comm.AllGather(in.as<float>(), counts, out.as<float>()).ok());
      DeviceBuffer at_root = Poisoned<float>(blocks.size());
      ASSERT_TRUE(
          comm.Gather(in.as<float>(), counts, r == root ? at_root.as<float>() : nullptr, root)
              .ok());
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      sums[r] = Download<float>(d, count);
      gathered[r] = Download<float>(out, blocks.size());
      if (r == root) rooted[r] = Download<float>(at_root, blocks.size());
      EXPECT_TRUE(comm.health().ok()) << comm.health();
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(sums[r].size(), static_cast<size_t>(count));
      EXPECT_EQ(std::memcmp(sums[r].data(), want[0].data(), count * sizeof(float)), 0)
          << "rank " << r;
      EXPECT_EQ(gathered[r], blocks) << "rank " << r;
    }
    EXPECT_EQ(rooted[root], blocks);
  }
}

// The model captures its step, collectives included, into CUDA graphs: captured on each rank's
// stream (thread-local capture, as the model does), the collectives run only when the graphs
// are launched, with the inputs of that moment. Ranks joined with ncclCommInitRank.
TEST(CollectiveCudaTest, NcclCollectivesCapturedIntoGraphsRunAtEachReplay) {
  GLM_REQUIRE_NCCL();
  const int n = std::min(Devices(), 3);
  if (n < 2) GTEST_SKIP() << "needs 2 devices";
  absl::StatusOr<NcclGroupId> id = NcclNewGroupId();
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t count = 300;
  const std::vector<int64_t> counts = Blocks(n);
  const int root = 1;
  const int64_t total = AllBlocks(n, 0).size();
  std::vector<std::vector<std::vector<float>>> sums(2, std::vector<std::vector<float>>(n)),
      gathered = sums, rooted = sums;
  std::vector<std::vector<float>> before_launch(n);
  std::barrier sync(n);
  OnRanks(n, [&](int r) {
    Stream stream = NewStream();
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        CreateNcclCommunicator(*id, r, n, r, stream.get());
    ASSERT_TRUE(comm.ok()) << comm.status();
    DeviceBuffer d = Poisoned<float>(count);
    DeviceBuffer in = Poisoned<float>(counts[r]);
    DeviceBuffer out = Poisoned<float>(total);
    DeviceBuffer at_root = Poisoned<float>(total);
    // A first sum outside the capture: it allocates the gather's scratch, which a capture
    // must not (the model warms up the same way).
    ASSERT_TRUE(CopyToDevice(d.get(), std::vector<float>(count, 1.f).data(), count * 4).ok());
    ASSERT_TRUE((*comm)->AllReduceSum(d.as<float>(), count).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);

    ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_TRUE((*comm)->AllReduceSum(d.as<float>(), count).ok());
    EXPECT_TRUE((*comm)->AllGather(in.as<float>(), counts, out.as<float>()).ok());
    EXPECT_TRUE(
        (*comm)
            ->Gather(in.as<float>(), counts, r == root ? at_root.as<float>() : nullptr, root)
            .ok());
    cudaGraph_t captured = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(stream.get(), &captured), cudaSuccess);
    Graph graph(captured);
    cudaGraphExec_t instantiated = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&instantiated, graph.get(), 0), cudaSuccess);
    GraphExec exec(instantiated);
    before_launch[r] = Download<float>(out, total);  // nothing ran while capturing

    for (int rep = 0; rep < 2; ++rep) {
      std::vector<float> mine(count);
      for (int64_t i = 0; i < count; ++i) mine[i] = Value(r + rep + 1, i);
      ASSERT_TRUE(CopyToDevice(d.get(), mine.data(), count * 4).ok());
      const std::vector<float> block = Block(r, counts[r], rep + 1);
      ASSERT_TRUE(CopyToDevice(in.get(), block.data(), block.size() * 4).ok());
      ASSERT_TRUE(FillDevice(out.get(), 0xff, total * 4).ok());
      ASSERT_TRUE(FillDevice(at_root.get(), 0xff, total * 4).ok());
      ASSERT_EQ(cudaGraphLaunch(exec.get(), stream.get()), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      sums[rep][r] = Download<float>(d, count);
      gathered[rep][r] = Download<float>(out, total);
      if (r == root) rooted[rep][r] = Download<float>(at_root, total);
      // No rank rewrites its inputs for the next replay before every rank has read them.
      sync.arrive_and_wait();
    }
    EXPECT_TRUE((*comm)->health().ok()) << (*comm)->health();
  });
  for (int r = 0; r < n; ++r) {
    for (float v : before_launch[r]) EXPECT_TRUE(std::isnan(v)) << "rank " << r;
  }
  for (int rep = 0; rep < 2; ++rep) {
    SCOPED_TRACE(rep);
    const std::vector<float> blocks = AllBlocks(n, rep + 1);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(sums[rep][r].size(), static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(sums[rep][r][i], RankOrderSum(n, i, rep + 1)) << "rank " << r << " element " << i;
      }
      EXPECT_EQ(gathered[rep][r], blocks) << "rank " << r;
    }
    EXPECT_EQ(rooted[rep][root], blocks);
  }
}

// Two threads on two devices run kernels and copies at the same time, each on its own
// stream; a device that does not exist is refused.
TEST(CollectiveCudaTest, TwoDevicesRunKernelsAndCopiesConcurrently) {
  GLM_REQUIRE_CUDA_DEVICE();
  const int devices = Devices();
  EXPECT_EQ(cudaSetDevice(devices), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  cudaGetLastError();
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  if (devices < 2) GTEST_SKIP() << "needs 2 devices";
  const int64_t count = 777;
  const int rounds = 20;
  std::vector<std::vector<float>> got(2);
  std::vector<int> seen(2, -1);
  OnRanks(2, [&](int r) {
    Stream stream = NewStream();
    const int ranks = 2 + r;  // different work on each device
    std::vector<float> parts(ranks * count), delta(count);
    for (int q = 0; q < ranks; ++q) {
      for (int64_t i = 0; i < count; ++i) parts[q * count + i] = Value(q + r, i);
    }
    for (int64_t i = 0; i < count; ++i) delta[i] = Value(r + 5, i) * 1e-3f;
    DeviceBuffer d_parts = Upload(parts);
    DeviceBuffer d_delta = Upload(delta);
    DeviceBuffer d_out = Poisoned<float>(count);
    DeviceBuffer d_copy = Poisoned<float>(count);
    for (int k = 0; k < rounds; ++k) {
      ASSERT_EQ(
          LaunchRankOrderSum(d_parts.as<float>(), ranks, count, d_out.as<float>(), stream.get()),
          cudaSuccess);
      ASSERT_EQ(LaunchAdd(d_out.as<float>(), d_delta.as<float>(), count, stream.get()),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(d_copy.get(), d_out.get(), count * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream.get()),
                cudaSuccess);
      // The next round sums the last result back in, as the first rank's part.
      ASSERT_EQ(cudaMemcpyAsync(d_parts.get(), d_copy.get(), count * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream.get()),
                cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    got[r] = Download<float>(d_copy, count);
    cudaGetDevice(&seen[r]);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(seen[r], r);
    const int ranks = 2 + r;
    std::vector<float> parts(ranks * count);
    for (int q = 0; q < ranks; ++q) {
      for (int64_t i = 0; i < count; ++i) parts[q * count + i] = Value(q + r, i);
    }
    ASSERT_EQ(got[r].size(), static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      float out = 0;
      for (int k = 0; k < rounds; ++k) {
        out = parts[i];
        for (int q = 1; q < ranks; ++q) out += parts[q * count + i];
        out += Value(r + 5, i) * 1e-3f;
        parts[i] = out;
      }
      ASSERT_EQ(got[r][i], out) << "device " << r << " element " << i;
    }
  }
}

#ifdef GLMSERVE_CUDA_EMU
// Emulation only: on a device a collective is enqueued and the call returns, a missing rank
// shows as a stream that never finishes. The emulated NCCL runs it on the calling thread, so
// the ranks that came block in the call until Abort (here from another thread, on a waiting
// rank's communicator) releases them with an error.
TEST(CollectiveCudaTest, EmulatedNcclAbortReleasesRanksWaitingForOneThatNeverComes) {
  GLM_REQUIRE_NCCL();
  const int n = 3;
  if (Devices() < n) GTEST_SKIP() << "needs 3 devices (EMU_DEVICES)";
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> group =
      CreateNcclGroup(FirstDevices(n));
  ASSERT_TRUE(group.ok()) << group.status();
  const int64_t count = 64;
  std::vector<absl::Status> got(n - 1);
  std::atomic<int> calling{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n - 1; ++r) {  // rank n - 1 never calls
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      Stream stream = NewStream();
      (*group)[r]->SetStream(stream.get());
      DeviceBuffer d = Upload(std::vector<float>(count, 1.f));
      ++calling;
      got[r] = (*group)[r]->AllReduceSum(d.as<float>(), count);
    });
  }
  while (calling.load() < n - 1) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  (*group)[0]->Abort(absl::CancelledError("rank 2 is gone"));
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_FALSE(got[r].ok()) << "rank " << r;
    EXPECT_FALSE((*group)[r]->health().ok()) << "rank " << r;
  }
  // The rank that never came learns it too, and its next collective fails at once.
  EXPECT_FALSE((*group)[n - 1]->health().ok());
  ASSERT_EQ(cudaSetDevice(n - 1), cudaSuccess);
  DeviceBuffer d = Upload(std::vector<float>(count, 1.f));
  EXPECT_FALSE((*group)[n - 1]->AllReduceSum(d.as<float>(), count).ok());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// Emulation only: ranks that diverge (here different counts, as a rank that took another
// branch of the model) fail with the reason instead of exchanging the wrong bytes.
TEST(CollectiveCudaTest, EmulatedNcclRefusesRanksThatDisagree) {
  GLM_REQUIRE_NCCL();
  if (Devices() < 2) GTEST_SKIP() << "needs 2 devices (EMU_DEVICES)";
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> group =
      CreateNcclGroup(FirstDevices(2));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<absl::Status> got(2);
  OnRanks(2, [&](int r) {
    Stream stream = NewStream();
    (*group)[r]->SetStream(stream.get());
    const int64_t count = r == 0 ? 8 : 16;
    DeviceBuffer d = Upload(std::vector<float>(count, 1.f));
    got[r] = (*group)[r]->AllReduceSum(d.as<float>(), count);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(got[r].ok()) << "rank " << r;
    EXPECT_FALSE((*group)[r]->health().ok()) << "rank " << r;
  }
}
#endif

}  // namespace
}  // namespace glmserve::cuda
