#include "core/base/op_times.h"

namespace glmserve {
namespace {

constexpr int kFamilies = static_cast<int>(OpFamily::kCount);
std::atomic<bool> enabled{false};
std::array<std::atomic<int64_t>, kFamilies> sums{};

}  // namespace

const char* OpFamilyName(OpFamily f) {
  static constexpr const char* kNames[kFamilies] = {
      "embed+norm", "qkv",         "attention",   "o_proj", "dense ffn",
      "router",     "expert gemm", "moe shuffle", "head",   "collective"};
  const int i = static_cast<int>(f);
  return i >= 0 && i < kFamilies ? kNames[i] : "?";
}

void EnableOpTimes(bool on) { enabled.store(on, std::memory_order_relaxed); }
bool OpTimesEnabled() { return enabled.load(std::memory_order_relaxed); }

void AddOpTime(OpFamily f, int64_t nanoseconds) {
  sums[static_cast<int>(f)].fetch_add(nanoseconds, std::memory_order_relaxed);
}

std::array<double, kFamilies> TakeOpTimes() {
  std::array<double, kFamilies> out{};
  for (int i = 0; i < kFamilies; ++i) out[i] = sums[i].exchange(0) * 1e-9;
  return out;
}

}  // namespace glmserve
