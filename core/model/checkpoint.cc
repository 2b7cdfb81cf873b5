// LoadCheckpoint, RandomWeights and LoadModel. Both weight sources walk the slot list of
// core/model/weight_layout.h, so a checkpoint and a preset give structurally identical weights.
#include "core/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/file_io.h"
#include "core/base/huge_pages.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/model/fp8.h"
#include "core/model/safetensors.h"
#include "core/model/weight_layout.h"

namespace glmserve {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// An owned, 64-byte aligned buffer that can sit in ModelWeights::storage. Large buffers are on
// transparent huge pages (core/base/huge_pages.h): a decode step streams every weight once, and
// with 4 KiB pages that is one TLB miss per page (and one page fault per page while the
// weights are generated).
std::shared_ptr<void> AllocateAligned(size_t bytes) {
  void* p = AllocateHugePageable(bytes);
  if (p == nullptr) return nullptr;
  return std::shared_ptr<void>(p, [bytes](void* q) { FreeHugePageable(q, bytes); });
}

// Element i of an unaligned buffer (checkpoint tensors need not be aligned).
float ReadUnaligned(const void* data, DType dtype, int64_t i) {
  const char* p = static_cast<const char*>(data) + i * DTypeSize(dtype);
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  }
  if (DTypeSize(dtype) == 1) return LoadAsFloat(p, dtype, 0);
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

// The matrices FP8 checkpoints keep unquantized whatever their config says: the embedding
// (a row gather), the routers (fp32 math by definition) and the head.
bool IsUnquantizedMatrix(const std::string& name) {
  return name == "model.embed_tokens.weight" || name == "lm_head.weight" ||
         absl::EndsWith(name, ".mlp.gate.weight");
}

int64_t BlocksOf(int64_t n) { return (n + kFp8PresetBlock - 1) / kFp8PresetBlock; }

// Parses "model.layers.<N>.<rest>"; false for any other name.
bool ParseLayerName(const std::string& name, int64_t* layer) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(name, kPrefix)) return false;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size()) return false;
  const absl::string_view digits(name.data() + kPrefix.size(), dot - kPrefix.size());
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return false;
  }
  return absl::SimpleAtoi(digits, layer);
}

class CheckpointLoader {
 public:
  CheckpointLoader(const std::string& dir, const TensorStore& store, const Fp8Scheme& fp8,
                   ModelWeights* w)
      : dir_(dir), store_(store), fp8_(fp8), w_(w) {}

