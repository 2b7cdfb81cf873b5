// GlmService end to end on loopback: the real server (tiny model) and the real client.
// Results equal the core library's bit for bit; concurrency, cancellation, deadlines and
// limits end each call with its precise status and leave the engine clean.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "core/base/dtype.h"
#include "core/engine/runner_factory.h"
#include "proto/tensor_codec.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::EngineDrained;
using testing::GreedyRequest;
using testing::StartServer;
using testing::TinyOptions;
using testing::WaitUntil;

std::vector<float> Floats(const v1::Tensor& t) {
  absl::StatusOr<std::vector<float>> v = DecodeTensor(t, "test", /*require_finite=*/false);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::vector<float>{};
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The core library's forward of `tokens` from position 0: logits of every row and the
// residual stream after the last layer.
glmserve::ForwardResult CoreForward(const std::vector<int32_t>& tokens) {
  std::unique_ptr<glmserve::ModelRunner> runner = testing::TinyRunner();
  absl::StatusOr<std::unique_ptr<glmserve::KvCache>> cache = runner->CreateCache(8, 16);
  EXPECT_TRUE(cache.ok());
  glmserve::BlockTable table;
  EXPECT_TRUE((*cache)->Reserve(&table, static_cast<int64_t>(tokens.size())).ok());
  glmserve::ForwardBatch batch;
  batch.sequences = {{static_cast<int64_t>(tokens.size()), 0, &table}};
  batch.token_ids = tokens;
  glmserve::ForwardOptions options;
  options.logits = glmserve::LogitsRows::kAll;
  options.return_hidden = true;
  glmserve::ForwardResult result;
  EXPECT_TRUE(runner->Forward(batch, cache->get(), options, &result).ok());
  return result;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer();
    ASSERT_NE(server_, nullptr);
    client_ = Connect(*server_);
  }
  void TearDown() override {
    // Every test leaves the engine without requests or KV blocks, and its checks intact.
    EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
    EXPECT_EQ(server_->engine()->Stats().invariant_error, "");
  }

  std::vector<int32_t> Generate(const v1::GenerateRequest& request) {
    std::vector<int32_t> tokens;
    absl::StatusOr<v1::Finished> finished = client_->Generate(
        request, [&](const v1::GeneratedToken& t) { tokens.push_back(t.token_id()); });
    EXPECT_TRUE(finished.ok()) << finished.status();
    return tokens;
  }

  std::unique_ptr<GlmServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServiceTest, ForwardIsBitwiseEqualToTheCoreLibrary) {
  const std::vector<int32_t> tokens = {5, 17, 200, 3, 99, 42, 7};
  const glmserve::ForwardResult ref = CoreForward(tokens);
  v1::ForwardRequest request;
  request.mutable_token_ids()->mutable_ids()->Add(tokens.begin(), tokens.end());
  request.set_return_logits(true);
  request.set_return_hidden_states(true);
  absl::StatusOr<v1::ForwardResponse> r = client_->Forward(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rows(), 7);
  EXPECT_EQ(r->start_position(), 0);
  ASSERT_EQ(r->logits().shape_size(), 2);
  EXPECT_EQ(r->logits().shape(0), 7);
  EXPECT_EQ(r->logits().shape(1), 256);
  EXPECT_EQ(r->logits().dtype(), v1::DATA_TYPE_FP32);
  EXPECT_TRUE(BitwiseEqual(Floats(r->logits()), ref.logits));
  EXPECT_TRUE(BitwiseEqual(Floats(r->hidden_states()), ref.hidden));

  // Last position only, and bf16 on the wire: exactly the rounded fp32 values.
  request.set_last_position_only(true);
  request.set_output_dtype(v1::DATA_TYPE_BF16);
  r = client_->Forward(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rows(), 1);
  ASSERT_EQ(r->logits().raw_data().size(), 256u * 2);
  const auto* bf16 = reinterpret_cast<const uint16_t*>(r->logits().raw_data().data());
  for (int i = 0; i < 256; ++i) {
    ASSERT_EQ(bf16[i], glmserve::FloatToBf16(ref.logits[6 * 256 + i])) << i;
  }
}

