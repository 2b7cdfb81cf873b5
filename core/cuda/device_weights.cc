#include "core/cuda/device_weights.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/dtype.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/cuda/cuda_check.h"
#include "core/model/rope_freq.h"

namespace glmserve::cuda {
namespace {

constexpr int64_t kAlign = 256;
constexpr size_t kStagingBytes = size_t{32} << 20;

// kU8: bytes copied as they are (FP8 codes).
enum class Target { kBf16, kF32, kU8 };

int64_t TargetSize(Target t) { return t == Target::kBf16 ? 2 : t == Target::kF32 ? 4 : 1; }

bool IsFp8(const Matrix& m) { return m.format == WeightFormat::kFp8Scaled; }

// One contiguous piece of the device image: `count` elements from `src` (of `src_type`;
// null: zeros) converted to `target` at byte `offset`.
struct Piece {
  const void* src = nullptr;
  DType src_type = DType::kF32;
  int64_t count = 0;
  int64_t offset = 0;
  Target target = Target::kBf16;
};

// An FP8 preset matrix's codes generated on the device (LaunchRandomFp8) at `offset`.
struct GeneratedCodes {
  int64_t offset = 0;
  int64_t count = 0;
  uint64_t key = 0;
  float value_scale = 0;
};

// Plans the device image: the byte offset of every tensor, in upload order, and the device
// pointer each will have once the image sits at `base`. The plan runs twice over the same
// weights: first with base 0 to size and check the image (its pointers are then plain
// offsets, never used), then at the allocation's address to fill the DeviceWeights the
// kernels read. The Plan* functions below are the one list of the device layout.
class ImagePlan {
 public:
  ImagePlan(const ModelWeights& w, char* base) : base_(reinterpret_cast<uintptr_t>(base)) {
    for (const ModelWeights::DeviceGeneratedFp8& g : w.device_generated_fp8) {
      generated_[g.matrix] = &g;
    }
  }
  // The device address of the byte at `offset`.
  template <typename T>
  const T* At(int64_t offset) const {
    return reinterpret_cast<const T*>(base_ + static_cast<uintptr_t>(offset));
  }
  // Starts a new tensor at an aligned offset; pieces added until the next Begin() follow it
  // contiguously (fused matrices).
  int64_t Begin() {
    size_ = (size_ + kAlign - 1) / kAlign * kAlign;
    return size_;
  }
  void Add(const void* src, DType type, int64_t count, Target target, bool per_step) {
    pieces_.push_back({src, type, count, size_, target});
    size_ += count * TargetSize(target);
    if (per_step) step_bytes_ += count * TargetSize(target);
  }
  void AddMatrix(const Matrix& m, Target target, bool per_step = true) {
    // Widening needs the dense values: an FP8 or int8 matrix here would be read as raw codes.
    if (m.format != WeightFormat::kDense) {
      Fail(
          "an FP8 or int8 matrix where the CUDA backend reads bf16 (the embedding, lm_head, "
          "a router, or GLM-5's indexer weights_proj): not supported on the device");
    }
    Add(m.data, m.dtype, m.rows * m.cols, target, per_step);
  }
  // FP8 matrices of one shape, [rows, cols] each (one, or a layer's routed experts: stacked),
  // with the same scale blocks: codes as they are at one offset, fp32 scales at another.
  Fp8DeviceMatrix AddFp8(const std::vector<const Matrix*>& ms, int64_t rows, int64_t cols,
                         bool per_step, const std::string& what) {
    Fp8DeviceMatrix out;
    const Matrix& first = *ms.front();
    for (const Matrix* m : ms) {
      if (m->empty() && generated_.count(m) == 0) {
        Fail(absl::StrCat(what, ": an FP8 matrix without codes"));
        return out;
      }
      if (!IsFp8(*m) || m->dtype != DType::kF8E4M3 || m->scales == nullptr || m->rows != rows ||
          m->cols != cols || m->scale_block_rows <= 0 || m->scale_block_cols <= 0 ||
          m->scale_block_rows != first.scale_block_rows ||
          m->scale_block_cols != first.scale_block_cols) {
        Fail(absl::StrCat(what, ": FP8 matrix shape or scale blocks do not match [", rows, ", ",
                          cols, "]"));
        return out;
      }
      // A row slice starting inside a block row (core/model/weights.h: a tensor-parallel
      // rank's k or v rows) takes the row-granular form below; stacked experts never do.
      if (m->scale_row_phase != 0 && ms.size() > 1) {
        Fail(absl::StrCat(what, ": stacked FP8 row slices starting inside a scale block"));
        return out;
      }
    }
    const bool row_scales = first.scale_row_phase != 0;
    out.codes = At<uint8_t>(Begin());
    for (const Matrix* m : ms) {
      if (auto g = generated_.find(m); g != generated_.end()) {
        // No piece to copy: the device fills these bytes after the copies.
        generated_codes_.push_back({size_, rows * cols, g->second->key, g->second->value_scale});
        size_ += rows * cols;
        if (per_step) step_bytes_ += rows * cols;
        continue;
      }
      Add(m->data, DType::kF8E4M3, rows * cols, Target::kU8, per_step);
    }
    out.scales = At<float>(Begin());
    out.rows = rows;
    out.cols = cols;
    out.block_rows = first.scale_block_rows;
    out.block_cols = first.scale_block_cols;
    if (row_scales) {
      // Its first block row is cut short at the top: each row's own copy of its block's scales
      // (block_rows 1, the same value per element; the kernels index scales generically).
      std::vector<float> expanded;
      expanded.reserve(rows * first.scale_cols());
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = first.Fp8RowScales(r);
        expanded.insert(expanded.end(), row, row + first.scale_cols());
      }
      owned_.push_back(std::move(expanded));
      Add(owned_.back().data(), DType::kF32, static_cast<int64_t>(owned_.back().size()),
          Target::kF32, per_step);
      out.block_rows = 1;
      return out;
    }
    for (const Matrix* m : ms) {
      Add(m->scales, DType::kF32, m->scale_rows() * m->scale_cols(), Target::kF32, per_step);
    }
    return out;
  }
  Fp8DeviceMatrix AddFp8(const Matrix& m, int64_t rows, int64_t cols, const std::string& what) {
    return AddFp8(std::vector<const Matrix*>{&m}, rows, cols, /*per_step=*/true, what);
  }
  void Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }
  const std::string& error() const { return error_; }
  // An empty vector reads as zeros; any other size must be `count`.
  void AddVector(const std::vector<float>& v, int64_t count) {
    if (!v.empty() && static_cast<int64_t>(v.size()) != count) bad_shapes_ = true;
    Add(v.empty() ? nullptr : v.data(), DType::kF32, count, Target::kF32, true);
  }
  // A matrix must be present with the expected shape.
  void AddMatrix(const Matrix& m, int64_t rows, int64_t cols, Target target, bool per_step = true) {
    if (m.empty() || m.rows != rows || m.cols != cols) bad_shapes_ = true;
    AddMatrix(m, target, per_step);
  }
  // One tensor of its own: a vector (fp32), or a matrix checked against [rows, cols].
  const float* Vector(const std::vector<float>& v, int64_t count) {
    const int64_t at = Begin();
    AddVector(v, count);
    return At<float>(at);
  }
  const uint16_t* Bf16(const Matrix& m, int64_t rows, int64_t cols) {
    const int64_t at = Begin();
    AddMatrix(m, rows, cols, Target::kBf16);
    return At<uint16_t>(at);
  }
  // A vector computed at load (not in the checkpoint): the plan keeps it until the upload.
  const float* OwnedVector(std::vector<float> v) {
    owned_.push_back(std::move(v));
    return Vector(owned_.back(), static_cast<int64_t>(owned_.back().size()));
  }
  bool bad_shapes() const { return bad_shapes_; }
  void CountStepBytes(int64_t bytes) { step_bytes_ += bytes; }
  int64_t size() const { return size_; }
  int64_t step_bytes() const { return step_bytes_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<GeneratedCodes>& generated_codes() const { return generated_codes_; }

 private:
  std::vector<Piece> pieces_;
  uintptr_t base_ = 0;
  std::list<std::vector<float>> owned_;  // stable addresses for OwnedVector's pieces
  std::unordered_map<const Matrix*, const ModelWeights::DeviceGeneratedFp8*> generated_;
  std::vector<GeneratedCodes> generated_codes_;
  int64_t size_ = 0;
  int64_t step_bytes_ = 0;
  bool bad_shapes_ = false;
  std::string error_;
};

// Converts elements [first, first + n) of `p` into `out` (pinned staging).
void ConvertChunk(const Piece& p, int64_t first, int64_t n, void* out) {
  ParallelFor(n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    if (p.src == nullptr) {
      std::memset(static_cast<char*>(out) + begin * TargetSize(p.target), 0,
                  (end - begin) * TargetSize(p.target));
      return;
    }
    if (p.target == Target::kU8) {
      std::memcpy(static_cast<char*>(out) + begin, static_cast<const char*>(p.src) + first + begin,
                  end - begin);
    } else if (p.target == Target::kBf16) {
      uint16_t* o = static_cast<uint16_t*>(out);
      if (p.src_type == DType::kBF16) {
        std::memcpy(o + begin, static_cast<const uint16_t*>(p.src) + first + begin,
                    (end - begin) * sizeof(uint16_t));
      } else {
        for (int64_t i = begin; i < end; ++i) {
          o[i] = FloatToBf16(LoadAsFloat(p.src, p.src_type, first + i));
        }
      }
    } else {
      float* o = static_cast<float*>(out);
      for (int64_t i = begin; i < end; ++i) o[i] = LoadAsFloat(p.src, p.src_type, first + i);
    }
  });
}