  absl::Status Load() {
    for (const WeightSlot& slot : ListWeightSlots(w_)) {
      RETURN_IF_ERROR(Fill(slot));
    }
    return CheckUnconsumed();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir_, ": ", what));
  }

  absl::StatusOr<const TensorInfo*> Get(const std::string& name,
                                        const std::vector<int64_t>& shape) {
    const TensorInfo* t = store_.Find(name);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", dir_, ": missing tensor '", name, "'"));
    }
    if (t->shape != shape) {
      return Error(absl::StrCat("tensor '", name, "' has shape ", ShapeToString(t->shape),
                                ", expected ", ShapeToString(shape)));
    }
    consumed_.insert(name);
    return t;
  }

  // The tensor's data, copied once into an aligned buffer when the file stores it at an
  // offset that is not a multiple of its element size (kernels load whole elements).
  const char* AlignedData(const TensorInfo* t) {
    if (reinterpret_cast<uintptr_t>(t->data) % DTypeSize(t->dtype) == 0) {
      return static_cast<const char*>(t->data);
    }
    auto it = copies_.find(t);
    if (it != copies_.end()) return it->second;
    std::shared_ptr<void> buffer = AllocateAligned(static_cast<size_t>(t->bytes));
    if (buffer == nullptr) return nullptr;
    std::memcpy(buffer.get(), t->data, static_cast<size_t>(t->bytes));
    w_->storage.push_back(buffer);
    const char* data = static_cast<const char*>(buffer.get());
    copies_.emplace(t, data);
    return data;
  }

  absl::Status SetMatrix(const TensorInfo* t, int64_t element_offset, int64_t rows, int64_t cols,
                         Matrix* m) {
    const char* base = AlignedData(t);
    if (base == nullptr) return absl::ResourceExhaustedError("out of memory copying " + t->name);
    *m = Matrix{t->dtype, rows, cols, base + element_offset * DTypeSize(t->dtype)};
    return absl::OkStatus();
  }

  absl::Status Fill(const WeightSlot& slot) {
    if (slot.expert >= 0) {
      const std::string fused = LayerPrefix(slot.layer) + "mlp.experts.gate_up_proj";
      if (store_.Find(fused) != nullptr) return FillFusedExpert(slot);
    }
    ASSIGN_OR_RETURN(const TensorInfo* t, Get(slot.name, slot.shape));
    if (t->dtype == DType::kF8E8M0 || (t->dtype == DType::kF8E4M3 && slot.matrix == nullptr)) {
      return Error(absl::StrCat("tensor '", slot.name, "' is ", std::string(DTypeName(t->dtype)),
                                ": only linear layers' weights may be FP8 (docs/fp8.md)"));
    }
    if (slot.matrix != nullptr) {
      if (t->dtype == DType::kF8E4M3) return SetFp8Matrix(slot, t);
      return SetMatrix(t, 0, slot.shape[0], slot.shape[1], slot.matrix);
    }
    slot.vector->resize(static_cast<size_t>(slot.shape[0]));
    for (int64_t i = 0; i < slot.shape[0]; ++i) {
      (*slot.vector)[static_cast<size_t>(i)] = ReadUnaligned(t->data, t->dtype, i);
    }
    return absl::OkStatus();
  }

  // An F8_E4M3 weight and its scale tensor (core/model/fp8.h): the codes stay in the mapping, one
  // byte per weight; the scales, a few per thousand weights, are widened to fp32 into a buffer
  // of their own after their shape, dtype and values are checked.
  absl::Status SetFp8Matrix(const WeightSlot& slot, const TensorInfo* t) {
    const std::string module = slot.name.substr(0, slot.name.size() - 7);  // less ".weight"
    if (!fp8_.quantized()) {
      return Error(absl::StrCat("tensor '", slot.name,
                                "' is F8_E4M3 but config.json has no quantization_config"));
    }
    if (slot.name != "lm_head.weight" && IsUnquantizedMatrix(slot.name)) {
      return Error(
          absl::StrCat("tensor '", slot.name,
                       "' is F8_E4M3: the embedding and the router must stay unquantized"));
    }
    if (fp8_.KeepsUnquantized(module)) {
      return Error(absl::StrCat("tensor '", slot.name,
                                "' is F8_E4M3 but quantization_config "
                                "lists '",
                                module, "' as kept unquantized"));
    }
    const int64_t rows = slot.shape[0], cols = slot.shape[1];
    const int64_t br = fp8_.block_rows, bc = fp8_.per_channel() ? cols : fp8_.block_cols;
    const std::vector<int64_t> scale_shape = {(rows + br - 1) / br, (cols + bc - 1) / bc};
    const std::string scale_name = module + "." + fp8_.scale_suffix();
    ASSIGN_OR_RETURN(const TensorInfo* s, Get(scale_name, scale_shape));
    const bool e8m0 = s->dtype == DType::kF8E8M0;
    if (s->dtype == DType::kF8E4M3 || (e8m0 && fp8_.kind != Fp8Scheme::Kind::kBlockFp8)) {
      return Error(absl::StrCat("scale tensor '", scale_name, "' is ",
                                std::string(DTypeName(s->dtype)), ", expected F32, BF16 or F16",
                                fp8_.kind == Fp8Scheme::Kind::kBlockFp8 ? " or F8_E8M0" : ""));
    }
    const int64_t n = scale_shape[0] * scale_shape[1];
    std::shared_ptr<void> buffer = AllocateAligned(static_cast<size_t>(n) * sizeof(float));
    if (buffer == nullptr) return absl::ResourceExhaustedError("out of memory for " + scale_name);
    float* scales = static_cast<float*>(buffer.get());
    for (int64_t i = 0; i < n; ++i) {
      const float v = ReadUnaligned(s->data, s->dtype, i);
      // A negative, NaN or infinite scale corrupts every weight of its block: refused here,
      // whatever --verify_weights says, as the scales are tiny to check.
      if (!(v >= 0.0f) || std::isinf(v)) {
        return Error(absl::StrCat("scale tensor '", scale_name, "' element ", i, " is ", v,
                                  ": scales must be finite and >= 0"));
      }
      int exponent = 0;
      if (fp8_.ue8m0 && v != 0.0f && std::frexp(v, &exponent) != 0.5f) {
        return Error(absl::StrCat("scale tensor '", scale_name, "' element ", i, " is ", v,
                                  ", not a power of two as scale_fmt 'ue8m0' requires"));
      }
      scales[i] = v;
    }
    w_->storage.push_back(buffer);
    Matrix m{DType::kF8E4M3, rows, cols, t->data};
    m.format = WeightFormat::kFp8Scaled;
    m.scales = scales;
    m.scale_block_rows = static_cast<int32_t>(br);
    m.scale_block_cols = static_cast<int32_t>(std::min<int64_t>(bc, INT32_MAX));
    *slot.matrix = m;
    w_->linear_format = WeightFormat::kFp8Scaled;
    return absl::OkStatus();
  }

  // Routed experts stored as mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up rows)
  // and mlp.experts.down_proj [E, H, I]: each expert's matrices are views at an offset.
  absl::Status FillFusedExpert(const WeightSlot& slot) {
    const ModelConfig& c = w_->config;
    const int64_t n = c.n_routed_experts, width = c.moe_intermediate_size, h = c.hidden_size;
    const std::string prefix = LayerPrefix(slot.layer) + "mlp.experts.";
    if (slot.part == ExpertPart::kDown) {
      absl::StatusOr<const TensorInfo*> t = Get(prefix + "down_proj", {n, h, width});
      if (!t.ok()) return t.status();
      if (DTypeSize((*t)->dtype) == 1) {
        return absl::UnimplementedError(
            absl::StrCat("checkpoint ", dir_,
                         ": fused expert tensors in FP8 are not supported; FP8 "
                         "checkpoints store experts one matrix per tensor (docs/fp8.md)"));
      }
      return SetMatrix(*t, slot.expert * h * width, h, width, slot.matrix);
    }
    absl::StatusOr<const TensorInfo*> t = Get(prefix + "gate_up_proj", {n, 2 * width, h});
    if (!t.ok()) return t.status();
    if (DTypeSize((*t)->dtype) == 1) {
      return absl::UnimplementedError(
          absl::StrCat("checkpoint ", dir_,
                       ": fused expert tensors in FP8 are not supported; FP8 "
                       "checkpoints store experts one matrix per tensor (docs/fp8.md)"));
    }
    const int64_t row = slot.expert * 2 * width + (slot.part == ExpertPart::kUp ? width : 0);
    return SetMatrix(*t, row * h, width, h, slot.matrix);
  }

  // Tensors nobody consumed are errors unless they belong to what the span leaves out.
  bool Skippable(const std::string& name) const {
    const ModelConfig& c = w_->config;
    const bool has_head = w_->layer_end == c.num_hidden_layers;
    int64_t layer = 0;
    if (ParseLayerName(name, &layer)) {
      if (layer >= c.num_hidden_layers) {
        // MTP layer(s): skipped unless loaded (docs/mtp.md); a loaded one may also store a
        // copy of the embedding, which the model's own serves.
        return !w_->mtp || layer > c.num_hidden_layers ||
               absl::EndsWith(name, ".embed_tokens.weight") ||
               absl::EndsWith(name, ".self_attn.rotary_emb.inv_freq");
      }
      if (layer < w_->layer_begin || layer >= w_->layer_end) return true;
      // Old checkpoints store the RoPE table; it is recomputed from the config.
      return absl::EndsWith(name, ".self_attn.rotary_emb.inv_freq");
    }
    if (name == "model.embed_tokens.weight") return true;  // consumed whenever needed
    if (name == "model.norm.weight") return !has_head;
    if (name == "lm_head.weight") return !has_head;
    if (name == "lm_head.weight_scale" || name == "lm_head.weight_scale_inv") return !has_head;
    return false;
  }

  absl::Status CheckUnconsumed() const {
    std::vector<std::string> unexpected;
    for (const std::string& name : store_.Names()) {
      if (consumed_.count(name) == 0 && !Skippable(name)) unexpected.push_back(name);
    }
    if (unexpected.empty()) return absl::OkStatus();
    std::string more;
    if (unexpected.size() > 1) more = absl::StrCat(" (and ", unexpected.size() - 1, " more)");
    return Error(absl::StrCat("unexpected tensor '", unexpected[0],
                              "', which this model config does not use", more));
  }

  const std::string& dir_;
  const TensorStore& store_;
  const Fp8Scheme& fp8_;
  ModelWeights* w_;

 public:
  const std::set<std::string>& consumed() const { return consumed_; }

 private:
  std::set<std::string> consumed_;
  std::map<const TensorInfo*, const char*> copies_;
};

