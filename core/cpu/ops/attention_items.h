// How the two-pass attentions (PagedAttention's fp32 path, attention.cc, and PagedAttentionBf16,
// attention_bf16.cc) split a batch into work items, walk an item's position blocks and the runs
// of rows that share them, and name the cache lines the next block will read (RowsAhead). The
// arithmetic is the caller's; nothing here touches a value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/model/forward_types.h"

namespace glmserve::internal {

// A unit of work: a block of consecutive tokens of one sequence slice and some of the query
// heads of one KV head group. Its rows (token x head) attend to the same keys and values, and
// it reads them in blocks of kPositionBlock positions: each block from memory once for all its
// rows, then from cache, where one row at a time re-read the whole context per row (GLM-4.5's
// 12 heads per KV head and every token of a prompt: a 2,048-token prefill's attention was bound
// by those reads). Every row's operations and their order are a lone row's, so the bits do not
// depend on the blocking.
struct AttentionItem {
  int32_t seq;     // index in the batch
  int64_t row0;    // the slice's first row in q / out
  int64_t token0;  // first token of the block, within the slice
  int64_t tokens;
  int64_t kv_head;
  int64_t head0, heads;  // query heads head0 .. of the KV head's group
};

// Positions whose keys (values) the rows share: 64 of a 128-wide head, packed, are 32 KiB in
// fp32. Even, so that a block holds whole position pairs (the bf16 path's operands).
constexpr int64_t kPositionBlock = 64;
// Rows of an fp32 attention item that read the cache in place on AVX-512 (PagedAttention) rather
// than from a packed copy of each position block: one token's query heads of a KV head (12 on
// GLM-4.5). At 24 rows (a 2-token chunk) both cost the same, at 2,048 tokens packing is 1.2x
// faster (attention_bench).
constexpr int64_t kInPlaceRows = 16;
// How long an item's token block may be: at most `tokens`, and its rows' scores (fp32, rows x
// the last token's context) at most `probs` floats, a per-thread buffer. Longer blocks pack
// each position block for more rows.
struct ItemLimits {
  int64_t tokens;
  int64_t probs;
};
// The fp32 path: 16 tokens, 4 MiB of scores (32 tokens measured no faster).
inline constexpr ItemLimits kFp32ItemLimits = {16, int64_t{1} << 20};
// Rows a loop takes together at most: one token's query heads of a KV head on GLM-4.5 (their
// query rows, 6 KiB at a 128-wide head, stay in L1 beside eight keys).
constexpr int64_t kRunRows = 12;

// The cached rows that the next position block's packing will read, prefetched a line or two at
// a time from inside the current block's loops. Spread over the arithmetic, the reads of a long
// context overlap it; a burst of prefetches ahead of a block's packing measured no faster than
// none (a core keeps only a few dozen misses in flight, and the burst waits on them), and the
// packers' own prefetches, a few positions ahead, leave the arithmetic between blocks without
// reads in flight. Memory hints only: no value depends on them.
struct LinesAhead {
  const uintptr_t* row = nullptr;  // the rows left (their first lines' addresses)
  const uintptr_t* end = nullptr;
  uintptr_t offset = 0, span = 0;  // the next line's offset in *row; the rows' lines' bytes
  // The next line's address, 0 when none is left.
  uintptr_t Next() {
    if (row == end) return 0;
    const uintptr_t line = *row + offset;
    offset += 64;
    if (offset == span) {
      offset = 0;
      ++row;
    }
    return line;
  }
  // The next line into L2 (into L1: decode at 16k measured 10% slower).
  void Prefetch() {
    if (const uintptr_t line = Next(); line != 0) {
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
    }
  }
};
// A block's rows, for LinesAhead: a row's first line is all a position costs to plan (a line per
// line of every row measured slower at 4k contexts than the prefetch gained).
class RowsAhead {
 public:
  void Clear() { n_ = span_ = 0; }
  // A row of `bytes` bytes at `row`; past kPositionBlock rows between Clears, left out (hints).
  void Add(const void* row, int64_t bytes) {
    if (n_ == kPositionBlock) return;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(row);
    rows_[n_++] = begin & ~uintptr_t{63};
    span_ = std::max<uintptr_t>(span_, ((begin & 63) + bytes + 63) & ~uintptr_t{63});
  }
  LinesAhead lines() const { return {rows_, rows_ + n_, 0, span_}; }

 private:
  uintptr_t rows_[kPositionBlock];
  int64_t n_ = 0;
  uintptr_t span_ = 0;
};

// Items for the batch: token blocks as long as `limits` allow, the group split into head subsets
// when there are fewer items than threads; the longest contexts first, so that the parallel
// loop's last items are short.
std::vector<AttentionItem> AttentionItems(absl::Span<const SequenceSlice> batch, int64_t kv_heads,
                                          int64_t group, ItemLimits limits);

// An item's rows. Row r: token token0 + r / heads of the slice, query head head0 + r % heads of
// the KV head's group.
struct ItemRows {
  const AttentionItem& item;
  const SequenceSlice& slice;
  int64_t heads, group;  // query heads in all, and per KV head

  int64_t count() const { return item.tokens * item.heads; }
  // The last token's context: the positions the item reads.
  int64_t context() const { return slice.start_position + item.token0 + item.tokens; }
  // Row r's index in q / out (in rows of head_dim), and its context (causal: positions 0 .. its
  // own).
  std::pair<int64_t, int64_t> operator()(int64_t r) const {
    const int64_t t = item.token0 + r / item.heads;
    const int64_t h = item.kv_head * group + item.head0 + r % item.heads;
    return {(item.row0 + t) * heads + h, slice.start_position + t + 1};
  }
};

// Position blocks outermost: block(p0, p1) for each block [p0, p1) of the item's context (where
// the caller packs it), then run(p0, end, r, n) for each run of rows r .. r + n - 1 (n <=
// kRunRows) whose contexts reach the block and end at the same place `end` in it (in a full
// block, all of them): those rows read positions [p0, end) of the block together.
template <typename Block, typename Run>
void ForEachBlockRun(const ItemRows& rows, Block&& block, Run&& run) {
  const int64_t n_rows = rows.count(), context = rows.context();
  for (int64_t p0 = 0; p0 < context; p0 += kPositionBlock) {
    const int64_t p1 = std::min(context, p0 + kPositionBlock);
    block(p0, p1);
    for (int64_t r = 0, n = 1; r < n_rows; r += n) {
      const int64_t end = std::min(rows(r).second, p1);
      for (n = 1; r + n < n_rows && n < kRunRows; ++n) {
        if (std::min(rows(r + n).second, p1) != end) break;
      }
      if (end > p0) run(p0, end, r, n);
    }
  }
}

}  // namespace glmserve::internal
