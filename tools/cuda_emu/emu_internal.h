// What the emulated libraries beside the runtime (nccl_emu.cc) ask the emulated runtime
// (emu_runtime.cc) beyond the CUDA API: which device memory and streams belong to.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace emu {

int DeviceCount();
// The device whose allocation holds all of [p, p + n): its index, -1 for pinned host memory
// (cudaMallocHost), -2 when no live allocation holds the range.
int AllocationDevice(const void* p, size_t n);
// The device a stream was created on; the legacy (null) stream is the calling thread's
// current device's.
int StreamDevice(cudaStream_t s);

}  // namespace emu
