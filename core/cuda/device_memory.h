// RAII owners for CUDA resources: device and pinned host buffers, streams, events, cuBLAS
// handles and graphs. Each is created through a factory that returns absl::StatusOr, is
// move-only, and releases its resource in the destructor (errors at release cannot be
// reported and are ignored: the process keeps running, as everywhere in this backend).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"

namespace glmserve::cuda {

// A unique owner of a handle `T` released by `Release`.
template <typename T, void (*Release)(T)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T handle) : handle_(handle) {}
  Owned(Owned&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, T{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Reset(); }

  T get() const { return handle_; }
  explicit operator bool() const { return handle_ != T{}; }
  void Reset() {
    if (handle_ != T{}) Release(std::exchange(handle_, T{}));
  }

 private:
  T handle_{};
};

namespace internal {
void FreeDevice(void* p);
void FreePinned(void* p);
void DestroyStream(cudaStream_t s);
void DestroyEvent(cudaEvent_t e);
void DestroyCublas(cublasHandle_t h);
void DestroyGraph(cudaGraph_t g);
void DestroyGraphExec(cudaGraphExec_t g);
}  // namespace internal

// Device memory (cudaMalloc: 256-byte aligned).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes);

  void* get() const { return ptr_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }
  size_t bytes() const { return bytes_; }
  void Reset() {
    ptr_.Reset();
    bytes_ = 0;
  }

 private:
  Owned<void*, internal::FreeDevice> ptr_;
  size_t bytes_ = 0;
};

// Page-locked host memory, so that copies are asynchronous and run at full link speed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Create(size_t bytes);

  void* get() const { return ptr_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }
  size_t bytes() const { return bytes_; }

 private:
  Owned<void*, internal::FreePinned> ptr_;
  size_t bytes_ = 0;
};

using Stream = Owned<cudaStream_t, internal::DestroyStream>;
using Event = Owned<cudaEvent_t, internal::DestroyEvent>;
using CublasHandle = Owned<cublasHandle_t, internal::DestroyCublas>;
using Graph = Owned<cudaGraph_t, internal::DestroyGraph>;
using GraphExec = Owned<cudaGraphExec_t, internal::DestroyGraphExec>;

// A non-blocking stream (no implicit ordering with the legacy default stream).
absl::StatusOr<Stream> CreateStream();
// An event; with `timing` false it is lighter (synchronisation only).
absl::StatusOr<Event> CreateEvent(bool timing);
absl::StatusOr<CublasHandle> CreateCublas();

// Blocking copies for tests and setup code (not for the step loop).
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
// Fills `bytes` of device memory with the byte `value` (0xff poisons floats and bf16 as NaN).
absl::Status FillDevice(void* dst, int value, size_t bytes);
// Waits for all work on the device and reports any asynchronous error.
absl::Status SynchronizeDevice();

}  // namespace glmserve::cuda
