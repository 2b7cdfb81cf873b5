// ModelRunner: what the engine needs from a backend. The CpuModel and the CUDA model both
// implement it over the same ForwardBatch / ForwardOptions / ForwardResult types, so the
// scheduler, the server and the tests do not care where the layers run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/forward_types.h"
#include "core/kv_cache.h"
#include "core/ops/linear.h"
#include "core/weights.h"

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
  // backend overrides this (the CPU backend's FP8 cache; the CUDA runner keeps bf16).
  virtual absl::Status SetKvCacheDType(KvCacheDType dtype);

  // A KV cache this runner's Forward can use: `num_blocks` blocks of `block_size` tokens.
  virtual absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                               int64_t block_size) = 0;

  // One step over a ragged batch; see core/model.h for the contract.
  virtual absl::Status Forward(const ForwardBatch& batch, KvCache* cache,
                               const ForwardOptions& options, ForwardResult* result) = 0;
};

enum class DeviceKind { kAuto, kCpu, kCuda };
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);

// FP8 tensor cores on the CUDA backend (docs/cuda.md "FP8 on tensor cores"): kAuto uses them
// where the device and cuBLASLt support them, else the CUDA-core kernels (one line on stderr);
// kOn refuses to start without them (a model with FP8 weights only); kOff never uses them.
enum class Fp8TensorCores { kAuto, kOn, kOff };
// "auto", "on", "off"; INVALID_ARGUMENT naming the three otherwise.
absl::StatusOr<Fp8TensorCores> ParseFp8TensorCores(absl::string_view name);

// kAuto picks CUDA when a usable GPU is present (run-time check), else the CPU; kCuda fails
// with FAILED_PRECONDITION when the build has no CUDA backend or no GPU is present.
// cpu_math: the CPU backend's linear arithmetic (core/ops/linear.h); the CUDA backend has its
// own and ignores it.
// upload_progress: called as the CUDA backend streams the weights to the device (the bytes
// copied so far; core/checkpoint.h's DescribeLoadProgress words it); ignored on the CPU.
// fp8_tensor_cores: the CUDA backend's FP8 GEMMs (glm-server --fp8_tensor_cores; docs/cuda.md
// "FP8 on tensor cores"); ignored on the CPU.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(
    ModelWeights weights, DeviceKind device, CpuMath cpu_math = CpuMath::kExact,
    const LoadProgressCallback& upload_progress = nullptr,
    Fp8TensorCores fp8_tensor_cores = Fp8TensorCores::kOff);

}  // namespace glmserve