TEST_F(ServiceTest, ForwardChainedThroughTwoSpansEqualsTheWholeModel) {
  // A pipeline: layers [0, 2) return hidden states that go into [2, 3) as a tensor.
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  const glmserve::ForwardResult ref = CoreForward(tokens);
  v1::ForwardRequest first;
  first.mutable_token_ids()->mutable_ids()->Add(tokens.begin(), tokens.end());
  first.set_layer_end(2);
  first.set_return_hidden_states(true);
  absl::StatusOr<v1::ForwardResponse> a = client_->Forward(first);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::ForwardRequest second;
  *second.mutable_hidden_states() = a->hidden_states();
  second.set_layer_begin(2);
  second.set_return_logits(true);
  absl::StatusOr<v1::ForwardResponse> b = client_->Forward(second);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(BitwiseEqual(Floats(b->logits()), ref.logits));
}

TEST_F(ServiceTest, SessionsContinueTheSequenceAndClose) {
  const std::vector<int32_t> tokens = {9, 8, 7, 6, 5};
  const glmserve::ForwardResult ref = CoreForward(tokens);
  v1::ForwardRequest request;
  request.set_session_id("s1");
  request.set_create_session(true);
  request.set_return_logits(true);
  request.mutable_token_ids()->mutable_ids()->Add(tokens.begin(), tokens.begin() + 3);
  absl::StatusOr<v1::ForwardResponse> r = client_->Forward(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(client_->Forward(request).status().code(), absl::StatusCode::kAlreadyExists);
  request.set_create_session(false);
  request.mutable_token_ids()->mutable_ids()->Clear();
  request.mutable_token_ids()->mutable_ids()->Add(tokens.begin() + 3, tokens.end());
  r = client_->Forward(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->start_position(), 3);
  const std::vector<float> tail(ref.logits.begin() + 3 * 256, ref.logits.end());
  EXPECT_TRUE(BitwiseEqual(Floats(r->logits()), tail));
  EXPECT_EQ(server_->engine()->Stats().sessions, 1);
  EXPECT_TRUE(client_->CloseSession("s1").ok());
  EXPECT_EQ(client_->CloseSession("s1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Forward(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServiceTest, GenerateStreamsTheSameTokensAsGlmRun) {
  const std::vector<int32_t> prompt = {151 % 256, 33, 9, 120};
  const std::vector<int32_t> expected = testing::GlmRunGreedy(prompt, 24);
  ASSERT_EQ(expected.size(), 24u);
  EXPECT_EQ(Generate(GreedyRequest(prompt, 24)), expected);

  // The iterator form gives the same, with the final message.
  std::unique_ptr<GenerateStream> stream = client_->StartGenerate(GreedyRequest(prompt, 24));
  std::vector<int32_t> tokens;
  v1::GeneratedToken t;
  while (stream->Next(&t)) {
    EXPECT_EQ(t.index(), static_cast<int64_t>(tokens.size()));
    tokens.push_back(t.token_id());
  }
  absl::StatusOr<v1::Finished> finished = stream->Finish();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(finished->reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(finished->prompt_tokens(), 4);
  EXPECT_EQ(finished->generated_tokens(), 24);
  EXPECT_GT(finished->timings().total_seconds(), 0);
  EXPECT_GE(finished->timings().total_seconds(), finished->timings().engine_seconds());
}

TEST_F(ServiceTest, LogprobsAndStopTokens) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> greedy = Generate(GreedyRequest(prompt, 8));
  v1::GenerateRequest request = GreedyRequest(prompt, 8);
  request.mutable_logprobs()->set_top_logprobs(3);
  request.mutable_stop()->add_stop_token_ids(greedy[4]);
  std::vector<v1::GeneratedToken> tokens;
  absl::StatusOr<v1::Finished> finished =
      client_->Generate(request, [&](const v1::GeneratedToken& t) { tokens.push_back(t); });
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->reason(), v1::FINISH_REASON_STOP);
  // Stops at the first occurrence of the stop token, which is returned.
  const size_t first = std::find(greedy.begin(), greedy.end(), greedy[4]) - greedy.begin();
  ASSERT_EQ(tokens.size(), first + 1);
  for (const v1::GeneratedToken& t : tokens) {
    ASSERT_EQ(t.top_logprobs_size(), 3);
    EXPECT_EQ(t.top_logprobs(0).token_id(), t.token_id());  // greedy: the best is chosen
    EXPECT_EQ(t.top_logprobs(0).logprob(), t.logprob());
    EXPECT_LE(t.logprob(), 0.0f);
  }
}

TEST_F(ServiceTest, SixtyFourConcurrentStreamsAllComplete) {
  // Eight distinct prompts, each run alone first, then 64 streams at once: batching must not
  // change a single token.
  constexpr int kPrompts = 8, kStreams = 64, kNew = 20;
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int p = 0; p < kPrompts; ++p) {
    prompts.push_back({p + 1, 2 * p + 40, 100 + p, 7});
    expected.push_back(Generate(GreedyRequest(prompts.back(), kNew)));
  }
  std::vector<std::vector<int32_t>> got(kStreams);
  std::vector<absl::Status> status(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<v1::Finished> f =
          client_->Generate(GreedyRequest(prompts[i % kPrompts], kNew),
                            [&](const v1::GeneratedToken& t) { got[i].push_back(t.token_id()); });
      status[i] = f.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(status[i].ok()) << i << ": " << status[i];
    EXPECT_EQ(got[i], expected[i % kPrompts]) << i;
  }
}

TEST_F(ServiceTest, GetModelInfoDescribesTheModelAndLimits) {
  absl::StatusOr<v1::ModelInfo> info = client_->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model(), "tiny");
  EXPECT_EQ(info->architecture(), "Glm4MoeForCausalLM");
  EXPECT_EQ(info->config().vocab_size(), 256);
  EXPECT_EQ(info->config().num_hidden_layers(), 3);
  EXPECT_EQ(info->layer_begin(), 0);
  EXPECT_EQ(info->layer_end(), 3);
  EXPECT_EQ(info->device(), "cpu");
  // The CPU math mode is never silent (the in-process server here builds the exact mode).
  EXPECT_EQ(info->compute().rfind("cpu math exact, kernel ", 0), 0u) << info->compute();
  EXPECT_EQ(info->weight_dtype(), v1::DATA_TYPE_BF16);
  EXPECT_GT(info->kv_capacity_tokens(), 0);
  EXPECT_EQ(info->kv_cache_dtype(), "fp32");
  EXPECT_EQ(info->kv_bytes_per_token(), 3 * 2 * 2 * 16 * 4);  // layers, K+V, heads x dim, fp32
  EXPECT_EQ(info->limits().max_prompt_tokens(), info->config().max_position_embeddings());
  EXPECT_EQ(info->limits().default_max_new_tokens(), 256);
  EXPECT_FALSE(info->server_version().empty());
}

