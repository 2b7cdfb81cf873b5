// glm-run --device: the CUDA runner from the command line, checked against the CPU runner on
// golden checkpoints the way a user checks a new checkpoint (a CPU run writes its logits and
// hidden states, a CUDA run compares with them under --max_relative_error), for every model
// family and weight form the CUDA runner serves; and the flags each runner refuses.
//
// Where the CUDA runner runs: on a GPU in a -DGLMSERVE_CUDA=ON build, and on the emulated
// device in the -DGLMSERVE_CUDA_EMU=ON build (whose glm-run links the emulated backend;
// ctest label cuda_emu). Elsewhere the CUDA cases skip with glm-run's own reason, and fail
// under GLMSERVE_REQUIRE_CUDA=1.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/test_util.h"
#include "tests/tools/glm_run_process.h"

namespace glmserve {
namespace {

using testing::RunGlmRun;
using testing::RunResult;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The fixture's checkpoint and prompt as glm-run arguments.
std::string ModelArgs(const std::string& fixture) {
  const std::string dir = testing::GoldenDir(fixture);
  const testing::GoldenExpected expected = testing::ReadGoldenExpected(dir);
  return absl::StrCat("--model=", dir, " --prompt=", absl::StrJoin(expected.prompt, ","),
                      " --max_new_tokens=", expected.greedy.size());
}

// Skips (or, under GLMSERVE_REQUIRE_CUDA=1, fails) when this build's glm-run has no usable
// CUDA runner, with the reason glm-run gives.
#define GLM_REQUIRE_CUDA_RUNNER()                                                               \
  do {                                                                                          \
    const RunResult probe = RunGlmRun(ModelArgs("bf16") + " --device=cuda --max_new_tokens=0"); \
    if (probe.exit_code != 0) {                                                                 \
      const char* require = std::getenv("GLMSERVE_REQUIRE_CUDA");                               \
      if (require != nullptr && std::string(require) == "1") {                                  \
        FAIL() << "GLMSERVE_REQUIRE_CUDA=1 but glm-run --device=cuda fails: " << probe.output;  \
      }                                                                                         \
      GTEST_SKIP() << "no CUDA runner in this glm-run: " << probe.output;                       \
    }                                                                                           \
  } while (0)

struct DeviceCase {
  const char* name;
  const char* fixture;
  const char* options;       // added to both runs
  const char* cuda_options;  // the CUDA run's own
  // The CUDA runner's bound against the CPU runner, the one its suites assert:
  //  * 3e-2: bf16 activations with fp32 accumulation (tests/core/engine/golden_test.cc), where
  //  every
  //    prompt row's argmax must also be the CPU's (the fixtures keep top-2 gaps well above it);
  //  * 0.2 with FP8 tensor cores: e4m3 activations, about 2.5e-2 per GEMM compounding over the
  //    layers (tests/core/cuda/fp8_gemm_cuda_test.cc: 0.139 measured on fp8_block_fp32);
  //  * 0.1 with the FP8 KV cache (tests/core/cuda/kv_fp8_cuda_test.cc): a value near an e4m3
  //    boundary takes the neighbouring code, and route near-ties amplify it. On the `bf16`
  //    fixture the prompt's logits alone land at 0.107 under emulation (its kv test measures
  //    0.082 over prompt and continuation together), so this case runs qknorm_bias_fp32 (0.020).
  // Under the two quantized forms a row's argmax may flip on a near-tie: not asserted.
  const char* bound;
  bool all_argmax;
};

// bf16 GLM-4.5, FP8 per-channel and block-scaled, GLM-5 (MLA + DSA), the FP8 KV cache, and
// the CUDA runner's FP8 tensor cores.
const DeviceCase kDeviceCases[] = {
    {"bf16", "bf16", "", "", "3e-2", true},
    {"fp8_channel", "fp8_channel_fp32", "", "", "3e-2", true},
    {"fp8_block", "fp8_block_fp32", "", "", "3e-2", true},
    {"fp8_block_tensor_cores", "fp8_block_fp32", "", "--fp8_tensor_cores=on", "0.2", false},
    {"glm5", "glm5_bf16", "", "", "3e-2", true},
    {"kv_fp8", "qknorm_bias_fp32", "--kv_cache_dtype=fp8_e4m3", "", "0.1", false},
};

// Test names and ctest entries show the case's name, not its bytes.
void PrintTo(const DeviceCase& c, std::ostream* os) { *os << c.name; }

class GlmRunDeviceTest : public ::testing::TestWithParam<DeviceCase> {};

// The CUDA runner's logits and hidden states within its bound of the CPU runner's, on the
// device it names.
TEST_P(GlmRunDeviceTest, CudaRunnerMatchesCpuRunnerThroughTheCommandLine) {
  GLM_REQUIRE_CUDA_RUNNER();
  const DeviceCase& c = GetParam();
  const std::string tmp = testing::MakeTempDir("glm_run_device_test");
  const std::string args = absl::StrCat(ModelArgs(c.fixture), " ", c.options);
  const RunResult cpu =
      RunGlmRun(absl::StrCat(args, " --device=cpu --logits_out=", tmp,
                             "/cpu_logits.npy --hidden_out=", tmp, "/cpu_hidden.npy"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_TRUE(Contains(cpu.output, "device    cpu\n")) << cpu.output;
  const RunResult cuda = RunGlmRun(absl::StrCat(
      args, " --device=cuda ", c.cuda_options, " --compare_logits=", tmp,
      "/cpu_logits.npy --compare_hidden=", tmp, "/cpu_hidden.npy --max_relative_error=", c.bound));
  ASSERT_EQ(cuda.exit_code, 0) << cuda.output;
  EXPECT_TRUE(Contains(cuda.output, "device    cuda:0 ")) << cuda.output;
  EXPECT_TRUE(Contains(cuda.output, "compare   logits vs ")) << cuda.output;
  EXPECT_TRUE(Contains(cuda.output, "compare   hidden vs ")) << cuda.output;
  EXPECT_FALSE(Contains(cuda.output, "EXCEEDED")) << cuda.output;
  // The run says which FP8 path it took: tensor cores when asked for, CUDA cores otherwise.
  if (Contains(c.cuda_options, "--fp8_tensor_cores=on")) {
    EXPECT_TRUE(Contains(cuda.output, "tensor cores on (")) << cuda.output;
    EXPECT_FALSE(Contains(cuda.output, "FP8 GEMMs on tensor cores 0,")) << cuda.output;
  } else if (Contains(c.fixture, "fp8")) {
    EXPECT_TRUE(Contains(cuda.output, "FP8 GEMMs on tensor cores 0,")) << cuda.output;
  }
  if (c.all_argmax) {
    const testing::GoldenExpected expected =
        testing::ReadGoldenExpected(testing::GoldenDir(c.fixture));
    const std::string rows =
        absl::StrCat("argmax ", expected.prompt.size(), "/", expected.prompt.size(), " rows");
    EXPECT_TRUE(Contains(cuda.output, rows)) << cuda.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Runners, GlmRunDeviceTest, ::testing::ValuesIn(kDeviceCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A comparison over its bound fails the run (exit 1, "EXCEEDED"), and one under it passes:
// the CPU's fp32-compute logits of the bf16 fixture against the reference's native bf16
// forward (they differ by ~1e-2; tests/core/engine/golden_test.cc).
TEST(GlmRunCompareTest, BoundIsEnforced) {
  const std::string dir = testing::GoldenDir("bf16");
  const RunResult tight = RunGlmRun(absl::StrCat(ModelArgs("bf16"), " --compare_logits=", dir,
                                                 "/logits_bf16.npy --max_relative_error=1e-6"));
  EXPECT_EQ(tight.exit_code, 1) << tight.output;
  EXPECT_TRUE(Contains(tight.output, "EXCEEDED")) << tight.output;
  EXPECT_TRUE(Contains(tight.output, "exceeded --max_relative_error")) << tight.output;
  const RunResult loose = RunGlmRun(absl::StrCat(ModelArgs("bf16"), " --compare_logits=", dir,
                                                 "/logits.npy --compare_hidden=", dir,
                                                 "/hidden_states.npy --max_relative_error=1e-5"));
  EXPECT_EQ(loose.exit_code, 0) << loose.output;
  EXPECT_TRUE(Contains(loose.output, "(bound 1e-05: ok)")) << loose.output;
  // A file of another shape is an error naming both shapes.
  const RunResult shape =
      RunGlmRun(absl::StrCat(ModelArgs("bf16"), " --compare_logits=", dir, "/hidden_states.npy"));
  EXPECT_EQ(shape.exit_code, 1) << shape.output;
  EXPECT_TRUE(Contains(shape.output, "has shape [")) << shape.output;
}

// Each runner's options are refused on the other runner, with what to do instead.
TEST(GlmRunDeviceFlagsTest, RunnerOptionsAreRefusedOnTheOtherRunner) {
  const RunResult math = RunGlmRun(ModelArgs("bf16") + " --device=cuda --cpu_math=bf16");
  EXPECT_EQ(math.exit_code, 1) << math.output;
  EXPECT_TRUE(Contains(math.output, "--cpu_math chooses the CPU runner's arithmetic"))
      << math.output;
  const RunResult tc = RunGlmRun(ModelArgs("bf16") + " --device=cpu --fp8_tensor_cores=on");
  EXPECT_EQ(tc.exit_code, 1) << tc.output;
  EXPECT_TRUE(Contains(tc.output, "--fp8_tensor_cores is the CUDA runner's option")) << tc.output;
  const RunResult bad = RunGlmRun(ModelArgs("bf16") + " --device=tpu");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(Contains(bad.output, "is not one of auto, cpu, cuda")) << bad.output;
}

// Without a CUDA runner, --device=cuda says why and --device=auto runs the CPU.
TEST(GlmRunDeviceFlagsTest, WithoutCudaRunnerCudaIsRefusedAndAutoRunsTheCpu) {
  const RunResult cuda = RunGlmRun(ModelArgs("bf16") + " --device=cuda --max_new_tokens=1");
  if (cuda.exit_code == 0) GTEST_SKIP() << "this glm-run has a CUDA runner";
  EXPECT_EQ(cuda.exit_code, 1) << cuda.output;
  EXPECT_TRUE(Contains(cuda.output, "--device=cuda: ")) << cuda.output;
  const RunResult automatic = RunGlmRun(ModelArgs("bf16") + " --device=auto --max_new_tokens=1");
  EXPECT_EQ(automatic.exit_code, 0) << automatic.output;
  EXPECT_TRUE(Contains(automatic.output, "device    cpu\n")) << automatic.output;
}

}  // namespace
}  // namespace glmserve
