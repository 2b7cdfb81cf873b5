// The request rules every backend shares (core/model/forward_types.h): which rows get logits, the
// run-span checks and the per-sequence logits options.
#include "core/model/forward_types.h"

#include <gtest/gtest.h>

namespace glmserve {
namespace {

ForwardBatch ThreeSequences(const BlockTable* table) {
  ForwardBatch batch;
  batch.sequences = {{3, 0, table}, {1, 5, table}, {2, 9, table}};  // rows 0-2, 3, 4-5
  return batch;
}

TEST(ReturnedLogitRows, OnePolicyForTheBatch) {
  const BlockTable table = {0, 1, 2};
  const ForwardBatch batch = ThreeSequences(&table);
  ForwardOptions o;
  o.logits = LogitsRows::kLast;
  EXPECT_EQ(ReturnedLogitRows(batch, o), (std::vector<int64_t>{2, 3, 5}));
  o.logits = LogitsRows::kAll;
  EXPECT_EQ(ReturnedLogitRows(batch, o), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  o.logits = LogitsRows::kNone;
  EXPECT_TRUE(ReturnedLogitRows(batch, o).empty());
}

TEST(ReturnedLogitRows, PerSequenceOverridesInBatchOrder) {
  const BlockTable table = {0, 1, 2};
  const ForwardBatch batch = ThreeSequences(&table);
  ForwardOptions o;
  o.logits = LogitsRows::kNone;  // ignored when sequence_logits is set
  o.sequence_logits = {LogitsRows::kAll, LogitsRows::kNone, LogitsRows::kLast};
  ASSERT_TRUE(*StepWantsLogits(batch, o));
  EXPECT_EQ(ReturnedLogitRows(batch, o), (std::vector<int64_t>{0, 1, 2, 5}));
  o.sequence_logits = {LogitsRows::kNone, LogitsRows::kNone, LogitsRows::kNone};
  EXPECT_FALSE(*StepWantsLogits(batch, o));
  EXPECT_TRUE(ReturnedLogitRows(batch, o).empty());
  o.sequence_logits = {LogitsRows::kLast};  // one entry for three sequences
  EXPECT_EQ(StepWantsLogits(batch, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateSampleRequests, OneRequestPerRowAndSoundPenalisedIds) {
  const BlockTable table = {0, 1, 2};
  const ForwardBatch batch = ThreeSequences(&table);
  ForwardOptions o;
  o.logits = LogitsRows::kLast;                             // three rows
  EXPECT_TRUE(ValidateSampleRequests(batch, o, 100).ok());  // no requests: nothing to check
  RowSampleRequest sampled;
  sampled.sample = true;
  sampled.params.penalised_begin = 1;
  sampled.params.penalised_count = 2;
  o.penalised_ids = {7, 3, 9};
  o.sample = {RowSampleRequest{}, sampled, RowSampleRequest{}};
  EXPECT_TRUE(ValidateSampleRequests(batch, o, 100).ok());
  auto refused = [&](const char* what) {
    const absl::Status s = ValidateSampleRequests(batch, o, 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
  };
  o.sample.pop_back();
  refused("two requests for three rows");
  o.sample.push_back(RowSampleRequest{});
  o.sample[1].params.penalised_count = 3;
  refused("the id range runs past the array");
  o.sample[1].params.penalised_count = 2;
  o.sample[1].params.penalised_begin = -1;
  refused("a negative start");
  o.sample[1].params.penalised_begin = 0;
  refused("ids not ascending (7 then 3)");
  o.sample[1].params.penalised_begin = 1;
  o.sample[1].params.columns = 5;
  refused("an id (9) beyond the row's columns");
  o.sample[1].params.columns = 0;
  EXPECT_TRUE(ValidateSampleRequests(batch, o, 100).ok());
  EXPECT_EQ(ValidateSampleRequests(batch, o, 9).code(), absl::StatusCode::kInvalidArgument)
      << "an id (9) beyond the vocabulary";
  o.sample[1].sample = false;  // an unsampled row's params are not read
  EXPECT_TRUE(ValidateSampleRequests(batch, o, 9).ok());
}

TEST(ValidateRunSpan, LogitsNeedTheLastLayer) {
  EXPECT_TRUE(ValidateRunSpan(0, 4, 0, 4, 4, /*wants_logits=*/true).ok());
  EXPECT_FALSE(ValidateRunSpan(0, 2, 0, 4, 4, true).ok());
  EXPECT_TRUE(ValidateRunSpan(0, 2, 0, 4, 4, false).ok());
}

}  // namespace
}  // namespace glmserve
