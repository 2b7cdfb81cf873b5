// Where a CPU forward spends its time, by op family: wall time of scopes on the thread that
// runs the forward (the ops' parallel loops included), for benchmarks and profiling
// (bench/cpu_bench --breakdown). Off unless enabled: a scope then costs one relaxed atomic
// load. Scopes of different families must not nest (each second is counted once).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace glmserve {

enum class OpFamily : int {
  kEmbedNorm,   // embedding lookup, RMS norms, residual adds
  kQkv,         // q/k/v projections, QK norm, RoPE, the KV cache write
  kAttention,   // scores, softmax, weighted sums (incl. packing K/V)
  kOProj,       // the attention output projection
  kDenseFfn,    // dense SwiGLU layers
  kRouter,      // router logits and expert choice
  kExpertGemm,  // routed and shared experts' gate/up and down projections
  kMoeShuffle,  // gathering tokens per expert, SiLU-mul, the weighted combine
  kHead,        // final norm and LM head
  kCollective,  // tensor parallel: the ranks' sums and gathers (core/model/communicator.h)
  kCount,
};

// "embed+norm", "qkv", "attention", ...
const char* OpFamilyName(OpFamily f);

// Turns timing on or off (process-wide) and reads/clears the sums (seconds per family).
void EnableOpTimes(bool on);
bool OpTimesEnabled();
std::array<double, static_cast<int>(OpFamily::kCount)> TakeOpTimes();
void AddOpTime(OpFamily f, int64_t nanoseconds);

class ScopedOpTime {
 public:
  explicit ScopedOpTime(OpFamily f) : family_(f), on_(OpTimesEnabled()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedOpTime() {
    if (!on_) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_);
    AddOpTime(family_, ns.count());
  }
  ScopedOpTime(const ScopedOpTime&) = delete;
  ScopedOpTime& operator=(const ScopedOpTime&) = delete;

 private:
  OpFamily family_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace glmserve
