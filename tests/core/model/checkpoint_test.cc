#include "core/model/checkpoint.h"

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "core/model/safetensors.h"
#include "core/model/safetensors_writer.h"
#include "core/model/weight_layout.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using ::testing::HasSubstr;

ModelConfig TinyConfig() {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny");
  EXPECT_TRUE(c.ok());
  return *c;
}

// Every slot of `a` and `b` holds the same dtype, shape and bytes.
void ExpectSameWeights(const ModelWeights& a, const ModelWeights& b) {
  ASSERT_EQ(a.layer_begin, b.layer_begin);
  ASSERT_EQ(a.layer_end, b.layer_end);
  ASSERT_EQ(a.has_embedding(), b.has_embedding());
  ASSERT_EQ(a.has_head(), b.has_head());
  EXPECT_EQ(a.weight_dtype, b.weight_dtype);
  ModelWeights ca = a, cb = b;
  const std::vector<WeightSlot> sa = ListWeightSlots(&ca), sb = ListWeightSlots(&cb);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].name, sb[i].name);
    if (sa[i].vector != nullptr) {
      EXPECT_EQ(*sa[i].vector, *sb[i].vector) << sa[i].name;
      continue;
    }
    const Matrix& ma = *sa[i].matrix;
    const Matrix& mb = *sb[i].matrix;
    ASSERT_EQ(ma.dtype, mb.dtype) << sa[i].name;
    ASSERT_EQ(ma.rows, mb.rows) << sa[i].name;
    ASSERT_EQ(ma.cols, mb.cols) << sa[i].name;
    ASSERT_FALSE(ma.empty()) << sa[i].name;
    ASSERT_EQ(ma.format, mb.format) << sa[i].name;
    EXPECT_EQ(
        std::memcmp(ma.data, mb.data, static_cast<size_t>(ma.rows * ma.cols * DTypeSize(ma.dtype))),
        0)
        << sa[i].name;
    if (ma.format == WeightFormat::kFp8Scaled) {
      ASSERT_EQ(ma.scale_block_rows, mb.scale_block_rows) << sa[i].name;
      ASSERT_EQ(ma.scale_block_cols, mb.scale_block_cols) << sa[i].name;
      EXPECT_TRUE(std::equal(ma.scales, ma.scales + ma.scale_rows() * ma.scale_cols(), mb.scales))
          << sa[i].name;
    }
  }
  // The head is checked separately because a tied head is not a slot of its own.
  if (a.has_head()) {
    ASSERT_EQ(a.lm_head.bytes(), b.lm_head.bytes());
    EXPECT_EQ(std::memcmp(a.lm_head.data, b.lm_head.data, static_cast<size_t>(a.lm_head.bytes())),
              0);
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = glmserve::testing::MakeTempDir("checkpoint_test_"); }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  // Random tiny weights saved to dir_; returns them.
  ModelWeights SaveTiny(const ModelConfig& config, SaveCheckpointOptions options = {},
                        DType dtype = DType::kBF16) {
    absl::StatusOr<ModelWeights> w = RandomWeights(config, {.seed = 3, .dtype = dtype});
    EXPECT_TRUE(w.ok()) << w.status();
    absl::Status s = SaveCheckpoint(*w, dir_, options);
    EXPECT_TRUE(s.ok()) << s;
    return *std::move(w);
  }

  // Rewrites dir_/model.safetensors after `edit` changed its tensor list.
  void Rewrite(const std::function<void(std::vector<TensorToWrite>*)>& edit) {
    absl::StatusOr<TensorStore> store = TensorStore::OpenFile(dir_ + "/model.safetensors");
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<TensorToWrite> tensors;
    for (const std::string& name : store->Names()) {
      const TensorInfo* t = store->Find(name);
      tensors.push_back({name, t->dtype, t->shape, {{t->data, t->bytes}}});
    }
    edit(&tensors);
    // The old mapping stays valid after the rename replaces the file.
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors).ok());
  }

  void WriteConfig(const ModelConfig& c) {
    std::ofstream(dir_ + "/config.json") << ConfigToJson(c);
  }

  std::string LoadError(LayerSpan span = {}) {
    absl::StatusOr<ModelWeights> w = LoadCheckpoint(dir_, span);
    EXPECT_FALSE(w.ok());
    return w.ok() ? "" : std::string(w.status().message());
  }

  std::string dir_;
};

