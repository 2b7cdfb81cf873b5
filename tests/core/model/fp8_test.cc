// FP8 checkpoints (core/model/fp8.h, docs/fp8.md): e4m3 / ue8m0 decoding, the quantization_config
// parser, the loader's validation of scales against weights (hostile checkpoints built by
// editing the golden FP8 fixtures), the kernels' partial-block widening and batch invariance,
// the FP8 presets, and the CUDA backend's refusal.
#include "core/model/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "core/cpu/ops/linear.h"
#include "core/cuda/runner.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/safetensors.h"
#include "core/model/safetensors_writer.h"
#include "core/model/weight_check.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;

// The e4m3fn definition, written independently of E4m3ToFloat: (-1)^s 2^(e-7) (1 + m/8), or
// 2^-6 (m/8) for e = 0; S.1111.111 is NaN.
double E4m3Reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

TEST(Fp8Test, E4m3DecodesEveryCodeIncludingSubnormals) {
  for (int code = 0; code < 256; ++code) {
    const double want = E4m3Reference(code);
    const float got = E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << code;
    }
  }
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal, not zero
  EXPECT_EQ(E4m3ToFloat(0x87), -7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xff)));
}

TEST(Fp8Test, FloatToE4m3RoundsToNearestEvenAndSaturates) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
  // Midpoints between neighbours go to the even code.
  for (int code = 0; code < 0x7e; ++code) {
    const float mid =
        (E4m3ToFloat(static_cast<uint8_t>(code)) + E4m3ToFloat(static_cast<uint8_t>(code + 1))) / 2;
    EXPECT_EQ(FloatToE4m3(mid), (code & 1) ? code + 1 : code) << code;
  }
  // Random values: the nearest code by brute force.
  const std::vector<float> v = testing::RandomVector(20000, 14, 40.0f);
  for (float x : v) {
    int best = 0;
    for (int code = 0; code < 0x7f; ++code) {
      if (std::fabs(E4m3ToFloat(static_cast<uint8_t>(code)) - std::fabs(x)) <
          std::fabs(E4m3ToFloat(static_cast<uint8_t>(best)) - std::fabs(x))) {
        best = code;
      }
    }
    const uint8_t got = FloatToE4m3(x);
    EXPECT_EQ(E4m3ToFloat(got & 0x7f), E4m3ToFloat(static_cast<uint8_t>(best))) << x;
    EXPECT_EQ((got & 0x80) != 0, x < 0) << x;
  }
  EXPECT_EQ(FloatToE4m3(1e6f), 0x7e);
  EXPECT_EQ(FloatToE4m3(-1e6f), 0xfe);
  EXPECT_EQ(FloatToE4m3(std::nanf("")), 0x7f);
}

TEST(Fp8Test, E8m0IsAPowerOfTwo) {
  EXPECT_EQ(E8m0ToFloat(127), 1.0f);
  EXPECT_EQ(E8m0ToFloat(120), std::ldexp(1.0f, -7));
  EXPECT_EQ(E8m0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(E8m0ToFloat(0xff)));
}

// --- quantization_config ---

Json BlockConfig() {
  return Json::parse(R"({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
      "activation_scheme": "dynamic", "weight_block_size": [128, 128],
      "modules_to_not_convert": ["lm_head", "mlp.gate"]}})");
}

Json ChannelConfig() {
  return Json::parse(R"({"quantization_config": {"quant_method": "compressed-tensors",
      "format": "float-quantized", "quantization_status": "compressed", "kv_cache_scheme": null,
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel",
                    "dynamic": false},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                              "dynamic": true},
        "output_activations": null}},
      "ignore": ["lm_head", "re:.*mlp\\.gate$"]}})");
}

absl::StatusOr<Fp8Scheme> Parse(const Json& j) { return ParseFp8Scheme(j.dump()); }

