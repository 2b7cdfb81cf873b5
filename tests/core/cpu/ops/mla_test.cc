// GLM-5's attention kernels (core/cpu/ops/mla.h, core/cpu/ops/dsa_indexer.h) against direct
// double-precision restatements of the reference's math, at the released model's widths.
#include "core/cpu/ops/mla.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/cpu/ops/dsa_indexer.h"
#include "core/cpu/ops/norm.h"
#include "core/cpu/ops/rope.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

// GLM-5's per-head widths (qk_nope 192, qk_rope 64, v 256, kv_lora_rank 512), two heads.
MlaShape Glm5Shape() {
  MlaShape s;
  s.heads = 2;
  s.nope_dim = 192;
  s.rope_dim = 64;
  s.v_dim = 256;
  s.latent_dim = 512;
  s.index_dim = 128;
  s.scale = 1.0f / std::sqrt(256.0f);
  return s;
}

// The expanded (reference) form in double: per-head keys and values from the latent, then
// softmax attention over every causal position.
std::vector<double> ExpandedReference(const std::vector<float>& q, const std::vector<float>& w,
                                      const std::vector<float>& latent,
                                      const std::vector<float>& k_rot, int64_t ctx,
                                      const MlaShape& s) {
  const int64_t dn = s.nope_dim, dv = s.v_dim, r = s.latent_dim, dr = s.rope_dim;
  std::vector<double> out(ctx * s.heads * dv);
  for (int64_t h = 0; h < s.heads; ++h) {
    // k_nope[p] = W_uk[h] latent[p], v[p] = W_uv[h] latent[p]
    std::vector<double> k(ctx * dn), v(ctx * dv);
    for (int64_t p = 0; p < ctx; ++p) {
      for (int64_t i = 0; i < dn + dv; ++i) {
        double acc = 0;
        for (int64_t c = 0; c < r; ++c)
          acc += double(w[(h * (dn + dv) + i) * r + c]) * latent[p * r + c];
        (i < dn ? k[p * dn + i] : v[p * dv + i - dn]) = acc;
      }
    }
    for (int64_t t = 0; t < ctx; ++t) {
      const float* qt = q.data() + (t * s.heads + h) * (dn + dr);
      std::vector<double> score(t + 1);
      double mx = -1e300;
      for (int64_t p = 0; p <= t; ++p) {
        double acc = 0;
        for (int64_t i = 0; i < dn; ++i) acc += double(qt[i]) * k[p * dn + i];
        for (int64_t i = 0; i < dr; ++i) acc += double(qt[dn + i]) * k_rot[p * dr + i];
        score[p] = acc * s.scale;
        mx = std::max(mx, score[p]);
      }
      double sum = 0;
      for (double& x : score) sum += (x = std::exp(x - mx));
      for (int64_t p = 0; p <= t; ++p)
        for (int64_t d = 0; d < dv; ++d)
          out[(t * s.heads + h) * dv + d] += score[p] / sum * v[p * dv + d];
    }
  }
  return out;
}

// The absorbed form the engine runs (prefill and decode alike) reproduces the expanded one.
// The error printed here is the one docs/glm5.md quotes.
TEST(MlaTest, AbsorbedFormMatchesTheExpandedReference) {
  const MlaShape s = Glm5Shape();
  const int64_t ctx = 40, r = s.latent_dim, dr = s.rope_dim;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // kv_b_proj [H * (dn + dv), R], in the tested storage dtype.
    const std::vector<float> w32 =
        testing::RandomVector(s.heads * (s.nope_dim + s.v_dim) * r, 7, 0.05f);
    std::vector<uint16_t> w16(w32.size());
    std::vector<float> w_rounded(w32.size());
    for (size_t i = 0; i < w32.size(); ++i) {
      w16[i] = FloatToBf16(w32[i]);
      w_rounded[i] = dtype == DType::kBF16 ? Bf16ToFloat(w16[i]) : w32[i];
    }
    Matrix kv_b{dtype, s.heads * (s.nope_dim + s.v_dim), r,
                dtype == DType::kBF16 ? static_cast<const void*>(w16.data()) : w32.data()};
    const std::vector<float> q = testing::RandomVector(ctx * s.heads * s.qk_dim(), 8);
    const std::vector<float> latent = testing::RandomVector(ctx * r, 9);
    const std::vector<float> k_rot = testing::RandomVector(ctx * dr, 10);

    KvCacheShape shape{1, 1, s.row_width(), 4, 16, /*latent=*/true};
    KvCache cache(shape);
    BlockTable table;
    ASSERT_TRUE(cache.Reserve(&table, ctx).ok());
    std::reverse(table.begin(), table.end());  // non-contiguous blocks
    const std::vector<SequenceSlice> batch = {{ctx, 0, &table}};
    WriteLatentRows(latent.data(), k_rot.data(), nullptr, batch, s, 0, &cache);

    TopkSelection all;
    all.count.assign(ctx, -1);
    all.offset.assign(ctx, 0);
    std::vector<float> q_lat(s.heads * ctx * r), out_lat(s.heads * ctx * r);
    std::vector<float> out(ctx * s.heads * s.v_dim);
    AbsorbQuery(q.data(), ctx, AbsorbedKeyWeights(kv_b, s), s, q_lat.data());
    LatentAttention(q_lat.data(), q.data(), batch, cache, 0, all, s, out_lat.data());
    ExpandValues(out_lat.data(), ctx, kv_b, s, out.data());

    const std::vector<double> ref = ExpandedReference(q, w_rounded, latent, k_rot, ctx, s);
    double num = 0, den = 0, max_abs = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num += (out[i] - ref[i]) * (out[i] - ref[i]);
      den += ref[i] * ref[i];
      max_abs = std::max(max_abs, std::abs(out[i] - ref[i]));
    }
    const double rel = std::sqrt(num / den);
    std::printf("[ %s ] absorbed MLA vs expanded fp64 reference: relative %.3g, max abs %.3g\n",
                std::string(DTypeName(dtype)).c_str(), rel, max_abs);
    EXPECT_LT(rel, 2e-6) << DTypeName(dtype);
  }
}