TEST_F(CheckpointTest, RoundTripEveryDType) {
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    const ModelWeights saved = SaveTiny(TinyConfig(), {}, dtype);
    absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameWeights(*loaded, saved);
    EXPECT_EQ(loaded->weight_dtype, dtype);
    EXPECT_EQ(loaded->layers.size(), 3u);
    EXPECT_FALSE(loaded->layers[0].is_moe);
    EXPECT_TRUE(loaded->layers[1].is_moe);
    EXPECT_EQ(loaded->layers[2].moe.experts.size(), 8u);
    EXPECT_TRUE(loaded->layers[2].moe.has_shared());
    EXPECT_EQ(loaded->layers[0].attn.q_bias.size(), 64u);
    EXPECT_EQ(loaded->layers[0].attn.k_norm.size(), 16u);
    EXPECT_EQ(loaded->ParameterBytes(), saved.ParameterBytes());
    EXPECT_FALSE(loaded->storage.empty());
  }
}

TEST_F(CheckpointTest, FusedAndPerExpertFormsAgree) {
  const ModelWeights saved = SaveTiny(TinyConfig(), {.fused_experts = true});
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  ASSERT_NE(store->Find("model.layers.1.mlp.experts.gate_up_proj"), nullptr);
  EXPECT_EQ(store->Find("model.layers.1.mlp.experts.gate_up_proj")->shape,
            (std::vector<int64_t>{8, 64, 64}));
  EXPECT_EQ(store->Find("model.layers.1.mlp.experts.down_proj")->shape,
            (std::vector<int64_t>{8, 64, 32}));
  EXPECT_EQ(store->Find("model.layers.1.mlp.experts.0.gate_proj.weight"), nullptr);
  absl::StatusOr<ModelWeights> fused = LoadCheckpoint(dir_);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectSameWeights(*fused, saved);

  // Spot-check the layout directly: expert 3's up rows follow its gate rows.
  const TensorInfo* gu = store->Find("model.layers.2.mlp.experts.gate_up_proj");
  const Matrix& up3 = fused->layers[2].moe.experts[3].up;
  EXPECT_EQ(up3.rows, 32);
  EXPECT_EQ(std::memcmp(up3.data, static_cast<const char*>(gu->data) + (3 * 64 + 32) * 64 * 2,
                        static_cast<size_t>(up3.bytes())),
            0);
  EXPECT_EQ(std::memcmp(up3.data, saved.layers[2].moe.experts[3].up.data,
                        static_cast<size_t>(up3.bytes())),
            0);

  const std::string per_expert_dir = dir_ + "/per_expert";
  ASSERT_TRUE(SaveCheckpoint(saved, per_expert_dir).ok());
  absl::StatusOr<ModelWeights> per_expert = LoadCheckpoint(per_expert_dir);
  ASSERT_TRUE(per_expert.ok()) << per_expert.status();
  ExpectSameWeights(*per_expert, *fused);
}

TEST_F(CheckpointTest, ShardedCheckpoint) {
  const ModelWeights saved = SaveTiny(TinyConfig(), {.max_shard_bytes = 40000});
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/model.safetensors.index.json").c_str(), &st), 0);
  ASSERT_NE(::stat((dir_ + "/model.safetensors").c_str(), &st), 0);
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  EXPECT_GT(store->Owners().size(), 2u);
  absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(*loaded, saved);
  // Saving single-file over it removes the index that would shadow the new file.
  ASSERT_TRUE(SaveCheckpoint(saved, dir_).ok());
  ASSERT_NE(::stat((dir_ + "/model.safetensors.index.json").c_str(), &st), 0);
  EXPECT_TRUE(LoadCheckpoint(dir_).ok());
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  SaveTiny(TinyConfig());
  Rewrite([](std::vector<TensorToWrite>* t) {
    std::erase_if(*t, [](const TensorToWrite& x) {
      return x.name == "model.layers.2.mlp.experts.5.up_proj.weight";
    });
  });
  const std::string message = LoadError();
  EXPECT_THAT(message, HasSubstr("missing tensor 'model.layers.2.mlp.experts.5.up_proj.weight'"));
  // Loading a span that does not need it is fine.
  EXPECT_TRUE(LoadCheckpoint(dir_, {0, 2}).ok());
}

TEST_F(CheckpointTest, UnexpectedTensorIsNamed) {
  SaveTiny(TinyConfig());
  static const float kZero[4] = {};
  Rewrite([](std::vector<TensorToWrite>* t) {
    t->push_back({"model.layers.1.mlp.mystery.weight", DType::kF32, {4}, {{kZero, 16}}});
    t->push_back({"model.something_else", DType::kF32, {4}, {{kZero, 16}}});
  });
  const std::string message = LoadError();
  EXPECT_THAT(message, HasSubstr("unexpected tensor 'model.layers.1.mlp.mystery.weight'"));
  EXPECT_THAT(message, HasSubstr("and 1 more"));
}