// Streams the pieces through two pinned buffers: the host fills one while the other's copy
// is in flight.
absl::Status Execute(const ImagePlan& plan, char* device_base, cudaStream_t stream,
                     const LoadProgressCallback& progress) {
  LoadProgress prog;
  prog.tensors_total = static_cast<int64_t>(plan.pieces().size());
  for (const Piece& piece : plan.pieces())
    prog.bytes_total += piece.count * TargetSize(piece.target);
  const auto start = std::chrono::steady_clock::now();
  constexpr int64_t kReportEvery = int64_t{256} << 20;
  int64_t next_report = kReportEvery;
  const auto report = [&] {
    if (!progress) return;
    prog.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress(prog);
  };
  report();
  absl::StatusOr<PinnedBuffer> staging[2] = {PinnedBuffer::Create(kStagingBytes),
                                             PinnedBuffer::Create(kStagingBytes)};
  absl::StatusOr<Event> done[2] = {CreateEvent(false), CreateEvent(false)};
  for (int i = 0; i < 2; ++i) {
    if (!staging[i].ok()) return staging[i].status();
    if (!done[i].ok()) return done[i].status();
  }
  int which = 0;
  for (const Piece& p : plan.pieces()) {
    const int64_t per_chunk = static_cast<int64_t>(kStagingBytes) / TargetSize(p.target);
    for (int64_t first = 0; first < p.count; first += per_chunk) {
      const int64_t n = std::min(per_chunk, p.count - first);
      GLM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done[which]->get()));
      ConvertChunk(p, first, n, staging[which]->get());
      GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          device_base + p.offset + first * TargetSize(p.target), staging[which]->get(),
          n * TargetSize(p.target), cudaMemcpyHostToDevice, stream));
      GLM_CUDA_RETURN_IF_ERROR(cudaEventRecord(done[which]->get(), stream));
      which ^= 1;
      prog.bytes_done += n * TargetSize(p.target);
      if (prog.bytes_done >= next_report && prog.bytes_done < prog.bytes_total) {
        report();
        next_report = (prog.bytes_done / kReportEvery + 1) * kReportEvery;
      }
    }
    ++prog.tensors_done;
  }
  // FP8 preset codes: generated in place, after (and ordered behind) the copies.
  for (const GeneratedCodes& g : plan.generated_codes()) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchRandomFp8(reinterpret_cast<uint8_t*>(device_base + g.offset),
                                             g.count, g.key, g.value_scale, stream));
  }
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  report();  // every byte on the device
  return absl::OkStatus();
}

