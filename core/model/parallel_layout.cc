#include "core/model/parallel_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace glmserve {

IndexRange SplitRange(int64_t extent, int64_t unit, int rank, int size) {
  const int64_t units = (extent + unit - 1) / unit;
  const int64_t u0 = units * rank / size, u1 = units * (rank + 1) / size;
  const int64_t begin = std::min(extent, u0 * unit), end = std::min(extent, u1 * unit);
  return {begin, end - begin};
}

ModelConfig RankLayout::LocalConfig(const ModelConfig& c) const {
  ModelConfig local = c;
  local.num_attention_heads = q_heads.count;
  if (!c.is_mla()) local.num_key_value_heads = kv_heads.count;
  return local;
}

absl::Status CheckParallelLayout(const ModelConfig& c, const ParallelConfig& p,
                                 int64_t width_unit) {
  const int n = p.tensor_parallel;
  if (n < 1 || n > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel size ", n, " is outside [1, 1024]"));
  }
  if (width_unit < 1) return absl::InvalidArgumentError("the FFN split unit must be positive");
  if (c.num_attention_heads % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel ", n, ": the ",
                                                   c.num_attention_heads,
                                                   " attention heads do not split evenly"));
  }
  const int64_t kv = c.num_key_value_heads;
  if (!c.is_mla() && kv % n != 0 && n % kv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel ", n, ": the ", kv,
                     " KV heads neither split evenly nor replicate evenly across the ranks"));
  }
  // o_proj's columns are cut by heads: with a scale block along them, each rank's heads must
  // cover whole blocks.
  const int64_t head_cols = (c.num_attention_heads / n) * (c.is_mla() ? c.v_head_dim : c.head_dim);
  if (width_unit > 1 && n > 1 && head_cols % width_unit != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel ", n, ": a rank's ", c.num_attention_heads / n, " heads are ",
                     head_cols, " columns of o_proj, not whole scale blocks of ", width_unit));
  }
  // Widths of fewer units than ranks are fine: the ranks past the last unit hold none of that
  // FFN (zero width) and add zeros to its sum.
  if (p.expert_parallel && c.n_routed_experts < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert parallel over ", n, " ranks needs at least ", n,
                     " routed experts, the model has ", c.n_routed_experts));
  }
  if (c.vocab_size < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel ", n, ": a vocabulary of ", c.vocab_size, " is too small"));
  }
  return absl::OkStatus();
}

RankLayout LayoutOf(const ModelConfig& c, const ParallelConfig& p, int rank, int64_t width_unit) {
  const int n = p.tensor_parallel;
  RankLayout l;
  l.rank = rank;
  l.size = n;
  l.width_unit = width_unit;
  const int64_t heads = c.num_attention_heads / n;
  l.q_heads = {rank * heads, heads};
  if (c.is_mla()) {
    l.kv_heads = {0, 1};  // the latent row, replicated
  } else if (c.num_key_value_heads % n == 0) {
    const int64_t kv = c.num_key_value_heads / n;
    l.kv_heads = {rank * kv, kv};
  } else {  // n a multiple of the KV heads: this rank's query heads read one KV head
    const int64_t group = c.num_attention_heads / c.num_key_value_heads;
    l.kv_heads = {l.q_heads.begin / group, 1};
  }
  l.vocab = SplitRange(c.vocab_size, 1, rank, n);
  l.expert_width_split = !p.expert_parallel;
  l.experts = p.expert_parallel ? SplitRange(c.n_routed_experts, 1, rank, n)
                                : IndexRange{0, c.n_routed_experts};
  return l;
}

std::string DescribeParallel(const ModelConfig& c, const ParallelConfig& p) {
  const int n = p.tensor_parallel;
  if (n == 1) return "one rank";
  const RankLayout first = LayoutOf(c, p, 0);
  std::string kv =
      c.is_mla() ? "the latent cache replicated on every rank"
      : c.num_key_value_heads % n == 0
          ? absl::StrCat(first.kv_heads.count, " KV heads per rank")
          : absl::StrCat("each of the ", c.num_key_value_heads, " KV heads replicated on ",
                         n / c.num_key_value_heads, " ranks");
  std::string experts =
      p.expert_parallel ? absl::StrCat("routed experts whole per rank (", c.n_routed_experts / n,
                                       c.n_routed_experts % n != 0
                                           ? absl::StrCat(" or ", c.n_routed_experts / n + 1)
                                           : std::string(),
                                       " each)")
                        : std::string("every routed expert's width split");
  return absl::StrCat("tensor parallel ", n, ": ", first.q_heads.count, " query heads per rank, ",
                      kv, ", ", experts, ", FFN widths, embedding and head split");
}

}  // namespace glmserve
