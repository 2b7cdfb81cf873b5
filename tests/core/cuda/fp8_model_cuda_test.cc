// The CUDA runner's FP8 weights (core/cuda/device_weights.h, docs/fp8.md): what reaches the
// device (codes at one byte per weight, scales, which projections stay bf16), the refusals
// (a group mixing FP8 and unquantized matrices, an FP8 lm_head), the block-scaled form's
// partial blocks through the whole model, and large MoE steps without a host round trip
// (fp8_moe_gemm_tc.cu). Forward results against the CPU are in
// model_cuda_test.cc (the fp8 case), runner_conformance_test.cc (cuda_fp8) and golden_test.cc
// (the fp8_* fixtures).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/cpu/cpu_model.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/model.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "tests/core/all_logits.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::AllLogits;
using ::glmserve::testing::RelativeError;

ModelWeights Random(const std::string& preset, DType dtype) {
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  RandomWeightOptions options;
  options.seed = 42;
  options.dtype = dtype;
  options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

std::vector<float> PromptLogits(CudaModel& m) { return AllLogits(m, {3, 17, 100, 42, 7}); }

TEST(Fp8ModelCudaTest, WeightsStayFp8OnTheDevice) {
  GLM_REQUIRE_CUDA_DEVICE();
  ModelWeights w = Random("tiny", DType::kF8E4M3);
  const ModelConfig c = w.config;
  const int64_t expected_bytes = [&] {
    const FfnWeights* e0 = nullptr;
    for (const LayerWeights& l : w.layers) {
      if (l.is_moe) e0 = &l.moe.experts[0];
    }
    return e0->gate.bytes() + e0->up.bytes() + e0->down.bytes();
  }();
  absl::StatusOr<std::unique_ptr<CudaModel>> fp8 = CudaModel::Create(std::move(w));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> bf16 = CudaModel::Create(Random("tiny", DType::kBF16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const DeviceWeights& d = (*fp8)->device_weights();
  for (const DeviceLayer& l : d.layers) {
    EXPECT_NE(l.q8.codes, nullptr);
    EXPECT_EQ(l.qkv, nullptr) << "q/k/v must not also be uploaded in bf16";
    EXPECT_NE(l.o8.codes, nullptr);
    EXPECT_EQ(l.q8.rows, c.q_dim());
    EXPECT_EQ(l.k8.rows, c.kv_dim());
    EXPECT_EQ(l.q8.block_rows, 1);  // the random FP8 model is per output channel
    EXPECT_EQ(l.q8.block_cols, c.hidden_size);
    if (l.is_moe) {
      EXPECT_NE(l.experts_gate8.codes, nullptr);
      EXPECT_EQ(l.experts_gate_up, nullptr);
      EXPECT_NE(l.router, nullptr) << "the router stays fp32";
      EXPECT_EQ(l.shared.present(), l.shared.fp8());
    } else {
      EXPECT_TRUE(l.dense.fp8());
    }
  }
  EXPECT_NE(d.lm_head, nullptr) << "the head stays bf16";
  EXPECT_EQ(d.routed_expert_bytes, expected_bytes) << "codes + fp32 scales of one expert";
  // Linear weights at 1 byte instead of 2: the image shrinks by well over a quarter.
  EXPECT_LT((*fp8)->weight_bytes(), (*bf16)->weight_bytes() * 3 / 4);
  EXPECT_LT(d.dense_step_bytes, (*bf16)->device_weights().dense_step_bytes);
}

TEST(Fp8ModelCudaTest, MixedGroupsAndAnFp8HeadAreRefused) {
  GLM_REQUIRE_CUDA_DEVICE();
  ModelWeights dense = Random("tiny", DType::kBF16);
  {
    ModelWeights w = Random("tiny", DType::kF8E4M3);
    w.layers[1].attn.k_proj = dense.layers[1].attn.k_proj;  // q and v FP8, k bf16
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find("layer 1 attention: 2 of 3"), std::string::npos)
        << m.status();
  }
  {
    ModelWeights w = Random("tiny", DType::kF8E4M3);
    for (LayerWeights& l : w.layers) {
      if (l.is_moe) l.moe.experts[2].down = dense.layers[l.layer_index].moe.experts[2].down;
    }
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("routed experts"), std::string::npos) << m.status();
  }
  {
    // An FP8 head of the right shape (checkpoints keep it bf16: the device reads it so).
    ModelWeights w = Random("tiny", DType::kF8E4M3);
    const int64_t vocab = w.config.vocab_size, hidden = w.config.hidden_size;
    const std::vector<uint8_t> codes(vocab * hidden, 0x38);
    const std::vector<float> scales(vocab, 0.5f);
    Matrix head{DType::kF8E4M3, vocab, hidden, codes.data()};
    head.format = WeightFormat::kFp8Scaled;
    head.scales = scales.data();
    head.scale_block_rows = 1;
    head.scale_block_cols = static_cast<int32_t>(hidden);
    w.lm_head = head;
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find("lm_head"), std::string::npos) << m.status();
  }
  // A whole group kept unquantized (as an ignore list does) is fine: o_proj in bf16.
  ModelWeights w = Random("tiny", DType::kF8E4M3);
  for (LayerWeights& l : w.layers) l.attn.o_proj = dense.layers[l.layer_index].attn.o_proj;
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->device_weights().layers[0].o8.codes, nullptr);
  EXPECT_NE((*m)->device_weights().layers[0].o, nullptr);
}