// Whether a group of projections that run together is FP8: all of them (true) or none (false);
// a mix is refused (docs/fp8.md).
absl::StatusOr<bool> GroupIsFp8(const std::vector<const Matrix*>& ms, const std::string& what) {
  size_t fp8 = 0;
  for (const Matrix* m : ms) fp8 += IsFp8(*m) ? 1 : 0;
  if (fp8 != 0 && fp8 != ms.size()) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": ", fp8, " of ", ms.size(),
                     " matrices are FP8 and the rest unquantized; the CUDA backend runs a group of "
                     "projections all FP8 or all unquantized"));
  }
  return fp8 != 0;
}

// An FFN's gate, up and down: FP8 as a group (gate8, up8, down8) or bf16 (gate|up fused, down).
absl::Status PlanFfn(const FfnWeights& f, ImagePlan& plan, const std::string& what, DeviceFfn& d) {
  ASSIGN_OR_RETURN(const bool fp8, GroupIsFp8({&f.gate, &f.up, &f.down}, what));
  d.width = f.gate.rows;
  if (fp8) {
    d.gate8 = plan.AddFp8(f.gate, f.gate.rows, f.gate.cols, what);
    d.up8 = plan.AddFp8(f.up, f.up.rows, f.up.cols, what);
    d.down8 = plan.AddFp8(f.down, f.down.rows, f.down.cols, what);
    return absl::OkStatus();
  }
  const int64_t gate_up = plan.Begin();
  plan.AddMatrix(f.gate, Target::kBf16);
  plan.AddMatrix(f.up, Target::kBf16);
  d.gate_up = plan.At<uint16_t>(gate_up);
  d.down = plan.Bf16(f.down, f.down.rows, f.down.cols);
  return absl::OkStatus();
}

