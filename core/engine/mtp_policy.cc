#include "core/engine/mtp_policy.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

constexpr int64_t kContext = 64;
constexpr int kRounds = 15;  // interleaved, best of each: a drift hits all three alike

double Seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

absl::StatusOr<MtpStepCosts> MeasureMtpStepCosts(ModelRunner& runner) {
  if (!runner.mtp_enabled()) {
    return absl::FailedPreconditionError("the runner's MTP layer is not enabled");
  }
  const ModelConfig& c = runner.config();
  constexpr int64_t kBlock = 16;
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                   runner.CreateCache((kContext + 2 + kBlock - 1) / kBlock, kBlock));
  BlockTable table;
  RETURN_IF_ERROR(cache->Reserve(&table, kContext + 2));
  // A context of varied ids, then steps at its end (rewritten each time: same positions).
  std::vector<int32_t> context(kContext);
  for (int64_t i = 0; i < kContext; ++i)
    context[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
  ForwardBatch prefill;
  prefill.sequences = {{kContext, 0, &table}};
  prefill.token_ids = context;
  ForwardResult result;
  RETURN_IF_ERROR(runner.Forward(prefill, cache.get(), {}, &result));

  // One timed step: `tokens` new tokens through the model, or through the MTP layer.
  const auto time = [&](int64_t tokens, bool mtp, double* best) -> absl::Status {
    std::vector<int32_t> ids(tokens);
    for (int64_t i = 0; i < tokens; ++i) ids[i] = context[(i * 31 + 5) % kContext];
    std::vector<float> h(mtp ? tokens * c.hidden_size : 0, 0.5f);
    ForwardBatch step;
    step.sequences = {{tokens, kContext, &table}};
    step.token_ids = ids;
    step.hidden_in = h;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    options.mtp = mtp;
    options.return_head_input = true;
    const auto t = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(runner.Forward(step, cache.get(), options, &result));
    *best = std::min(*best, Seconds(t));
    return absl::OkStatus();
  };
  MtpStepCosts costs{1e30, 1e30, 1e30};
  for (int r = 0; r < kRounds; ++r) {
    RETURN_IF_ERROR(time(1, false, &costs.decode));
    RETURN_IF_ERROR(time(2, false, &costs.verify));
    RETURN_IF_ERROR(time(1, true, &costs.mtp));
  }
  return costs;
}

double ExpectedMtpSpeedup(const MtpStepCosts& costs, double acceptance) {
  const double per_verify = costs.verify + costs.mtp;
  return per_verify > 0 ? acceptance * costs.decode / per_verify : 0.0;
}

int AutoMtpDraftTokens(const MtpStepCosts& costs, std::string* why) {
  const double speedup = ExpectedMtpSpeedup(costs, kAutoMtpAcceptance);
  const int k = speedup >= kAutoMtpMinSpeedup ? 1 : 0;
  if (why != nullptr) {
    *why = absl::StrFormat(
        "a verify step costs %.2fx a decode step and an MTP pass %.2fx: at acceptance length "
        "%.1f, %.2fx the speed (needs %.2fx)",
        costs.verify / costs.decode, costs.mtp / costs.decode, kAutoMtpAcceptance, speedup,
        kAutoMtpMinSpeedup);
  }
  return k;
}

}  // namespace glmserve
