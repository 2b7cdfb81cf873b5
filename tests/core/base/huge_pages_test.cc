#include "core/base/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace glmserve {
namespace {

// The VmFlags line of the mapping that holds `p` in /proc/self/smaps ("" if none is found).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= addr && addr < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool KernelHasThp() { return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good(); }

TEST(HugePagesTest, LargeBuffersAreZeroedAlignedAndAdvisedForHugePages) {
  const size_t bytes = kHugePageThreshold + 12345;
  auto* p = static_cast<unsigned char*>(AllocateHugePageable(bytes));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(p[i], 0) << i;
  EXPECT_EQ(p[bytes - 1], 0);
  p[bytes - 1] = 1;  // writable to the last byte
  if (!KernelHasThp()) {
    FreeHugePageable(p, bytes);
    GTEST_SKIP() << "this kernel has no transparent huge pages: the advice is a no-op";
  }
  const std::string flags = VmFlagsOf(p);
  ASSERT_FALSE(flags.empty()) << "no /proc/self/smaps entry for the buffer";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;  // MADV_HUGEPAGE
  FreeHugePageable(p, bytes);
  EXPECT_TRUE(VmFlagsOf(p).empty() || VmFlagsOf(p).find(" hg") == std::string::npos)
      << "the mapping outlived FreeHugePageable";
}

TEST(HugePagesTest, SmallBuffersAreZeroedAndCacheLineAligned) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{1} << 20}) {
    auto* p = static_cast<unsigned char*>(AllocateHugePageable(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << i;
    FreeHugePageable(p, bytes);
  }
}

TEST(HugePagesTest, VectorsUseItAndRefuseImpossibleSizes) {
  std::vector<float, HugePageAllocator<float>> v(kHugePageThreshold / sizeof(float) + 7, 0.0f);
  if (KernelHasThp()) {
    EXPECT_NE(VmFlagsOf(v.data()).find(" hg"), std::string::npos);
  }
  v.back() = 3.0f;
  EXPECT_EQ(v.back(), 3.0f);
  HugePageAllocator<double> a;
  EXPECT_THROW(a.allocate(static_cast<size_t>(-1) / 4), std::bad_alloc);
}

}  // namespace
}  // namespace glmserve
