#include "core/cpu/ops/linear.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/lane_sum.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"

namespace glmserve {
namespace {

// The rounded activations of one LinearMany call live in a per-thread, cache-line aligned
// arena reused from call to call: a fresh multi-megabyte buffer per call came back from
// malloc 16 bytes off a cache line (AMX tile loads then run at a third of their rate:
// core/base/aligned_vector.h) and cost its page faults and zeroing every time. A lease is taken by
// the calling thread for the call's duration; a nested call on the same thread (none today)
// gets a buffer of its own. Arenas above kKeepBytes are released after the call, so a long
// prefill does not pin its peak. 256 MiB keeps the largest of a default 2,048-token step (the
// MoE gate/up activations packed for every expert: 16,384 rows x 4,096, 128 MiB on
// glm-4.5-air); at 64 MiB it was released and faulted in again on every MoE layer, 0.08 .. 0.15 s
// of a 2,048-token prefill's 1.9 s (docs/performance.md).
class ScratchLease {
 public:
  ScratchLease() : owner_(!leased_) { leased_ = true; }
  ~ScratchLease() {
    if (!owner_) return;
    if (arena_.size() * sizeof(uint16_t) > kKeepBytes) AlignedVector<uint16_t>().swap(arena_);
    leased_ = false;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  uint16_t* Get(int64_t elements) { return GrowTo(owner_ ? &arena_ : &own_, elements); }

 private:
  static constexpr size_t kKeepBytes = size_t{256} << 20;
  static thread_local AlignedVector<uint16_t> arena_;
  static thread_local bool leased_;
  bool owner_;
  AlignedVector<uint16_t> own_;
};
thread_local AlignedVector<uint16_t> ScratchLease::arena_;
thread_local bool ScratchLease::leased_ = false;

}  // namespace

const char* CpuMathName(CpuMath math) {
  switch (math) {
    case CpuMath::kBf16:
      return "bf16";
    case CpuMath::kBf16Amx:
      return "bf16_amx";
    case CpuMath::kExact:
      break;
  }
  return "exact";
}

absl::StatusOr<CpuMath> ParseCpuMath(absl::string_view name) {
  if (name == "exact") return CpuMath::kExact;
  if (name == "bf16") return CpuMath::kBf16;
  if (name == "bf16_amx") return CpuMath::kBf16Amx;
  return absl::InvalidArgumentError(
      absl::StrCat("cpu math '", name.substr(0, 64), "' is not one of exact, bf16, bf16_amx"));
}

namespace internal {
namespace {
std::atomic<bool> force_generic{false};
std::atomic<bool> force_avx2{false};
std::atomic<bool> force_avx_vnni{false};
// Whether AVX-512 and AMX are hidden (ForceAvx2Kernels, ForceAvxVnniKernels).
bool NoAvx512Forced() { return force_avx2.load() || force_avx_vnni.load(); }
}  // namespace

void ForceGenericKernels(bool force) { force_generic.store(force); }
void ForceAvx2Kernels(bool force) { force_avx2.store(force); }
void ForceAvxVnniKernels(bool force) { force_avx_vnni.store(force); }

bool CpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has && !force_generic.load() && !NoAvx512Forced();
#else
  return false;
#endif
}

bool CpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !force_generic.load();
#else
  return false;
#endif
}

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has && CpuHasAvx512();
#else
  return false;
#endif
}

bool CpuHasAmx() { return AmxPermitted() && !force_generic.load() && !NoAvx512Forced(); }

bool CpuHasAvxVnni() {
#if defined(__x86_64__) || defined(__i386__)
  // CPUID leaf 7, subleaf 1, EAX bit 4 (clang 14's __builtin_cpu_supports has no name for it).
  // Its VEX instructions use the YMM state, which CpuHasAvx2Fma's check covers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0;
  }();
  return has && CpuHasAvx2Fma() && !force_avx2.load();
#else
  return false;
#endif
}

bool CpuHasAvx512Vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has && CpuHasAvx512();
#else
  return false;
#endif
}

void RoundToBf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(x[i]);
}

const float* E4m3Table() {
  static const auto* table = [] {
    auto* t = new float[256];
    for (int v = 0; v < 256; ++v) t[v] = E4m3ToFloat(static_cast<uint8_t>(v));
    return t;
  }();
  return table;
}