TEST(Fp8SchemeTest, ReadsBothForms) {
  absl::StatusOr<Fp8Scheme> none = ParseFp8Scheme(R"({"hidden_size": 4})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->quantized());

  absl::StatusOr<Fp8Scheme> block = Parse(BlockConfig());
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->kind, Fp8Scheme::Kind::kBlockFp8);
  EXPECT_EQ(block->block_rows, 128);
  EXPECT_EQ(block->block_cols, 128);
  EXPECT_STREQ(block->scale_suffix(), "weight_scale_inv");
  EXPECT_TRUE(block->KeepsUnquantized("lm_head"));
  EXPECT_TRUE(block->KeepsUnquantized("model.layers.3.mlp.gate"));
  EXPECT_FALSE(block->KeepsUnquantized("model.layers.3.mlp.gate_proj"));
  EXPECT_FALSE(block->KeepsUnquantized("model.layers.3.mlp.experts.0.gate_proj"));

  absl::StatusOr<Fp8Scheme> channel = Parse(ChannelConfig());
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ(channel->kind, Fp8Scheme::Kind::kCompressedTensors);
  EXPECT_TRUE(channel->per_channel());
  EXPECT_STREQ(channel->scale_suffix(), "weight_scale");
  EXPECT_TRUE(channel->KeepsUnquantized("model.layers.1.mlp.gate"));
  EXPECT_FALSE(channel->KeepsUnquantized("model.layers.1.mlp.gate_proj"));

  Json ct_block = ChannelConfig();
  Json& w = ct_block["quantization_config"]["config_groups"]["group_0"]["weights"];
  w["strategy"] = "block";
  w["block_structure"] = {128, 64};
  absl::StatusOr<Fp8Scheme> b2 = Parse(ct_block);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->block_cols, 64);
}

TEST(Fp8SchemeTest, RefusesOtherMethodsByName) {
  struct Case {
    std::function<void(Json&)> edit;
    absl::StatusCode code;
    const char* needle;
  };
  const auto q = [](Json& j) -> Json& { return j["quantization_config"]; };
  const auto g = [](Json& j) -> Json& {
    return j["quantization_config"]["config_groups"]["group_0"];
  };
  const std::vector<std::pair<bool, Case>> cases = {
      {true,
       {[&](Json& j) { q(j)["quant_method"] = "gptq"; }, absl::StatusCode::kUnimplemented,
        "'gptq'"}},
      {true, {[&](Json& j) { q(j)["fmt"] = "e5m2"; }, absl::StatusCode::kUnimplemented, "e5m2"}},
      {true,
       {[&](Json& j) { q(j)["activation_scheme"] = "static"; }, absl::StatusCode::kUnimplemented,
        "static"}},
      {true,
       {[&](Json& j) { q(j).erase("weight_block_size"); }, absl::StatusCode::kUnimplemented,
        "weight_block_size"}},
      {true,
       {[&](Json& j) {
          q(j)["weight_block_size"] = {0, 128};
        },
        absl::StatusCode::kInvalidArgument, "weight_block_size"}},
      {true,
       {[&](Json& j) { q(j)["weight_block_size"] = "128"; }, absl::StatusCode::kInvalidArgument,
        "weight_block_size"}},
      {true,
       {[&](Json& j) { q(j)["scale_fmt"] = "fp16"; }, absl::StatusCode::kUnimplemented,
        "scale_fmt"}},
      {true,
       {[&](Json& j) { q(j)["modules_to_not_convert"] = {1}; }, absl::StatusCode::kInvalidArgument,
        "modules_to_not_convert"}},
      {false,
       {[&](Json& j) { q(j)["format"] = "pack-quantized"; }, absl::StatusCode::kUnimplemented,
        "pack-quantized"}},
      {false,
       {[&](Json& j) { g(j)["weights"]["strategy"] = "tensor"; }, absl::StatusCode::kUnimplemented,
        "strategy"}},
      {false,
       {[&](Json& j) { g(j)["weights"]["num_bits"] = 4; }, absl::StatusCode::kUnimplemented,
        "num_bits"}},
      {false,
       {[&](Json& j) { g(j)["input_activations"]["dynamic"] = false; },
        absl::StatusCode::kUnimplemented, "dynamic"}},
      {false,
       {[&](Json& j) { g(j)["targets"] = {"re:.*down_proj"}; }, absl::StatusCode::kUnimplemented,
        "targets"}},
      {false,
       {[&](Json& j) { q(j)["ignore"] = {"re:(unclosed"}; }, absl::StatusCode::kInvalidArgument,
        "regular expression"}},
      {false,
       {[&](Json& j) { q(j)["quantization_status"] = "frozen"; }, absl::StatusCode::kUnimplemented,
        "frozen"}},
      {false,
       {[&](Json& j) {
          q(j)["kv_cache_scheme"] = Json::object({{"num_bits", 8}});
        },
        absl::StatusCode::kUnimplemented, "kv_cache_scheme"}},
  };
  for (const auto& [block, c] : cases) {
    Json j = block ? BlockConfig() : ChannelConfig();
    c.edit(j);
    absl::StatusOr<Fp8Scheme> s = Parse(j);
    ASSERT_FALSE(s.ok()) << j.dump();
    EXPECT_EQ(s.status().code(), c.code) << s.status();
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos) << s.status();
  }
}

