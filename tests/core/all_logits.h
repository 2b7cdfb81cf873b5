// Test helper: the logits of every token of a prompt, from one forward over a fresh cache.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/model/model_runner.h"

namespace glmserve::testing {

// [ids.size(), vocab] logits of `ids` run as one prefill through `runner` (any backend), over
// a fresh cache of `block_size`-token blocks; an empty vector, with a test failure, if the
// cache or the forward is refused.
inline std::vector<float> AllLogits(ModelRunner& runner, const std::vector<int32_t>& ids,
                                    int64_t block_size = 4) {
  const int64_t n = static_cast<int64_t>(ids.size());
  absl::StatusOr<std::unique_ptr<KvCache>> cache =
      runner.CreateCache((n + block_size - 1) / block_size + 1, block_size);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  BlockTable table;
  EXPECT_TRUE((*cache)->Reserve(&table, n).ok());
  ForwardBatch batch;
  batch.sequences = {{n, 0, &table}};
  batch.token_ids = ids;
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  const absl::Status s = runner.Forward(batch, cache->get(), options, &result);
  EXPECT_TRUE(s.ok()) << s;
  return result.logits;
}

}  // namespace glmserve::testing