// The FP8 presets on the device: the codes generated there (no host copy) give the very image
// the host-generated preset uploads, byte for byte, hence the same logits bit for bit.
TEST(Fp8ModelCudaTest, DeviceGeneratedPresetEqualsTheHostPreset) {
  GLM_REQUIRE_CUDA_DEVICE();
  RandomWeightOptions on_device;
  on_device.fp8_codes_on_device = true;
  absl::StatusOr<ModelWeights> host = LoadModel("tiny-fp8:layers=2");
  absl::StatusOr<ModelWeights> device = LoadModel("tiny-fp8:layers=2", {}, on_device);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_TRUE(host->device_generated_fp8.empty());
  // Every FP8 matrix deferred, none with host codes; the host arena shrank accordingly.
  ASSERT_FALSE(device->device_generated_fp8.empty());
  for (const auto& g : device->device_generated_fp8) {
    EXPECT_EQ(g.matrix->data, nullptr);
    EXPECT_EQ(g.matrix->format, WeightFormat::kFp8Scaled);
  }
  EXPECT_EQ(device->layers[1].attn.q_proj.data, nullptr);
  {
    // Only the CUDA runner can hold such weights.
    absl::StatusOr<ModelWeights> again = LoadModel("tiny-fp8:layers=2", {}, on_device);
    ASSERT_TRUE(again.ok());
    absl::StatusOr<std::unique_ptr<ModelRunner>> cpu =
        CreateModelRunner(*std::move(again), DeviceKind::kCpu);
    ASSERT_FALSE(cpu.ok());
    EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  absl::StatusOr<std::unique_ptr<CudaModel>> a = CudaModel::Create(*std::move(host));
  absl::StatusOr<std::unique_ptr<CudaModel>> b = CudaModel::Create(*std::move(device));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const DeviceWeights& wa = (*a)->device_weights();
  const DeviceWeights& wb = (*b)->device_weights();
  ASSERT_EQ(wa.bytes, wb.bytes);
  EXPECT_EQ(wa.dense_step_bytes, wb.dense_step_bytes);
  std::vector<char> image_a(wa.bytes), image_b(wb.bytes);
  ASSERT_TRUE(CopyToHost(image_a.data(), wa.memory.get(), wa.bytes).ok());
  ASSERT_TRUE(CopyToHost(image_b.data(), wb.memory.get(), wb.bytes).ok());
  // Alignment gaps are never written (NaN-filled under emulation): compare the tensors.
  const auto same = [&](const void* pa, const void* pb, int64_t n) {
    const int64_t oa = static_cast<const char*>(pa) - static_cast<const char*>(wa.memory.get());
    const int64_t ob = static_cast<const char*>(pb) - static_cast<const char*>(wb.memory.get());
    return oa == ob && std::memcmp(image_a.data() + oa, image_b.data() + ob, n) == 0;
  };
  for (size_t i = 0; i < wa.layers.size(); ++i) {
    const DeviceLayer &la = wa.layers[i], &lb = wb.layers[i];
    EXPECT_TRUE(same(la.q8.codes, lb.q8.codes, la.q8.rows * la.q8.cols)) << "layer " << i;
    EXPECT_TRUE(same(la.o8.codes, lb.o8.codes, la.o8.rows * la.o8.cols)) << "layer " << i;
    EXPECT_TRUE(same(la.q8.scales, lb.q8.scales, la.q8.rows * 4)) << "layer " << i;
    if (la.is_moe) {
      const int64_t n =
          la.experts_down8.rows * la.experts_down8.cols * (*a)->config().n_routed_experts;
      EXPECT_TRUE(same(la.experts_down8.codes, lb.experts_down8.codes, n)) << "layer " << i;
    } else {
      EXPECT_TRUE(
          same(la.dense.up8.codes, lb.dense.up8.codes, la.dense.up8.rows * la.dense.up8.cols));
    }
  }
  // And so the same logits, bit for bit.
  EXPECT_EQ(PromptLogits(**a), PromptLogits(**b));
}

// Prefill steps beyond device_moe_max_pairs with FP8 experts, per output channel (tiny) and in
// 128x128 blocks (tiny-glm5, blocks cut short), FP8 tensor cores off (the default): every MoE
// layer runs the grouped tensor-core GEMM over the device-side offsets and none reads its
// counts back to the host. The logits agree with the device-offset GEMV path (the same
// arithmetic up to the fp32 summation order: model_cuda_test's GPU-against-GPU 1e-2) and with
// the CPU's FP8 path (its whole-model 3e-2). With FP8 tensor cores on, its quantized-activation
// form, likewise without a host round trip, against the quantizing GEMV path (1e-2; measured 0)
// and the CPU (0.3, the e4m3 activations' tolerance; measured 5e-2 at most).
TEST(Fp8ModelCudaTest, LargeMoeStepsRunWithoutAHostRoundTrip) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const std::string preset : {"tiny", "tiny-glm5"}) {
    // 7 tokens: within tiny-glm5's index_topk (8), so its attention is dense on both sides.
    const std::vector<int32_t> ids = {3, 17, 100, 42, 7, 250, 64};
    CpuModel cpu(Random(preset, DType::kF8E4M3));
    const std::vector<float> want = AllLogits(cpu, ids);
    CudaModelOptions large;
    large.device_moe_max_pairs = 4;  // 7 tokens x top-2: 14 pairs
    absl::StatusOr<std::unique_ptr<CudaModel>> grouped =
        CudaModel::Create(Random(preset, DType::kF8E4M3), large);
    absl::StatusOr<std::unique_ptr<CudaModel>> gemv =
        CudaModel::Create(Random(preset, DType::kF8E4M3));
    ASSERT_TRUE(grouped.ok()) << grouped.status();
    ASSERT_TRUE(gemv.ok()) << gemv.status();
    for (const DeviceLayer& l : (*grouped)->device_weights().layers) {
      if (!l.is_moe) continue;
      ASSERT_NE(l.experts_gate8.codes, nullptr) << preset;
      EXPECT_EQ(l.experts_gate8.block_rows, preset == "tiny" ? 1 : 128) << preset;
    }
    const std::vector<float> got = AllLogits(**grouped, ids);
    EXPECT_EQ((*grouped)->moe_host_round_trips(), 0) << preset;
    const double vs_gemv = RelativeError(got, AllLogits(**gemv, ids));
    const double vs_cpu = RelativeError(got, want);
    std::printf("%s FP8, grouped MoE GEMM: against the GEMV path %.2e, against the CPU %.2e\n",
                preset.c_str(), vs_gemv, vs_cpu);
    EXPECT_LT(vs_gemv, 1e-2) << preset;
    EXPECT_LT(vs_cpu, 3e-2) << preset;
    // FP8 tensor cores on, where the device has them (the emulated one does): the grouped
    // GEMM's quantized-activation form, still without a host round trip, against the
    // small-step path's quantizing GEMV (the same arithmetic: 1e-2 as above) and the CPU,
    // whose activations stay fp32 (model_cuda_test's kFp8ActivationTolerance, 0.3).
    (*grouped)->set_fp8_tensor_cores(true);
    (*gemv)->set_fp8_tensor_cores(true);
    if ((*grouped)->fp8_tensor_core_status().rfind("unavailable", 0) != 0) {
      const std::vector<float> got_q = AllLogits(**grouped, ids);
      EXPECT_EQ((*grouped)->moe_host_round_trips(), 0) << preset;
      const double q_vs_gemv = RelativeError(got_q, AllLogits(**gemv, ids));
      const double q_vs_cpu = RelativeError(got_q, want);
      std::printf(
          "%s FP8, tensor cores on, grouped MoE GEMM: against the GEMV path %.2e, "
          "against the CPU %.2e\n",
          preset.c_str(), q_vs_gemv, q_vs_cpu);
      EXPECT_LT(q_vs_gemv, 1e-2) << preset;
      EXPECT_GT(q_vs_cpu, 0) << preset << ": the activations are quantized";
      EXPECT_LT(q_vs_cpu, 0.3) << preset;
    }
  }
}