// A query's attention covers exactly its selected positions: restricting to a selection
// equals attending over a cache that holds only those keys.
TEST(MlaTest, SelectionRestrictsTheAttendedPositions) {
  MlaShape s = Glm5Shape();
  s.latent_dim = 16;
  s.nope_dim = 8;
  s.rope_dim = 4;
  s.v_dim = 8;
  s.index_dim = 0;
  const int64_t ctx = 12, r = s.latent_dim;
  const std::vector<float> latent = testing::RandomVector(ctx * r, 1);
  const std::vector<float> k_rot = testing::RandomVector(ctx * s.rope_dim, 2);
  const std::vector<float> q = testing::RandomVector(s.heads * s.qk_dim(), 3);
  const std::vector<float> q_lat = testing::RandomVector(s.heads * r, 4);
  const std::vector<int32_t> chosen = {1, 4, 5, 9};

  KvCache full({1, 1, s.row_width(), 4, 4, true}), sub({1, 1, s.row_width(), 4, 4, true});
  BlockTable tf, ts;
  ASSERT_TRUE(full.Reserve(&tf, ctx).ok());
  ASSERT_TRUE(sub.Reserve(&ts, 4).ok());
  // The whole context, the last token (position 11) querying with a selection...
  std::vector<SequenceSlice> batch = {{ctx, 0, &tf}};
  WriteLatentRows(latent.data(), k_rot.data(), nullptr, batch, s, 0, &full);
  TopkSelection sel;
  sel.count = {4};
  sel.offset = {0};
  sel.positions = chosen;
  std::vector<float> a(s.heads * r), b(s.heads * r);
  LatentAttention(q_lat.data(), q.data(), {{1, ctx - 1, &tf}}, full, 0, sel, s, a.data());
  // ...equals position 3 of a cache holding only the chosen rows, attending to all.
  std::vector<float> lsub, rsub;
  for (int32_t p : chosen) {
    lsub.insert(lsub.end(), latent.begin() + p * r, latent.begin() + (p + 1) * r);
    rsub.insert(rsub.end(), k_rot.begin() + p * s.rope_dim, k_rot.begin() + (p + 1) * s.rope_dim);
  }
  WriteLatentRows(lsub.data(), rsub.data(), nullptr, {{4, 0, &ts}}, s, 0, &sub);
  TopkSelection all;
  all.count = {-1};
  all.offset = {0};
  LatentAttention(q_lat.data(), q.data(), {{1, 3, &ts}}, sub, 0, all, s, b.data());
  EXPECT_EQ(a, b);
}

TEST(DsaIndexerTest, TopkKeepsTheLargestWithTiesToTheLowerPosition) {
  const std::vector<float> scores = {0.5f, 0.f, 2.f, 0.f, 0.f, -1.f, 0.5f, 3.f};
  // 3.0 (7), 2.0 (2), 0.5 (0, 6): the top four; ascending.
  EXPECT_EQ(TopkPositions(scores.data(), 8, 4), (std::vector<int32_t>{0, 2, 6, 7}));
  // The 5th place is a three-way tie at 0: the lowest position (1) wins.
  EXPECT_EQ(TopkPositions(scores.data(), 8, 5), (std::vector<int32_t>{0, 1, 2, 6, 7}));
  EXPECT_EQ(TopkPositions(scores.data(), 8, 6), (std::vector<int32_t>{0, 1, 2, 3, 6, 7}));
  EXPECT_EQ(TopkPositions(scores.data(), 8, 1), (std::vector<int32_t>{7}));
}

