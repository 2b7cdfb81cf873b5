#include "core/cuda/device_weights.h"

#include <algorithm>
#include <chrono>
#include <cstring>
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

// Where an FP8 matrix's codes and scales sit in the image (-1: absent), and its shape.
struct Fp8Offsets {
  int64_t codes = -1;
  int64_t scales = -1;
  Fp8DeviceMatrix shape;  // codes and scales null until resolved
};

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

// Plans the device image: byte offsets of every tensor, in upload order.
class ImagePlan {
 public:
  explicit ImagePlan(const ModelWeights& w) {
    for (const ModelWeights::DeviceGeneratedFp8& g : w.device_generated_fp8) {
      generated_[g.matrix] = &g;
    }
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
  Fp8Offsets AddFp8(const std::vector<const Matrix*>& ms, int64_t rows, int64_t cols, bool per_step,
                    const std::string& what) {
    Fp8Offsets out;
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
      // A row slice starting inside a block row (core/model/weights.h) has no device form.
      if (m->scale_row_phase != 0) {
        Fail(absl::StrCat(what, ": an FP8 row slice starting inside a scale block"));
        return out;
      }
    }
    out.codes = Begin();
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
    out.scales = Begin();
    for (const Matrix* m : ms) {
      Add(m->scales, DType::kF32, m->scale_rows() * m->scale_cols(), Target::kF32, per_step);
    }
    out.shape.rows = rows;
    out.shape.cols = cols;
    out.shape.block_rows = first.scale_block_rows;
    out.shape.block_cols = first.scale_block_cols;
    return out;
  }
  Fp8Offsets AddFp8(const Matrix& m, int64_t rows, int64_t cols, const std::string& what) {
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
  bool bad_shapes() const { return bad_shapes_; }
  void CountStepBytes(int64_t bytes) { step_bytes_ += bytes; }
  int64_t size() const { return size_; }
  int64_t step_bytes() const { return step_bytes_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<GeneratedCodes>& generated_codes() const { return generated_codes_; }

 private:
  std::vector<Piece> pieces_;
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

// Byte offsets of one layer's tensors (-1: absent).
struct LayerOffsets {
  int64_t input_norm = -1, post_norm = -1, qkv = -1, qkv_bias = -1, o = -1, q_norm = -1,
          k_norm = -1, dense_gate_up = -1, dense_down = -1, router = -1, router_bias = -1,
          experts_gate_up = -1, experts_down = -1, shared_gate_up = -1, shared_down = -1;
  // GLM-5
  int64_t q_a = -1, q_a_norm = -1, q_b = -1, kv_a = -1, kv_a_norm = -1, kv_b = -1, mla_o = -1,
          wq_b = -1, wk = -1, ik_norm = -1, ik_norm_bias = -1, weights_proj = -1;
  // FP8 projections (codes -1: the bf16 ones above)
  Fp8Offsets q_a8, q_b8, kv_a8, kv_b8, mla_o8, wq_b8, wk8;  // GLM-5 (FP8)
  Fp8Offsets q8, k8, v8, o8, dense_gate8, dense_up8, dense_down8, shared_gate8, shared_up8,
      shared_down8, experts_gate8, experts_up8, experts_down8;
};

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

// An FFN's gate, up and down: FP8 (offsets set in g8/u8/d8) or fused bf16 (gate_up, down).
absl::Status PlanFfn(const FfnWeights& f, ImagePlan& plan, const std::string& what,
                     int64_t& gate_up, int64_t& down, Fp8Offsets& g8, Fp8Offsets& u8,
                     Fp8Offsets& d8) {
  ASSIGN_OR_RETURN(const bool fp8, GroupIsFp8({&f.gate, &f.up, &f.down}, what));
  if (fp8) {
    g8 = plan.AddFp8(f.gate, f.gate.rows, f.gate.cols, what);
    u8 = plan.AddFp8(f.up, f.up.rows, f.up.cols, what);
    d8 = plan.AddFp8(f.down, f.down.rows, f.down.cols, what);
    return absl::OkStatus();
  }
  gate_up = plan.Begin();
  plan.AddMatrix(f.gate, Target::kBf16);
  plan.AddMatrix(f.up, Target::kBf16);
  down = plan.Begin();
  plan.AddMatrix(f.down, Target::kBf16);
  return absl::OkStatus();
}

// GLM-5's attention tensors, checked against the config's widths. FP8 by group (q_a, q_b,
// kv_a, kv_b, o; the indexer's wq_b, wk): codes and block scales as stored, kv_b included
// (the attention kernel reads its codes: the CPU's exact fp32 values, at a quarter of an fp32
// copy's bytes). Whether a layer has an indexer is the config's word: an FP8 preset's
// device-generated wq_b has no host data.
absl::Status PlanMla(const ModelConfig& c, int64_t layer, const MlaWeights& m, ImagePlan& plan,
                     LayerOffsets& o) {
  const int64_t hidden = c.hidden_size, q_rank = c.q_lora_rank, r = c.kv_lora_rank;
  const int64_t dr = c.qk_rope_head_dim, heads = c.num_attention_heads;
  const int64_t kv_b_rows = heads * (c.qk_nope_head_dim + c.v_head_dim);
  const std::string where = absl::StrCat("layer ", layer, " MLA attention");
  ASSIGN_OR_RETURN(
      const bool fp8,
      GroupIsFp8({&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.o_proj}, where));
  if (fp8) {
    o.q_a8 = plan.AddFp8(m.q_a_proj, q_rank, hidden, where);
    o.q_b8 = plan.AddFp8(m.q_b_proj, heads * c.qk_head_dim(), q_rank, where);
    o.kv_a8 = plan.AddFp8(m.kv_a_proj, r + dr, hidden, where);
    o.kv_b8 = plan.AddFp8(m.kv_b_proj, kv_b_rows, r, where);
    o.mla_o8 = plan.AddFp8(m.o_proj, hidden, heads * c.v_head_dim, where);
  } else {
    o.q_a = plan.Begin();
    plan.AddMatrix(m.q_a_proj, q_rank, hidden, Target::kBf16);
    o.q_b = plan.Begin();
    plan.AddMatrix(m.q_b_proj, heads * c.qk_head_dim(), q_rank, Target::kBf16);
    o.kv_a = plan.Begin();
    plan.AddMatrix(m.kv_a_proj, r + dr, hidden, Target::kBf16);
    o.kv_b = plan.Begin();
    plan.AddMatrix(m.kv_b_proj, kv_b_rows, r, Target::kBf16);
    o.mla_o = plan.Begin();
    plan.AddMatrix(m.o_proj, hidden, heads * c.v_head_dim, Target::kBf16);
  }
  o.q_a_norm = plan.Begin();
  plan.AddVector(m.q_a_norm, q_rank);
  o.kv_a_norm = plan.Begin();
  plan.AddVector(m.kv_a_norm, r);
  if (!c.has_indexer(layer)) return absl::OkStatus();
  const IndexerWeights& x = m.indexer;
  const int64_t di = c.index_head_dim;
  const std::string iwhere = absl::StrCat("layer ", layer, " DSA indexer");
  ASSIGN_OR_RETURN(const bool ifp8, GroupIsFp8({&x.wq_b, &x.wk}, iwhere));
  if (ifp8) {
    o.wq_b8 = plan.AddFp8(x.wq_b, c.index_n_heads * di, q_rank, iwhere);
    o.wk8 = plan.AddFp8(x.wk, di, hidden, iwhere);
  } else {
    o.wq_b = plan.Begin();
    plan.AddMatrix(x.wq_b, c.index_n_heads * di, q_rank, Target::kBf16);
    o.wk = plan.Begin();
    plan.AddMatrix(x.wk, di, hidden, Target::kBf16);
  }
  o.ik_norm = plan.Begin();
  plan.AddVector(x.k_norm, di);
  o.ik_norm_bias = plan.Begin();
  plan.AddVector(x.k_norm_bias, di);
  o.weights_proj = plan.Begin();
  plan.AddMatrix(x.weights_proj, c.index_n_heads, hidden, Target::kF32);
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
                           LayerOffsets& o) {
  const AttentionWeights& a = l.attn;
  const int64_t hidden = c.hidden_size;
  const std::string where = absl::StrCat("layer ", l.layer_index, " attention");
  ASSIGN_OR_RETURN(const bool qkv8, GroupIsFp8({&a.q_proj, &a.k_proj, &a.v_proj}, where));
  if (qkv8) {
    o.q8 = plan.AddFp8(a.q_proj, c.q_dim(), hidden, where);
    o.k8 = plan.AddFp8(a.k_proj, c.kv_dim(), hidden, where);
    o.v8 = plan.AddFp8(a.v_proj, c.kv_dim(), hidden, where);
  } else {
    o.qkv = plan.Begin();
    plan.AddMatrix(a.q_proj, c.q_dim(), hidden, Target::kBf16);
    plan.AddMatrix(a.k_proj, c.kv_dim(), hidden, Target::kBf16);
    plan.AddMatrix(a.v_proj, c.kv_dim(), hidden, Target::kBf16);
  }
  if (!a.q_bias.empty() || !a.k_bias.empty() || !a.v_bias.empty()) {
    o.qkv_bias = plan.Begin();  // a missing one of the three reads as zeros
    plan.AddVector(a.q_bias, c.q_dim());
    plan.AddVector(a.k_bias, c.kv_dim());
    plan.AddVector(a.v_bias, c.kv_dim());
  }
  if (IsFp8(a.o_proj)) {
    o.o8 = plan.AddFp8(a.o_proj, hidden, c.q_dim(), where);
  } else {
    o.o = plan.Begin();
    plan.AddMatrix(a.o_proj, hidden, c.q_dim(), Target::kBf16);
  }
  if (!a.q_norm.empty()) {
    o.q_norm = plan.Begin();
    plan.AddVector(a.q_norm, c.head_dim);
    o.k_norm = plan.Begin();
    plan.AddVector(a.k_norm, c.head_dim);
  }
  return absl::OkStatus();
}

// A MoE layer's router (fp32), its routed experts (FP8 as a group, or bf16 gate+up then down)
// and its shared expert. `routed_bytes`: what one routed expert's matrices take.
absl::Status PlanMoe(const ModelConfig& c, const LayerWeights& l, ImagePlan& plan, LayerOffsets& o,
                     int64_t* routed_bytes) {
  const int64_t hidden = c.hidden_size;
  const MoeWeights& m = l.moe;
  if (static_cast<int64_t>(m.experts.size()) != c.n_routed_experts ||
      m.router.rows != c.n_routed_experts || m.router.cols != hidden ||
      static_cast<int64_t>(m.router_bias.size()) != c.n_routed_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l.layer_index, ": router or expert count does not match"));
  }
  o.router = plan.Begin();
  plan.AddMatrix(m.router, Target::kF32);
  o.router_bias = plan.Begin();
  plan.AddVector(m.router_bias, c.n_routed_experts);
  std::vector<const Matrix*> gates, ups, downs, all;
  for (const FfnWeights& e : m.experts) {
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
    o.experts_gate8 = plan.AddFp8(gates, width, hidden, /*per_step=*/false, experts_what);
    o.experts_up8 = plan.AddFp8(ups, width, hidden, false, experts_what);
    o.experts_down8 = plan.AddFp8(downs, hidden, width, false, experts_what);
    const FfnWeights& e0 = m.experts.front();
    *routed_bytes = e0.gate.bytes() + e0.up.bytes() + e0.down.bytes();
  } else {
    o.experts_gate_up = plan.Begin();
    for (const FfnWeights& e : m.experts) {
      plan.AddMatrix(e.gate, Target::kBf16, /*per_step=*/false);
      plan.AddMatrix(e.up, Target::kBf16, /*per_step=*/false);
    }
    o.experts_down = plan.Begin();
    for (const FfnWeights& e : m.experts) plan.AddMatrix(e.down, Target::kBf16, false);
    *routed_bytes = 3 * width * hidden * 2;
  }
  if (!Absent(m.shared.gate)) {
    RETURN_IF_ERROR(CheckFfn(m.shared, hidden, "shared expert"));
    RETURN_IF_ERROR(PlanFfn(m.shared, plan, absl::StrCat("layer ", l.layer_index, " shared expert"),
                            o.shared_gate_up, o.shared_down, o.shared_gate8, o.shared_up8,
                            o.shared_down8));
  }
  return absl::OkStatus();
}

// One decoder layer: its norms, attention (GLM-4.5's or GLM-5's MLA) and FFN (dense or MoE).
absl::Status PlanLayer(const ModelConfig& c, const LayerWeights& l, ImagePlan& plan,
                       LayerOffsets& o, int64_t* routed_bytes) {
  o.input_norm = plan.Begin();
  plan.AddVector(l.input_norm, c.hidden_size);
  o.post_norm = plan.Begin();
  plan.AddVector(l.post_attention_norm, c.hidden_size);
  if (c.is_mla()) {
    RETURN_IF_ERROR(PlanMla(c, l.layer_index, l.mla, plan, o));
  } else {
    RETURN_IF_ERROR(PlanAttention(c, l, plan, o));
  }
  if (l.is_moe) return PlanMoe(c, l, plan, o, routed_bytes);
  RETURN_IF_ERROR(CheckFfn(l.dense, c.hidden_size, "dense FFN"));
  return PlanFfn(l.dense, plan, absl::StrCat("layer ", l.layer_index, " dense FFN"),
                 o.dense_gate_up, o.dense_down, o.dense_gate8, o.dense_up8, o.dense_down8);
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

// Offsets into the uploaded image -> device pointers (-1: absent, null).
struct Binder {
  char* base;
  const uint16_t* bf16(int64_t off) const {
    return off < 0 ? nullptr : reinterpret_cast<const uint16_t*>(base + off);
  }
  const float* f32(int64_t off) const {
    return off < 0 ? nullptr : reinterpret_cast<const float*>(base + off);
  }
  Fp8DeviceMatrix fp8(const Fp8Offsets& off) const {
    Fp8DeviceMatrix m = off.shape;
    if (off.codes >= 0) {
      m.codes = reinterpret_cast<const uint8_t*>(base + off.codes);
      m.scales = reinterpret_cast<const float*>(base + off.scales);
    }
    return m;
  }

  DeviceLayer Layer(const LayerWeights& l, const LayerOffsets& o) const {
    DeviceLayer d;
    d.input_norm = f32(o.input_norm);
    d.post_norm = f32(o.post_norm);
    d.qkv = bf16(o.qkv);
    d.qkv_bias = f32(o.qkv_bias);
    d.o = bf16(o.o);
    d.q_norm = f32(o.q_norm);
    d.k_norm = f32(o.k_norm);
    d.q8 = fp8(o.q8);
    d.k8 = fp8(o.k8);
    d.v8 = fp8(o.v8);
    d.o8 = fp8(o.o8);
    d.mla = {bf16(o.q_a),      f32(o.q_a_norm), bf16(o.q_b),         bf16(o.kv_a),
             f32(o.kv_a_norm), bf16(o.kv_b),    bf16(o.mla_o),       bf16(o.wq_b),
             bf16(o.wk),       f32(o.ik_norm),  f32(o.ik_norm_bias), f32(o.weights_proj)};
    d.mla.q_a8 = fp8(o.q_a8);
    d.mla.q_b8 = fp8(o.q_b8);
    d.mla.kv_a8 = fp8(o.kv_a8);
    d.mla.kv_b8 = fp8(o.kv_b8);
    d.mla.o8 = fp8(o.mla_o8);
    d.mla.wq_b8 = fp8(o.wq_b8);
    d.mla.wk8 = fp8(o.wk8);
    d.is_moe = l.is_moe;
    if (!l.is_moe) {
      d.dense = {bf16(o.dense_gate_up), bf16(o.dense_down), l.dense.gate.rows,
                 fp8(o.dense_gate8),    fp8(o.dense_up8),   fp8(o.dense_down8)};
      return d;
    }
    d.router = f32(o.router);
    d.router_bias = f32(o.router_bias);
    d.experts_gate_up = bf16(o.experts_gate_up);
    d.experts_down = bf16(o.experts_down);
    d.experts_gate8 = fp8(o.experts_gate8);
    d.experts_up8 = fp8(o.experts_up8);
    d.experts_down8 = fp8(o.experts_down8);
    if (!Absent(l.moe.shared.gate)) {  // has_shared(), device-generated codes included
      d.shared = {bf16(o.shared_gate_up), bf16(o.shared_down), l.moe.shared.gate.rows,
                  fp8(o.shared_gate8),    fp8(o.shared_up8),   fp8(o.shared_down8)};
    }
    return d;
  }
};

}  // namespace

// Plan (every tensor's offset in one image) -> upload (Execute) -> bind (offsets to pointers).
absl::StatusOr<DeviceWeights> UploadWeights(const ModelWeights& w, cudaStream_t stream,
                                            const LoadProgressCallback& progress) {
  const ModelConfig& c = w.config;
  const int64_t hidden = c.hidden_size;
  ImagePlan plan(w);
  int64_t embed = -1, final_norm = -1, lm_head = -1, inv_freq = -1;
  int64_t routed_bytes = 0;

  if (w.has_embedding()) {
    embed = plan.Begin();
    plan.AddMatrix(w.embed_tokens, c.vocab_size, hidden, Target::kBf16,
                   /*per_step=*/false);  // only the batch's rows are read
  }
  std::vector<LayerOffsets> offsets(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    RETURN_IF_ERROR(PlanLayer(c, w.layers[i], plan, offsets[i], &routed_bytes));
  }
  if (w.has_head()) {
    final_norm = plan.Begin();
    plan.AddVector(w.final_norm, hidden);
    const bool tied = w.has_embedding() && w.lm_head.data == w.embed_tokens.data &&
                      w.lm_head.dtype == w.embed_tokens.dtype &&
                      w.lm_head.rows == w.embed_tokens.rows;
    if (tied) {
      lm_head = embed;
      plan.CountStepBytes(w.embed_tokens.rows * w.embed_tokens.cols * 2);  // read in full
    } else {
      lm_head = plan.Begin();
      plan.AddMatrix(w.lm_head, c.vocab_size, hidden, Target::kBf16);
    }
  }
  const std::vector<float> rope_inv_freq = RopeInvFreq(c.rotary_dim(), c.rope_theta);
  inv_freq = plan.Begin();
  plan.AddVector(rope_inv_freq, c.rotary_dim() / 2);  // read at upload, below
  plan.Begin();
  RETURN_IF_ERROR(CheckPlan(plan));

  DeviceWeights out;
  ASSIGN_OR_RETURN(DeviceBuffer memory, DeviceBuffer::Create(static_cast<size_t>(plan.size())));
  out.memory = std::move(memory);
  char* base = static_cast<char*>(out.memory.get());
  RETURN_IF_ERROR(Execute(plan, base, stream, progress));

  const Binder bind{base};
  out.embed = bind.bf16(embed);
  out.final_norm = bind.f32(final_norm);
  out.lm_head = bind.bf16(lm_head);
  out.inv_freq = bind.f32(inv_freq);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    out.layers.push_back(bind.Layer(w.layers[i], offsets[i]));
  }
  out.bytes = plan.size();
  out.dense_step_bytes = plan.step_bytes();
  out.routed_expert_bytes = routed_bytes;
  return out;
}

}  // namespace glmserve::cuda
