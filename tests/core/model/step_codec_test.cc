// The leader-to-worker step format (core/model/step_codec.h): what goes in comes out, and
// no truncation or corruption of a frame gets past the decoder or makes it allocate unbounded.
#include "core/model/step_codec.h"

#include <gtest/gtest.h>

#include <cstring>

namespace glmserve {
namespace {

struct Example {
  std::vector<int32_t> ids = {5, 6, 7, 8, 9};
  std::vector<float> hidden;
  BlockTable a = {3, 1}, b = {7};
  ForwardBatch batch;
  ForwardOptions options;
  Example() {
    batch.sequences = {{3, 4, &a}, {2, 0, &b}};
    batch.token_ids = ids;
    options.logits = LogitsRows::kAll;
    options.sequence_logits = {LogitsRows::kNone, LogitsRows::kLast};
    options.return_hidden = true;
    options.mtp = true;
    options.sample.resize(2);
    options.sample[0].sample = true;
    options.sample[0].keep_logits = false;
    options.sample[0].params.temperature = 0.7f;
    options.sample[0].params.top_k = 40;
    options.sample[0].params.seed = 1234567890123ULL;
    options.sample[0].params.logprob = true;
    options.sample[1].params.forced = 9;
    options.penalised_ids = {1, 4, 2};
    options.layer_begin = 0;
    options.layer_end = 3;
  }
};

TEST(StepCodecTest, AForwardStepRoundTrips) {
  const Example e;
  const std::string bytes = EncodeForward(42, e.batch, e.options);
  DecodedStep got;
  ASSERT_TRUE(DecodeForward(bytes, StepLimits{}, &got).ok());
  EXPECT_EQ(got.cache_id, 42);
  EXPECT_EQ(std::vector<int32_t>(got.batch.token_ids.begin(), got.batch.token_ids.end()), e.ids);
  EXPECT_TRUE(got.batch.hidden_in.empty());
  ASSERT_EQ(got.batch.sequences.size(), 2u);
  EXPECT_EQ(got.batch.sequences[0].num_tokens, 3);
  EXPECT_EQ(got.batch.sequences[0].start_position, 4);
  EXPECT_EQ(*got.batch.sequences[0].blocks, e.a);
  EXPECT_EQ(*got.batch.sequences[1].blocks, e.b);
  const ForwardOptions& o = got.options;
  EXPECT_EQ(o.logits, LogitsRows::kAll);
  EXPECT_EQ(o.sequence_logits, e.options.sequence_logits);
  EXPECT_TRUE(o.return_hidden);
  EXPECT_FALSE(o.return_layer_hidden);
  EXPECT_TRUE(o.mtp);
  ASSERT_EQ(o.sample.size(), 2u);
  EXPECT_TRUE(o.sample[0].sample);
  EXPECT_FALSE(o.sample[0].keep_logits);
  EXPECT_EQ(o.sample[0].params.temperature, 0.7f);
  EXPECT_EQ(o.sample[0].params.top_k, 40);
  EXPECT_EQ(o.sample[0].params.seed, 1234567890123ULL);
  EXPECT_TRUE(o.sample[0].params.logprob);
  EXPECT_EQ(o.sample[1].params.forced, 9);
  EXPECT_TRUE(o.sample[1].keep_logits);
  EXPECT_EQ(o.penalised_ids, e.options.penalised_ids);
  EXPECT_EQ(o.layer_begin, 0);
  EXPECT_EQ(o.layer_end, 3);
  // Encoding the decoded step gives the same bytes: nothing was lost or reordered.
  EXPECT_EQ(EncodeForward(got.cache_id, got.batch, got.options), bytes);
}

TEST(StepCodecTest, HiddenRowsNeedAHiddenSizeWithinTheLimit) {
  Example e;
  e.hidden.assign(5 * 4, 0.5f);
  e.batch.token_ids = {};
  e.batch.hidden_in = e.hidden;
  const std::string bytes = EncodeForward(1, e.batch, e.options);
  DecodedStep got;
  EXPECT_FALSE(DecodeForward(bytes, StepLimits{}, &got).ok());  // hidden_size 0: none accepted
  StepLimits limits;
  limits.hidden_size = 4;
  ASSERT_TRUE(DecodeForward(bytes, limits, &got).ok());
  EXPECT_EQ(got.hidden_in, e.hidden);
}

TEST(StepCodecTest, EveryTruncationAndTrailingByteIsRefused) {
  const Example e;
  const std::string bytes = EncodeForward(7, e.batch, e.options);
  DecodedStep got;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const absl::Status s = DecodeForward(bytes.substr(0, n), StepLimits{}, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "truncated to " << n;
  }
  EXPECT_FALSE(DecodeForward(bytes + "x", StepLimits{}, &got).ok());
}

TEST(StepCodecTest, HugeCountsAreRefusedBeforeAllocating) {
  // A token count of 2^60 at the token ids' place: refused by the bytes left, not allocated.
  const Example e;
  std::string bytes = EncodeForward(7, e.batch, e.options);
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(&bytes[sizeof(int64_t)], &huge, sizeof(huge));
  DecodedStep got;
  EXPECT_EQ(DecodeForward(bytes, StepLimits{}, &got).code(), absl::StatusCode::kInvalidArgument);
  // Within the bytes but over a limit: refused too.
  StepLimits tight;
  tight.max_tokens = 4;
  EXPECT_FALSE(DecodeForward(EncodeForward(7, e.batch, e.options), tight, &got).ok());
  tight = StepLimits{};
  tight.max_sequences = 1;
  EXPECT_FALSE(DecodeForward(EncodeForward(7, e.batch, e.options), tight, &got).ok());
}

TEST(StepCodecTest, RandomCorruptionNeverCrashes) {
  const Example e;
  const std::string bytes = EncodeForward(7, e.batch, e.options);
  uint32_t x = 12345;
  DecodedStep got;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string c = bytes;
    for (int k = 0; k < 3; ++k) {
      x = x * 1664525u + 1013904223u;
      c[x % c.size()] = static_cast<char>(x >> 24);
    }
    (void)DecodeForward(c, StepLimits{}, &got);  // any status; sanitizers check the rest
  }
}

TEST(StepCodecTest, RepliesAndIntegersRoundTrip) {
  absl::Status status;
  int64_t value = 0;
  ASSERT_TRUE(DecodeReply(EncodeReply(absl::OkStatus(), 17), &status, &value).ok());
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(value, 17);
  ASSERT_TRUE(
      DecodeReply(EncodeReply(absl::ResourceExhaustedError("no memory")), &status, &value).ok());
  EXPECT_EQ(status, absl::ResourceExhaustedError("no memory"));
  EXPECT_FALSE(DecodeReply("abc", &status, &value).ok());
  std::vector<int64_t> ints;
  ASSERT_TRUE(DecodeInts(EncodeInts({3, -4}), 2, &ints).ok());
  EXPECT_EQ(ints, (std::vector<int64_t>{3, -4}));
  EXPECT_FALSE(DecodeInts(EncodeInts({3}), 2, &ints).ok());
}

}  // namespace
}  // namespace glmserve

