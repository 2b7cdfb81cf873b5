// GLM-5's device kernels (core/cuda/mla.cu, dsa_indexer.cu) against the CPU backend's ops
// (core/cpu/ops/mla.h, dsa_indexer.h) on the same inputs: a ragged two-sequence batch over a paged
// latent cache whose values are bf16-representable, so that both sides read identical keys.
//
// The indexer's selection must be IDENTICAL (count and positions), including exact ties
// (duplicated keys), which both sides break towards the lower position. Attention output is
// bf16 on the device: relative error of the norm under 1e-2; the in-place fp32 query RoPE
// under 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/base/dtype.h"
#include "core/cpu/ops/dsa_indexer.h"
#include "core/cpu/ops/mla.h"
#include "core/cpu/ops/norm.h"
#include "core/cpu/ops/rope.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels.h"
#include "core/cuda/step_plan.h"
#include "core/model/kv_cache.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::FromBf16;
using ::glmserve::testing::RandomVector;
using ::glmserve::testing::RelativeError;
using ::glmserve::testing::RoundBf16;
using ::glmserve::testing::ToBf16;

// Small widths with the real structure: 4 heads, a 32-wide latent, 8 rotary dims, an
// indexer of 4 heads x 16 and index_topk 8; blocks of 4 token slots. The tensor-core test
// widens it (more heads, longer sequences, GLM-5's latent and rotary widths).
struct LatentShape {
  std::vector<int64_t> lengths = {30, 13};  // sequences, prefilled from position 0
  int64_t heads = 4, latent = 32, rope = 8, topk = 8;
};

struct LatentFixture {
  MlaShape mla;
  IndexerShape idx;
  int64_t block_size = 4;
  std::vector<int64_t> lengths;
  std::vector<BlockTable> tables;
  std::unique_ptr<KvCache> host;  // fp32, the CPU ops' cache
  ForwardBatch batch;
  StepPlan plan;
  int64_t tokens = 0;

  explicit LatentFixture(const LatentShape& ls = {}) : lengths(ls.lengths) {
    mla.heads = ls.heads;
    mla.nope_dim = 16;
    mla.rope_dim = ls.rope;
    mla.v_dim = 12;
    mla.latent_dim = ls.latent;
    mla.index_dim = 16;
    mla.scale = 1.0f / std::sqrt(static_cast<float>(16 + ls.rope));
    idx.heads = 4;
    idx.head_dim = 16;
    idx.rope_dim = 8;
    idx.topk = ls.topk;
    int64_t max_blocks = 0, blocks = 0;
    for (int64_t n : lengths) {
      max_blocks = std::max(max_blocks, (n + block_size - 1) / block_size);
      blocks += (n + block_size - 1) / block_size;
    }
    KvCacheShape shape;
    shape.num_layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = mla.row_width();
    shape.block_size = block_size;
    shape.num_blocks = std::max<int64_t>(16, blocks);
    shape.latent = true;
    host = std::make_unique<KvCache>(shape);
    tables.resize(lengths.size());
    // Interleave the sequences' blocks, so that block tables matter.
    for (int64_t step = 0; step < max_blocks; ++step) {
      for (size_t s = 0; s < lengths.size(); ++s) {
        const int64_t want = std::min<int64_t>(lengths[s], (step + 1) * block_size);
        EXPECT_TRUE(host->Reserve(&tables[s], want).ok());
      }
    }
    for (size_t s = 0; s < lengths.size(); ++s) {
      batch.sequences.push_back({lengths[s], 0, &tables[s]});
      tokens += lengths[s];
    }
    BuildStepPlan(batch, LogitsRows::kNone, block_size, /*tile_tokens=*/1, StepPadding{}, false, &plan);
    // Cache rows: bf16-representable values; sequence 0's index keys at positions 10 and 17
    // repeat position 3's (exact score ties at every query that sees them).
    const int64_t width = mla.row_width();
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (int64_t p = 0; p < lengths[s]; ++p) {
        const std::vector<float> row =
            RoundBf16(RandomVector(width, static_cast<uint32_t>(100 * s + p + 1)));
        float* dst = Row(s, p);
        std::copy(row.begin(), row.end(), dst);
      }
    }
    for (int64_t p : {10, 17}) {
      std::copy_n(Row(0, 3) + mla.index_offset(), mla.index_dim, Row(0, p) + mla.index_offset());
    }
  }
  float* Row(size_t s, int64_t p) {
    return host->keys(0, tables[s][p / block_size]) + (p % block_size) * mla.row_width();
  }
  // The device kernels address rows by block: the same shape with the block size.
  MlaShape Dev() const {
    MlaShape d = mla;
    d.block_size = block_size;
    return d;
  }
  IndexerShape DevIndexer() const { return idx; }
  // The device cache: the host cache's values as bf16, same layout.
  DeviceBuffer DeviceCache() const {
    const int64_t n = host->shape().num_blocks * block_size * mla.row_width();
    return Upload(ToBf16(std::vector<float>(host->keys(0, 0), host->keys(0, 0) + n)));
  }
};

class CudaMlaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    GLM_REQUIRE_CUDA_DEVICE();
    ASSERT_EQ(PrepareKernels(), cudaSuccess);
  }
};

TEST_F(CudaMlaKernels, IndexerTopkMatchesCpuIncludingTies) {
  LatentFixture s;
  const int64_t t = s.tokens, hi = s.idx.heads, di = s.idx.head_dim, k = s.idx.topk;
  const std::vector<float> iq = RandomVector(t * hi * di, 7);
  // Signed head weights; sequence 1's all negative, so that its best score is 0 (a key
  // whose every head's dot product is negative), shared by many keys: ties at the k-th place.
  std::vector<float> w = RandomVector(t * hi, 8);
  for (int64_t i = 30 * hi; i < t * hi; ++i) w[i] = -std::fabs(w[i]);
  TopkSelection want;
  IndexerSelect(iq.data(), w.data(), s.batch.sequences, *s.host, 0, s.mla, s.idx, &want);

  DeviceBuffer cache = s.DeviceCache();
  DeviceBuffer d_iq = Upload(iq), d_w = Upload(w);
  DeviceBuffer tiles = Upload(s.plan.tiles), tables = Upload(s.plan.block_tables);
  DeviceBuffer count = Poisoned<int32_t>(t), pos = Poisoned<int32_t>(t * k);
  // Two launches of part of the tiles each, as the model chunks them.
  DeviceBuffer scores = Poisoned<float>(t * s.plan.max_kv_len);
  const int split = static_cast<int>(s.plan.num_tiles / 2);
  ASSERT_EQ(LaunchIndexerTopk(d_iq.as<float>(), d_w.as<float>(), tiles.as<int32_t>(), 0, split,
                              s.plan.max_kv_len, tables.as<int32_t>(), cache.as<uint16_t>(),
                              s.DevIndexer(), s.Dev(), scores.as<float>(), count.as<int32_t>(),
                              pos.as<int32_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchIndexerTopk(d_iq.as<float>(), d_w.as<float>(), tiles.as<int32_t>(), split,
                              static_cast<int>(s.plan.num_tiles), s.plan.max_kv_len,
                              tables.as<int32_t>(), cache.as<uint16_t>(), s.DevIndexer(), s.Dev(),
                              scores.as<float>(), count.as<int32_t>(), pos.as<int32_t>(), nullptr),
            cudaSuccess);
  const std::vector<int32_t> got_count = Download<int32_t>(count, t);
  const std::vector<int32_t> got_pos = Download<int32_t>(pos, t * k);
  int64_t sparse = 0, tie_rows = 0, zero_ties = 0;
  for (int64_t row = 0; row < t; ++row) {
    ASSERT_EQ(got_count[row], want.count[row]) << "row " << row;
    if (want.count[row] < 0) continue;
    ++sparse;
    const std::vector<int32_t> w_list(want.positions.begin() + want.offset[row],
                                      want.positions.begin() + want.offset[row] + k);
    const std::vector<int32_t> g_list(got_pos.begin() + row * k, got_pos.begin() + (row + 1) * k);
    EXPECT_EQ(g_list, w_list) << "row " << row;
    // A row that keeps position 3 but not 10 (or 10 but not 17) was decided by the tie rule.
    const auto has = [&](int32_t p) { return std::count(w_list.begin(), w_list.end(), p) > 0; };
    // Sequence 1: the list is the first k keys of score 0 (the maximum) when more than k
    // score 0; count rows whose list is not a prefix of the causal keys.
    if (row >= 30 && w_list.back() >= static_cast<int32_t>(k)) ++zero_ties;
    if (row < 30 && ((has(3) && row >= 10 && !has(10)) || (has(10) && row >= 17 && !has(17)))) {
      ++tie_rows;
    }
  }
  EXPECT_EQ(sparse, (30 - 8) + (13 - 8));
  EXPECT_GT(tie_rows, 0) << "the duplicated keys decided no row";
  std::printf(
      "[ indexer top-k ] %ld sparse rows identical; duplicated-key ties decided %ld, "
      "zero-score rows with a non-prefix list %ld\n",
      static_cast<long>(sparse), static_cast<long>(tie_rows), static_cast<long>(zero_ties));
}

// kv_b_proj as FP8 (GLM-5-FP8's form): e4m3 codes with block scales of br x bc (partial edge
// blocks when they do not divide the shape), and the fp32 values the CPU widens it to.
struct Fp8KvB {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<float> values;  // e4m3 x scale, one fp32 rounding: the CPU's W_uk^T / W_uv
  Fp8DeviceMatrix shape;
  Fp8KvB(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t br, int64_t bc) {
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    scales = RandomVector(sr * sc, 31, 0.01f);
    for (float& x : scales) x = std::abs(x) + 1e-3f;  // positive, distinct per block
    codes.resize(rows * cols);
    values.resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float scale = scales[(r / br) * sc + c / bc];
        codes[r * cols + c] = FloatToE4m3(w[r * cols + c] / scale);
        values[r * cols + c] = E4m3ToFloat(codes[r * cols + c]) * scale;
      }
    }
    shape.rows = rows;
    shape.cols = cols;
    shape.block_rows = br;
    shape.block_cols = bc;
  }
};