// The indexer's scores, restated in double from the reference, pick the same keys; a query
// with at most topk causal keys keeps them all without scoring.
TEST(DsaIndexerTest, SelectionFollowsTheReferenceScores) {
  MlaShape mla;
  mla.latent_dim = 4;
  mla.rope_dim = 4;
  mla.index_dim = 16;
  IndexerShape s{/*heads=*/3, /*head_dim=*/16, /*rope_dim=*/4, /*topk=*/5};
  const int64_t ctx = 14;
  const std::vector<float> iq = testing::RandomVector(ctx * s.heads * s.head_dim, 11);
  const std::vector<float> ik = testing::RandomVector(ctx * s.head_dim, 12);
  const std::vector<float> w = testing::RandomVector(ctx * s.heads, 13);
  const std::vector<float> zeros(ctx * 4);
  KvCache cache({1, 1, mla.row_width(), 4, 4, true});
  BlockTable table;
  ASSERT_TRUE(cache.Reserve(&table, ctx).ok());
  const std::vector<SequenceSlice> batch = {{ctx, 0, &table}};
  WriteLatentRows(zeros.data(), zeros.data(), ik.data(), batch, mla, 0, &cache);
  TopkSelection sel;
  IndexerSelect(iq.data(), w.data(), batch, cache, 0, mla, s, &sel);
  ASSERT_EQ(sel.count.size(), static_cast<size_t>(ctx));
  for (int64_t t = 0; t < ctx; ++t) {
    if (t + 1 <= s.topk) {
      EXPECT_EQ(sel.count[t], -1) << t;
      continue;
    }
    ASSERT_EQ(sel.count[t], s.topk);
    std::vector<std::pair<double, int32_t>> ref;
    for (int64_t p = 0; p <= t; ++p) {
      double score = 0;
      for (int64_t h = 0; h < s.heads; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < s.head_dim; ++d)
          dot += double(iq[(t * s.heads + h) * s.head_dim + d]) * ik[p * s.head_dim + d];
        score += w[t * s.heads + h] * std::max(dot / std::sqrt(16.0), 0.0);
      }
      ref.push_back({-score, static_cast<int32_t>(p)});
    }
    std::sort(ref.begin(), ref.end());
    std::vector<int32_t> want;
    for (int64_t i = 0; i < s.topk; ++i) want.push_back(ref[i].second);
    std::sort(want.begin(), want.end());
    const std::vector<int32_t> got(sel.positions.begin() + sel.offset[t],
                                   sel.positions.begin() + sel.offset[t] + s.topk);
    EXPECT_EQ(got, want) << "query " << t;
  }
}

// apply_rotary_pos_emb_interleave: pairs (2i, 2i+1) rotate, results land de-interleaved.
TEST(RopeTest, InterleavedFormDeinterleavesRotatedPairs) {
  const int64_t dr = 8, stride = 12, offset = 3;
  RotaryEmbedding rope(dr, dr, 10000.0);
  const std::vector<float> x = testing::RandomVector(2 * stride, 21);
  std::vector<float> y = x;
  const int32_t positions[] = {0, 37};
  rope.ApplyInterleaved(y.data(), 2, 1, stride, offset, positions);
  for (int t = 0; t < 2; ++t) {
    const float* in = x.data() + t * stride + offset;
    const float* out = y.data() + t * stride + offset;
    for (int64_t i = 0; i < dr / 2; ++i) {
      const double angle = positions[t] * std::pow(10000.0, -2.0 * i / dr);
      EXPECT_NEAR(out[i], in[2 * i] * std::cos(angle) - in[2 * i + 1] * std::sin(angle), 1e-5);
      EXPECT_NEAR(out[i + dr / 2], in[2 * i + 1] * std::cos(angle) + in[2 * i] * std::sin(angle),
                  1e-5);
    }
    for (int64_t c = 0; c < offset; ++c) EXPECT_EQ(y[t * stride + c], x[t * stride + c]);
    for (int64_t c = offset + dr; c < stride; ++c) EXPECT_EQ(y[t * stride + c], x[t * stride + c]);
  }
}

TEST(NormTest, LayerNormMatchesItsDefinition) {
  const int64_t width = 37;
  const std::vector<float> x = testing::RandomVector(2 * width, 31, 3.0f);
  const std::vector<float> g = testing::RandomVector(width, 32);
  const std::vector<float> b = testing::RandomVector(width, 33);
  std::vector<float> y(x.size());
  LayerNorm(x.data(), g.data(), b.data(), 2, width, 1e-6f, y.data());
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < width; ++c) mean += x[r * width + c];
    mean /= width;
    for (int64_t c = 0; c < width; ++c)
      var += (x[r * width + c] - mean) * (x[r * width + c] - mean);
    var /= width;
    for (int64_t c = 0; c < width; ++c) {
      const double want = (x[r * width + c] - mean) / std::sqrt(var + 1e-6) * g[c] + b[c];
      EXPECT_NEAR(y[r * width + c], want, 1e-5);
    }
  }
}

}  // namespace
}  // namespace glmserve