// GLM-5's attention tensors, checked against the config's widths. FP8 by group (q_a, q_b,
// kv_a, kv_b, o; the indexer's wq_b, wk): codes and block scales as stored, kv_b included
// (the attention kernel reads its codes: the CPU's exact fp32 values, at a quarter of an fp32
// copy's bytes). Whether a layer has an indexer is the config's word: an FP8 preset's
// device-generated wq_b has no host data.
absl::Status PlanMla(const ModelConfig& c, int64_t layer, const MlaWeights& m, ImagePlan& plan,
                     DeviceMla& d) {
  const int64_t hidden = c.hidden_size, q_rank = c.q_lora_rank, r = c.kv_lora_rank;
  const int64_t dr = c.qk_rope_head_dim, heads = c.num_attention_heads;
  const int64_t q_b_rows = heads * c.qk_head_dim();
  const int64_t kv_b_rows = heads * (c.qk_nope_head_dim + c.v_head_dim);
  const int64_t o_cols = heads * c.v_head_dim;
  const std::string where = absl::StrCat("layer ", layer, " MLA attention");
  ASSIGN_OR_RETURN(
      const bool fp8,
      GroupIsFp8({&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.o_proj}, where));
  if (fp8) {
    d.q_a8 = plan.AddFp8(m.q_a_proj, q_rank, hidden, where);
    d.q_b8 = plan.AddFp8(m.q_b_proj, q_b_rows, q_rank, where);
    d.kv_a8 = plan.AddFp8(m.kv_a_proj, r + dr, hidden, where);
    d.kv_b8 = plan.AddFp8(m.kv_b_proj, kv_b_rows, r, where);
    d.o8 = plan.AddFp8(m.o_proj, hidden, o_cols, where);
  } else {
    d.q_a = plan.Bf16(m.q_a_proj, q_rank, hidden);
    d.q_b = plan.Bf16(m.q_b_proj, q_b_rows, q_rank);
    d.kv_a = plan.Bf16(m.kv_a_proj, r + dr, hidden);
    d.kv_b = plan.Bf16(m.kv_b_proj, kv_b_rows, r);
    d.o = plan.Bf16(m.o_proj, hidden, o_cols);
  }
  d.q_a_norm = plan.Vector(m.q_a_norm, q_rank);
  d.kv_a_norm = plan.Vector(m.kv_a_norm, r);
  if (!c.has_indexer(layer)) return absl::OkStatus();
  const IndexerWeights& x = m.indexer;
  const int64_t di = c.index_head_dim;
  const std::string iwhere = absl::StrCat("layer ", layer, " DSA indexer");
  ASSIGN_OR_RETURN(const bool ifp8, GroupIsFp8({&x.wq_b, &x.wk}, iwhere));
  if (ifp8) {
    d.wq_b8 = plan.AddFp8(x.wq_b, c.index_n_heads * di, q_rank, iwhere);
    d.wk8 = plan.AddFp8(x.wk, di, hidden, iwhere);
  } else {
    d.wq_b = plan.Bf16(x.wq_b, c.index_n_heads * di, q_rank);
    d.wk = plan.Bf16(x.wk, di, hidden);
  }
  d.k_norm = plan.Vector(x.k_norm, di);
  d.k_norm_bias = plan.Vector(x.k_norm_bias, di);
  const int64_t weights_proj = plan.Begin();
  plan.AddMatrix(x.weights_proj, c.index_n_heads, hidden, Target::kF32);
  d.weights_proj = plan.At<float>(weights_proj);
  return absl::OkStatus();
}

