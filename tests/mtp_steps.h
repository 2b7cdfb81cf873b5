// The MTP tests' common pass (tests/core/cpu/cpu_model_mtp_test.cc,
// tests/core/cuda/mtp_cuda_test.cc, tests/models/glm45_kjv_mtp_test.cc): the model over a prompt
// with every row's head input, then the MTP layer over the pairs (ids[i + 1], h[i]) at positions
// 0..n-2, which is what the references' mtp_logits rows hold. Model: anything with CreateCache,
// Forward and config() (a ModelRunner, a CudaModel); its MTP layer must be enabled.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve::testing {

struct MtpPass {
  std::vector<float> model_logits;    // [n, vocab] when asked for, else empty
  std::vector<float> mtp_logits;      // [n - 1, vocab]
  std::vector<float> mtp_head_input;  // [n - 1, hidden] when asked for, else empty
};

template <typename Model>
MtpPass RunModelThenMtp(Model& model, const std::vector<int32_t>& ids, bool model_logits,
                        bool mtp_head_input = false) {
  MtpPass pass;
  const int64_t n = static_cast<int64_t>(ids.size()), hidden = model.config().hidden_size;
  auto cache = model.CreateCache((n + 15) / 16, 16);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return pass;
  EXPECT_EQ((*cache)->shape().num_layers, model.config().num_hidden_layers + 1)
      << "the cache holds the MTP layer's keys and values as one more layer";
  BlockTable table;
  EXPECT_TRUE((*cache)->Reserve(&table, n).ok());
  ForwardBatch batch;
  batch.sequences = {{n, 0, &table}};
  batch.token_ids = ids;
  ForwardOptions options;
  options.logits = model_logits ? LogitsRows::kAll : LogitsRows::kNone;
  options.return_head_input = true;
  ForwardResult main;
  const absl::Status s = model.Forward(batch, cache->get(), options, &main);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(static_cast<int64_t>(main.head_input.size()), n * hidden);
  if (!s.ok() || static_cast<int64_t>(main.head_input.size()) != n * hidden) return pass;
  pass.model_logits = std::move(main.logits);

  const std::vector<int32_t> next(ids.begin() + 1, ids.end());
  const std::vector<float> h(main.head_input.begin(), main.head_input.end() - hidden);
  ForwardBatch mtp;
  mtp.sequences = {{n - 1, 0, &table}};
  mtp.token_ids = next;
  mtp.hidden_in = h;
  ForwardOptions mtp_options;
  mtp_options.mtp = true;
  mtp_options.logits = LogitsRows::kAll;
  mtp_options.return_head_input = mtp_head_input;
  ForwardResult out;
  const absl::Status m = model.Forward(mtp, cache->get(), mtp_options, &out);
  EXPECT_TRUE(m.ok()) << m;
  if (mtp_head_input) {
    EXPECT_EQ(static_cast<int64_t>(out.head_input.size()), (n - 1) * hidden);
  }
  pass.mtp_logits = std::move(out.logits);
  pass.mtp_head_input = std::move(out.head_input);
  return pass;
}

}  // namespace glmserve::testing