void WidenPanel(const Matrix& w, int64_t row_begin, int64_t rows, int64_t k_begin, int64_t k_len,
                float* out) {
  if (w.format == WeightFormat::kFp8Scaled) {
    // e4m3 x its block's scale, one fp32 rounding: the dequantized checkpoint's value, so the
    // exact arithmetic below computes what an fp32 forward of the dequantized model does.
    const float* table = E4m3Table();
    const int64_t bc = w.scale_block_cols;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + (row_begin + r) * w.cols;
      const float* scales = w.Fp8RowScales(row_begin + r);
      float* dst = out + r * k_len;
      for (int64_t k = k_begin; k < k_begin + k_len;) {
        const int64_t end = std::min(k_begin + k_len, (k / bc + 1) * bc);
        const float scale = scales[k / bc];
        for (; k < end; ++k) dst[k - k_begin] = table[src[k]] * scale;
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = (row_begin + r) * w.cols + k_begin;
    float* dst = out + r * k_len;
    switch (w.dtype) {
      case DType::kF32:
        std::copy_n(static_cast<const float*>(w.data) + base, k_len, dst);
        break;
      case DType::kBF16: {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + base;
        for (int64_t k = 0; k < k_len; ++k) dst[k] = Bf16ToFloat(src[k]);
        break;
      }
      case DType::kF16: {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + base;
        for (int64_t k = 0; k < k_len; ++k) dst[k] = F16ToFloat(src[k]);
        break;
      }
      case DType::kF8E4M3:  // only as kFp8Scaled, above
      case DType::kF8E8M0:
        std::fill_n(dst, k_len, 0.0f);
        break;
    }
  }
}

void LinearBlockGeneric(const LinearJob& job, int64_t nb, AlignedVector<float>* panel) {
  const Matrix& w = *job.w;
  const int64_t m = job.m, n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  float* y = job.y;
  for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * n_rows + n0, nn, 0.f);
  panel->resize(kBlockN * std::min(k_total, kBlockK));
  for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
    const int64_t kk = std::min(kBlockK, k_total - k0);
    WidenPanel(w, n0, nn, k0, kk, panel->data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < nn; ++n) {
        y[i * n_rows + n0 + n] += LaneDot<16>(job.x + i * k_total + k0, panel->data() + n * kk, kk);
      }
    }
  }
  if (job.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < nn; ++n) y[i * n_rows + n0 + n] += job.bias[n0 + n];
  }
}

namespace {

// One job of a LinearMany call, in the arithmetic it runs: int8 (int8.x set), kBf16
// (bf16.xb set), kBf16Amx (amx.xp set) or exact (none).
struct Task {
  LinearJob exact;
  Bf16Job bf16;
  AmxJob amx;
  Int8Job int8;
  int64_t rows() const { return exact.w->rows; }
  int64_t m() const { return exact.m; }
  int64_t blocks() const { return (rows() + kBlockN - 1) / kBlockN; }
  // Activation rows per unit (linear.h, kPartBytes): kBf16, exact, and int8 on the VNNI tiles
  // (a row's codes and its group scales).
  int64_t part_rows() const {
    if (int8.x != nullptr) return ActivationPartRows(int8.x->kp + int8.x->kp / kInt8Group * 4);
    return ActivationPartRows(exact.w->cols * (bf16.xb != nullptr ? 2 : 4));
  }
  bool int8_in_parts() const {
    return int8.x != nullptr && int8.x->operands == Int8Operands::kVnniTiles;
  }
  // Parallel units: kBf16Amx cuts its jobs its own way (AmxUnits), int8 off the VNNI tiles
  // into kBlockN output rows, the others into kBlockN output rows by parts of the activation
  // rows.
  int64_t units() const {
    if (m() <= 0) return 0;
    if (amx.xp != nullptr) return AmxUnits(amx);
    if (int8.x != nullptr && !int8_in_parts()) return blocks();
    return blocks() * ((m() + part_rows() - 1) / part_rows());
  }
  // A unit of a job cut in parts: its block of output rows and its activation rows [i0,
  // i0 + count). Parts run one after another, each over all the blocks.
  struct Cut {
    int64_t nb, i0, count;
  };
  Cut cut(int64_t unit) const {
    const int64_t part = part_rows(), i0 = unit / blocks() * part;
    return {unit % blocks(), i0, std::min(m() - i0, part)};
  }
};

}  // namespace

