// ModelRunner: what the engine needs from a backend. The CpuModel and the CUDA model both
// implement it over the same ForwardBatch / ForwardOptions / ForwardResult types, so the
// scheduler, the server and the tests do not care where the layers run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/checkpoint.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"
#include "core/model/weights.h"

namespace glmserve {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  virtual int64_t layer_begin() const = 0;
  virtual int64_t layer_end() const = 0;
  int64_t num_span_layers() const { return layer_end() - layer_begin(); }
  bool has_embedding() const { return layer_begin() == 0; }
  bool has_head() const { return layer_end() == config().num_hidden_layers; }

  // Whether Forward honours ForwardOptions::layer_begin / layer_end inside the loaded span.
  virtual bool supports_sub_spans() const { return true; }

  // Whether Forward honours ForwardOptions::sample: chooses tokens where the logits are and
  // returns only the rows a request keeps (the CUDA runner). A runner that does not refuses
  // a non-empty sample list; the engine then samples on the host.
  virtual bool samples_tokens() const { return false; }

  // "cpu" or e.g. "cuda:0 NVIDIA H200".
  virtual std::string device_name() const = 0;
  // How it computes, for logs and GetModelInfo (e.g. "cpu math bf16, kernel avx512_bf16");
  // empty when there is nothing to say beyond device_name().
  virtual std::string compute_description() const { return ""; }
  // Bytes of weights this runner holds (for info and sizing).
  virtual int64_t weight_bytes() const = 0;
  // KV bytes one token slot takes across the span's layers.
  virtual int64_t kv_bytes_per_token() const = 0;

  // The element format of the caches CreateCache makes from now on (--kv_cache_dtype).
  // kAuto is always accepted; anything else FAILED_PRECONDITION naming the flag unless the
  // backend overrides this (the CPU backend's fp32, bf16 and FP8 caches; the CUDA runner's
  // bf16 and FP8).
  virtual absl::Status SetKvCacheDType(KvCacheDType dtype);

  // The MTP layer (docs/mtp.md): whether the loaded weights have one, and turning it on, which
  // must come before CreateCache: caches then hold one more layer (the MTP layer's K/V) and
  // Forward takes ForwardOptions::mtp. FAILED_PRECONDITION without MTP weights or for a span,
  // UNIMPLEMENTED where the backend does not run it.
  virtual bool has_mtp() const { return false; }
  virtual absl::Status EnableMtp();
  virtual bool mtp_enabled() const { return false; }

  // A KV cache this runner's Forward can use: `num_blocks` blocks of `block_size` tokens.
  virtual absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                               int64_t block_size) = 0;

  // OK while the runner can run steps; otherwise why not (a tensor-parallel group whose rank
  // failed, core/model/rank_group.h). glm-server reports not ready with this reason.
  virtual absl::Status health() const { return absl::OkStatus(); }

  // One step over a ragged batch; see core/cpu/cpu_model.h for the contract.
  virtual absl::Status Forward(const ForwardBatch& batch, KvCache* cache,
                               const ForwardOptions& options, ForwardResult* result) = 0;
};

// FP8 tensor cores on the CUDA backend (docs/cuda.md "FP8 on tensor cores"): kAuto uses them
// where the device and cuBLASLt support them, else the CUDA-core kernels (one line on stderr);
// kOn refuses to start without them (a model with FP8 weights only); kOff never uses them.
enum class Fp8TensorCores { kAuto, kOn, kOff };
// "auto", "on", "off"; INVALID_ARGUMENT naming the three otherwise.
absl::StatusOr<Fp8TensorCores> ParseFp8TensorCores(absl::string_view name);

}  // namespace glmserve