// GLM-5 through the same binary and RPCs: GetModelInfo names the architecture and carries its
// fields, and Generate (a 12-token prompt, past index_topk 8) reproduces glm-run.
TEST(ServiceGlm5Test, ServesGlm5ThroughTheSameRpcs) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> child =
      testing::StartServerProcess({"--model=tiny-glm5"}, &target);
  std::unique_ptr<Client> client = Connect(target);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->architecture(), "GlmMoeDsaForCausalLM");
  EXPECT_EQ(info->config().model_type(), "glm_moe_dsa");
  EXPECT_EQ(info->config().index_topk(), 8);
  EXPECT_EQ(info->config().indexer_types_size(), 4);
  EXPECT_EQ(info->device(), "cpu");
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26};
  std::unique_ptr<GenerateStream> stream = client->StartGenerate(GreedyRequest(prompt, 10));
  std::vector<int32_t> got;
  v1::GeneratedToken t;
  while (stream->Next(&t)) got.push_back(t.token_id());
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_EQ(got, testing::GlmRunGreedy(prompt, 10, "tiny-glm5"));
}

// ---- Bad inputs -------------------------------------------------------------------------------

struct BadGenerate {
  const char* name;
  std::function<void(v1::GenerateRequest*)> mutate;
};

TEST_F(ServiceTest, EveryBadGenerateGetsInvalidArgumentAndChangesNothing) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<BadGenerate> cases = {
      {"empty prompt", [](auto* r) { r->clear_prompt_token_ids(); }},
      {"negative token", [](auto* r) { r->set_prompt_token_ids(0, -1); }},
      {"token >= vocab", [](auto* r) { r->set_prompt_token_ids(1, 256); }},
      {"stop token out of range", [](auto* r) { r->mutable_stop()->add_stop_token_ids(300); }},
      {"max_new_tokens 0", [](auto* r) { r->mutable_stop()->set_max_new_tokens(0); }},
      {"max_new_tokens beyond positions",
       [](auto* r) { r->mutable_stop()->set_max_new_tokens(5000); }},
      {"negative temperature", [](auto* r) { r->mutable_sampling()->set_temperature(-1); }},
      {"NaN temperature", [nan](auto* r) { r->mutable_sampling()->set_temperature(nan); }},
      {"negative top_k", [](auto* r) { r->mutable_sampling()->set_top_k(-2); }},
      {"top_p 0", [](auto* r) { r->mutable_sampling()->set_top_p(0); }},
      {"top_p > 1", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); }},
      {"min_p 1", [](auto* r) { r->mutable_sampling()->set_min_p(1); }},
      {"repetition_penalty 0", [](auto* r) { r->mutable_sampling()->set_repetition_penalty(0); }},
      {"top_logprobs 21", [](auto* r) { r->mutable_logprobs()->set_top_logprobs(21); }},
  };
  const glmserve::EngineStats before = server_->engine()->Stats();
  for (const BadGenerate& c : cases) {
    v1::GenerateRequest request = GreedyRequest({1, 2, 3}, 4);
    c.mutate(&request);
    bool got_token = false;
    absl::StatusOr<v1::Finished> f =
        client_->Generate(request, [&](const v1::GeneratedToken&) { got_token = true; });
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << f.status();
    EXPECT_FALSE(got_token) << c.name;
  }
  // Nothing reached the engine, and it still serves.
  EXPECT_EQ(server_->engine()->Stats().steps, before.steps);
  EXPECT_EQ(Generate(GreedyRequest({1, 2, 3}, 4)).size(), 4u);
}