TEST_F(CheckpointTest, BiasWithoutAttentionBiasIsUnexpected) {
  ModelConfig c = TinyConfig();
  SaveTiny(c);
  c.attention_bias = false;
  WriteConfig(c);
  EXPECT_THAT(LoadError(), HasSubstr("unexpected tensor 'model.layers.0.self_attn."));
  c.attention_bias = true;
  c.use_qk_norm = false;
  WriteConfig(c);
  EXPECT_THAT(LoadError(), HasSubstr("_norm.weight'"));
}

TEST_F(CheckpointTest, WrongShapeIsNamed) {
  SaveTiny(TinyConfig());
  static const uint16_t kZero[64 * 63] = {};
  Rewrite([](std::vector<TensorToWrite>* t) {
    for (TensorToWrite& x : *t) {
      if (x.name == "model.layers.1.self_attn.k_proj.weight") {
        x.shape = {63, 64};
        x.pieces = {{kZero, sizeof kZero}};
      }
    }
  });
  const std::string message = LoadError();
  EXPECT_THAT(message, HasSubstr("'model.layers.1.self_attn.k_proj.weight'"));
  EXPECT_THAT(message, HasSubstr("shape [63, 64], expected [32, 64]"));
}

// The 5-shard golden checkpoint (with an MTP layer, which is not read): progress starts at 0,
// never goes back, and ends with every byte of the tensors the span uses read.
TEST(LoadProgressTest, ReportsEveryUsedByteOfAMultiShardCheckpoint) {
  const std::string dir = testing::GoldenDir("sharded_fp32");
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ(store->Owners().size(), 5u);
  absl::StatusOr<ModelConfig> config = LoadConfigFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  // What each span must read: its layers' tensors, the embedding for layer 0, the final norm
  // and head for the last layer; the MTP layer (stored, complete) with the whole model only.
  const auto expected_bytes = [&](int64_t begin, int64_t end) {
    int64_t bytes = 0;
    for (const std::string& name : store->Names()) {
      int64_t layer = -1;
      const bool in_layer = absl::StartsWith(name, "model.layers.") &&
                            absl::SimpleAtoi(name.substr(13, name.find('.', 13) - 13), &layer);
      const int64_t n = config->num_hidden_layers;
      const bool mtp = layer == n && begin == 0 && end == n;
      const bool used =
          in_layer ? (layer >= begin && layer < end) || mtp
          : name == "model.embed_tokens.weight"
              ? begin == 0 || (end == config->num_hidden_layers && config->tie_word_embeddings)
              : end == config->num_hidden_layers;
      if (used) bytes += store->Find(name)->bytes;
    }
    return bytes;
  };
  for (const LayerSpan span : {LayerSpan{}, LayerSpan{1, 2}}) {
    std::vector<LoadProgress> calls;
    absl::StatusOr<ModelWeights> w =
        LoadCheckpoint(dir, span, [&](const LoadProgress& p) { calls.push_back(p); });
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_GE(calls.size(), 2u);
    EXPECT_EQ(calls.front().bytes_done, 0);
    EXPECT_EQ(calls.front().tensors_done, 0);
    for (size_t i = 1; i < calls.size(); ++i) {
      EXPECT_GE(calls[i].bytes_done, calls[i - 1].bytes_done);
      EXPECT_GE(calls[i].seconds, calls[i - 1].seconds);
      EXPECT_EQ(calls[i].bytes_total, calls[0].bytes_total);
    }
    const int64_t end = span.end < 0 ? config->num_hidden_layers : span.end;
    EXPECT_EQ(calls.back().bytes_total, expected_bytes(span.begin, end)) << span.begin;
    EXPECT_EQ(calls.back().bytes_done, calls.back().bytes_total);
    EXPECT_EQ(calls.back().tensors_done, calls.back().tensors_total);
    // Reading changes nothing: the same weights as a load without progress.
    absl::StatusOr<ModelWeights> plain = LoadCheckpoint(dir, span);
    ASSERT_TRUE(plain.ok());
    ExpectSameWeights(*w, *plain);
  }
}

