// The fixture the bf16 attention tests share (attention_amx_test.cc, attention_bf16_test.cc):
// a cache holding sequences' full K/V histories, the query rows of a batch over them, and the
// float64 attention on bf16-rounded operands that both arithmetics approximate.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/base/dtype.h"
#include "core/cpu/ops/attention.h"
#include "core/cpu/ops/linear.h"
#include "core/model/kv_cache.h"
#include "tests/test_util.h"

namespace glmserve::testing {

// PagedAttention's signature: PagedAttentionAmx, PagedAttentionBf16.
using AttentionFn = void (*)(const float* q, absl::Span<const SequenceSlice> batch,
                             const KvCache& cache, int64_t layer, int64_t heads, float scale,
                             float* out);

struct AttentionFixture {
  AttentionFn fn;
  int64_t heads, kv_heads, head_dim;
  KvCache cache;
  std::vector<BlockTable> tables;
  std::vector<std::vector<float>> keys, values;  // per sequence [context, kv_dim]
  std::vector<SequenceSlice> batch;
  std::vector<float> q;  // [total, heads, head_dim]

  // seqs: (cached tokens, new tokens) per sequence; every position random, q scaled by 2.
  AttentionFixture(AttentionFn f, int64_t h, int64_t kvh, int64_t hd, int64_t block_size,
                   const std::vector<std::pair<int64_t, int64_t>>& seqs, uint32_t seed)
      : fn(f),
        heads(h),
        kv_heads(kvh),
        head_dim(hd),
        cache(KvCacheShape{1, kvh, hd, block_size, 4096 / block_size + 64}),
        tables(seqs.size()) {
    const int64_t kv_dim = kv_heads * head_dim;
    int64_t total = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto [cached, fresh] = seqs[i];
      BlockTable spare;  // tables not contiguous
      EXPECT_TRUE(cache.Reserve(&spare, 1).ok());
      EXPECT_TRUE(cache.Reserve(&tables[i], cached + fresh).ok());
      keys.push_back(RandomVector((cached + fresh) * kv_dim, seed++));
      values.push_back(RandomVector((cached + fresh) * kv_dim, seed++));
      batch.push_back({fresh, cached, &tables[i]});
      total += fresh;
    }
    Write();
    q = RandomVector(total * heads * head_dim, seed++, 2.0f);
  }
  // Every position of every sequence into the cache (the cached part as an earlier step would
  // have written it; again after a test edits keys or values).
  void Write() {
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceSlice all{batch[i].start_position + batch[i].num_tokens, 0, &tables[i]};
      WriteKv(keys[i].data(), values[i].data(), {all}, 0, &cache);
    }
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
  std::vector<float> Run() const { return RunOn(cache); }
  // fn over another cache with the same shape and block ids (Bf16Cache).
  std::vector<float> RunOn(const KvCache& other) const {
    std::vector<float> out(q.size(), NAN);
    fn(q.data(), batch, other, 0, heads, scale(), out.data());
    return out;
  }
  // The same keys and values written into a bf16 cache (KvCacheShape::bf16) at the same block
  // ids: what a bf16 cache holds for them.
  KvCache Bf16Cache() const {
    KvCacheShape shape = cache.shape();
    shape.bf16 = true;
    KvCache bf16(shape);
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceSlice all{batch[i].start_position + batch[i].num_tokens, 0, &tables[i]};
      WriteKv(keys[i].data(), values[i].data(), {all}, 0, &bf16);
    }
    return bf16;
  }
};

// The kernel forms this machine can run, each set up by Use(): the portable code, AVX2 (as a CPU
// without AVX-512 runs, ForceAvx2Kernels) where the CPU has it, and the CPU's own where that is
// more (AVX-512, AVX512_BF16, AMX).
struct KernelForm {
  const char* name;
  bool generic, avx2;
  void Use() const {
    internal::ForceGenericKernels(generic);
    internal::ForceAvx2Kernels(avx2);
  }
  static void Reset() { KernelForm{"native", false, false}.Use(); }
};
inline std::vector<KernelForm> KernelForms() {
  std::vector<KernelForm> forms = {{"portable", true, false}};
  if (internal::CpuHasAvx2Fma()) forms.push_back({"avx2", false, true});
  if (internal::CpuHasAvx512()) forms.push_back({"native", false, false});
  return forms;
}