// Parts start at whole 16-row vectors of the int8 tiles.
static_assert(kBf16ChunkRows % kAmxTileRows == 0);

int64_t ActivationPartRows(int64_t row_bytes) {
  const int64_t rows = kPartBytes / std::max<int64_t>(1, row_bytes);
  return std::max(kBf16ChunkRows, rows / kBf16ChunkRows * kBf16ChunkRows);
}

namespace {

using BlockFn = void (*)(const LinearJob&, int64_t, AlignedVector<float>*);

void RunTasks(const std::vector<Task>& tasks, BlockFn exact_fn) {
  const auto bf16_fn = CpuHasAvx512Bf16() ? Bf16BlockAvx512 : Bf16BlockGeneric;
  // The operands LinearMany packed name the kernel (Int8OperandsFor); all give the same bits.
  // Either layout has a kernel on AVX512-VNNI and on AVX2.
  const auto int8_kernel = [](const Int8Job& job) {
    const bool rows16 = job.w->int8_layout == Int8Layout::kRows16;
    if (job.x->operands == Int8Operands::kVnniTiles) return Int8BlockAvx512Vnni;
    // AMX's operands where AMX is missing (only if asked for by hand): the reference reads them.
    if (job.x->operands != Int8Operands::kGroups) return Int8BlockGeneric;
    if (CpuHasAvx512Vnni()) return rows16 ? Int8BlockAvx512VnniRows16 : Int8BlockAvx512VnniRows;
    if (!CpuHasAvx2Fma()) return Int8BlockGeneric;
    if (rows16) return CpuHasAvxVnni() ? Int8BlockAvxVnniRows16 : Int8BlockAvx2Rows16;
    return Int8BlockAvx2;
  };
  // Blocks of all tasks in one index space: [starts[j], starts[j + 1]) belong to task j.
  std::vector<int64_t> starts(tasks.size() + 1, 0);
  for (size_t j = 0; j < tasks.size(); ++j) {
    starts[j + 1] = starts[j] + tasks[j].units();
  }
  const bool amx = CpuHasAmx(), amx_int8 = CpuHasAmxInt8();
  const bool amx_int8_model = Int8AmxTileModelForced(), amx_model = AmxTileModelForced();
  ParallelFor(starts.back(), 1, [&](int64_t begin, int64_t end) {
    thread_local AlignedVector<float> panel;
    // This thread's tile configuration (it is per thread; the two kernels' tiles differ).
    enum class Tiles { kNone, kBf16, kInt8 } tiles = Tiles::kNone;
    auto use_tiles = [&tiles](Tiles kind) {
      if (tiles != kind) kind == Tiles::kInt8 ? Int8AmxThreadBegin() : AmxThreadBegin();
      tiles = kind;
    };
    for (int64_t b = begin; b < end; ++b) {
      const size_t j = std::upper_bound(starts.begin(), starts.end(), b) - starts.begin() - 1;
      const Int8Activation* int8_x = tasks[j].int8.x;
      const bool amx_rows = int8_x != nullptr && int8_x->operands == Int8Operands::kAmxRows;
      const bool amx_tiles =
          amx_rows || (int8_x != nullptr && int8_x->operands == Int8Operands::kAmxTiles);
      if (amx_tiles && amx_int8_model) {
        (amx_rows ? Int8AmxRows16BlockTileModel : Int8AmxBlockTileModel)(tasks[j].int8,
                                                                         b - starts[j]);
      } else if (amx_tiles && amx_int8) {
        use_tiles(Tiles::kInt8);
        (amx_rows ? Int8AmxRows16BlockHardware : Int8AmxBlockHardware)(tasks[j].int8,
                                                                       b - starts[j]);
      } else if (tasks[j].int8.x != nullptr) {
        const auto kernel = int8_kernel(tasks[j].int8);
        if (!tasks[j].int8_in_parts()) {
          kernel(tasks[j].int8, b - starts[j]);
          continue;
        }
        // The unit's part of the activation rows (whole 16-row vectors of the tiles).
        const Task::Cut cut = tasks[j].cut(b - starts[j]);
        Int8Job job = tasks[j].int8;
        job.row_begin = cut.i0;
        job.row_end = cut.i0 + cut.count;
        kernel(job, cut.nb);
      } else if (tasks[j].amx.xp != nullptr) {
        if (amx_model || !amx) {
          (amx_model ? AmxUnitTileModel : AmxUnitEmulated)(tasks[j].amx, b - starts[j]);
          continue;
        }
        use_tiles(Tiles::kBf16);
        AmxUnitHardware(tasks[j].amx, b - starts[j]);
      } else {
        // kBf16 or exact: the unit's part of the activation rows is a job of its own.
        const auto [nb, i0, rows] = tasks[j].cut(b - starts[j]);
        const int64_t k = tasks[j].exact.w->cols, n = tasks[j].rows();
        if (tasks[j].bf16.xb != nullptr) {
          const Bf16Job& job = tasks[j].bf16;
          bf16_fn({job.xb + i0 * k, rows, job.w, job.bias, job.y + i0 * n}, nb);
        } else {
          const LinearJob& job = tasks[j].exact;
          exact_fn({job.x + i0 * k, rows, job.w, job.bias, job.y + i0 * n}, nb, &panel);
        }
      }
    }
    // Released tiles are not saved at a context switch, and other code on this pool thread
    // never finds them configured.
    if (tiles != Tiles::kNone) AmxThreadEnd();
  });
}

BlockFn ExactBlockFn() {
  if (CpuHasAvx512()) return LinearBlockAvx512;
  return CpuHasAvx2Fma() ? LinearBlockAvx2 : LinearBlockGeneric;
}

}  // namespace

