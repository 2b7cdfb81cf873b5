#include "core/base/aligned_vector.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace glmserve {
namespace {

TEST(AlignedVectorTest, StorageStartsOnACacheLine) {
  for (const int64_t n : {1, 3, 17, 1000}) {
    AlignedVector<float> v(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kCacheLine, 0u) << n;
  }
}

// GrowTo only grows: a smaller request keeps the size and the storage (and so the values
// written before), a larger one gives at least that many elements.
TEST(AlignedVectorTest, GrowToNeverShrinks) {
  AlignedVector<int> arena;
  int* p = GrowTo(&arena, 100);
  ASSERT_EQ(arena.size(), 100u);
  EXPECT_EQ(p, arena.data());
  p[99] = 7;
  EXPECT_EQ(GrowTo(&arena, 10), p);
  EXPECT_EQ(arena.size(), 100u);
  EXPECT_EQ(arena[99], 7);
  EXPECT_EQ(GrowTo(&arena, 0), p);
  int* q = GrowTo(&arena, 1000);
  EXPECT_EQ(arena.size(), 1000u);
  EXPECT_EQ(q[99], 7);
}

}  // namespace
}  // namespace glmserve
