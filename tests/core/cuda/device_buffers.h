// Device buffers for the CUDA kernel tests: a host vector's device copy, a poisoned buffer
// (every byte 0xff, so a kernel that leaves an element unwritten shows NaN), and the copy back.
// Allocation and copy failures are test failures, not crashes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/cuda/device_memory.h"

namespace glmserve::cuda {

template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Create(std::max<size_t>(1, v.size()) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(CopyToDevice(b->get(), v.data(), v.size() * sizeof(T)).ok());
  return *std::move(b);
}

template <typename T>
DeviceBuffer Poisoned(size_t n) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Create(std::max<size_t>(1, n) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(FillDevice(b->get(), 0xff, n * sizeof(T)).ok());
  return *std::move(b);
}

// Waits for the device, then copies n elements back.
template <typename T>
std::vector<T> Download(const DeviceBuffer& b, size_t n) {
  EXPECT_TRUE(SynchronizeDevice().ok());
  std::vector<T> v(n);
  EXPECT_TRUE(CopyToHost(v.data(), b.get(), n * sizeof(T)).ok());
  return v;
}

}  // namespace glmserve::cuda