v1::Tensor HiddenTensor(int64_t rows, int64_t cols, float fill = 0.5f) {
  v1::Tensor t;
  const std::vector<float> values(rows * cols, fill);
  const int64_t shape[] = {rows, cols};
  EncodeTensor(values, shape, v1::DATA_TYPE_FP32, &t);
  return t;
}

struct BadForward {
  const char* name;
  std::function<void(v1::ForwardRequest*)> mutate;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

TEST_F(ServiceTest, EveryBadForwardGetsItsStatusAndChangesNothing) {
  const float inf = std::numeric_limits<float>::infinity();
  const auto hidden = [](v1::ForwardRequest* r, v1::Tensor t) {
    *r->mutable_hidden_states() = std::move(t);
    r->set_layer_begin(1);
  };
  const std::vector<BadForward> cases = {
      {"no input", [](auto* r) { r->clear_token_ids(); }},
      {"empty token ids", [](auto* r) { r->mutable_token_ids()->clear_ids(); }},
      {"token out of range", [](auto* r) { r->mutable_token_ids()->set_ids(0, 1000); }},
      {"layer_end beyond the model", [](auto* r) { r->set_layer_end(4); }},
      {"empty span", [](auto* r) { r->set_layer_begin(0), r->set_layer_end(0); }},
      {"tokens into a later layer", [](auto* r) { r->set_layer_begin(1); }},
      {"hidden into layer 0",
       [&](auto* r) { hidden(r, HiddenTensor(2, 64)), r->set_layer_begin(0); }},
      {"logits from a span ending early", [](auto* r) { r->set_layer_end(2); }},
      {"unknown output dtype", [](auto* r) { r->set_output_dtype(static_cast<v1::DataType>(9)); }},
      {"hidden dtype unspecified",
       [&](auto* r) {
         v1::Tensor t = HiddenTensor(2, 64);
         t.set_dtype(v1::DATA_TYPE_UNSPECIFIED);
         hidden(r, t);
       }},
      {"hidden wrong width", [&](auto* r) { hidden(r, HiddenTensor(2, 63)); }},
      {"hidden 1-D",
       [&](auto* r) {
         v1::Tensor t = HiddenTensor(2, 64);
         t.clear_shape();
         t.add_shape(128);
         hidden(r, t);
       }},
      {"hidden byte count",
       [&](auto* r) {
         v1::Tensor t = HiddenTensor(2, 64);
         t.mutable_raw_data()->pop_back();
         hidden(r, t);
       }},
      {"hidden bf16 bytes for fp32 shape",
       [&](auto* r) {
         v1::Tensor t = HiddenTensor(2, 64);
         t.set_dtype(v1::DATA_TYPE_BF16);
         hidden(r, t);
       }},
      {"hidden NaN",
       [&](auto* r) { hidden(r, HiddenTensor(2, 64, std::numeric_limits<float>::quiet_NaN())); }},
      {"hidden Inf", [&](auto* r) { hidden(r, HiddenTensor(2, 64, inf)); }},
      {"create_session without id", [](auto* r) { r->set_create_session(true); }},
      {"no output requested", [](auto* r) { r->set_return_logits(false); }},
      {"unknown session", [](auto* r) { r->set_session_id("nope"); }, absl::StatusCode::kNotFound},
  };
  const glmserve::EngineStats before = server_->engine()->Stats();
  for (const BadForward& c : cases) {
    v1::ForwardRequest request;
    testing::SetIds(request.mutable_token_ids()->mutable_ids(), {1, 2, 3});
    request.set_return_logits(true);
    c.mutate(&request);
    absl::StatusOr<v1::ForwardResponse> r = client_->Forward(request);
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status();
  }
  EXPECT_EQ(client_->CloseSession("never").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->CloseSession("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server_->engine()->Stats().steps, before.steps);
  EXPECT_EQ(server_->engine()->Stats().sessions, 0);
  v1::ForwardRequest good;
  testing::SetIds(good.mutable_token_ids()->mutable_ids(), {1, 2, 3});
  good.set_return_logits(true);
  EXPECT_TRUE(client_->Forward(good).ok());
}

// ---- Deadlines, cancellation, limits ------------------------------------------------------------

TEST_F(ServiceTest, DeadlineExpiryEndsTheStreamAndFreesItsBlocks) {
  ClientOptions options;
  options.timeout = absl::Milliseconds(80);
  std::unique_ptr<Client> hurried = Connect(*server_, options);
  int tokens = 0;
  absl::StatusOr<v1::Finished> f = hurried->Generate(GreedyRequest({1, 2, 3}, 1000),
                                                     [&](const v1::GeneratedToken&) { ++tokens; });
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDeadlineExceeded) << f.status();
  EXPECT_LT(tokens, 1000);
  EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
}

// --kv_cache_dtype=fp8_e4m3 (EngineOptions::kv_cache_dtype): GetModelInfo reports the FP8
// cache and its bytes (a code per value, a 4-byte scale per token and KV head), and it serves.
TEST(ServiceKvCacheTest, Fp8KvCacheIsReportedAndServes) {
  ServerOptions options = TinyOptions();
  options.engine.kv_cache_dtype = KvCacheDType::kFp8E4M3;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kv_cache_dtype(), "fp8_e4m3");
  EXPECT_EQ(info->kv_bytes_per_token(), 3 * 2 * 2 * (16 + 4));
  absl::StatusOr<v1::Finished> f = client->Generate(GreedyRequest({1, 2, 3}, 5), nullptr);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_NE(server->StartupSummary().find("bytes per token, fp8_e4m3)"), std::string::npos)
      << server->StartupSummary();
}

// --cpu_math=bf16 on bf16 weights with the default --kv_cache_dtype=auto: a bf16 cache (its
// attention rounds K and V to bf16 anyway, docs/kv_cache.md), reported as such with half the fp32
// cache's bytes, in GetModelInfo and the start-up line.
TEST(ServiceKvCacheTest, TheBf16ModesAutoCacheIsReportedAsBf16) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<ModelWeights> weights = LoadModel("tiny");
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_EQ(weights->weight_dtype, DType::kBF16);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(*std::move(weights), DeviceKind::kCpu, CpuMath::kBf16);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE(server->Serve(*std::move(runner), DType::kBF16).ok());
  std::unique_ptr<Client> client = Connect(*server);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kv_cache_dtype(), "bf16");
  EXPECT_EQ(info->kv_bytes_per_token(), 3 * 2 * 2 * 16 * 2);  // layers x (K, V) x KV heads x d
  absl::StatusOr<v1::Finished> f = client->Generate(GreedyRequest({1, 2, 3}, 5), nullptr);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_NE(server->StartupSummary().find("bytes per token, bf16)"), std::string::npos)
      << server->StartupSummary();
}

