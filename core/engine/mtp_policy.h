// Whether speculative decoding with the MTP layer pays on a runner (docs/mtp.md, "When it
// pays"): a verify step of k + 1 tokens costs more than a decode step of one wherever the
// step is not bound by reading the dense weights once (the drafted token routes to other
// experts, whose weights the step must read or compute too), and each draft costs an MTP-layer
// pass. glm-server's --mtp_draft_tokens=-1 (auto) measures both on the loaded model at
// startup and drafts one token per step only when the expected speed-up at a typical
// acceptance length clears a margin.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/model/model_runner.h"

namespace glmserve {

// Seconds at batch 1 after a 64-token context, best of several: a decode step (1 new token),
// a verify step of one draft (2 new tokens) and one MTP-layer pass.
struct MtpStepCosts {
  double decode = 0;
  double verify = 0;
  double mtp = 0;
};

// Measures them on `runner`, which must have its MTP layer enabled (ModelRunner::EnableMtp);
// uses a cache of its own (a few blocks).
absl::StatusOr<MtpStepCosts> MeasureMtpStepCosts(ModelRunner& runner);

// Time per output token without drafts over with one draft per step, when a verify step
// gains `acceptance` tokens on average: acceptance * decode / (verify + mtp).
double ExpectedMtpSpeedup(const MtpStepCosts& costs, double acceptance);

// The auto policy's assumptions: the acceptance length of one draft that the released GLM
// checkpoints' users report (first draft accepted ~80-90% of the time), and the speed-up it
// must promise before the server turns drafting on.
inline constexpr double kAutoMtpAcceptance = 1.8;
inline constexpr double kAutoMtpMinSpeedup = 1.2;

// 1 when ExpectedMtpSpeedup(costs, kAutoMtpAcceptance) >= kAutoMtpMinSpeedup, else 0; `why`
// (may be null) gets the numbers behind the choice, for the startup summary.
int AutoMtpDraftTokens(const MtpStepCosts& costs, std::string* why);

}  // namespace glmserve