// Absent: neither values nor (for an FP8 preset's device-generated codes) scales.
bool Absent(const Matrix& m) { return m.empty() && m.scales == nullptr; }

absl::Status CheckFfn(const FfnWeights& f, int64_t hidden, const char* what) {
  if (Absent(f.gate) || Absent(f.up) || Absent(f.down) || f.gate.cols != hidden ||
      f.up.rows != f.gate.rows || f.up.cols != hidden || f.down.rows != hidden ||
      f.down.cols != f.gate.rows) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent ", what, " weights"));
  }
  return absl::OkStatus();
}

// GLM-4.5's attention: q, k, v (fused bf16, or FP8 as a group), their biases, o, the QK norms.
absl::Status PlanAttention(const ModelConfig& c, const LayerWeights& l, ImagePlan& plan,
                           DeviceLayer& d) {
  const AttentionWeights& a = l.attn;
  const int64_t hidden = c.hidden_size;
  const std::string where = absl::StrCat("layer ", l.layer_index, " attention");
  ASSIGN_OR_RETURN(const bool qkv8, GroupIsFp8({&a.q_proj, &a.k_proj, &a.v_proj}, where));
  if (qkv8) {
    d.q8 = plan.AddFp8(a.q_proj, c.q_dim(), hidden, where);
    d.k8 = plan.AddFp8(a.k_proj, c.kv_dim(), hidden, where);
    d.v8 = plan.AddFp8(a.v_proj, c.kv_dim(), hidden, where);
  } else {
    const int64_t qkv = plan.Begin();
    plan.AddMatrix(a.q_proj, c.q_dim(), hidden, Target::kBf16);
    plan.AddMatrix(a.k_proj, c.kv_dim(), hidden, Target::kBf16);
    plan.AddMatrix(a.v_proj, c.kv_dim(), hidden, Target::kBf16);
    d.qkv = plan.At<uint16_t>(qkv);
  }
  if (!a.q_bias.empty() || !a.k_bias.empty() || !a.v_bias.empty()) {
    const int64_t bias = plan.Begin();  // a missing one of the three reads as zeros
    plan.AddVector(a.q_bias, c.q_dim());
    plan.AddVector(a.k_bias, c.kv_dim());
    plan.AddVector(a.v_bias, c.kv_dim());
    d.qkv_bias = plan.At<float>(bias);
  }
  if (IsFp8(a.o_proj)) {
    d.o8 = plan.AddFp8(a.o_proj, hidden, c.q_dim(), where);
  } else {
    d.o = plan.Bf16(a.o_proj, hidden, c.q_dim());
  }
  if (!a.q_norm.empty()) {
    d.q_norm = plan.Vector(a.q_norm, c.head_dim);
    d.k_norm = plan.Vector(a.k_norm, c.head_dim);
  }
  return absl::OkStatus();
}