void LinearGeneric(const float* x, int64_t m, const Matrix& w, const float* bias, float* y) {
  RunTasks({Task{LinearJob{x, m, &w, bias, y}, {}, {}, {}}}, LinearBlockGeneric);
}

}  // namespace internal

void LinearMany(absl::Span<const LinearJob> jobs, CpuMath math) {
  std::vector<internal::Task> tasks(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) tasks[j].exact = jobs[j];
  // Which jobs take the bf16 arithmetic: bf16 weights in kBf16 (int8 weights take their own,
  // below, in every mode).
  auto takes_bf16 = [math](const LinearJob& job) {
    const Matrix& w = *job.w;
    return job.m > 0 && w.format == WeightFormat::kDense && math == CpuMath::kBf16 &&
           w.dtype == DType::kBF16;
  };
  // kBf16Amx: dense bf16 weights (int8 keeps its own kernel below; FP8 the exact one).
  auto takes_amx = [math](const LinearJob& job) {
    const Matrix& w = *job.w;
    return job.m > 0 && math == CpuMath::kBf16Amx && w.format == WeightFormat::kDense &&
           w.dtype == DType::kBF16;
  };
  // Int8 weights: each distinct activation quantized once (q/k/v and gate/up share theirs),
  // with the operands this machine's kernel reads; a deque keeps the addresses the tasks hold.
  // The storage stays with the thread from call to call: a prefill's activations are tens of
  // MB, which fresh from the allocator are fresh pages, faulted in and zeroed on every call.
  struct Quantized {
    const float* x;
    internal::Int8Activation a;
  };
  static thread_local std::deque<Quantized> quantized;
  size_t used = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const LinearJob& job = jobs[j];
    if (job.m <= 0 || job.w->format != WeightFormat::kInt8Groups) continue;
    const int64_t k = job.w->cols;
    const internal::Int8Operands operands = internal::Int8OperandsFor(job.m, job.w->int8_layout);
    auto same = [&](const Quantized& q) {
      return q.x == job.x && q.a.m == job.m && q.a.k == k && q.a.operands == operands;
    };
    auto it = std::find_if(quantized.begin(), quantized.begin() + used, same);
    if (it == quantized.begin() + used) {
      if (used == quantized.size()) quantized.emplace_back();
      it = quantized.begin() + used++;
      it->x = job.x;
      internal::QuantizeActivationInt8(job.x, job.m, k, &it->a, operands);
    }
    tasks[j].int8 = {&it->a, job.w, job.bias, job.y};
  }
  // Each distinct activation of those is rounded to bf16 once (q/k/v and gate/up share
  // theirs), in parallel over rows; the rounding is elementwise, so its cut cannot change a bit.
  // kBf16Amx packs them (linear_amx.h) instead: `amx` tells the two apart.
  struct Rounded {
    const float* x;
    int64_t m, k;
    bool amx;
    int64_t offset = 0;  // into the scratch arena, in elements (a multiple of 32)
    int64_t units() const {
      return amx ? (m + internal::kAmxTileRows - 1) / internal::kAmxTileRows : m;
    }
    bool Serves(const LinearJob& job, bool job_amx) const {
      return x == job.x && m == job.m && k == job.w->cols && amx == job_amx;
    }
  };
  std::vector<Rounded> rounded;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const bool amx = takes_amx(jobs[j]);
    if (!amx && !takes_bf16(jobs[j])) continue;
    auto same = [&](const Rounded& r) { return r.Serves(jobs[j], amx); };
    if (std::find_if(rounded.begin(), rounded.end(), same) == rounded.end()) {
      rounded.push_back({jobs[j].x, jobs[j].m, jobs[j].w->cols, amx});
    }
  }
  // All rounded activations in one cache-line aligned arena, leased until the tasks are done.
  // Every element is written below (the AMX packing writes its padding zeros itself), so the
  // arena is reused uninitialised.
  ScratchLease scratch;
  if (!rounded.empty()) {
    int64_t total = 0;
    std::vector<int64_t> unit_starts(rounded.size() + 1, 0);
    for (size_t r = 0; r < rounded.size(); ++r) {
      rounded[r].offset = total;
      const int64_t size = rounded[r].amx ? internal::AmxPackedSize(rounded[r].m, rounded[r].k)
                                          : rounded[r].m * rounded[r].k;
      total += (size + 31) / 32 * 32;
      unit_starts[r + 1] = unit_starts[r] + rounded[r].units();
    }
    uint16_t* arena = scratch.Get(total);
    // Decode-sized activations are rounded on the caller: waking the pool costs more.
    int64_t elements = 0;
    for (const Rounded& r : rounded) elements += r.m * r.k;
    const int64_t grain = elements <= (int64_t{1} << 16) ? unit_starts.back() : 1;
    // A unit: one row (kBf16) or one 16-row tile block (kBf16Amx). The rounding is
    // elementwise, so how units are cut cannot change a bit.
    ParallelFor(unit_starts.back(), grain, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit) {
        const size_t r = std::upper_bound(unit_starts.begin(), unit_starts.end(), unit) -
                         unit_starts.begin() - 1;
        const Rounded& rr = rounded[r];
        const int64_t i = unit - unit_starts[r];
        if (rr.amx) {
          internal::PackAmxActivations(rr.x, rr.m, rr.k, i, arena + rr.offset);
        } else {
          internal::RoundToBf16(rr.x + i * rr.k, rr.k, arena + rr.offset + i * rr.k);
        }
      }
    });
    for (size_t j = 0; j < jobs.size(); ++j) {
      const bool amx = takes_amx(jobs[j]);
      for (const Rounded& r : rounded) {
        if (!r.Serves(jobs[j], amx)) continue;
        if (amx) {
          tasks[j].amx = {arena + r.offset, jobs[j].m, jobs[j].w, jobs[j].bias, jobs[j].y};
        } else if (takes_bf16(jobs[j])) {
          tasks[j].bf16 = {arena + r.offset, jobs[j].m, jobs[j].w, jobs[j].bias, jobs[j].y};
        }
      }
    }
  }
  internal::RunTasks(tasks, internal::ExactBlockFn());
}

void Linear(const float* x, int64_t m, const Matrix& w, const float* bias, float* y, CpuMath math) {
  if (m <= 0 || w.rows <= 0) return;
  const LinearJob job{x, m, &w, bias, y};
  LinearMany({job}, math);
}

const char* LinearInt8KernelName() {
  if (internal::CpuHasAmxInt8()) return "amx_int8";
  if (internal::CpuHasAvx512Vnni()) return "avx512_vnni";
  if (internal::CpuHasAvxVnni()) return "avx_vnni_int8";
  return internal::CpuHasAvx2Fma() ? "avx2_int8" : "generic_int8";
}

const char* LinearKernelName(CpuMath math) {
  if (math == CpuMath::kBf16Amx) return internal::CpuHasAmx() ? "amx_bf16" : "generic_amx_bf16";
  if (math == CpuMath::kBf16) {
    return internal::CpuHasAvx512Bf16() ? "avx512_bf16" : "generic_bf16";
  }
  if (internal::CpuHasAvx512()) return "avx512";
  return internal::CpuHasAvx2Fma() ? "avx2" : "generic";
}

}  // namespace glmserve
