// glm-server --plan (server/plan_command.h): in-process for presets and a checkpoint directory,
// and as the glm-server binary (exit codes and the printed plan).
#include "server/plan_command.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/model/checkpoint.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

// The plan without its first line (which names the model's source).
std::string Table(const std::string& plan) { return plan.substr(plan.find('\n') + 1); }

TEST(PlanCommandTest, PrintsTheTablesOfPresets) {
  PlanCommandOptions o;
  o.model = "glm-4.5-fp8";
  o.devices = "8x80GB";
  const absl::StatusOr<std::string> plan = PlanCommand(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const char* part : {"model: preset glm-4.5-fp8", "devices: 8 x 80.00 GB, tensor parallel 8",
                           "--gpu_memory_fraction=0.9: 72.00 GB per rank",
                           "FP8 per-channel, MTP layer included", "\n0-7 ", "KV tokens: "}) {
    EXPECT_NE(plan->find(part), std::string::npos) << part << "\n" << *plan;
  }
  // --tensor_parallel must be the device count; --expert_parallel=false splits expert widths.
  o.tensor_parallel = 4;
  EXPECT_EQ(PlanCommand(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tensor_parallel = 8;
  o.expert_parallel = false;
  const absl::StatusOr<std::string> split = PlanCommand(o);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_NE(split->find("every routed expert's width split"), std::string::npos) << *split;
}

TEST(PlanCommandTest, RefusesWithTheNumbersAndBadOptions) {
  PlanCommandOptions o;
  o.model = "glm-4.5";
  o.devices = "4x80GB";
  absl::StatusOr<std::string> plan = PlanCommand(o);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("preset glm-4.5"), std::string::npos) << plan.status();
  EXPECT_NE(plan.status().message().find("short by"), std::string::npos) << plan.status();
  for (const char* devices : {"", "8x", "8x80", "bogus"}) {
    o.devices = devices;
    EXPECT_EQ(PlanCommand(o).status().code(), absl::StatusCode::kInvalidArgument) << devices;
  }
  o.devices = "8x141GB";
  o.weight_dtype = "int8";
  EXPECT_EQ(PlanCommand(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.model = "glm-4.5-fp8";
  o.weight_dtype = "fp8_block";  // FP8 already
  EXPECT_EQ(PlanCommand(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.model = "glm-4.5";  // a bf16 model made FP8 at load fits 8 x 141 GB
  plan = PlanCommand(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->find("FP8 128x128 blocks (converted at load)"), std::string::npos) << *plan;
}

// A checkpoint directory (sharded, with the MTP layer) plans as the preset of its shapes: the
// config and the index are read, the MTP layer found in the index.
TEST(PlanCommandTest, PlansACheckpointFromItsConfigAndIndex) {
  RandomWeightOptions random;
  random.mtp = true;
  absl::StatusOr<ModelWeights> w = RandomWeights(*PresetConfig("tiny"), random);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string dir = testing::MakeTempDir("glmserve_plan");
  ASSERT_TRUE(SaveCheckpoint(*w, dir, {.max_shard_bytes = 100'000}).ok());
  PlanCommandOptions o;
  o.devices = "2x2GB";
  o.model = dir;
  const absl::StatusOr<std::string> from_dir = PlanCommand(o);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  o.model = "tiny";
  const absl::StatusOr<std::string> from_preset = PlanCommand(o);
  ASSERT_TRUE(from_preset.ok()) << from_preset.status();
  EXPECT_EQ(Table(*from_dir), Table(*from_preset));
  EXPECT_NE(from_dir->find("MTP layer included"), std::string::npos) << *from_dir;
}

TEST(PlanCommandTest, TheBinaryPrintsThePlanOrRefuses) {
  testing::CommandResult r = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --plan --model=glm-4.5-fp8 --devices=8x80GB"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("KV tokens: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("listening"), std::string::npos) << r.output;  // no server started
  r = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --plan --model=glm-5-fp8 --devices=4x80GB"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("does not fit 4 x 80.00 GB"), std::string::npos) << r.output;
  r = testing::RunCommand(absl::StrCat(GLM_SERVER_PATH, " --plan --model=tiny --devices=8xlots"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("expected COUNTxSIZE"), std::string::npos) << r.output;
  // The plan is a GPU one: the CPU's fp32 cache is refused by name, bf16 is the GPUs' own.
  r = testing::RunCommand(absl::StrCat(
      GLM_SERVER_PATH, " --plan --model=glm-4.5-fp8 --devices=8x80GB --kv_cache_dtype=fp32"));
  EXPECT_EQ(r.exit_code, 2) << r.output;  // a bad flag, as every flag error
  EXPECT_NE(r.output.find("--kv_cache_dtype=fp32 is the CPU backend's"), std::string::npos)
      << r.output;
  const testing::CommandResult bf16 = testing::RunCommand(absl::StrCat(
      GLM_SERVER_PATH, " --plan --model=glm-4.5-fp8 --devices=8x80GB --kv_cache_dtype=bf16"));
  EXPECT_EQ(bf16.exit_code, 0) << bf16.output;
  const testing::CommandResult automatic = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --plan --model=glm-4.5-fp8 --devices=8x80GB"));
  EXPECT_EQ(bf16.output, automatic.output);
}

}  // namespace
}  // namespace glmserve