// --- Seeded random weights ---

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

// The splitmix64 output function: a bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(absl::string_view name) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

// Element i of a tensor is the sum of the four 16-bit fields of splitmix64 draw i of the
// tensor's stream (Irwin-Hall: nearly normal, within +-3.46 sigma), centred and scaled.
// Integer arithmetic plus one float multiply: identical on every machine and thread count.
struct FillJob {
  uint64_t key;
  void* dst;
  DType dtype;
  int64_t first;
  int64_t count;
  float scale;
};

void RunFillJob(const FillJob& job) {
  for (int64_t i = job.first; i < job.first + job.count; ++i) {
    const uint64_t u = Mix64(job.key + static_cast<uint64_t>(i + 1) * kGamma);
    const int64_t sum = static_cast<int64_t>((u & 0xffff) + ((u >> 16) & 0xffff) +
                                             ((u >> 32) & 0xffff) + (u >> 48));
    const float v = static_cast<float>(sum - 2 * 65535) * job.scale;
    switch (job.dtype) {
      case DType::kF32:
        static_cast<float*>(job.dst)[i] = v;
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(job.dst)[i] = FloatToBf16(v);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(job.dst)[i] = FloatToF16(v);
        break;
      case DType::kF8E4M3:  // job.scale folds in 1 / the matrix's FP8 scale
        static_cast<uint8_t*>(job.dst)[i] = FloatToE4m3(v);
        break;
      case DType::kF8E8M0:
        break;
    }
  }
}

}  // namespace