// A safetensors image: 8-byte length, the header, `data_bytes` zero bytes.
std::string Image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(Fp8SafetensorsTest, HostileFp8HeadersAreRefused) {
  // One byte per F8 element: 4x4 needs 16 bytes, not 15 or 32.
  for (const char* offsets : {"[0, 15]", "[0, 32]"}) {
    const std::string img =
        Image(std::string(R"({"w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": )") +
                  offsets + "}}",
              32);
    absl::StatusOr<std::vector<TensorInfo>> t = ParseSafetensors(img.data(), img.size(), "x");
    EXPECT_FALSE(t.ok()) << offsets;
  }
  const std::string ok = Image(
      R"({"w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]},
          "s": {"dtype": "F8_E8M0", "shape": [1, 1], "data_offsets": [16, 17]}})",
      17);
  absl::StatusOr<std::vector<TensorInfo>> t = ParseSafetensors(ok.data(), ok.size(), "x");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0].dtype, DType::kF8E4M3);
  EXPECT_EQ((*t)[0].num_elements(), 16);
  EXPECT_EQ((*t)[1].dtype, DType::kF8E8M0);
  // Other 8-bit float formats are named and refused.
  const std::string e5m2 =
      Image(R"({"w": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}})", 2);
  t = ParseSafetensors(e5m2.data(), e5m2.size(), "x");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("F8_E5M2"), std::string::npos) << t.status();
}

// --- hostile checkpoints: the golden fixtures, edited ---