TEST(LoadProgressTest, Describes) {
  LoadProgress p;
  p.bytes_total = 213'700'000'000;
  EXPECT_EQ(DescribeLoadProgress(p), "0.0 of 213.7 GB (0.0%)");
  p.bytes_done = 12'300'000'000;
  p.seconds = 10;
  EXPECT_EQ(DescribeLoadProgress(p), "12.3 of 213.7 GB (5.8%), 1.23 GB/s, ETA 2m44s");
  p.bytes_done = p.bytes_total;
  p.seconds = 100;
  EXPECT_EQ(DescribeLoadProgress(p), "213.7 of 213.7 GB (100.0%), 2.14 GB/s");
  LoadProgress small{.bytes_done = 250'000, .bytes_total = 500'000, .seconds = 0.5};
  EXPECT_EQ(DescribeLoadProgress(small), "0.2 of 0.5 MB (50.0%), 0.50 MB/s, ETA 1s");
}

// Old checkpoints' RoPE tables are recomputed, not loaded; an MTP layer is skipped by a span.
TEST_F(CheckpointTest, RotaryTablesAndASpansMtpLayerAreSkipped) {
  const ModelWeights saved = SaveTiny(TinyConfig());
  static const float kZero[64 * 128] = {};
  Rewrite([](std::vector<TensorToWrite>* t) {
    t->push_back({"model.layers.3.eh_proj.weight", DType::kF32, {64, 128}, {{kZero, 32768}}});
    t->push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {4}, {{kZero, 16}}});
  });
  absl::StatusOr<ModelWeights> span = LoadCheckpoint(dir_, {0, 2});
  ASSERT_TRUE(span.ok()) << span.status();
  EXPECT_FALSE(span->mtp.has_value());
  // The whole model takes the MTP layer, which must then be complete: a missing tensor is an
  // error naming it, as for any other layer.
  absl::StatusOr<ModelWeights> whole = LoadCheckpoint(dir_);
  ASSERT_FALSE(whole.ok());
  EXPECT_NE(whole.status().message().find("missing tensor 'model.layers.3."), std::string::npos)
      << whole.status();
}

