// RowsAhead / LinesAhead (attention_items.h): the lines the attentions prefetch for the next
// position block are exactly those its rows span, each once, in order.
#include "core/cpu/ops/attention_items.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace glmserve::internal {
namespace {

std::vector<uintptr_t> Drain(LinesAhead lines) {
  std::vector<uintptr_t> out;
  for (uintptr_t line = lines.Next(); line != 0; line = lines.Next()) out.push_back(line);
  return out;
}

TEST(RowsAheadTest, VisitsEveryLineOfEveryRowOnce) {
  alignas(64) static char storage[64 * 64];
  RowsAhead ahead;
  ahead.Clear();
  ahead.Add(storage + 256, 256);  // four whole lines
  ahead.Add(storage + 1024, 256);
  const uintptr_t base = reinterpret_cast<uintptr_t>(storage);
  EXPECT_EQ(Drain(ahead.lines()),
            (std::vector<uintptr_t>{base + 256, base + 320, base + 384, base + 448, base + 1024,
                                    base + 1088, base + 1152, base + 1216}));
}

TEST(RowsAheadTest, AMisalignedRowCoversItsPartialLines) {
  alignas(64) static char storage[64 * 64];
  const uintptr_t base = reinterpret_cast<uintptr_t>(storage);
  RowsAhead ahead;
  ahead.Clear();
  // 100 bytes from offset 40 touch lines 0 .. 2 (bytes 40 .. 139); the span covers the widest.
  ahead.Add(storage + 40, 100);
  ahead.Add(storage + 640, 100);
  const std::vector<uintptr_t> lines = Drain(ahead.lines());
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0], base);
  EXPECT_EQ(lines[2], base + 128);
  EXPECT_EQ(lines[3], base + 640);
  for (const uintptr_t line : lines) EXPECT_EQ(line % 64, 0u);
}

TEST(RowsAheadTest, ClearedOrEmptyGivesNoLines) {
  alignas(64) static char storage[256];
  RowsAhead ahead;
  ahead.Clear();
  EXPECT_TRUE(Drain(ahead.lines()).empty());
  ahead.Add(storage, 128);
  ahead.Clear();
  EXPECT_TRUE(Drain(ahead.lines()).empty());
  LinesAhead none;
  none.Prefetch();  // a default cursor is empty: nothing to read
  EXPECT_EQ(none.Next(), 0u);
}

TEST(RowsAheadTest, HoldsAFullPositionBlock) {
  static std::vector<uint16_t> rows(kPositionBlock * 128);
  RowsAhead ahead;
  ahead.Clear();
  for (int64_t p = 0; p < kPositionBlock; ++p) ahead.Add(rows.data() + 128 * p, 256);
  const std::vector<uintptr_t> lines = Drain(ahead.lines());
  const uintptr_t first = reinterpret_cast<uintptr_t>(rows.data()) & ~uintptr_t{63};
  EXPECT_EQ(lines.front(), first);
  // Rows back to back: the lines (four a row, or five where the rows are not line-aligned) run
  // to the last row's end.
  EXPECT_GE(lines.back() + 64, reinterpret_cast<uintptr_t>(rows.data() + rows.size()));
  EXPECT_GE(lines.size(), static_cast<size_t>(4 * kPositionBlock));
  // A row past the block's count is left out, not written past the end.
  ahead.Add(rows.data(), 256);
  EXPECT_EQ(Drain(ahead.lines()).size(), lines.size());
}

}  // namespace
}  // namespace glmserve::internal