class Fp8CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("fp8_test_"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Copies fixture `name` into dir_, letting `edit` change its tensors (copied into owned
  // buffers) and config.json.
  struct Owned {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<char> bytes;
  };
  void Copy(const std::string& name, const std::function<void(std::vector<Owned>&)>& edit,
            const std::function<void(Json&)>& edit_config = nullptr) {
    const std::string src = testing::GoldenDir(name);
    absl::StatusOr<TensorStore> store = TensorStore::Open(src);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<Owned> tensors;
    for (const std::string& n : store->Names()) {
      const TensorInfo* t = store->Find(n);
      const char* p = static_cast<const char*>(t->data);
      tensors.push_back({n, t->dtype, t->shape, std::vector<char>(p, p + t->bytes)});
    }
    if (edit) edit(tensors);
    std::vector<TensorToWrite> out;
    for (const Owned& t : tensors) {
      out.push_back({t.name, t.dtype, t.shape, {{t.bytes.data(), int64_t(t.bytes.size())}}});
    }
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", out).ok());
    std::ifstream in(src + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    Json config = Json::parse(text.str());
    if (edit_config) edit_config(config);
    std::ofstream(dir_ + "/config.json") << config.dump(2);
  }
  static Owned* Find(std::vector<Owned>& ts, const std::string& name) {
    for (Owned& t : ts) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  void ExpectError(absl::StatusCode code, const std::string& needle) {
    absl::StatusOr<ModelWeights> w = LoadCheckpoint(dir_);
    ASSERT_FALSE(w.ok()) << "loaded a hostile checkpoint; expected: " << needle;
    EXPECT_EQ(w.status().code(), code) << w.status();
    EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status();
  }
  std::string dir_;
};

constexpr char kQ[] = "model.layers.0.self_attn.q_proj.weight";
constexpr char kQScaleInv[] = "model.layers.0.self_attn.q_proj.weight_scale_inv";
constexpr char kQScale[] = "model.layers.0.self_attn.q_proj.weight_scale";

TEST_F(Fp8CheckpointTest, FixturesLoadAsFp8WithCutShortBlocks) {
  Copy("fp8_block_fp32", nullptr);
  absl::StatusOr<ModelWeights> w = LoadCheckpoint(dir_);
  ASSERT_TRUE(w.ok()) << w.status();
  const Matrix& q = w->layers[0].attn.q_proj;  // [160, 160]: blocks of 128 and 32
  EXPECT_EQ(q.format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(q.dtype, DType::kF8E4M3);
  EXPECT_EQ(q.scale_rows(), 2);
  EXPECT_EQ(q.scale_cols(), 2);
  EXPECT_EQ(q.bytes(), 160 * 160 + 4 * 4);  // one byte per weight plus the scales
  EXPECT_EQ(w->layers[1].moe.router.dtype, DType::kF32);
  EXPECT_EQ(w->lm_head.format, WeightFormat::kDense);
  // Element (r, c) is e4m3 x scale[r / 128][c / 128]: check the corner of the last block.
  std::vector<float> panel(160 * 160);
  internal::WidenPanel(q, 0, 160, 0, 160, panel.data());
  const auto* codes = static_cast<const uint8_t*>(q.data);
  for (int64_t r : {0, 127, 128, 159}) {
    for (int64_t c : {0, 127, 128, 159}) {
      EXPECT_EQ(panel[r * 160 + c],
                E4m3ToFloat(codes[r * 160 + c]) * q.scales[(r / 128) * 2 + c / 128]);
    }
  }
  Copy("fp8_channel_fp32", nullptr);
  w = LoadCheckpoint(dir_);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers[0].attn.q_proj.scale_rows(), 160);
  EXPECT_EQ(w->layers[0].attn.q_proj.scale_cols(), 1);
}

TEST_F(Fp8CheckpointTest, ScaleShapeDtypeAndValuesAreValidated) {
  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) { Find(ts, kQScaleInv)->shape = {4, 1}; });
  ExpectError(absl::StatusCode::kInvalidArgument, "expected [2, 2]");

  // An even split of 160 into blocks of 80 would need [2, 2] as well: the values decide, and
  // the goldens check them; a scale grid for 64-wide blocks is refused.
  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) {
    Owned* s = Find(ts, kQScaleInv);
    s->shape = {3, 3};
    s->bytes.resize(9 * 4, 0);
  });
  ExpectError(absl::StatusCode::kInvalidArgument, "weight_scale_inv' has shape [3, 3]");

  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) {
    ts.erase(
        std::find_if(ts.begin(), ts.end(), [](const Owned& t) { return t.name == kQScaleInv; }));
  });
  ExpectError(absl::StatusCode::kNotFound, kQScaleInv);

  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) {
    Owned* s = Find(ts, kQScaleInv);
    s->dtype = DType::kF8E4M3;
    s->bytes.resize(4);
  });
  ExpectError(absl::StatusCode::kInvalidArgument, "expected F32, BF16 or F16 or F8_E8M0");

  for (float bad : {-1.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    Copy("fp8_block_fp32", [bad](std::vector<Owned>& ts) {
      std::memcpy(Find(ts, kQScaleInv)->bytes.data() + 4, &bad, 4);
    });
    ExpectError(absl::StatusCode::kInvalidArgument, "element 1");
  }

  // scale_fmt ue8m0 requires powers of two.
  Copy("fp8_block_fp32", nullptr, [](Json& c) { c["quantization_config"]["scale_fmt"] = "ue8m0"; });
  ExpectError(absl::StatusCode::kInvalidArgument, "not a power of two");

  // Per-channel scales: [out, 1].
  Copy("fp8_channel_fp32", [](std::vector<Owned>& ts) { Find(ts, kQScale)->shape = {1, 160}; });
  ExpectError(absl::StatusCode::kInvalidArgument, "expected [160, 1]");
}

