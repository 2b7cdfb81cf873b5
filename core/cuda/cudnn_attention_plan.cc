#include "core/cuda/cudnn_attention_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace glmserve::cuda {

int64_t BucketUp(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

void CudnnAttentionBatch::Write(int32_t* out) const {
  const auto put = [&out](const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(out, v.data(), v.size() * sizeof(int32_t));
    out += v.size();
  };
  put(seq_len_q);
  put(seq_len_kv);
  put(ragged);
  put(page_table);
}

bool BuildCudnnAttentionBatch(const StepPlan& plan, int64_t block_size, int64_t row_elems,
                              CudnnAttentionBatch* out, std::string* why) {
  struct Seq {
    int64_t row0, num_q, pos0, bt_offset, kv_len;
  };
  std::vector<Seq> seqs;
  int64_t next_row = 0;
  for (int64_t t = 0; t < plan.num_tiles; ++t) {
    const int32_t* tile = plan.tiles.data() + t * kAttentionTileInts;
    const int64_t row0 = tile[0], num_q = tile[1], pos0 = tile[2], bt = tile[3], kv = tile[4];
    if (kv <= 0) {
      *why = "the step has padding rows (a CUDA-graph step)";
      return false;
    }
    if (row0 != next_row || num_q <= 0 || kv != pos0 + num_q) {
      *why = absl::StrCat("attention tile ", t, " is not the next rows of a sequence");
      return false;
    }
    next_row = row0 + num_q;
    if (!seqs.empty() && seqs.back().bt_offset == bt &&
        seqs.back().pos0 + seqs.back().num_q == pos0) {
      seqs.back().num_q += num_q;  // the same sequence's next tile
      seqs.back().kv_len = kv;
    } else {
      seqs.push_back({row0, num_q, pos0, bt, kv});
    }
  }
  if (seqs.empty()) {
    *why = "the step has no attention rows";
    return false;
  }
  if (next_row * row_elems > std::numeric_limits<int32_t>::max()) {
    *why = "the step's query elements exceed int32 ragged offsets";
    return false;
  }
  int64_t max_q = 0;
  int64_t max_pages = 0;
  for (const Seq& s : seqs) {
    max_q = std::max(max_q, s.num_q);
    max_pages = std::max(max_pages, (s.kv_len + block_size - 1) / block_size);
  }
  CudnnAttentionBatch& b = *out;
  b.key = {BucketUp(static_cast<int64_t>(seqs.size())), BucketUp(max_q), BucketUp(max_pages)};
  b.sequences = static_cast<int64_t>(seqs.size());
  const int64_t n = b.key.batch;
  b.seq_len_q.assign(n, 0);
  b.seq_len_kv.assign(n, 1);  // bucket padding: no query rows, one (masked-in) key on page 0
  b.ragged.assign(n + 1, static_cast<int32_t>(next_row * row_elems));
  b.page_table.assign(n * b.key.max_pages, 0);
  for (int64_t i = 0; i < b.sequences; ++i) {
    const Seq& s = seqs[i];
    b.seq_len_q[i] = static_cast<int32_t>(s.num_q);
    b.seq_len_kv[i] = static_cast<int32_t>(s.kv_len);
    b.ragged[i] = static_cast<int32_t>(s.row0 * row_elems);
    const int64_t pages = (s.kv_len + block_size - 1) / block_size;
    if (s.bt_offset + pages > static_cast<int64_t>(plan.block_tables.size())) {
      *why = absl::StrCat("sequence ", i, "'s block table is shorter than its context");
      return false;
    }
    std::copy(plan.block_tables.begin() + s.bt_offset,
              plan.block_tables.begin() + s.bt_offset + pages,
              b.page_table.begin() + i * b.key.max_pages);
  }
  return true;
}

}  // namespace glmserve::cuda