// A MoE layer's router (fp32), its routed experts (FP8 as a group, or bf16 gate+up then down)
// and its shared expert. `routed_bytes`: what one routed expert's matrices take.
absl::Status PlanMoe(const ModelConfig& c, const LayerWeights& l, const IndexRange& held,
                     ImagePlan& plan, DeviceLayer& d, int64_t* routed_bytes) {
  const int64_t hidden = c.hidden_size;
  const MoeWeights& m = l.moe;
  if (static_cast<int64_t>(m.experts.size()) != c.n_routed_experts ||
      m.router.rows != c.n_routed_experts || m.router.cols != hidden ||
      static_cast<int64_t>(m.router_bias.size()) != c.n_routed_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l.layer_index, ": router or expert count does not match"));
  }
  const int64_t router = plan.Begin();
  plan.AddMatrix(m.router, Target::kF32);
  d.router = plan.At<float>(router);
  d.router_bias = plan.Vector(m.router_bias, c.n_routed_experts);
  // The experts this rank holds (all of them on its own), stacked from local index 0.
  if (held.begin < 0 || held.count < 1 || held.end() > c.n_routed_experts) {
    return absl::InvalidArgumentError("held routed experts out of range");
  }
  // Pointers into the weights themselves: device-generated FP8 codes are found by address.
  std::vector<const FfnWeights*> mine;
  for (int64_t e = held.begin; e < held.end(); ++e) mine.push_back(&m.experts[e]);
  std::vector<const Matrix*> gates, ups, downs, all;
  for (const FfnWeights* expert : mine) {
    const FfnWeights& e = *expert;
    RETURN_IF_ERROR(CheckFfn(e, hidden, "expert"));
    if (e.gate.rows != c.moe_intermediate_size) {
      return absl::InvalidArgumentError("expert width differs from moe_intermediate_size");
    }
    gates.push_back(&e.gate);
    ups.push_back(&e.up);
    downs.push_back(&e.down);
    all.insert(all.end(), {&e.gate, &e.up, &e.down});
  }
  const std::string experts_what = absl::StrCat("layer ", l.layer_index, " routed experts");
  ASSIGN_OR_RETURN(const bool experts8, GroupIsFp8(all, experts_what));
  const int64_t width = c.moe_intermediate_size;
  if (experts8) {
    d.experts_gate8 = plan.AddFp8(gates, width, hidden, /*per_step=*/false, experts_what);
    d.experts_up8 = plan.AddFp8(ups, width, hidden, false, experts_what);
    d.experts_down8 = plan.AddFp8(downs, hidden, width, false, experts_what);
    const FfnWeights& e0 = *mine.front();
    *routed_bytes = e0.gate.bytes() + e0.up.bytes() + e0.down.bytes();
  } else {
    const int64_t gate_up = plan.Begin();
    for (const FfnWeights* e : mine) {
      plan.AddMatrix(e->gate, Target::kBf16, /*per_step=*/false);
      plan.AddMatrix(e->up, Target::kBf16, /*per_step=*/false);
    }
    const int64_t down = plan.Begin();
    for (const FfnWeights* e : mine) plan.AddMatrix(e->down, Target::kBf16, false);
    d.experts_gate_up = plan.At<uint16_t>(gate_up);
    d.experts_down = plan.At<uint16_t>(down);
    *routed_bytes = 3 * width * hidden * 2;
  }
  // has_shared(), device-generated codes included. A rank past the shared expert's last scale
  // block holds none of it (ShardWeights leaves it absent: it adds nothing to the sum).
  if (!Absent(m.shared.gate)) {
    RETURN_IF_ERROR(CheckFfn(m.shared, hidden, "shared expert"));
    RETURN_IF_ERROR(
        PlanFfn(m.shared, plan, absl::StrCat("layer ", l.layer_index, " shared expert"), d.shared));
  }
  return absl::OkStatus();
}