// A model saved with its MTP layer (the slot list writes it) loads it back, bit for bit; the
// head it shares is the model's unless shared_head.head is stored.
TEST_F(CheckpointTest, MtpLayerRoundTrips) {
  ModelConfig config = TinyConfig();
  config.num_nextn_predict_layers = 1;
  absl::StatusOr<ModelWeights> random = RandomWeights(config, {.seed = 5, .mtp = true});
  ASSERT_TRUE(random.ok()) << random.status();
  ASSERT_TRUE(random->mtp.has_value());
  EXPECT_EQ(random->mtp->head.data, random->lm_head.data);
  EXPECT_EQ(random->mtp->layer.layer_index, config.num_hidden_layers);
  ASSERT_TRUE(SaveCheckpoint(*random, dir_).ok());
  absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->mtp.has_value());
  EXPECT_FALSE(loaded->mtp_head_stored);
  EXPECT_EQ(loaded->mtp->head.data, loaded->lm_head.data);
  ExpectSameWeights(*loaded, *random);
  const MtpWeights& a = *loaded->mtp;
  const MtpWeights& b = *random->mtp;
  EXPECT_EQ(a.enorm, b.enorm);
  EXPECT_EQ(a.hnorm, b.hnorm);
  EXPECT_EQ(a.head_norm, b.head_norm);
  ASSERT_EQ(a.eh_proj.rows, b.eh_proj.rows);
  EXPECT_EQ(std::memcmp(a.eh_proj.data, b.eh_proj.data, a.eh_proj.bytes()), 0);
  EXPECT_EQ(std::memcmp(a.layer.moe.experts[1].down.data, b.layer.moe.experts[1].down.data,
                        a.layer.moe.experts[1].down.bytes()),
            0);
  EXPECT_EQ(loaded->ParameterBytes(), random->ParameterBytes());
  // A config without num_nextn_predict_layers has no MTP layer to generate, and a span none.
  ModelConfig none = config;
  none.num_nextn_predict_layers = 0;
  EXPECT_EQ(RandomWeights(none, {.seed = 5, .mtp = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RandomWeights(config, {.seed = 5, .mtp = true}, {0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, Spans) {
  const ModelWeights full = SaveTiny(TinyConfig());
  {
    absl::StatusOr<ModelWeights> mid = LoadCheckpoint(dir_, {1, 2});
    ASSERT_TRUE(mid.ok()) << mid.status();
    EXPECT_FALSE(mid->has_embedding());
    EXPECT_FALSE(mid->has_head());
    EXPECT_TRUE(mid->final_norm.empty());
    ASSERT_EQ(mid->layers.size(), 1u);
    EXPECT_EQ(mid->layers[0].layer_index, 1);
    absl::StatusOr<ModelWeights> random = RandomWeights(TinyConfig(), {.seed = 3}, {1, 2});
    ASSERT_TRUE(random.ok());
    ExpectSameWeights(*mid, *random);
    EXPECT_LT(mid->ParameterBytes(), full.ParameterBytes());
  }
  {
    absl::StatusOr<ModelWeights> head = LoadCheckpoint(dir_, {2, -1});
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_FALSE(head->has_embedding());
    EXPECT_TRUE(head->has_head());
    EXPECT_EQ(head->final_norm.size(), 64u);
    EXPECT_EQ(head->layer_end, 3);
  }
  {
    absl::StatusOr<ModelWeights> first = LoadCheckpoint(dir_, {0, 1});
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE(first->has_embedding());
    EXPECT_FALSE(first->has_head());
  }
  for (LayerSpan bad :
       {LayerSpan{2, 1}, LayerSpan{-1, 2}, LayerSpan{0, 4}, LayerSpan{3, -1}, LayerSpan{1, 1}}) {
    EXPECT_THAT(LoadError(bad), HasSubstr("layer span")) << bad.begin << " " << bad.end;
    EXPECT_FALSE(RandomWeights(TinyConfig(), {}, bad).ok());
  }
}

TEST_F(CheckpointTest, TiedHead) {
  ModelConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  absl::StatusOr<ModelWeights> w = RandomWeights(c, {.seed = 5});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
  absl::StatusOr<ModelWeights> untied = RandomWeights(TinyConfig(), {.seed = 5});
  ASSERT_TRUE(untied.ok());
  EXPECT_EQ(untied->ParameterBytes() - w->ParameterBytes(), 256 * 64 * 2);

  ASSERT_TRUE(SaveCheckpoint(*w, dir_).ok());
  absl::StatusOr<TensorStore> store = TensorStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->Find("lm_head.weight"), nullptr);
  absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->lm_head.data, loaded->embed_tokens.data);
  ExpectSameWeights(*loaded, *w);

  // A tail span has no embedding but its head is the embedding matrix.
  absl::StatusOr<ModelWeights> tail = LoadCheckpoint(dir_, {2, -1});
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_FALSE(tail->has_embedding());
  ASSERT_TRUE(tail->has_head());
  EXPECT_EQ(std::memcmp(tail->lm_head.data, w->embed_tokens.data, 256 * 64 * 2), 0);
  absl::StatusOr<ModelWeights> random_tail = RandomWeights(c, {.seed = 5}, {2, -1});
  ASSERT_TRUE(random_tail.ok());
  ExpectSameWeights(*tail, *random_tail);
  EXPECT_EQ(random_tail->ParameterBytes(), tail->ParameterBytes());

  // A stored lm_head next to tied embeddings is used, as Transformers 5.x does (4.x tied
  // them; tests/golden/tied_distinct_head_fp32 is the reference's own output).
  static const uint16_t kZero[256 * 64] = {};
  Rewrite([](std::vector<TensorToWrite>* t) {
    t->push_back({"lm_head.weight", DType::kBF16, {256, 64}, {{kZero, sizeof kZero}}});
  });
  absl::StatusOr<ModelWeights> again = LoadCheckpoint(dir_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->head_stored_despite_tie);
  EXPECT_NE(again->lm_head.data, again->embed_tokens.data);
  EXPECT_EQ(std::memcmp(again->lm_head.data, kZero, sizeof kZero), 0);
  absl::StatusOr<ModelWeights> again_tail = LoadCheckpoint(dir_, {2, -1});
  ASSERT_TRUE(again_tail.ok()) << again_tail.status();
  EXPECT_EQ(std::memcmp(again_tail->lm_head.data, kZero, sizeof kZero), 0);
  // Saving keeps the stored head.
  const std::string copy = dir_ + "/copy";
  ASSERT_TRUE(SaveCheckpoint(*again, copy).ok());
  absl::StatusOr<ModelWeights> reloaded = LoadCheckpoint(copy);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(std::memcmp(reloaded->lm_head.data, kZero, sizeof kZero), 0);
}

TEST_F(CheckpointTest, NoSharedExperts) {
  ModelConfig c = TinyConfig();
  c.n_shared_experts = 0;
  const ModelWeights saved = SaveTiny(c);
  EXPECT_FALSE(saved.layers[1].moe.has_shared());
  absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(*loaded, saved);
}

// Hugging Face's writer keeps tensors aligned, but others need not: a misaligned F32 matrix
// is copied to aligned memory rather than handed to kernels as is.
TEST_F(CheckpointTest, MisalignedTensorsAreCopied) {
  const ModelWeights saved = SaveTiny(TinyConfig(), {}, DType::kF32);
  absl::StatusOr<TensorStore> store = TensorStore::OpenFile(dir_ + "/model.safetensors");
  ASSERT_TRUE(store.ok());
  // Rebuild the file by hand with a header 2 bytes past a multiple of 8, so that the data
  // section (and every tensor) starts misaligned.
  std::string header = "{", data;
  for (const std::string& name : store->Names()) {
    const TensorInfo* t = store->Find(name);
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"" + std::string(DTypeName(t->dtype)) +
              "\",\"shape\":" + ShapeToString(t->shape) + ",\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + t->bytes) + "]}";
    data.append(static_cast<const char*>(t->data), static_cast<size_t>(t->bytes));
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8 + 2, ' ');
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(dir_ + "/model.safetensors", std::ios::binary | std::ios::trunc)
      << len << header << data;
  absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(loaded->layers[1].attn.q_proj.data) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(loaded->layers[1].moe.experts[7].down.data) % 4, 0u);
  ExpectSameWeights(*loaded, saved);
}