TEST(ServiceLimitsTest, ServerDefaultDeadlineAppliesToCallsWithoutOne) {
  ServerOptions options = TinyOptions();
  options.service.default_deadline = absl::Milliseconds(60);
  std::unique_ptr<GlmServer> server = StartServer(options);
  ClientOptions client_options;
  client_options.timeout = absl::InfiniteDuration();
  std::unique_ptr<Client> client = Connect(*server, client_options);
  absl::StatusOr<v1::Finished> f = client->Generate(GreedyRequest({1, 2, 3}, 1000), nullptr);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDeadlineExceeded) << f.status();
  EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server->engine()); }));
}

TEST_F(ServiceTest, ClientCancelMidStreamFreesTheKvCacheAtOnce) {
  std::unique_ptr<GenerateStream> stream = client_->StartGenerate(GreedyRequest({1, 2, 3}, 900));
  v1::GeneratedToken t;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(stream->Next(&t));
  EXPECT_GT(server_->engine()->Stats().kv_usage(), 0.0);
  stream->Cancel();
  while (stream->Next(&t)) {
  }
  EXPECT_EQ(stream->Finish().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }, absl::Seconds(2)));
  // A client that simply goes away (stream destroyed mid-flight) is cancelled too.
  stream = client_->StartGenerate(GreedyRequest({4, 5, 6}, 900));
  ASSERT_TRUE(stream->Next(&t));
  stream.reset();
  EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }, absl::Seconds(2)));
}