absl::StatusOr<LayerSpan> ResolveLayerSpan(const ModelConfig& config, LayerSpan span) {
  const int64_t n = config.num_hidden_layers;
  const int64_t end = span.end == -1 ? n : span.end;
  if (span.begin < 0 || span.begin >= end || end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer span [", span.begin, ", ", span.end, ") is not within the model's ", n,
                     " layers (need 0 <= begin < end <= ", n, "; end -1 means ", n, ")"));
  }
  return LayerSpan{span.begin, end};
}

namespace {

// Reads (page by page) the mapped bytes of `tensors`, in address order so that each file is
// read front to back, reporting progress as it goes.
void ReadTensors(std::vector<const TensorInfo*> tensors, const LoadProgressCallback& progress) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  LoadProgress p;
  p.tensors_total = static_cast<int64_t>(tensors.size());
  for (const TensorInfo* t : tensors) p.bytes_total += t->bytes;
  const auto start = std::chrono::steady_clock::now();
  const auto report = [&] {
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress(p);
  };
  report();
  constexpr int64_t kReportEvery = 64 << 20;
  constexpr int64_t kPage = 4096;
  int64_t next_report = kReportEvery;
  unsigned char sink = 0;
  for (const TensorInfo* t : tensors) {
    const auto* bytes = static_cast<const volatile unsigned char*>(t->data);
    for (int64_t offset = 0; offset < t->bytes;) {
      const int64_t chunk = std::min(t->bytes - offset, next_report - p.bytes_done);
      for (int64_t i = 0; i < chunk; i += kPage) sink ^= bytes[offset + i];
      offset += chunk;
      p.bytes_done += chunk;
      if (p.bytes_done >= next_report) {
        report();
        next_report += kReportEvery;
      }
    }
    ++p.tensors_done;
  }
  (void)sink;
  report();
}

}  // namespace