TEST_F(CheckpointTest, BadConfigOrDirectory) {
  EXPECT_EQ(LoadCheckpoint(dir_).status().code(), absl::StatusCode::kNotFound);  // no config
  SaveTiny(TinyConfig());
  std::ofstream(dir_ + "/config.json") << R"({"model_type": "llama"})";
  EXPECT_THAT(LoadError(), HasSubstr("model_type"));
  WriteConfig(TinyConfig());
  std::remove((dir_ + "/model.safetensors").c_str());
  EXPECT_THAT(LoadError(), HasSubstr("no model.safetensors"));
}

TEST_F(CheckpointTest, LoadModelDirectoryOrPreset) {
  const ModelWeights saved = SaveTiny(TinyConfig());
  absl::StatusOr<ModelWeights> from_dir = LoadModel(dir_);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  ExpectSameWeights(*from_dir, saved);

  absl::StatusOr<ModelWeights> preset = LoadModel("tiny:layers=2", {1, -1}, {.seed = 3});
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_EQ(preset->config.num_hidden_layers, 2);
  EXPECT_EQ(preset->layers.size(), 1u);
  EXPECT_TRUE(preset->has_head());

  absl::StatusOr<ModelWeights> missing = LoadModel(dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("checkpoint directory"));
  EXPECT_THAT(missing.status().message(), HasSubstr("preset"));
  EXPECT_THAT(missing.status().message(), HasSubstr("does not exist"));
  EXPECT_EQ(LoadModel("tiny:layers=99").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigJsonTest, RoundTripsEveryPreset) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> c = PresetConfig(name);
    ASSERT_TRUE(c.ok());
    absl::StatusOr<ModelConfig> back = ParseConfigJson(ConfigToJson(*c));
    ASSERT_TRUE(back.ok()) << name << ": " << back.status();
    // Same text means every field came back.
    EXPECT_EQ(ConfigToJson(*back), ConfigToJson(*c)) << name;
    EXPECT_EQ(back->rope_theta, c->rope_theta);
    EXPECT_EQ(back->eos_token_ids, c->eos_token_ids);
    EXPECT_EQ(back->rms_norm_eps, c->rms_norm_eps);
  }
  EXPECT_THAT(ConfigToJson(TinyConfig(), DType::kF32), HasSubstr("\"torch_dtype\": \"float32\""));
  EXPECT_THAT(ConfigToJson(TinyConfig()), HasSubstr("\"architectures\": [\n    \"Glm4Moe"));
}

// --- Random weights ---