TEST(ServiceLimitsTest, QueueFullIsResourceExhausted) {
  ServerOptions options = TinyOptions();
  options.engine.max_running = 1;
  options.engine.max_waiting = 1;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  std::unique_ptr<GenerateStream> running = client->StartGenerate(GreedyRequest({1, 2}, 900));
  v1::GeneratedToken t;
  ASSERT_TRUE(running->Next(&t));  // running
  std::unique_ptr<GenerateStream> queued = client->StartGenerate(GreedyRequest({3, 4}, 900));
  ASSERT_TRUE(WaitUntil([&] { return server->engine()->Stats().waiting == 1; }));
  absl::StatusOr<v1::Finished> refused = client->Generate(GreedyRequest({5, 6}, 4), nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  running->Cancel();
  queued->Cancel();
  EXPECT_EQ(running->Finish().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(queued->Finish().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server->engine()); }));
  EXPECT_TRUE(client->Generate(GreedyRequest({5, 6}, 4), nullptr).ok());
}

TEST(ServiceLimitsTest, RequestLargerThanTheKvCacheIsResourceExhausted) {
  ServerOptions options = TinyOptions();
  options.engine.kv_capacity_tokens = 64;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  absl::StatusOr<v1::Finished> f = client->Generate(GreedyRequest({1, 2, 3}, 100), nullptr);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kResourceExhausted) << f.status();
  EXPECT_TRUE(client->Generate(GreedyRequest({1, 2, 3}, 20), nullptr).ok());
}