// One decoder layer: its norms, attention (GLM-4.5's or GLM-5's MLA) and FFN (dense or MoE).
// `slice`: a tensor-parallel rank's layer (ShardWeights), whose narrow FFNs may be empty.
absl::Status PlanLayer(const ModelConfig& c, const LayerWeights& l, const IndexRange& held,
                       bool slice, ImagePlan& plan, DeviceLayer& d, int64_t* routed_bytes) {
  d.input_norm = plan.Vector(l.input_norm, c.hidden_size);
  d.post_norm = plan.Vector(l.post_attention_norm, c.hidden_size);
  if (c.is_mla()) {
    RETURN_IF_ERROR(PlanMla(c, l.layer_index, l.mla, plan, d.mla));
  } else {
    RETURN_IF_ERROR(PlanAttention(c, l, plan, d));
  }
  d.is_moe = l.is_moe;
  if (l.is_moe) return PlanMoe(c, l, held, plan, d, routed_bytes);
  // A tensor-parallel rank past a narrow dense FFN's last scale block holds none of it
  // (ShardWeights leaves the matrices empty): width 0, its output zeros.
  if (slice && l.dense.gate.empty() && l.dense.up.empty() && l.dense.down.empty()) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckFfn(l.dense, c.hidden_size, "dense FFN"));
  return PlanFfn(l.dense, plan, absl::StrCat("layer ", l.layer_index, " dense FFN"), d.dense);
}