TEST(RandomWeightsTest, Deterministic) {
  const ModelConfig c = TinyConfig();
  absl::StatusOr<ModelWeights> a = RandomWeights(c, {.seed = 11});
  absl::StatusOr<ModelWeights> b = RandomWeights(c, {.seed = 11});
  absl::StatusOr<ModelWeights> other = RandomWeights(c, {.seed = 12});
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  ExpectSameWeights(*a, *b);
  EXPECT_NE(std::memcmp(a->embed_tokens.data, other->embed_tokens.data, 256 * 64 * 2), 0);
  EXPECT_NE(std::memcmp(a->layers[2].moe.experts[1].down.data,
                        other->layers[2].moe.experts[1].down.data, 64 * 32 * 2),
            0);
  // Different tensors get different streams.
  EXPECT_NE(std::memcmp(a->layers[1].attn.k_proj.data, a->layers[1].attn.v_proj.data, 32 * 64 * 2),
            0);
  // HF-like init of the 1-D parameters.
  EXPECT_EQ(a->layers[1].input_norm, std::vector<float>(64, 1.0f));
  EXPECT_EQ(a->layers[1].attn.q_norm, std::vector<float>(16, 1.0f));
  EXPECT_EQ(a->layers[1].attn.q_bias, std::vector<float>(64, 0.0f));
  EXPECT_EQ(a->layers[1].moe.router_bias, std::vector<float>(8, 0.0f));
  EXPECT_EQ(a->final_norm, std::vector<float>(64, 1.0f));
  EXPECT_EQ(a->weight_dtype, DType::kBF16);
}

// Literal values: a change of the generator (and so of every preset model) must be deliberate.
TEST(RandomWeightsTest, FixedSeedValues) {
  absl::StatusOr<ModelWeights> w = RandomWeights(TinyConfig(), {.seed = 1, .dtype = DType::kF32});
  ASSERT_TRUE(w.ok());
  const float* embed = static_cast<const float*>(w->embed_tokens.data);
  const float* down = static_cast<const float*>(w->layers[2].moe.experts[7].down.data);
  std::vector<uint32_t> bits;
  for (float v : {embed[0], embed[1], embed[12345], down[0], down[2047]}) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    bits.push_back(u);
  }
  EXPECT_EQ(bits,
            (std::vector<uint32_t>{984965471, 3157745482, 3164427725, 1025330557, 1007137992}));
  // bf16 is the rounding of the same values.
  absl::StatusOr<ModelWeights> b = RandomWeights(TinyConfig(), {.seed = 1});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(static_cast<const uint16_t*>(b->embed_tokens.data)[12345], FloatToBf16(embed[12345]));
}

TEST(RandomWeightsTest, Statistics) {
  ModelConfig c = TinyConfig();
  c.vocab_size = 4096;  // 262144 embedding values
  for (double stddev : {0.02, 1.0}) {
    absl::StatusOr<ModelWeights> w =
        RandomWeights(c, {.seed = 9, .dtype = DType::kF32, .stddev = stddev});
    ASSERT_TRUE(w.ok());
    const float* v = static_cast<const float*>(w->embed_tokens.data);
    const int64_t n = 4096 * 64;
    double sum = 0, sum2 = 0, max_abs = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += v[i];
      sum2 += static_cast<double>(v[i]) * v[i];
      max_abs = std::max(max_abs, std::abs(static_cast<double>(v[i])));
    }
    const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_LT(std::abs(mean), 5 * stddev / std::sqrt(n));
    EXPECT_NEAR(sd, stddev, 0.01 * stddev);
    EXPECT_LE(max_abs, 3.47 * stddev);  // Irwin-Hall of four: bounded at sqrt(12)
    EXPECT_GT(max_abs, 3.0 * stddev);
  }
}

TEST(RandomWeightsTest, SpanEqualsSliceOfFullModel) {
  absl::StatusOr<ModelWeights> full = RandomWeights(TinyConfig(), {.seed = 4});
  absl::StatusOr<ModelWeights> span = RandomWeights(TinyConfig(), {.seed = 4}, {1, 3});
  ASSERT_TRUE(full.ok() && span.ok());
  EXPECT_FALSE(span->has_embedding());
  EXPECT_TRUE(span->has_head());
  const Matrix& a = full->layers[2].moe.experts[6].gate;
  const Matrix& b = span->layers[1].moe.experts[6].gate;
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())), 0);
  EXPECT_EQ(std::memcmp(full->lm_head.data, span->lm_head.data, 256 * 64 * 2), 0);
}

TEST(RandomWeightsTest, RejectsBadInput) {
  ModelConfig c = TinyConfig();
  EXPECT_FALSE(RandomWeights(c, {.stddev = -1}).ok());
  EXPECT_FALSE(RandomWeights(c, {.stddev = NAN}).ok());
  c.num_key_value_heads = 3;
  EXPECT_FALSE(RandomWeights(c).ok());
}