// A model whose weights exceed the device's free memory is refused before any allocation,
// with the numbers (GLM-4.5-FP8 on one GPU; here 37 of its layers against the emulated
// device's or the real GPU's memory; the codes are never generated on the host).
TEST(Fp8ModelCudaTest, WeightsBeyondTheDeviceAreRefusedWithTheNumbers) {
  GLM_REQUIRE_CUDA_DEVICE();
  RandomWeightOptions on_device;
  on_device.fp8_codes_on_device = true;
  absl::StatusOr<ModelWeights> w = LoadModel("glm-4.5-fp8", LayerSpan{3, 40}, on_device);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(*std::move(w));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
  EXPECT_NE(m.status().message().find("GB of device memory, but only"), std::string::npos)
      << m.status();
}

// A checkpoint on disk (mmap'd safetensors shards) streamed to the device through the pinned
// double buffer, with its progress reports, gives the same device weights as the plain path
// (the same weights uploaded from memory): FP8 and bf16.
TEST(Fp8ModelCudaTest, StreamedCheckpointEqualsThePlainPathWithProgress) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const std::string preset : {"tiny-fp8:layers=2", "tiny:layers=2"}) {
    absl::StatusOr<ModelWeights> plain = LoadModel(preset);
    ASSERT_TRUE(plain.ok()) << plain.status();
    const std::string dir = glmserve::testing::MakeTempDir("fp8_stream_");
    ASSERT_TRUE(SaveCheckpoint(*plain, dir).ok());
    absl::StatusOr<ModelWeights> mapped = LoadCheckpoint(dir);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    std::vector<LoadProgress> reports;
    CudaModelOptions options;
    options.upload_progress = [&](const LoadProgress& p) { reports.push_back(p); };
    absl::StatusOr<std::unique_ptr<CudaModel>> streamed =
        CudaModel::Create(*std::move(mapped), options);
    absl::StatusOr<std::unique_ptr<CudaModel>> direct = CudaModel::Create(*std::move(plain));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ((*streamed)->weight_bytes(), (*direct)->weight_bytes()) << preset;
    EXPECT_EQ(PromptLogits(**streamed), PromptLogits(**direct)) << preset;
    // Progress: from 0, never backwards, to every byte.
    ASSERT_GE(reports.size(), 2u);
    EXPECT_EQ(reports.front().bytes_done, 0);
    EXPECT_GT(reports.back().bytes_total, 0);
    EXPECT_EQ(reports.back().bytes_done, reports.back().bytes_total);
    EXPECT_EQ(reports.back().tensors_done, reports.back().tensors_total);
    for (size_t i = 1; i < reports.size(); ++i) {
      EXPECT_GE(reports[i].bytes_done, reports[i - 1].bytes_done);
      EXPECT_GE(reports[i].seconds, reports[i - 1].seconds);
    }
    // The line the server prints: "<done> of <total> MB (100.0%), <rate> MB/s" at the end.
    const std::string line = DescribeLoadProgress(reports.back());
    EXPECT_NE(line.find("(100.0%)"), std::string::npos) << line;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace glmserve::cuda