TEST_F(Fp8CheckpointTest, Ue8m0ScalesStoredAsF8E8M0Load) {
  // Every scale rounded to a power of two and stored as one F8_E8M0 byte.
  std::vector<std::vector<float>> expected;
  Copy(
      "fp8_block_fp32",
      [&](std::vector<Owned>& ts) {
        for (Owned& t : ts) {
          if (t.name.find("weight_scale_inv") == std::string::npos) continue;
          const size_t n = t.bytes.size() / 4;
          std::vector<char> codes(n);
          std::vector<float> values(n);
          for (size_t i = 0; i < n; ++i) {
            float v;
            std::memcpy(&v, t.bytes.data() + 4 * i, 4);
            int e = 0;
            std::frexp(v, &e);
            codes[i] = static_cast<char>(e - 1 + 127);
            values[i] = std::ldexp(1.0f, e - 1);
          }
          if (t.name == kQScaleInv) expected.push_back(values);
          t.dtype = DType::kF8E8M0;
          t.bytes = codes;
        }
      },
      [](Json& c) { c["quantization_config"]["scale_fmt"] = "ue8m0"; });
  absl::StatusOr<ModelWeights> w = LoadCheckpoint(dir_);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(expected.size(), 1u);
  const Matrix& q = w->layers[0].attn.q_proj;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q.scales[i], expected[0][i]);
  // An E8M0 scale is refused in the compressed-tensors form, which has none.
}

TEST_F(Fp8CheckpointTest, Fp8WhereTheConfigSaysOtherwiseIsRefused) {
  Copy("fp8_block_fp32", nullptr, [](Json& c) { c.erase("quantization_config"); });
  ExpectError(absl::StatusCode::kInvalidArgument, "has no quantization_config");

  Copy("fp8_block_fp32", nullptr, [](Json& c) {
    c["quantization_config"]["modules_to_not_convert"].push_back("model.layers.0.self_attn.q_proj");
  });
  ExpectError(absl::StatusCode::kInvalidArgument, "as kept unquantized");

  // The router stored as FP8 (with a scale): refused by name.
  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) {
    Owned* r = Find(ts, "model.layers.1.mlp.gate.weight");
    r->dtype = DType::kF8E4M3;
    r->bytes.resize(r->bytes.size() / 4, 0x38);
  });
  ExpectError(absl::StatusCode::kInvalidArgument, "router must stay unquantized");

  // A norm gain stored as FP8.
  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) {
    Owned* r = Find(ts, "model.norm.weight");
    r->dtype = DType::kF8E4M3;
    r->bytes.resize(r->bytes.size() / 4, 0x38);
  });
  ExpectError(absl::StatusCode::kInvalidArgument, "only linear layers' weights may be FP8");

  // A scale for a module that is not FP8: an unexpected tensor.
  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) {
    ts.push_back({"lm_head.weight_scale_inv", DType::kF32, {2, 2}, std::vector<char>(16, 0)});
  });
  ExpectError(absl::StatusCode::kInvalidArgument, "unexpected tensor 'lm_head.weight_scale_inv'");

  Copy("fp8_block_fp32", nullptr,
       [](Json& c) { c["quantization_config"]["quant_method"] = "awq"; });
  ExpectError(absl::StatusCode::kUnimplemented, "'awq'");
}

TEST_F(Fp8CheckpointTest, NanCodesAreFoundByTheWeightCheck) {
  Copy("fp8_block_fp32", [](std::vector<Owned>& ts) { Find(ts, kQ)->bytes[100] = 0x7f; });
  absl::StatusOr<ModelWeights> w = LoadModel(dir_);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("q_proj"), std::string::npos) << w.status();
}

// --- kernels ---