std::string DescribeLoadProgress(const LoadProgress& p) {
  const double total = static_cast<double>(p.bytes_total);
  const bool gb = total >= 1e9;
  const double unit = gb ? 1e9 : 1e6;
  std::string out =
      absl::StrFormat("%.1f of %.1f %s (%.1f%%)", p.bytes_done / unit, total / unit,
                      gb ? "GB" : "MB", total > 0 ? 100.0 * p.bytes_done / total : 100.0);
  if (p.seconds > 0 && p.bytes_done > 0) {
    const double rate = p.bytes_done / p.seconds;
    absl::StrAppendFormat(&out, ", %.2f %s/s", rate / unit, gb ? "GB" : "MB");
    if (p.bytes_done < p.bytes_total) {
      const double eta = (p.bytes_total - p.bytes_done) / rate;
      const int64_t secs = static_cast<int64_t>(std::ceil(eta));
      if (secs >= 60) {
        absl::StrAppendFormat(&out, ", ETA %dm%02ds", secs / 60, secs % 60);
      } else {
        absl::StrAppendFormat(&out, ", ETA %ds", secs);
      }
    }
  }
  return out;
}

absl::StatusOr<ModelWeights> LoadCheckpoint(const std::string& dir, LayerSpan span,
                                            const LoadProgressCallback& progress) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadConfigFile(dir + "/config.json"));
  ASSIGN_OR_RETURN(LayerSpan resolved, ResolveLayerSpan(config, span));
  Fp8Scheme fp8;
  {
    ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(dir + "/config.json", 1 << 20));
    absl::StatusOr<Fp8Scheme> parsed = ParseFp8Scheme(text);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat(dir, "/config.json: ", parsed.status().message()));
    }
    fp8 = *std::move(parsed);
  }
  ASSIGN_OR_RETURN(TensorStore store, TensorStore::Open(dir));

  ModelWeights w;
  PrepareWeights(config, resolved.begin, resolved.end, &w);
  // A tied config with a stored head: Transformers 5.x uses the stored head (warning when it
  // differs from the embedding); 4.x tied them. We follow 5.x, as everywhere.
  w.head_stored_despite_tie = config.tie_word_embeddings &&
                              resolved.end == config.num_hidden_layers &&
                              store.Find("lm_head.weight") != nullptr;
  // The MTP layer comes with the whole model when the checkpoint stores it.
  const std::string mtp_prefix = LayerPrefix(config.num_hidden_layers);
  if (resolved.begin == 0 && resolved.end == config.num_hidden_layers &&
      config.num_nextn_predict_layers >= 1 &&
      store.Find(mtp_prefix + "eh_proj.weight") != nullptr) {
    PrepareMtp(&w);
    w.mtp_head_stored = store.Find(mtp_prefix + "shared_head.head.weight") != nullptr;
  }
  CheckpointLoader loader(dir, store, fp8, &w);
  RETURN_IF_ERROR(loader.Load());
  if (progress) {
    std::vector<const TensorInfo*> used;
    for (const std::string& name : loader.consumed()) used.push_back(store.Find(name));
    ReadTensors(std::move(used), progress);
  }
  FinishWeights(&w);
  for (std::shared_ptr<const void>& owner : store.Owners()) w.storage.push_back(owner);
  return w;
}

bool Fp8PresetKeepsUnquantized(const ModelConfig& config, const std::string& name) {
  return IsUnquantizedMatrix(name) || absl::EndsWith(name, ".eh_proj.weight") ||
         absl::EndsWith(name, ".shared_head.head.weight") ||
         (config.is_mla() && absl::EndsWith(name, ".indexer.weights_proj.weight"));
}