TEST(ServiceLimitsTest, ConcurrentStreamAndLengthLimits) {
  ServerOptions options = TinyOptions();
  options.service.max_concurrent_streams = 1;
  options.engine.limits.max_prompt_tokens = 8;
  // The limit sits below the tiny model's 1,024 positions, so 901 is refused by it alone.
  options.engine.limits.max_new_tokens = 900;
  options.engine.limits.default_max_new_tokens = 16;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  EXPECT_EQ(
      client->Generate(GreedyRequest({1, 2, 3, 4, 5, 6, 7, 8, 9}, 4), nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Generate(GreedyRequest({1}, 901), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The stream that holds the only slot asks for 900 tokens and is cancelled afterwards: with
  // 50 the tiny model finished it before the second call arrived (a CI run saw it).
  std::unique_ptr<GenerateStream> first = client->StartGenerate(GreedyRequest({1, 2}, 900));
  v1::GeneratedToken t;
  ASSERT_TRUE(first->Next(&t));
  EXPECT_EQ(client->Generate(GreedyRequest({1, 2}, 4), nullptr).status().code(),
            absl::StatusCode::kResourceExhausted);
  first->Cancel();
  EXPECT_EQ(first->Finish().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  EXPECT_TRUE(client->Generate(GreedyRequest({1, 2}, 4), nullptr).ok());
}

TEST(ServiceLimitsTest, OversizedMessageIsResourceExhausted) {
  ServerOptions options = TinyOptions();
  options.max_message_bytes = 4096;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  const int64_t steps = server->engine()->Stats().steps;
  v1::ForwardRequest request;
  *request.mutable_hidden_states() = HiddenTensor(32, 64);  // 8 KiB
  request.set_layer_begin(1);
  EXPECT_EQ(client->Forward(request).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(server->engine()->Stats().steps, steps);
}

TEST(SpanServerTest, AServerOfLaterLayersTakesHiddenStatesFromAnother) {
  // Two pipeline stages on two servers: [0, 1) and [1, 3) of the tiny model.
  ServerOptions options = TinyOptions();
  std::unique_ptr<GlmServer> first = StartServer(options);
  absl::StatusOr<std::unique_ptr<GlmServer>> second = GlmServer::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<glmserve::ModelWeights> weights =
      glmserve::LoadModel("tiny", glmserve::LayerSpan{1, 3});
  ASSERT_TRUE(weights.ok()) << weights.status();
  const glmserve::DType dtype = weights->weight_dtype;
  absl::StatusOr<std::unique_ptr<glmserve::ModelRunner>> runner =
      glmserve::CreateModelRunner(*std::move(weights), glmserve::DeviceKind::kCpu);
  ASSERT_TRUE(runner.ok()) << runner.status();
  // Its warm-up sends hidden states (it has no embedding).
  const absl::Status served = (*second)->Serve(*std::move(runner), dtype);
  ASSERT_TRUE(served.ok()) << served;
  std::unique_ptr<Client> a = Connect(*first);
  std::unique_ptr<Client> b = Connect(**second);

  absl::StatusOr<v1::ModelInfo> info = b->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->layer_begin(), 1);
  EXPECT_EQ(info->layer_end(), 3);
  EXPECT_EQ(b->Generate(GreedyRequest({1, 2}, 2), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);

  const std::vector<int32_t> tokens = {4, 8, 15, 16, 23, 42};
  const glmserve::ForwardResult ref = CoreForward(tokens);
  v1::ForwardRequest stage1;
  testing::SetIds(stage1.mutable_token_ids()->mutable_ids(), {4, 8, 15, 16, 23, 42});
  stage1.set_layer_end(1);
  stage1.set_return_hidden_states(true);
  absl::StatusOr<v1::ForwardResponse> h = a->Forward(stage1);
  ASSERT_TRUE(h.ok()) << h.status();
  v1::ForwardRequest stage2;
  *stage2.mutable_hidden_states() = h->hidden_states();
  stage2.set_return_logits(true);
  absl::StatusOr<v1::ForwardResponse> out = b->Forward(stage2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(BitwiseEqual(Floats(out->logits()), ref.logits));
  // Token ids cannot enter a server without the embedding.
  stage1.clear_layer_end();
  stage1.set_return_logits(true);
  EXPECT_EQ(b->Forward(stage1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace glmserve