// A [rows, cols] FP8 matrix with random codes (no NaN) and random block scales.
struct Fp8Matrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Matrix m;
  Fp8Matrix(int64_t rows, int64_t cols, int32_t br, int32_t bc, uint32_t seed) {
    const std::vector<float> v = testing::RandomVector(rows * cols, seed, 100.0f);
    for (float x : v) codes.push_back(FloatToE4m3(x));
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    for (float x : testing::RandomVector(sr * sc, seed + 1, 1.0f)) {
      scales.push_back(std::fabs(x) / 448);
    }
    m = Matrix{DType::kF8E4M3, rows, cols, codes.data()};
    m.format = WeightFormat::kFp8Scaled;
    m.scales = scales.data();
    m.scale_block_rows = br;
    m.scale_block_cols = bc;
  }
  float At(int64_t r, int64_t c) const {
    return E4m3ToFloat(codes[r * m.cols + c]) *
           scales[(r / m.scale_block_rows) * m.scale_cols() + c / m.scale_block_cols];
  }
};

TEST(Fp8KernelTest, MatchesTheDequantizedMatrixAndIsBatchInvariant) {
  for (auto [rows, cols, br, bc] : std::vector<std::tuple<int64_t, int64_t, int32_t, int32_t>>{
           {200, 300, 128, 128}, {37, 1100, 128, 128}, {65, 129, 1, 129}, {1, 700, 128, 128}}) {
    Fp8Matrix f(rows, cols, br, bc, static_cast<uint32_t>(rows * 7 + cols));
    // The same matrix dequantized to fp32 (weight x scale, one rounding): Linear must give
    // its exact-mode bits.
    std::vector<float> deq(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) deq[r * cols + c] = f.At(r, c);
    const Matrix dense{DType::kF32, rows, cols, deq.data()};
    // 9 rows: weights widened in registers (the AVX-512 kernel's direct path); 130: through
    // the widened panel (above kDirectMaxRowsFp8). Either must give the dense bits, and every row
    // alone the same.
    for (const int64_t m : {int64_t{9}, int64_t{130}}) {
      const std::vector<float> x = testing::RandomVector(m * cols, 3, 1.0f);
      for (CpuMath math : {CpuMath::kExact, CpuMath::kBf16}) {
        std::vector<float> y(m * rows), want(m * rows), one(rows);
        Linear(x.data(), m, f.m, nullptr, y.data(), math);
        Linear(x.data(), m, dense, nullptr, want.data(), CpuMath::kExact);
        EXPECT_EQ(y, want) << rows << "x" << cols << " " << CpuMathName(math);
        for (int64_t i = 0; i < m; ++i) {
          Linear(x.data() + i * cols, 1, f.m, nullptr, one.data(), math);
          EXPECT_TRUE(std::equal(one.begin(), one.end(), y.begin() + i * rows))
              << "row " << i << " alone differs from the batch";
        }
      }
    }
    // Row slices starting inside a block keep their scales.
    if (rows > 150) {
      const Matrix slice = f.m.RowSlice(130, 50);
      std::vector<float> panel(50 * cols), full(rows * cols);
      internal::WidenPanel(slice, 0, 50, 0, cols, panel.data());
      internal::WidenPanel(f.m, 0, rows, 0, cols, full.data());
      EXPECT_TRUE(std::equal(panel.begin(), panel.end(), full.begin() + 130 * cols));
    }
  }
}

TEST(Fp8KernelTest, Avx512WideningGivesThePortableValuesForEveryCode) {
  if (!internal::CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU: the portable kernel runs";
  // Every code (NaN included) in every position, two rows, two scale blocks of 128. The
  // AVX-512 kernel on the FP8 matrix against the same kernel on the matrix widened by the
  // portable table (WidenPanel): only the widening differs.
  for (bool with_nan : {true, false}) {
    Fp8Matrix f(2, 300, 128, 128, 5);
    for (int64_t i = 0; i < 600; ++i) {
      const uint8_t c = static_cast<uint8_t>(i * 7);
      f.codes[i] = with_nan || (c & 0x7f) != 0x7f ? c : 0x7e;
    }
    std::vector<float> deq(600);
    internal::WidenPanel(f.m, 0, 2, 0, 300, deq.data());
    const Matrix dense{DType::kF32, 2, 300, deq.data()};
    const std::vector<float> x = testing::RandomVector(3 * 300, 9, 1.0f);
    std::vector<float> fast(6), want(6);
    Linear(x.data(), 3, f.m, nullptr, fast.data());
    Linear(x.data(), 3, dense, nullptr, want.data());
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(std::isnan(fast[i]), std::isnan(want[i])) << i;  // NaN codes decode to NaN
      if (!std::isnan(want[i])) {
        EXPECT_EQ(fast[i], want[i]) << i;
      }
      if (!with_nan) {
        EXPECT_TRUE(std::isfinite(fast[i])) << i;
      }
    }
  }
}

