// The MTP layer's step (docs/mtp.md), the published formula for one draft position i:
//
//   e = embed(t[i+1])                    zero where the position i is 0, as the references do
//   x = eh_proj(concat(enorm(e), hnorm(h[i])))      [T, 2 hidden] -> [T, hidden]
//   x = decoder_layer(x)                 attention over the MTP layer's own cache layer, FFN
//   logits = head(shared_head.norm(x))   predicts t[i+2]
//
// h[i] is what the LM head read at position i: the model's final-normed hidden state, or, when
// drafts are chained, the MTP layer's own shared_head.norm output.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/embedding.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/norm.h"

namespace glmserve {

absl::Status CpuModel::ForwardMtp(const ForwardBatch& batch, KvCache* cache,
                                  const ForwardOptions& options, ForwardResult* result) {
  if (!mtp_enabled_) {
    return absl::FailedPreconditionError("the MTP layer is not enabled (ModelRunner::EnableMtp)");
  }
  if (options.layer_begin >= 0 || options.layer_end >= 0 || options.return_layer_hidden ||
      options.return_expert_choices) {
    return absl::InvalidArgumentError(
        "an MTP step takes no layer range, layer hidden states or expert choices");
  }
  RETURN_IF_ERROR(StepWantsLogits(batch, options).status());
  const ModelConfig& c = config();
  const int64_t t = batch.total_tokens();
  const int64_t hidden = c.hidden_size;
  if (static_cast<int64_t>(batch.hidden_in.size()) != t * hidden) {
    return absl::InvalidArgumentError(absl::StrCat("an MTP step takes the head inputs h [", t, ", ",
                                                   hidden, "] beside its tokens"));
  }
  ForwardBatch tokens_only = batch;  // the shared checks: tokens, positions, block tables
  tokens_only.hidden_in = {};
  RETURN_IF_ERROR(CheckBatch(tokens_only, *cache, 0, layer_end()));
  const MtpWeights& m = *weights_.mtp;
  const float eps = static_cast<float>(c.rms_norm_eps);
  ResizeBuffers(t);
  cat_.resize(t * 2 * hidden);
  const std::vector<int32_t> positions = BatchPositions(batch);

  // x_ = embed(t[i+1]) (zero at position 0); out_ = hnorm(h). Then cat_ = [enorm(x_) | out_].
  if (comm_ != nullptr) comm_status_ = comm_->health();
  Embed(batch.token_ids.data(), t, x_.data());
  for (int64_t i = 0; i < t; ++i) {
    if (positions[i] == 0) std::fill_n(x_.data() + i * hidden, hidden, 0.0f);
  }
  RmsNorm(x_.data(), m.enorm.data(), t, hidden, eps, x_.data());
  RmsNorm(batch.hidden_in.data(), m.hnorm.data(), t, hidden, eps, out_.data());
  for (int64_t i = 0; i < t; ++i) {
    std::copy_n(x_.data() + i * hidden, hidden, cat_.data() + i * 2 * hidden);
    std::copy_n(out_.data() + i * hidden, hidden, cat_.data() + i * 2 * hidden + hidden);
  }
  Linear(cat_.data(), t, m.eh_proj, nullptr, h_.data(), math_);  // [T, hidden]

  std::vector<int64_t> rows = ReturnedLogitRows(batch, options);
  int64_t live = t;
  const bool prune = !options.return_hidden && !options.return_head_input;
  const bool any = DecoderLayer(m.layer, num_span_layers(), batch, positions, cache, prune, &rows,
                                &live, nullptr);
  result->layer_hidden.clear();
  result->expert_choices.clear();
  if (options.return_hidden) {
    result->hidden.assign(h_.begin(), h_.begin() + t * hidden);  // h_ may hold more rows
  } else {
    result->hidden.clear();
  }
  if (!any) {
    result->logits.clear();
    result->head_input.clear();
    return comm_status_;
  }
  Head(rows, t, m.head_norm, m.head, options.return_head_input, result);
  return comm_status_;
}

}  // namespace glmserve
