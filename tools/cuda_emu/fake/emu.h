// CPU emulation of CUDA kernel launches: every block runs its threads as cooperative fibers
// (switching at barriers and shuffles, in a random order), so index math, bounds, barrier
// placement and unwritten outputs can be checked without a GPU.
#pragma once
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace emu {
struct LaunchConfig {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
};
// Validates, then runs now or records into a capturing stream.
void RunKernel(const void* func, const LaunchConfig& cfg, std::function<void()> body);
void SetFuncMaxSmem(const void* func, int bytes);
void* DynamicSmemRaw();
// For emulated libraries (cublaslt_emu.cc): runs `op` now, or records it into a capturing
// stream, as a kernel; and the range check of device accesses (dies outside an allocation).
cudaError_t EnqueueHostOp(cudaStream_t stream, std::function<void()> op);
void CheckDeviceRange(const void* p, size_t n, const char* what);

class Launcher {
 public:
  Launcher(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = nullptr) {
    cfg_.grid = g;
    cfg_.block = b;
    cfg_.smem = smem;
    cfg_.stream = s;
  }
  template <typename... P, typename... A>
  void Run(void (*kernel)(P...), A&&... args) {
    std::tuple<std::decay_t<P>...> t(std::forward<A>(args)...);
    RunKernel(reinterpret_cast<const void*>(kernel), cfg_,
              [kernel, t]() { std::apply(kernel, t); });
  }

 private:
  LaunchConfig cfg_;
};

template <typename T>
T* DynamicSmem() {
  return static_cast<T*>(DynamicSmemRaw());
}
}  // namespace emu

template <typename F>
cudaError_t cudaFuncSetAttribute(F* func, cudaFuncAttribute, int value) {
  emu::SetFuncMaxSmem(reinterpret_cast<const void*>(func), value);
  return cudaSuccess;
}
