#include "core/cuda/device_memory.h"

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cuda/cublas_api.h"
#include "core/cuda/cuda_check.h"

namespace glmserve::cuda {

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  // Clears the (non-sticky) error so that it does not resurface at the next check.
  cudaGetLastError();
  const std::string message =
      absl::StrCat("CUDA error ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ") in ",
                   call, " at ", file, ":", line);
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  const std::string message =
      absl::StrCat("cuBLAS error ", Cublas().status_name(status), " (",
                   Cublas().status_string(status), ") in ", call, " at ", file, ":", line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

namespace internal {
void FreeDevice(void* p) { cudaFree(p); }
void FreePinned(void* p) { cudaFreeHost(p); }
void DestroyStream(cudaStream_t s) { cudaStreamDestroy(s); }
void DestroyEvent(cudaEvent_t e) { cudaEventDestroy(e); }
void DestroyCublas(cublasHandle_t h) { Cublas().destroy(h); }
void DestroyGraph(cudaGraph_t g) { cudaGraphDestroy(g); }
void DestroyGraphExec(cudaGraphExec_t g) { cudaGraphExecDestroy(g); }
}  // namespace internal

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(e)));
  }
  b.ptr_ = Owned<void*, internal::FreeDevice>(p);
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Create(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMallocHost of ", bytes, " bytes failed: ", cudaGetErrorString(e)));
  }
  b.ptr_ = Owned<void*, internal::FreePinned>(p);
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<Stream> CreateStream() {
  cudaStream_t s = nullptr;
  GLM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

absl::StatusOr<Event> CreateEvent(bool timing) {
  cudaEvent_t e = nullptr;
  GLM_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(e);
}

absl::StatusOr<CublasHandle> CreateCublas() {
  RETURN_IF_ERROR(LoadCublas());
  cublasHandle_t h = nullptr;
  GLM_CUBLAS_RETURN_IF_ERROR(Cublas().create(&h));
  return CublasHandle(h);
}

absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  GLM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status FillDevice(void* dst, int value, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  GLM_CUDA_RETURN_IF_ERROR(cudaMemset(dst, value, bytes));
  return absl::OkStatus();
}

absl::Status SynchronizeDevice() {
  GLM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  GLM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