namespace glmserve {
namespace {

TEST(StepCodecTest, HelloAndWorkerReportRoundTrip) {
  WorkerHello hello{"build 1", "token", 3};
  WorkerHello got;
  ASSERT_TRUE(DecodeHello(EncodeHello(hello), &got).ok());
  EXPECT_EQ(got.build, "build 1");
  EXPECT_EQ(got.token, "token");
  EXPECT_EQ(got.node, 3);
  EXPECT_FALSE(DecodeHello(EncodeHello(hello).substr(1), &got).ok());
  WorkerInfo info;
  info.status = absl::InternalError("no weights");
  info.kv_bytes_per_token = 123;
  info.weight_bytes = 456;
  info.device_name = "cpu ranks 2..3";
  WorkerInfo back;
  ASSERT_TRUE(DecodeWorkerInfo(EncodeWorkerInfo(info), &back).ok());
  EXPECT_EQ(back.status, info.status);
  EXPECT_EQ(back.kv_bytes_per_token, 123);
  EXPECT_EQ(back.weight_bytes, 456);
  EXPECT_EQ(back.device_name, "cpu ranks 2..3");
  EXPECT_FALSE(DecodeWorkerInfo(EncodeWorkerInfo(info) + "x", &back).ok());
}

}  // namespace
}  // namespace glmserve