// A bf16 cache gives an attention that rounds K and V to bf16 itself (PagedAttentionBf16,
// PagedAttentionAmx) the fp32 cache's bits, for every case of `cases` ((heads, KV heads, head
// dim, block size), sequences) in the form this machine runs and the portable one.
struct CacheCase {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached tokens, new tokens)
};
inline void ExpectTheBf16CacheGivesTheFp32CachesBits(AttentionFn fn,
                                                     const std::vector<CacheCase>& cases) {
  uint32_t seed = 7000;
  for (const KernelForm& form : KernelForms()) {
    form.Use();
    for (const CacheCase& c : cases) {
      const AttentionFixture s(fn, c.heads, c.kv_heads, c.head_dim, c.block_size, c.seqs,
                               seed += 10);
      const std::vector<float> fp32 = s.Run(), bf16 = s.RunOn(s.Bf16Cache());
      ASSERT_EQ(fp32.size(), bf16.size());
      for (size_t i = 0; i < fp32.size(); ++i) {
        ASSERT_EQ(std::memcmp(&fp32[i], &bf16[i], sizeof(float)), 0)
            << form.name << " form, head_dim " << c.head_dim << ", element " << i << ": " << bf16[i]
            << " against " << fp32[i];
      }
    }
  }
  KernelForm::Reset();
}

// Float64 attention on the bf16-rounded q, K and V: what both bf16 arithmetics promise up to
// fp32 accumulation, the exp polynomial and the probabilities' bf16 rounding.
inline std::vector<float> Bf16OperandsReference(const AttentionFixture& s) {
  const int64_t hd = s.head_dim, kv_dim = s.kv_heads * hd, group = s.heads / s.kv_heads;
  auto b = [](float x) { return static_cast<double>(Bf16ToFloat(FloatToBf16(x))); };
  std::vector<float> ref(s.q.size());
  int64_t row = 0;
  for (size_t i = 0; i < s.batch.size(); ++i) {
    for (int64_t t = 0; t < s.batch[i].num_tokens; ++t, ++row) {
      const int64_t pos = s.batch[i].start_position + t;
      for (int64_t h = 0; h < s.heads; ++h) {
        const float* qv = s.q.data() + (row * s.heads + h) * hd;
        const int64_t off = (h / group) * hd;
        std::vector<double> w(pos + 1);
        double mx = -INFINITY, sum = 0;
        for (int64_t p = 0; p <= pos; ++p) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += b(qv[e]) * b(s.keys[i][p * kv_dim + off + e]);
          w[p] = d * s.scale();
          mx = std::max(mx, w[p]);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t p = 0; p <= pos; ++p) o += w[p] / sum * b(s.values[i][p * kv_dim + off + e]);
          ref[(row * s.heads + h) * hd + e] = static_cast<float>(o);
        }
      }
    }
  }
  return ref;
}

// The arithmetic is per row: a 75-token prompt (12 query heads of 64 over one KV head) gives
// the same bits in one call as in chunks of 1, 7, 32 and 40 tokens, each after another slice
// of 9 rows (another view of the same cache, positions 3..11), as the engine batches sequences.
inline void ExpectChunksGiveTheWholePromptsBits(AttentionFn fn) {
  const int64_t heads = 12, kv_heads = 1, head_dim = 64, n = 75;
  const AttentionFixture whole(fn, heads, kv_heads, head_dim, 16, {{0, n}}, 900);
  const std::vector<float> ref = whole.Run();
  const int64_t width = heads * head_dim;
  for (const int64_t chunk : {1, 7, 32, 40}) {
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      const std::vector<SequenceSlice> batch = {{9, 3, &whole.tables[0]},
                                                {len, start, &whole.tables[0]}};
      std::vector<float> q = RandomVector(9 * width, 77 + chunk);
      q.insert(q.end(), whole.q.begin() + start * width, whole.q.begin() + (start + len) * width);
      std::vector<float> out(q.size(), NAN);
      fn(q.data(), batch, whole.cache, 0, heads, whole.scale(), out.data());
      ASSERT_EQ(0, std::memcmp(out.data() + 9 * width, ref.data() + start * width,
                               len * width * sizeof(float)))
          << "chunk " << chunk << " start " << start;
    }
  }
}

}  // namespace glmserve::testing