int64_t Fp8PresetScaleCount(const ModelConfig& config, int64_t rows, int64_t cols) {
  if (!config.is_mla()) return rows;
  return BlocksOf(rows) * BlocksOf(cols);
}

RandomFp8Stream RandomFp8StreamFor(const std::string& name, const RandomWeightOptions& options) {
  // The same expressions as RandomWeights below.
  const float scale =
      static_cast<float>(options.stddev / std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0));
  const float fp8_scale = static_cast<float>(scale * 2.0 * 65535.0 / 448.0);
  return {Mix64(options.seed ^ Mix64(HashName(name))), fp8_scale > 0 ? scale / fp8_scale : 0.0f,
          fp8_scale};
}

absl::StatusOr<ModelWeights> RandomWeights(const ModelConfig& config,
                                           const RandomWeightOptions& options, LayerSpan span) {
  RETURN_IF_ERROR(ValidateConfig(config));
  ASSIGN_OR_RETURN(LayerSpan resolved, ResolveLayerSpan(config, span));
  if (!(options.stddev >= 0.0 && std::isfinite(options.stddev))) {
    return absl::InvalidArgumentError(
        absl::StrCat("random weight stddev must be finite and >= 0, got ", options.stddev));
  }

  ModelWeights w;
  PrepareWeights(config, resolved.begin, resolved.end, &w);
  if (options.mtp) {
    if (resolved.begin != 0 || resolved.end != config.num_hidden_layers) {
      return absl::InvalidArgumentError("an MTP layer needs the whole model, not a span");
    }
    if (config.num_nextn_predict_layers < 1) {
      return absl::InvalidArgumentError(
          "an MTP layer needs a config with num_nextn_predict_layers >= 1");
    }
    PrepareMtp(&w);
  }
  const std::vector<WeightSlot> slots = ListWeightSlots(&w);

  // FP8 presets (docs/fp8.md): the linear layers as e4m3 with one fp32 scale per output
  // channel (the released GLM-4.5-FP8 form), the embedding, routers and head in bf16. GLM-5
  // presets take the GLM-5-FP8 form instead: one scale per 128x128 block (all equal, so the
  // values are those of the per-channel form), the indexer's weights_proj kept unquantized.
  const bool fp8 = options.dtype == DType::kF8E4M3;
  const bool fp8_blocks = fp8 && config.is_mla();
  if (options.dtype == DType::kF8E8M0) {
    return absl::InvalidArgumentError("F8_E8M0 is a scale format, not a weight dtype");
  }
  const auto slot_dtype = [&](const WeightSlot& slot) {
    const bool keep = Fp8PresetKeepsUnquantized(config, slot.name);
    return fp8 && !keep ? DType::kF8E4M3 : fp8 ? DType::kBF16 : options.dtype;
  };
  const auto scale_count = [&](const WeightSlot& slot) {
    return Fp8PresetScaleCount(config, slot.shape[0], slot.shape[1]);
  };

  // One arena for every matrix, each at a 64-byte aligned offset; FP8 scales after them.
  std::vector<int64_t> offsets(slots.size(), -1), scale_offsets(slots.size(), -1);
  int64_t total = 0;
  const auto on_device = [&](const WeightSlot& slot) {
    return options.fp8_codes_on_device && slot_dtype(slot) == DType::kF8E4M3;
  };
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].matrix == nullptr || on_device(slots[i])) continue;
    offsets[i] = total;
    total +=
        (slots[i].shape[0] * slots[i].shape[1] * DTypeSize(slot_dtype(slots[i])) + 63) / 64 * 64;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].matrix == nullptr || slot_dtype(slots[i]) != DType::kF8E4M3) continue;
    scale_offsets[i] = total;
    total += (scale_count(slots[i]) * int64_t{sizeof(float)} + 63) / 64 * 64;
  }
  std::shared_ptr<void> arena = AllocateAligned(static_cast<size_t>(total));
  if (arena == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", total, " bytes of random weights"));
  }
  char* base = static_cast<char*>(arena.get());
  w.storage.push_back(arena);

  // Values depend only on (seed, name, element), never on the chunking or the thread count.
  constexpr int64_t kChunk = 1 << 16;
  // Unit variance: four uniforms on {0..65535} have variance 4 * (65536^2 - 1) / 12.
  const float scale =
      static_cast<float>(options.stddev / std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0));
  // FP8: every row's scale maps the sum's largest magnitude (2 * 65535, +-3.46 sigma) to 448,
  // the largest e4m3 value, as an amax / 448 quantizer would.
  const float fp8_scale = static_cast<float>(scale * 2.0 * 65535.0 / 448.0);
  std::vector<FillJob> jobs;
  for (size_t i = 0; i < slots.size(); ++i) {
    const WeightSlot& slot = slots[i];
    if (slot.vector != nullptr) {
      slot.vector->assign(static_cast<size_t>(slot.shape[0]),
                          slot.init == ParamInit::kOnes ? 1.0f : 0.0f);
      continue;
    }
    const int64_t rows = slot.shape[0], cols = slot.shape[1];
    const DType dtype = slot_dtype(slot);
    *slot.matrix = Matrix{dtype, rows, cols, on_device(slot) ? nullptr : base + offsets[i]};
    float job_scale = scale;
    if (dtype == DType::kF8E4M3) {
      float* scales = reinterpret_cast<float*>(base + scale_offsets[i]);
      std::fill_n(scales, scale_count(slot), fp8_scale);
      slot.matrix->format = WeightFormat::kFp8Scaled;
      slot.matrix->scales = scales;
      slot.matrix->scale_block_rows = fp8_blocks ? kFp8PresetBlock : 1;
      slot.matrix->scale_block_cols = static_cast<int32_t>(fp8_blocks ? kFp8PresetBlock : cols);
      job_scale = fp8_scale > 0 ? scale / fp8_scale : 0.0f;
      w.linear_format = WeightFormat::kFp8Scaled;
    }
    const uint64_t key = Mix64(options.seed ^ Mix64(HashName(slot.name)));
    if (on_device(slot)) {
      w.device_generated_fp8.push_back({slot.matrix, key, job_scale});
      continue;
    }
    for (int64_t first = 0; first < rows * cols; first += kChunk) {
      jobs.push_back(
          {key, base + offsets[i], dtype, first, std::min(kChunk, rows * cols - first), job_scale});
    }
  }
  ParallelFor(static_cast<int64_t>(jobs.size()), 1, [&jobs](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) RunFillJob(jobs[static_cast<size_t>(j)]);
  });

  FinishWeights(&w);
  return w;
}

