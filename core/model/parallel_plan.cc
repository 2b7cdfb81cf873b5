#include "core/model/parallel_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/model/checkpoint.h"
#include "core/model/gpu_memory_plan.h"
#include "core/model/weights.h"

namespace glmserve {
namespace {

std::string Gb(int64_t bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

IndexRange Whole(int64_t n) { return {0, n}; }

// `count` consecutive items of `size` elements each from item `begin`.
IndexRange Scaled(const IndexRange& items, int64_t size) {
  return {items.begin * size, items.count * size};
}

// Blocks of side b that [r.begin, r.end()) touches: a slice cut inside a block keeps that
// block's scale.
int64_t BlocksTouched(const IndexRange& r, int64_t b) {
  if (r.count == 0) return 0;
  return (r.end() + b - 1) / b - r.begin / b;
}

bool IsHeadName(const std::string& name) {
  return name == "lm_head.weight" || absl::EndsWith(name, ".shared_head.head.weight");
}

bool IsFp8(const ModelConfig& config, const PlanWeightForm& form, const WeightSlot& slot) {
  if (!form.fp8 || slot.matrix == nullptr) return false;
  if (form.converted_at_load) {
    // core/cpu/quantize.cc: ModelWeights::LinearMatrices but the heads (a tied head is the
    // embedding's slot, marked linear where it fills lm_head).
    return slot.linear && !IsHeadName(slot.name) && slot.name != "model.embed_tokens.weight";
  }
  return !Fp8PresetKeepsUnquantized(config, slot.name);
}

// The bytes of `slice` of `slot`, and how many of them every rank holds alike.
RankWeightBytes SliceBytes(const ModelConfig& config, const PlanWeightForm& form,
                           const WeightSlot& slot, const SlotSlice& s) {
  RankWeightBytes b;
  if (s.empty()) return b;
  if (slot.vector != nullptr) {
    b.total = s.rows.count * int64_t{sizeof(float)};  // 1-D parameters are widened to fp32
  } else if (!IsFp8(config, form, slot)) {
    b.total = s.rows.count * s.cols.count * DTypeSize(form.dtype);
  } else {
    const int64_t scales = form.fp8_block > 0 ? BlocksTouched(s.rows, form.fp8_block) *
                                                    BlocksTouched(s.cols, form.fp8_block)
                                              : s.rows.count;
    b.total = s.rows.count * s.cols.count + scales * int64_t{sizeof(float)};
    // Split by columns with a scale per row: every rank keeps every row's scale.
    if (form.fp8_block == 0 && !s.whole_on_every_rank && s.cols.count < slot.shape[1]) {
      b.replicated = scales * int64_t{sizeof(float)};
    }
  }
  if (s.whole_on_every_rank) b.replicated = b.total;
  return b;
}

RankWeightBytes SumSlices(const ModelConfig& config, const RankLayout& layout,
                          const PlanWeightForm& form, const std::vector<WeightSlot>& slots) {
  RankWeightBytes sum;
  for (const WeightSlot& slot : slots) {
    const RankWeightBytes b = SliceBytes(config, form, slot, SliceOfSlot(config, layout, slot));
    sum.total += b.total;
    sum.replicated += b.replicated;
  }
  return sum;
}

// The prepared whole model whose slots the plan walks (with the MTP layer when loaded).
ModelWeights PreparedModel(const ModelConfig& config, const PlanWeightForm& form) {
  ModelWeights w;
  PrepareWeights(config, 0, config.num_hidden_layers, &w);
  if (form.mtp) {
    PrepareMtp(&w);
    w.mtp_head_stored = form.mtp_head_stored;
  }
  return w;
}

// "0-3,6"
std::string RankList(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(i == j ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace

std::string PlanWeightForm::Describe() const {
  std::string text = !fp8             ? std::string(DTypeName(dtype))
                     : fp8_block == 0 ? std::string("FP8 per-channel")
                                      : absl::StrCat("FP8 ", fp8_block, "x", fp8_block, " blocks");
  if (fp8 && converted_at_load) absl::StrAppend(&text, " (converted at load)");
  if (mtp) absl::StrAppend(&text, ", MTP layer included");
  return text;
}

PlanWeightForm PresetWeightForm(const ModelConfig& config, bool fp8) {
  PlanWeightForm f;
  f.fp8 = fp8;
  f.fp8_block = fp8 && config.is_mla() ? kFp8PresetBlock : 0;
  f.mtp = config.num_nextn_predict_layers >= 1;
  return f;
}

SlotSlice SliceOfSlot(const ModelConfig& c, const RankLayout& l, const WeightSlot& slot) {
  const std::string& name = slot.name;
  const int64_t rows = slot.shape[0];
  const int64_t cols = slot.vector != nullptr ? 1 : slot.shape[1];
  const auto by_rows = [&](IndexRange r) { return SlotSlice{r, Whole(cols)}; };
  const auto by_cols = [&](IndexRange r) { return SlotSlice{Whole(rows), r}; };
  const SlotSlice replicated{Whole(rows), Whole(cols), true};

  if (name == "model.embed_tokens.weight" || IsHeadName(name)) return by_rows(l.vocab);
  if (absl::StrContains(name, ".self_attn.")) {
    if (c.is_mla()) {
      if (absl::EndsWith(name, "self_attn.q_b_proj.weight")) {
        return by_rows(Scaled(l.q_heads, c.qk_head_dim()));
      }
      if (absl::EndsWith(name, "self_attn.kv_b_proj.weight")) {
        return by_rows(Scaled(l.q_heads, c.qk_nope_head_dim + c.v_head_dim));
      }
      if (absl::EndsWith(name, "self_attn.o_proj.weight")) {
        return by_cols(Scaled(l.q_heads, c.v_head_dim));
      }
      return replicated;  // q_a / kv_a projections and norms, the DSA indexer
    }
    if (absl::EndsWith(name, "self_attn.q_proj.weight") ||
        absl::EndsWith(name, "self_attn.q_proj.bias")) {
      return by_rows(Scaled(l.q_heads, c.head_dim));
    }
    for (const char* kv : {"self_attn.k_proj.", "self_attn.v_proj."}) {
      if (absl::StrContains(name, kv)) return by_rows(Scaled(l.kv_heads, c.head_dim));
    }
    if (absl::EndsWith(name, "self_attn.o_proj.weight")) {
      return by_cols(Scaled(l.q_heads, c.head_dim));
    }
    return replicated;  // q_norm, k_norm
  }
  if (slot.expert >= 0) {
    if (!l.expert_width_split) {
      const bool held = slot.expert >= l.experts.begin && slot.expert < l.experts.end();
      return held ? SlotSlice{Whole(rows), Whole(cols)} : SlotSlice{{0, 0}, {0, 0}};
    }
    return slot.part == ExpertPart::kDown ? by_cols(l.ExpertWidth(c)) : by_rows(l.ExpertWidth(c));
  }
  for (const auto& [prefix, width] : {std::tuple{".mlp.shared_experts.", l.SharedWidth(c)},
                                      std::tuple{".mlp.", l.DenseWidth(c)}}) {
    for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
      if (absl::EndsWith(name, absl::StrCat(prefix, part))) return by_rows(width);
    }
    if (absl::EndsWith(name, absl::StrCat(prefix, "down_proj.weight"))) return by_cols(width);
  }
  // The norms, the router and its correction bias, the MTP layer's eh_proj.
  return replicated;
}

RankWeightBytes RankWeights(const ModelConfig& config, const RankLayout& layout,
                            const PlanWeightForm& form) {
  ModelWeights w = PreparedModel(config, form);
  return SumSlices(config, layout, form, ListWeightSlots(&w));
}

int64_t RankKvBytesPerToken(const ModelConfig& c, const RankLayout& l, int64_t cache_layers,
                            bool fp8_kv) {
  if (c.is_mla()) return cache_layers * c.cache_values_per_token_layer() * 2;
  if (fp8_kv) return cache_layers * 2 * l.kv_heads.count * (c.head_dim + 4);
  return cache_layers * 2 * l.kv_heads.count * c.head_dim * 2;
}

int64_t RankActivationArenaBytes(const ModelConfig& c, const RankLayout& l,
                                 int64_t max_batch_tokens, int64_t max_running) {
  const ModelConfig local = l.LocalConfig(c);
  const int64_t routed = std::min(c.num_experts_per_tok, l.experts.count);
  const int64_t ffn =
      std::max(l.DenseWidth(c).count, l.ExpertWidth(c).count * routed +
                                          (c.n_shared_experts > 0 ? l.SharedWidth(c).count : 0));
  const int64_t per_token = 2 * c.hidden_size + local.q_dim() + 2 * local.kv_dim() + local.q_dim() +
                            2 * ffn + c.hidden_size;
  return (max_batch_tokens * per_token + max_running * c.vocab_size) * int64_t{sizeof(float)};
}

int64_t ParallelPlan::TotalWeightBytes() const {
  int64_t total = 0;
  for (const RankPlan& r : ranks) total += r.weights.total;
  return total;
}

std::string ParallelPlan::Describe() const {
  const ParallelPlanRequest& q = request;
  std::string out = absl::StrFormat(
      "devices: %d x %s, tensor parallel %d (one rank per device), --gpu_memory_fraction=%g: "
      "%s per rank\n",
      q.devices, Gb(q.device_bytes), q.devices, q.gpu_memory_fraction,
      Gb(ranks.empty() ? 0 : ranks[0].budget_bytes));
  absl::StrAppend(&out, "weights: ", q.form.Describe(), "; ", Gb(TotalWeightBytes()),
                  " over all ranks\n", "layout: ", layout, "\n");
  absl::StrAppend(&out, absl::StrFormat("%-8s  %10s  %13s  %8s  %10s  %11s  %14s  %13s\n", "ranks",
                                        "weights GB", "replicated GB", "arena GB", "reserve GB",
                                        "KV cache GB", "KV bytes/token", "own KV tokens"));
  // One row per kind of rank, in the order of their first rank.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, std::vector<int>> kinds;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> order;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankPlan& r = ranks[i];
    const auto key = std::tuple{r.weights.total, r.weights.replicated, r.activation_bytes,
                                r.kv_bytes_per_token, r.own_kv_tokens};
    if (kinds[key].empty()) order.push_back(key);
    kinds[key].push_back(static_cast<int>(i));
  }
  for (const auto& key : order) {
    const RankPlan& r = ranks[static_cast<size_t>(kinds[key].front())];
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%-8s  %10.2f  %13.2f  %8.2f  %10.2f  %11.2f  %14d  %13d\n", RankList(kinds[key]),
                  r.weights.total / 1e9, r.weights.replicated / 1e9, r.activation_bytes / 1e9,
                  r.reserve_bytes / 1e9, r.kv_bytes / 1e9, r.kv_bytes_per_token, r.own_kv_tokens));
  }
  absl::StrAppend(&out, "KV tokens: ", kv_tokens, " (", kv_blocks, " blocks of ", q.block_size,
                  "), the fewest any rank holds (rank ", limiting_rank, ")\n");
  return out;
}

absl::StatusOr<ParallelPlan> PlanParallelMemory(const ModelConfig& config,
                                                const ParallelPlanRequest& q) {
  if (!(q.gpu_memory_fraction > 0.0 && q.gpu_memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_memory_fraction=", q.gpu_memory_fraction, " must be in (0, 1]"));
  }
  if (q.device_bytes <= 0 || q.block_size <= 0 || q.min_kv_tokens < 0 || q.reserve_bytes < 0 ||
      q.max_batch_tokens < 0 || q.max_running < 0) {
    return absl::InvalidArgumentError(
        "plan request: device bytes and block size must be > 0, the other sizes >= 0");
  }
  if (q.fp8_kv && config.is_mla()) {
    return absl::InvalidArgumentError("an FP8 KV cache is GLM-4.5's only (GQA), not GLM-5's");
  }
  const ParallelConfig parallel{q.devices, q.expert_parallel};
  const int64_t unit = q.form.width_unit();
  RETURN_IF_ERROR(CheckParallelLayout(config, parallel, unit));

  ParallelPlan plan;
  plan.request = q;
  plan.layout = DescribeParallel(config, parallel);
  ModelWeights w = PreparedModel(config, q.form);
  const std::vector<WeightSlot> slots = ListWeightSlots(&w);
  const int64_t cache_layers = config.num_hidden_layers + (q.form.mtp && q.mtp_cache ? 1 : 0);
  const int64_t budget =
      static_cast<int64_t>(std::floor(static_cast<double>(q.device_bytes) * q.gpu_memory_fraction));
  int worst = -1, short_ranks = 0;
  int64_t worst_short = 0;
  for (int rank = 0; rank < q.devices; ++rank) {
    RankPlan r;
    r.layout = LayoutOf(config, parallel, rank, unit);
    r.budget_bytes = budget;
    r.weights = SumSlices(config, r.layout, q.form, slots);
    r.activation_bytes =
        RankActivationArenaBytes(config, r.layout, q.max_batch_tokens, q.max_running);
    r.reserve_bytes = q.reserve_bytes;
    r.kv_bytes_per_token = RankKvBytesPerToken(config, r.layout, cache_layers, q.fp8_kv);
    const int64_t fixed = r.weights.total + r.activation_bytes + r.reserve_bytes;
    const int64_t shortfall = fixed + q.min_kv_tokens * r.kv_bytes_per_token - budget;
    if (shortfall > 0) {
      ++short_ranks;
      if (shortfall > worst_short) worst_short = shortfall, worst = rank;
    }
    r.own_kv_tokens =
        fixed < budget ? (budget - fixed) / r.kv_bytes_per_token / q.block_size * q.block_size : 0;
    plan.ranks.push_back(r);
  }
  if (worst >= 0) {
    const RankPlan& r = plan.ranks[static_cast<size_t>(worst)];
    const int64_t min_kv = q.min_kv_tokens * r.kv_bytes_per_token;
    const int64_t need = r.weights.total + r.activation_bytes + r.reserve_bytes + min_kv;
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model does not fit ", q.devices, " x ", Gb(q.device_bytes), ": rank ", worst, " of ",
        q.devices, " needs weights ", Gb(r.weights.total), " + activations ",
        Gb(r.activation_bytes), " + reserve ", Gb(r.reserve_bytes), " + KV cache for ",
        q.min_kv_tokens, " tokens ", Gb(min_kv), " = ", Gb(need), ", but its budget is ",
        Gb(budget), " (--gpu_memory_fraction=", q.gpu_memory_fraction, " of ", Gb(q.device_bytes),
        "): short by ", Gb(worst_short), "; ", short_ranks, " of ", q.devices,
        " ranks are short; the weights total ", Gb(plan.TotalWeightBytes()), " (",
        q.form.Describe(), "); ", plan.layout));
  }
  plan.kv_tokens = plan.ranks[0].own_kv_tokens;
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    if (plan.ranks[i].own_kv_tokens < plan.kv_tokens) {
      plan.kv_tokens = plan.ranks[i].own_kv_tokens;
      plan.limiting_rank = static_cast<int>(i);
    }
  }
  if (plan.kv_tokens == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV cache would hold no token on rank ",
                                                     plan.limiting_rank, " (budget ", Gb(budget),
                                                     ")"));
  }
  plan.kv_blocks = plan.kv_tokens / q.block_size;
  for (RankPlan& r : plan.ranks) r.kv_bytes = plan.kv_tokens * r.kv_bytes_per_token;
  return plan;
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices='", text, "': ", why,
                     "; expected COUNTxSIZE such as 8x80GB, 4x141GB, 2x80GiB or 8xH200"));
  };
  const std::string spec = absl::AsciiStrToLower(text);
  const size_t x = spec.find('x');
  if (x == std::string::npos) return bad("no 'x' between the count and the size");
  DeviceSpec d;
  if (!absl::SimpleAtoi(spec.substr(0, x), &d.count) || d.count < 1 || d.count > 1024) {
    return bad("the count must be a whole number in [1, 1024]");
  }
  const std::string size = spec.substr(x + 1);
  if (size == "h200") {
    d.bytes = kH200Bytes;
    return d;
  }
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"gib", 1073741824.0}, {"mib", 1048576.0}, {"tib", 1099511627776.0},
      {"gb", 1e9},           {"mb", 1e6},        {"tb", 1e12}};
  for (const auto& [suffix, scale] : kUnits) {
    if (!absl::EndsWith(size, suffix)) continue;
    const std::string number = size.substr(0, size.size() - std::string(suffix).size());
    double value = 0;
    // Digits and one point only: no signs, exponents, "inf" or "nan".
    if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos ||
        !absl::SimpleAtod(number, &value)) {
      return bad(absl::StrCat("'", number, "' is not a number"));
    }
    const double bytes = value * scale;
    if (!(bytes >= 1e6 && bytes <= 1e15)) return bad("the size must be between 1 MB and 1 PB");
    d.bytes = static_cast<int64_t>(std::llround(bytes));
    return d;
  }
  return bad("the size needs a unit (GB, GiB, MB, MiB, TB, TiB) or a device name (H200)");
}

}  // namespace glmserve