TEST_F(CudaMlaKernels, AbsorbedAttentionMatchesCpu) {
  LatentFixture s;
  const MlaShape& m = s.mla;
  const int64_t t = s.tokens, k = s.idx.topk;
  const int64_t kv_b_rows = m.heads * (m.nope_dim + m.v_dim);
  const std::vector<float> q = RandomVector(t * m.heads * m.qk_dim(), 11);
  const std::vector<float> kv_b16 = RoundBf16(RandomVector(kv_b_rows * m.latent_dim, 12, 0.2f));
  // 24 x 12 blocks over [112, 32]: the last block row and column are cut short.
  const Fp8KvB kv_b8(kv_b16, kv_b_rows, m.latent_dim, 24, 12);
  // A selection from the CPU indexer (sparse rows) and every causal key (dense rows).
  const std::vector<float> iq = RandomVector(t * s.idx.heads * s.idx.head_dim, 13);
  const std::vector<float> iw = RandomVector(t * s.idx.heads, 14);
  TopkSelection sel;
  IndexerSelect(iq.data(), iw.data(), s.batch.sequences, *s.host, 0, m, s.idx, &sel);
  for (const bool fp8 : {false, true}) {
    const std::vector<float>& kv_b = fp8 ? kv_b8.values : kv_b16;
    const Matrix w{DType::kF32, kv_b_rows, m.latent_dim, kv_b.data()};
    for (const bool dense : {false, true}) {
      TopkSelection use = sel;
      if (dense) std::fill(use.count.begin(), use.count.end(), -1);
      const AbsorbedKey absorbed = AbsorbedKeyWeights(w, m);
      std::vector<float> q_lat(m.heads * t * m.latent_dim), out_lat(q_lat.size());
      std::vector<float> want(t * m.heads * m.v_dim);
      AbsorbQuery(q.data(), t, absorbed, m, q_lat.data());
      LatentAttention(q_lat.data(), q.data(), s.batch.sequences, *s.host, 0, use, m,
                      out_lat.data());
      ExpandValues(out_lat.data(), t, w, m, want.data());

      std::vector<int32_t> count(t, -1), positions(t * k, 0);
      for (int64_t row = 0; row < t; ++row) {
        count[row] = use.count[row];
        for (int32_t i = 0; i < use.count[row]; ++i)
          positions[row * k + i] = use.positions[use.offset[row] + i];
      }
      DeviceBuffer cache = s.DeviceCache();
      DeviceBuffer d_q = Upload(q), d_w = Upload(ToBf16(kv_b16));
      DeviceBuffer d_codes = Upload(kv_b8.codes), d_scales = Upload(kv_b8.scales);
      Fp8DeviceMatrix w8;  // the bf16 form: none
      if (fp8) {
        w8 = kv_b8.shape;
        w8.codes = d_codes.as<uint8_t>();
        w8.scales = d_scales.as<float>();
      }
      DeviceBuffer tiles = Upload(s.plan.tiles), tables = Upload(s.plan.block_tables);
      DeviceBuffer d_count = Upload(count), d_pos = Upload(positions);
      DeviceBuffer out = Poisoned<uint16_t>(t * m.heads * m.v_dim);
      ASSERT_EQ(LaunchMlaAttention(d_q.as<float>(), tiles.as<int32_t>(),
                                   static_cast<int>(s.plan.num_tiles), tables.as<int32_t>(),
                                   cache.as<uint16_t>(), fp8 ? nullptr : d_w.as<uint16_t>(), w8,
                                   s.Dev(), dense ? nullptr : d_count.as<int32_t>(),
                                   d_pos.as<int32_t>(), k, out.as<uint16_t>(), nullptr),
                cudaSuccess);
      const std::vector<float> got = FromBf16(Download<uint16_t>(out, want.size()));
      const double err = RelativeError(got, want);
      const char* what = fp8 ? (dense ? "fp8 dense" : "fp8 sparse") : dense ? "dense" : "sparse";
      EXPECT_LT(err, 1e-2) << what;
      std::printf("[ MLA attention %s ] relative error vs CPU: %.3g\n", what, err);
    }
  }
  // Both forms or neither: refused.
  DeviceBuffer d_codes = Upload(kv_b8.codes), d_scales = Upload(kv_b8.scales);
  Fp8DeviceMatrix w8 = kv_b8.shape;
  w8.codes = d_codes.as<uint8_t>();
  w8.scales = d_scales.as<float>();
  DeviceBuffer tiles = Upload(s.plan.tiles), tables = Upload(s.plan.block_tables);
  DeviceBuffer d_q = Upload(q), cache = s.DeviceCache(), d_w = Upload(ToBf16(kv_b16));
  DeviceBuffer out = Poisoned<uint16_t>(t * m.heads * m.v_dim);
  EXPECT_EQ(LaunchMlaAttention(d_q.as<float>(), tiles.as<int32_t>(), 1, tables.as<int32_t>(),
                               cache.as<uint16_t>(), d_w.as<uint16_t>(), w8, s.Dev(), nullptr,
                               nullptr, k, out.as<uint16_t>(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchMlaAttention(d_q.as<float>(), tiles.as<int32_t>(), 1, tables.as<int32_t>(),
                               cache.as<uint16_t>(), nullptr, Fp8DeviceMatrix{}, s.Dev(), nullptr,
                               nullptr, k, out.as<uint16_t>(), nullptr),
            cudaErrorInvalidValue);
}

// The tensor-core kernels (mla_tc.cu) against the same CPU ops: a ragged batch whose contexts
// run below and above index_topk (dense rows, then selections of topk keys), several splits of
// kMlaTcChunk keys per token, a partial head tile, kv_b as bf16 and as FP8; and GLM-5's
// widths (latent 512 + rope 64: Kp 576, the shared-memory limit, 8 accumulators per warp).
// The only roundings besides the CPU's: q_lat and the softmax weights to bf16 for the MMAs
// and the bf16 output: 1e-2 relative, as the CUDA-core kernel.
TEST_F(CudaMlaKernels, TensorCoreAttentionMatchesCpu) {
  struct Case {
    const char* name;
    LatentShape shape;
    bool fp8;
  };
  const Case cases[] = {
      {"ragged, 20 heads, topk 100", {{150, 70}, 20, 32, 8, 100}, false},
      {"ragged fp8 kv_b", {{150, 70}, 20, 32, 8, 100}, true},
      {"GLM-5 widths", {{70}, 16, 512, 64, 40}, false},
  };
  for (const Case& cs : cases) {
    LatentFixture s(cs.shape);
    const MlaShape& m = s.mla;
    const int64_t t = s.tokens, k = s.idx.topk;
    const int64_t kv_b_rows = m.heads * (m.nope_dim + m.v_dim);
    const std::vector<float> q = RandomVector(t * m.heads * m.qk_dim(), 41);
    const std::vector<float> kv_b16 = RoundBf16(RandomVector(kv_b_rows * m.latent_dim, 42, 0.2f));
    const Fp8KvB kv_b8(kv_b16, kv_b_rows, m.latent_dim, 24, 12);
    const std::vector<float>& kv_b = cs.fp8 ? kv_b8.values : kv_b16;
    const Matrix w{DType::kF32, kv_b_rows, m.latent_dim, kv_b.data()};
    const std::vector<float> iq = RandomVector(t * s.idx.heads * s.idx.head_dim, 43);
    const std::vector<float> iw = RandomVector(t * s.idx.heads, 44);
    TopkSelection sel;
    IndexerSelect(iq.data(), iw.data(), s.batch.sequences, *s.host, 0, m, s.idx, &sel);
    for (const bool dense : {false, true}) {
      TopkSelection use = sel;
      if (dense) std::fill(use.count.begin(), use.count.end(), -1);
      const AbsorbedKey absorbed = AbsorbedKeyWeights(w, m);
      std::vector<float> q_lat(m.heads * t * m.latent_dim), out_lat(q_lat.size());
      std::vector<float> want(t * m.heads * m.v_dim);
      AbsorbQuery(q.data(), t, absorbed, m, q_lat.data());
      LatentAttention(q_lat.data(), q.data(), s.batch.sequences, *s.host, 0, use, m,
                      out_lat.data());
      ExpandValues(out_lat.data(), t, w, m, want.data());
      std::vector<int32_t> count(t, -1), positions(t * k, 0);
      for (int64_t row = 0; row < t; ++row) {
        count[row] = use.count[row];
        for (int32_t i = 0; i < use.count[row]; ++i)
          positions[row * k + i] = use.positions[use.offset[row] + i];
      }
      // Without a selection a token attends to its whole context.
      const int64_t max_len = *std::max_element(s.lengths.begin(), s.lengths.end());
      const MlaTcLayout layout = MlaTcLayoutFor(s.Dev(), dense ? max_len : k);
      ASSERT_TRUE(layout.supported) << cs.name;
      EXPECT_GE(layout.splits, dense ? 2 : 1) << cs.name;
      DeviceBuffer q_cat = Poisoned<uint16_t>(t * layout.q_cat_elems);
      DeviceBuffer o_part = Poisoned<float>(t * layout.o_part_floats);
      DeviceBuffer ml_part = Poisoned<float>(t * layout.ml_part_floats);
      MlaTcScratch scratch{q_cat.as<uint16_t>(), o_part.as<float>(), ml_part.as<float>()};
      DeviceBuffer cache = s.DeviceCache();
      DeviceBuffer d_q = Upload(q), d_w = Upload(ToBf16(kv_b16));
      DeviceBuffer d_codes = Upload(kv_b8.codes), d_scales = Upload(kv_b8.scales);
      Fp8DeviceMatrix w8;
      if (cs.fp8) {
        w8 = kv_b8.shape;
        w8.codes = d_codes.as<uint8_t>();
        w8.scales = d_scales.as<float>();
      }
      DeviceBuffer tiles = Upload(s.plan.tiles), tables = Upload(s.plan.block_tables);
      DeviceBuffer d_count = Upload(count), d_pos = Upload(positions);
      DeviceBuffer out = Poisoned<uint16_t>(t * m.heads * m.v_dim);
      ASSERT_EQ(LaunchMlaAttentionTc(d_q.as<float>(), t, tiles.as<int32_t>(),
                                     static_cast<int>(s.plan.num_tiles), tables.as<int32_t>(),
                                     cache.as<uint16_t>(), cs.fp8 ? nullptr : d_w.as<uint16_t>(),
                                     w8, s.Dev(), dense ? nullptr : d_count.as<int32_t>(),
                                     d_pos.as<int32_t>(), k, layout, scratch, out.as<uint16_t>(),
                                     nullptr),
                cudaSuccess);
      const std::vector<float> got = FromBf16(Download<uint16_t>(out, want.size()));
      double worst = 0;
      for (int64_t row = 0; row < t; ++row) {
        const int64_t width = m.heads * m.v_dim;
        worst = std::max(worst,
                         RelativeError(got.data() + row * width, want.data() + row * width, width));
      }
      EXPECT_LT(worst, 1e-2) << cs.name << (dense ? " dense" : " sparse");
      std::printf("[ MLA tensor cores %s, %s, %ld splits ] worst row relative error vs CPU: %.3g\n",
                  cs.name, dense ? "dense" : "sparse", static_cast<long>(layout.splits), worst);
    }
  }
}

TEST_F(CudaMlaKernels, RopeNormsAndCacheWritesMatchCpu) {
  LatentFixture s;
  const MlaShape& m = s.mla;
  const int64_t t = s.tokens, r = m.latent_dim, dr = m.rope_dim, di = s.idx.head_dim;
  const int64_t hi = s.idx.heads;
  std::vector<int32_t> positions(s.plan.positions.begin(), s.plan.positions.end());
  const RotaryEmbedding rope(dr, dr, 10000.0);
  std::vector<float> q = RandomVector(t * m.heads * m.qk_dim(), 21);
  std::vector<float> kv_a = RandomVector(t * (r + dr), 22);
  std::vector<float> iq = RandomVector(t * hi * di, 23);
  std::vector<float> ik = RandomVector(t * di, 24);
  std::vector<float> iw = RandomVector(t * hi, 25);
  const std::vector<float> gain = RandomVector(r, 26), ln_gain = RandomVector(di, 27);
  const std::vector<float> ln_bias = RandomVector(di, 28);
  DeviceBuffer d_q = Upload(q), d_kv = Upload(kv_a), d_iq = Upload(iq), d_ik = Upload(ik);
  DeviceBuffer d_iw = Upload(iw), d_gain = Upload(gain), d_lg = Upload(ln_gain);
  DeviceBuffer d_lb = Upload(ln_bias), d_freq = Upload(rope.inv_freq());
  DeviceBuffer d_pos = Upload(positions), d_slots = Upload(s.plan.slots);
  const int64_t cache_n = s.host->shape().num_blocks * s.block_size * m.row_width();
  DeviceBuffer cache = Poisoned<uint16_t>(cache_n);
  ASSERT_EQ(
      LaunchMlaRopeLatentWrite(d_q.as<float>(), d_kv.as<float>(), t, s.Dev(), d_gain.as<float>(),
                               1e-6f, d_freq.as<float>(), d_pos.as<int32_t>(),
                               d_slots.as<int32_t>(), cache.as<uint16_t>(), nullptr),
      cudaSuccess);
  ASSERT_EQ(LaunchIndexerPrepare(d_iq.as<float>(), d_ik.as<float>(), d_iw.as<float>(), t,
                                 s.DevIndexer(), s.Dev(), d_lg.as<float>(), d_lb.as<float>(), 1e-6f,
                                 d_freq.as<float>(), d_pos.as<int32_t>(), d_slots.as<int32_t>(),
                                 cache.as<uint16_t>(), nullptr),
            cudaSuccess);
  // The CPU backend's steps (core/cpu/cpu_model_mla.cc, IndexerProject).
  std::vector<float> latent(t * r), k_rot(t * dr);
  for (int64_t i = 0; i < t; ++i) {
    std::copy_n(kv_a.data() + i * (r + dr), r, latent.data() + i * r);
    std::copy_n(kv_a.data() + i * (r + dr) + r, dr, k_rot.data() + i * dr);
  }
  RmsNorm(latent.data(), gain.data(), t, r, 1e-6f, latent.data());
  rope.ApplyInterleaved(k_rot.data(), t, 1, dr, 0, positions.data());
  rope.ApplyInterleaved(q.data(), t, m.heads, m.qk_dim(), m.nope_dim, positions.data());
  LayerNorm(ik.data(), ln_gain.data(), ln_bias.data(), t, di, 1e-6f, ik.data());
  rope.ApplyInterleaved(ik.data(), t, 1, di, 0, positions.data());
  rope.ApplyInterleaved(iq.data(), t, hi, di, 0, positions.data());
  for (float& x : iw) x *= 1.0f / std::sqrt(static_cast<float>(hi));
  EXPECT_LT(RelativeError(Download<float>(d_q, q.size()), q), 1e-5) << "q RoPE";
  EXPECT_LT(RelativeError(Download<float>(d_iq, iq.size()), iq), 1e-5) << "indexer q RoPE";
  EXPECT_LT(RelativeError(Download<float>(d_iw, iw.size()), iw), 1e-6) << "head weights";
  WriteLatentRows(latent.data(), k_rot.data(), ik.data(), s.batch.sequences, m, 0, s.host.get());
  const std::vector<float> got = FromBf16(Download<uint16_t>(cache, cache_n));
  std::vector<float> got_rows, want_rows;
  for (size_t q_seq = 0; q_seq < s.lengths.size(); ++q_seq) {
    for (int64_t p = 0; p < s.lengths[q_seq]; ++p) {
      const float* w_row = s.Row(q_seq, p);
      const int64_t slot =
          static_cast<int64_t>(s.tables[q_seq][p / s.block_size]) * s.block_size + p % s.block_size;
      want_rows.insert(want_rows.end(), w_row, w_row + m.row_width());
      got_rows.insert(got_rows.end(), got.begin() + slot * m.row_width(),
                      got.begin() + (slot + 1) * m.row_width());
    }
  }
  // bf16 storage: 2^-9 relative per value.
  EXPECT_LT(RelativeError(got_rows, want_rows), 5e-3) << "cache rows";
}

}  // namespace
}  // namespace glmserve::cuda