absl::StatusOr<ModelWeights> LoadModel(const std::string& dir_or_preset, LayerSpan span,
                                       const RandomWeightOptions& random_options,
                                       const LoadOptions& load_options) {
  const bool is_dir = IsDirectory(dir_or_preset);
  if (is_dir && Exists(dir_or_preset + "/config.json")) {
    ASSIGN_OR_RETURN(ModelWeights weights,
                     LoadCheckpoint(dir_or_preset, span, load_options.progress));
    if (absl::Status s = VerifyWeightsFinite(&weights, load_options.verify,
                                             absl::StrCat("checkpoint ", dir_or_preset));
        !s.ok()) {
      return s;
    }
    return weights;
  }
  absl::StatusOr<ModelConfig> preset = PresetConfig(dir_or_preset);
  if (preset.ok() && PresetIsFp8(dir_or_preset)) {
    RandomWeightOptions fp8 = random_options;
    fp8.dtype = DType::kF8E4M3;
    return RandomWeights(*preset, fp8, span);
  }
  if (preset.ok()) return RandomWeights(*preset, random_options, span);
  if (preset.status().code() != absl::StatusCode::kNotFound) return preset.status();
  const std::string what = is_dir                  ? "is a directory without config.json"
                           : Exists(dir_or_preset) ? "is not a checkpoint directory"
                                                   : "does not exist";
  return absl::NotFoundError(absl::StrCat(
      "'", dir_or_preset, "' is neither a checkpoint directory containing config.json (it ", what,
      ") nor a preset (", preset.status().message(), ")"));
}

}  // namespace glmserve