// --- presets and devices ---

TEST(Fp8PresetTest, WeightsAreE4m3WithBf16EmbeddingRouterAndHead) {
  absl::StatusOr<ModelWeights> fp8 = LoadModel("tiny-fp8");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  absl::StatusOr<ModelWeights> bf16 = LoadModel("tiny");
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(fp8->linear_format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(fp8->weight_dtype, DType::kF8E4M3);
  const LayerWeights& moe = fp8->layers.back();
  EXPECT_EQ(moe.attn.q_proj.dtype, DType::kF8E4M3);
  EXPECT_EQ(moe.moe.experts[0].down.format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(moe.moe.router.dtype, DType::kBF16);
  EXPECT_EQ(fp8->embed_tokens.dtype, DType::kBF16);
  EXPECT_EQ(fp8->lm_head.dtype, DType::kBF16);
  EXPECT_LT(fp8->ParameterBytes(), bf16->ParameterBytes());
  // Values follow the bf16 preset's distribution: the codes span the e4m3 range.
  std::vector<float> row(moe.attn.q_proj.cols);
  internal::WidenPanel(moe.attn.q_proj, 0, 1, 0, moe.attn.q_proj.cols, row.data());
  double sum2 = 0;
  for (float v : row) sum2 += v * v;
  EXPECT_NEAR(std::sqrt(sum2 / row.size()), 0.02, 0.004);
  // Deterministic, and the "-fp8" spelling is a preset of its own.
  absl::StatusOr<ModelWeights> again = LoadModel("tiny-fp8");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(again->layers[0].attn.o_proj.data, fp8->layers[0].attn.o_proj.data,
                        fp8->layers[0].attn.o_proj.rows * fp8->layers[0].attn.o_proj.cols),
            0);
  EXPECT_TRUE(PresetIsFp8("glm-4.5-air-fp8:layers=2"));
  EXPECT_FALSE(PresetIsFp8("glm-4.5-air:layers=2"));
}

TEST(Fp8PresetTest, SavedPresetLoadsBackInTheCompressedTensorsForm) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny-fp8");
  ASSERT_TRUE(w.ok());
  const std::string dir = testing::MakeTempDir("fp8_save_");
  ASSERT_TRUE(SaveCheckpoint(*w, dir).ok());
  std::ifstream in(dir + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  const Json config = Json::parse(text.str());
  EXPECT_EQ(config["quantization_config"]["quant_method"], "compressed-tensors");
  absl::StatusOr<ModelWeights> again = LoadCheckpoint(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  const Matrix& a = w->layers.back().moe.experts[3].up;
  const Matrix& b = again->layers.back().moe.experts[3].up;
  ASSERT_EQ(b.format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.rows * a.cols), 0);
  EXPECT_TRUE(std::equal(a.scales, a.scales + a.rows, b.scales));
  SaveCheckpointOptions fused;
  fused.fused_experts = true;
  EXPECT_EQ(SaveCheckpoint(*w, dir + "/fused", fused).code(), absl::StatusCode::kUnimplemented);
  std::filesystem::remove_all(dir);
}

// FP8 weights are the CUDA backend's too (docs/fp8.md): without a GPU (or without the CUDA
// build) the only refusal left is the device's own, which says nothing of FP8; with one, the
// runner is created (its results are tested in tests/core/cuda and the runner suites).
TEST(Fp8PresetTest, CudaTakesFp8) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny-fp8");
  ASSERT_TRUE(w.ok());
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      CreateModelRunner(*std::move(w), DeviceKind::kCuda);
  if (CudaDeviceAvailable()) {
    EXPECT_TRUE(r.ok()) << r.status();
    return;
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message().find("FP8"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace glmserve
