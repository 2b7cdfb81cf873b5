#include "core/model/weight_check.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/parallel.h"
#include "core/model/weight_layout.h"

namespace glmserve {
namespace {

// Index of the first non-finite element of [begin, end), or -1. Checked on the bit
// patterns: an all-ones exponent is Inf or NaN in every format.
int64_t FirstNonFinite(const void* data, DType dtype, int64_t begin, int64_t end) {
  switch (dtype) {
    case DType::kF32: {
      const auto* p = static_cast<const uint32_t*>(data);
      for (int64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, p + i, 4);  // the mapping need not be 4-byte aligned
        if ((bits & 0x7f800000u) == 0x7f800000u) return i;
      }
      return -1;
    }
    case DType::kBF16:
    case DType::kF16: {
      const uint16_t mask = dtype == DType::kBF16 ? 0x7f80 : 0x7c00;
      const auto* p = static_cast<const unsigned char*>(data);
      for (int64_t i = begin; i < end; ++i) {
        const uint16_t bits = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
        if ((bits & mask) == mask) return i;
      }
      return -1;
    }
    case DType::kF8E4M3:
    case DType::kF8E8M0: {
      // e4m3 has no infinities and one NaN code per sign (S.1111.111); e8m0's NaN is 0xff.
      const uint8_t nan = dtype == DType::kF8E4M3 ? 0x7f : 0xff;
      const auto* p = static_cast<const uint8_t*>(data);
      for (int64_t i = begin; i < end; ++i) {
        if ((p[i] & nan) == nan) return i;
      }
      return -1;
    }
  }
  return -1;
}

// The element ranges a matrix is checked over.
std::vector<std::pair<int64_t, int64_t>> Ranges(int64_t n, bool full) {
  if (full || n <= kVerifySamples * kVerifyRunElements) return {{0, n}};
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t s = 0; s < kVerifySamples; ++s) {
    // Evenly spaced runs, the first at the start and the last ending at the end.
    const int64_t begin = s * (n - kVerifyRunElements) / (kVerifySamples - 1);
    ranges.push_back({begin, begin + kVerifyRunElements});
  }
  return ranges;
}

}  // namespace

absl::StatusOr<VerifyWeights> ParseVerifyWeights(absl::string_view text) {
  if (text == "auto") return VerifyWeights::kAuto;
  if (text == "full") return VerifyWeights::kFull;
  if (text == "sampled") return VerifyWeights::kSampled;
  if (text == "off") return VerifyWeights::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("--verify_weights='", text, "': expected auto, full, sampled or off"));
}

absl::Status VerifyWeightsFinite(ModelWeights* w, VerifyWeights mode, absl::string_view source) {
  if (mode == VerifyWeights::kOff) return absl::OkStatus();
  const bool full = mode == VerifyWeights::kFull ||
                    (mode == VerifyWeights::kAuto && w->ParameterBytes() <= kFullVerifyLimitBytes);
  std::vector<WeightSlot> slots = ListWeightSlots(w);
  // The tied head is the embedding, checked as such.
  std::mutex mu;
  size_t bad_slot = slots.size();
  int64_t bad_element = -1;
  std::atomic<bool> found{false};
  ParallelFor(static_cast<int64_t>(slots.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last && !found.load(std::memory_order_relaxed); ++i) {
      const WeightSlot& slot = slots[static_cast<size_t>(i)];
      int64_t at = -1;
      if (slot.vector != nullptr) {
        at = FirstNonFinite(slot.vector->data(), DType::kF32, 0,
                            static_cast<int64_t>(slot.vector->size()));
      } else if (!slot.matrix->empty()) {
        const Matrix& m = *slot.matrix;
        for (const auto& [begin, end] : Ranges(m.rows * m.cols, full)) {
          if ((at = FirstNonFinite(m.data, m.dtype, begin, end)) >= 0) break;
        }
      }
      if (at < 0) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (static_cast<size_t>(i) < bad_slot) {  // report the first in slot order
        bad_slot = static_cast<size_t>(i);
        bad_element = at;
      }
      found.store(true);
    }
  });
  if (bad_slot == slots.size()) return absl::OkStatus();
  const WeightSlot& slot = slots[bad_slot];
  std::string where = absl::StrCat("element ", bad_element);
  if (slot.matrix != nullptr) {
    where = absl::StrCat("row ", bad_element / slot.matrix->cols, ", column ",
                         bad_element % slot.matrix->cols);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": tensor '", slot.name, "' holds a non-finite value (NaN or Inf) at ", where,
      "; the checkpoint is corrupt (re-download it, or --verify_weights=off to serve it anyway)"));
}

}  // namespace glmserve