// The whole image: embedding, layers, final norm and LM head (tied: the embedding's), RoPE
// frequencies. Fills `out`'s pointers for the plan's base and its per-step byte counts.
absl::Status PlanImage(const ModelWeights& w, const DeviceSlice& slice, ImagePlan& plan,
                       DeviceWeights& out) {
  const ModelConfig& c = w.config;
  const int64_t hidden = c.hidden_size;
  const int64_t vocab = slice.whole ? c.vocab_size : slice.vocab_rows;
  const IndexRange held = slice.whole ? IndexRange{0, c.n_routed_experts} : slice.experts;
  if (w.has_embedding()) {
    const int64_t embed = plan.Begin();
    plan.AddMatrix(w.embed_tokens, vocab, hidden, Target::kBf16,
                   /*per_step=*/false);  // only the batch's rows are read
    out.embed = plan.At<uint16_t>(embed);
  }
  out.layers.assign(w.layers.size(), DeviceLayer{});
  for (size_t i = 0; i < w.layers.size(); ++i) {
    RETURN_IF_ERROR(PlanLayer(c, w.layers[i], held, !slice.whole, plan, out.layers[i],
                              &out.routed_expert_bytes));
  }
  if (w.has_head()) {
    out.final_norm = plan.Vector(w.final_norm, hidden);
    const bool tied = w.has_embedding() && w.lm_head.data == w.embed_tokens.data &&
                      w.lm_head.dtype == w.embed_tokens.dtype &&
                      w.lm_head.rows == w.embed_tokens.rows;
    if (tied) {
      out.lm_head = out.embed;
      plan.CountStepBytes(w.embed_tokens.rows * w.embed_tokens.cols * 2);  // read in full
    } else {
      out.lm_head = plan.Bf16(w.lm_head, vocab, hidden);
    }
  }
  out.inv_freq = plan.OwnedVector(RopeInvFreq(c.rotary_dim(), c.rope_theta));
  out.dense_step_bytes = plan.step_bytes();
  // The MTP layer, its matrices outside the decoder block unquantized (an FP8 eh_proj or head
  // leaves it on the host: the runner then has none). A rank's is cut as its layers are
  // (ShardWeights): its block like any layer, eh_proj whole, a stored head by vocabulary rows.
  if (w.mtp && w.has_embedding() && w.has_head() && w.mtp->eh_proj.format == WeightFormat::kDense &&
      (!w.mtp_head_stored || w.mtp->head.format == WeightFormat::kDense)) {
    const MtpWeights& m = *w.mtp;
    out.layers.emplace_back();
    int64_t routed = 0;
    RETURN_IF_ERROR(PlanLayer(c, m.layer, held, !slice.whole, plan, out.layers.back(), &routed));
    out.mtp.enorm = plan.Vector(m.enorm, hidden);
    out.mtp.hnorm = plan.Vector(m.hnorm, hidden);
    out.mtp.eh_proj = plan.Bf16(m.eh_proj, hidden, 2 * hidden);
    out.mtp.head_norm = plan.Vector(m.head_norm, hidden);
    out.mtp.head = w.mtp_head_stored ? plan.Bf16(m.head, vocab, hidden) : out.lm_head;
  }
  plan.Begin();
  out.bytes = plan.size();
  return absl::OkStatus();
}

// A planned image that cannot be uploaded: bad shapes, an unsupported form, or more bytes
// than the device has free (refused with the numbers before anything is allocated; an FP8
// GLM-4.5 on one GPU: docs/fp8.md plans it over several).
absl::Status CheckPlan(const ImagePlan& plan) {
  if (plan.bad_shapes()) {
    return absl::InvalidArgumentError("weights do not match the config's shapes");
  }
  if (!plan.error().empty()) return absl::UnimplementedError(plan.error());
  size_t free_bytes = 0, total_bytes = 0;
  GLM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (plan.size() > static_cast<int64_t>(free_bytes)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the weights need %.2f GB of device memory, but only %.2f GB of the device's %.2f GB "
        "are free (docs/fp8.md: a model this size needs several GPUs)",
        plan.size() / 1e9, free_bytes / 1e9, total_bytes / 1e9));
  }
  return absl::OkStatus();
}

}  // namespace

// Size and check the image (a plan at base 0) -> allocate -> plan again at the allocation,
// filling the pointers -> upload (Execute).
absl::StatusOr<DeviceWeights> UploadWeights(const ModelWeights& w, cudaStream_t stream,
                                            const LoadProgressCallback& progress,
                                            const DeviceSlice& slice) {
  ImagePlan sizing(w, /*base=*/nullptr);
  DeviceWeights unused;
  RETURN_IF_ERROR(PlanImage(w, slice, sizing, unused));
  RETURN_IF_ERROR(CheckPlan(sizing));

  DeviceWeights out;
  ASSIGN_OR_RETURN(DeviceBuffer memory, DeviceBuffer::Create(static_cast<size_t>(sizing.size())));
  out.memory = std::move(memory);
  char* base = static_cast<char*>(out.memory.get());
  ImagePlan plan(w, base);
  RETURN_IF_ERROR(PlanImage(w, slice, plan, out));
  if (plan.size() != sizing.size()) return absl::InternalError("device image plan changed");
  RETURN_IF_ERROR(Execute(plan, base, stream, progress));
  return out;
}

}  // namespace glmserve::cuda