// The embedded default model must come up fast (about a second on two cores).
TEST(RandomWeightsTest, DefaultModelIsQuick) {
  absl::StatusOr<ModelConfig> c = PresetConfig("glm-4.5-mini");
  ASSERT_TRUE(c.ok());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<ModelWeights> w = RandomWeights(*c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(w.ok()) << w.status();
  std::printf("glm-4.5-mini random weights: %.1f MB in %.2f s\n", w->ParameterBytes() / 1e6,
              seconds);
  EXPECT_EQ(w->layers.size(), 4u);
  EXPECT_LT(seconds, 15.0);  // generous: catches an accidental serial or libm-heavy generator
}

// Golden fixtures produced from Hugging Face (tests/golden/<case>/) load without complaint.
TEST(GoldenCheckpointTest, EveryFixtureLoads) {
  const std::string root = glmserve::testing::GoldenDir("");
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) GTEST_SKIP() << "no golden fixtures in " << root;
  std::vector<std::string> cases;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    struct stat st;
    if (name[0] != '.' && ::stat((root + name + "/config.json").c_str(), &st) == 0) {
      cases.push_back(name);
    }
  }
  ::closedir(d);
  if (cases.empty()) GTEST_SKIP() << "no golden checkpoints in " << root;
  const std::string tmp = glmserve::testing::MakeTempDir("golden_resave_");
  for (const std::string& name : cases) {
    absl::StatusOr<ModelWeights> w = LoadCheckpoint(root + name);
    ASSERT_TRUE(w.ok()) << name << ": " << w.status();
    // What we write, we read back identically.
    ASSERT_TRUE(SaveCheckpoint(*w, tmp + "/" + name).ok()) << name;
    absl::StatusOr<ModelWeights> again = LoadCheckpoint(tmp + "/" + name);
    ASSERT_TRUE(again.ok()) << name << ": " << again.status();
    ExpectSameWeights(*again, *w);
    // Every span of the model loads on its own.
    const int64_t n = w->config.num_hidden_layers;
    for (int64_t begin = 0; begin < n; ++begin) {
      absl::StatusOr<ModelWeights> span = LoadCheckpoint(root + name, {begin, begin + 1});
      EXPECT_TRUE(span.ok()) << name << " layer " << begin << ": " << span.status();
    }
  }
  std::system(("rm -rf '" + tmp + "'").c_str());
}

// Facts about particular fixtures (see tests/golden/README.md).
TEST(GoldenCheckpointTest, FixtureDetails) {
  const std::string root = glmserve::testing::GoldenDir("");
  struct stat st;
  if (::stat((root + "fused_experts_fp32/config.json").c_str(), &st) != 0) {
    GTEST_SKIP() << "no golden fixtures in " << root;
  }
  // The fused file is the per-expert one rewritten: identical weights.
  absl::StatusOr<ModelWeights> fused = LoadCheckpoint(root + "fused_experts_fp32");
  absl::StatusOr<ModelWeights> per_expert = LoadCheckpoint(root + "qknorm_bias_fp32");
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(per_expert.ok()) << per_expert.status();
  ExpectSameWeights(*fused, *per_expert);

  // HF keeps the router in fp32 inside a bf16 checkpoint; the rest stays bf16 (not widened).
  absl::StatusOr<ModelWeights> bf16 = LoadCheckpoint(root + "bf16");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->weight_dtype, DType::kBF16);
  EXPECT_EQ(bf16->embed_tokens.dtype, DType::kBF16);
  EXPECT_EQ(bf16->layers[1].moe.experts[0].down.dtype, DType::kBF16);
  EXPECT_EQ(bf16->layers[1].moe.router.dtype, DType::kF32);

  absl::StatusOr<ModelWeights> tied = LoadCheckpoint(root + "dense2_tied_fp32");
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ(tied->lm_head.data, tied->embed_tokens.data);
  EXPECT_FALSE(tied->layers[1].is_moe);
  EXPECT_TRUE(tied->layers[2].is_moe);
  absl::StatusOr<ModelWeights> tied_tail = LoadCheckpoint(root + "dense2_tied_fp32", {3, -1});
  ASSERT_TRUE(tied_tail.ok()) << tied_tail.status();
  EXPECT_FALSE(tied_tail->has_embedding());
  EXPECT_EQ(std::memcmp(tied_tail->lm_head.data, tied->embed_tokens.data,
                        static_cast<size_t>(tied->embed_tokens.bytes())),
            0);

  // Sharded, with an MTP layer the loader skips.
  absl::StatusOr<TensorStore> store = TensorStore::Open(root + "sharded_fp32");
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->Owners().size(), 5u);
  EXPECT_NE(store->Find("model.layers.3.eh_proj.weight"), nullptr);
  absl::StatusOr<ModelWeights> sharded = LoadCheckpoint(root + "sharded_fp32");
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(sharded->layers.size(), 3u);
}

}  // namespace
}  // namespace glmserve
