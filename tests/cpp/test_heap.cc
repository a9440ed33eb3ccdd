#include "runtime/heap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "test_support.h"

namespace hp::shmem {
namespace {

using testutil::kMiB;

std::size_t MustAllocate(HeapAllocator& heap, std::size_t bytes, std::size_t alignment = 64) {
  Result<std::size_t> offset = heap.Allocate(bytes, alignment);
  EXPECT_TRUE(offset.ok()) << offset.status().ToString();
  return offset.ok() ? offset.value() : static_cast<std::size_t>(-1);
}

TEST(HeapTest, FreshHeap) {
  HeapAllocator heap(kMiB);
  EXPECT_EQ(heap.capacity(), kMiB);
  EXPECT_EQ(heap.used(), 0u);
  EXPECT_EQ(heap.largest_free_block(), kMiB);
  EXPECT_EQ(heap.free_block_count(), 1u);
}

TEST(HeapTest, CapacityIsFlooredToTheGranule) {
  HeapAllocator heap(1000);
  EXPECT_EQ(heap.capacity(), 960u);
  EXPECT_EQ(heap.largest_free_block(), 960u);
  HeapAllocator tiny(63);
  EXPECT_EQ(tiny.capacity(), 0u);
  EXPECT_EQ(tiny.free_block_count(), 0u);
  Result<std::size_t> none = tiny.Allocate(0, 64);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(none.status().message(), "symmetric heap exhausted: requested=0 alignment=64 largest_free=0 heap_size=0");
}

TEST(HeapTest, SizesRoundUpToTheGranule) {
  HeapAllocator heap(kMiB);
  const std::size_t zero = MustAllocate(heap, 0);
  const std::size_t one = MustAllocate(heap, 1);
  const std::size_t exact = MustAllocate(heap, 128);
  const std::size_t odd = MustAllocate(heap, 129);
  EXPECT_EQ(zero, 0u);
  EXPECT_EQ(one, 64u);
  EXPECT_EQ(exact, 128u);
  EXPECT_EQ(odd, 256u);
  EXPECT_EQ(heap.ReservedBytes(zero), 64u);
  EXPECT_EQ(heap.ReservedBytes(one), 64u);
  EXPECT_EQ(heap.ReservedBytes(exact), 128u);
  EXPECT_EQ(heap.ReservedBytes(odd), 192u);
  EXPECT_EQ(heap.ReservedBytes(32), 0u);
  EXPECT_EQ(heap.ReservedBytes(kMiB), 0u);
  EXPECT_EQ(heap.used(), 64u + 64u + 128u + 192u);
}

TEST(HeapTest, AlignmentMustBeAPowerOfTwo) {
  HeapAllocator heap(kMiB);
  for (std::size_t alignment : {std::size_t{0}, std::size_t{3}, std::size_t{48}, std::size_t{100}, std::size_t{192}}) {
    Result<std::size_t> result = heap.Allocate(64, alignment);
    ASSERT_FALSE(result.ok()) << alignment;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(result.status().message(), "`alignment` must be a power of two, but got " + std::to_string(alignment));
  }
  EXPECT_EQ(heap.used(), 0u);
}

TEST(HeapTest, SmallAlignmentsAreRaisedToTheGranule) {
  HeapAllocator heap(kMiB);
  for (std::size_t alignment : {1, 2, 8, 16, 32, 64}) {
    const std::size_t offset = MustAllocate(heap, 1, alignment);
    EXPECT_EQ(offset % 64, 0u) << alignment;
  }
  EXPECT_EQ(heap.used(), 6u * 64u);
}

TEST(HeapTest, LargeAlignmentLeavesTheFrontGapFree) {
  HeapAllocator heap(kMiB);
  EXPECT_EQ(MustAllocate(heap, 64), 0u);
  const std::size_t aligned = MustAllocate(heap, 100, 4096);
  EXPECT_EQ(aligned, 4096u);
  EXPECT_EQ(heap.ReservedBytes(aligned), 128u);
  EXPECT_EQ(heap.used(), 64u + 128u);
  // Free: [64, 4096) and [4224, 1 MiB).
  EXPECT_EQ(heap.free_block_count(), 2u);
  EXPECT_EQ(MustAllocate(heap, 4096 - 64), 64u);   // the gap exactly: best fit picks it
  EXPECT_EQ(heap.free_block_count(), 1u);
  EXPECT_EQ(heap.largest_free_block(), kMiB - 4224);
}

TEST(HeapTest, AlignedOffsetsAreMultiplesOfTheAlignment) {
  HeapAllocator heap(16 * kMiB);
  std::vector<std::size_t> alignments = {64, 128, 256, 512, 1024, 4096, 65536, 2 * kMiB};
  for (int round = 0; round < 3; ++round) {
    for (std::size_t alignment : alignments) {
      const std::size_t offset = MustAllocate(heap, 100 + round * 1000, alignment);
      EXPECT_EQ(offset % alignment, 0u) << "alignment=" << alignment;
    }
  }
}

TEST(HeapTest, BestFitPicksTheSmallestHole) {
  HeapAllocator heap(64 * 1024);
  // Lay out [a:512][x:64][b:256][y:64][c:1024][z:64][rest] and free a, b, c to make holes of 512, 256 and 1024.
  const std::size_t a = MustAllocate(heap, 512);
  MustAllocate(heap, 64);
  const std::size_t b = MustAllocate(heap, 256);
  MustAllocate(heap, 64);
  const std::size_t c = MustAllocate(heap, 1024);
  MustAllocate(heap, 64);
  ASSERT_TRUE(heap.Free(a).ok());
  ASSERT_TRUE(heap.Free(b).ok());
  ASSERT_TRUE(heap.Free(c).ok());
  EXPECT_EQ(heap.free_block_count(), 4u);
  EXPECT_EQ(MustAllocate(heap, 200), b);    // 256 is the smallest that fits
  EXPECT_EQ(MustAllocate(heap, 300), a);    // then 512
  EXPECT_EQ(MustAllocate(heap, 1000), c);   // then 1024, not the big tail
  EXPECT_EQ(heap.free_block_count(), 2u);   // [a+320, a+512) and the tail
}

TEST(HeapTest, BestFitTiesGoToTheLowestOffset) {
  HeapAllocator heap(64 * 1024);
  std::vector<std::size_t> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(MustAllocate(heap, 256));
  // Holes of 256 at blocks[4], blocks[2], blocks[0] (freed in that order); separators keep them apart.
  ASSERT_TRUE(heap.Free(blocks[4]).ok());
  ASSERT_TRUE(heap.Free(blocks[2]).ok());
  ASSERT_TRUE(heap.Free(blocks[0]).ok());
  EXPECT_EQ(MustAllocate(heap, 256), blocks[0]);
  EXPECT_EQ(MustAllocate(heap, 64), blocks[2]);
  EXPECT_EQ(MustAllocate(heap, 192), blocks[2] + 64);   // the 192-byte remainder is now the best fit
  EXPECT_EQ(MustAllocate(heap, 256), blocks[4]);
}

TEST(HeapTest, BestFitAccountsForAlignment) {
  HeapAllocator heap(64 * 1024);
  // A hole of 256 at offset 64 cannot hold 256 bytes aligned to 256, a bigger hole at 4096 can.
  const std::size_t first = MustAllocate(heap, 64);
  const std::size_t hole = MustAllocate(heap, 256);
  const std::size_t pad = MustAllocate(heap, 4096 - 320);
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(hole, 64u);
  EXPECT_EQ(pad, 320u);
  const std::size_t big = MustAllocate(heap, 512);
  MustAllocate(heap, 64);
  EXPECT_EQ(big, 4096u);
  ASSERT_TRUE(heap.Free(hole).ok());
  ASSERT_TRUE(heap.Free(big).ok());
  EXPECT_EQ(MustAllocate(heap, 256, 256), 4096u);
  EXPECT_EQ(MustAllocate(heap, 128, 128), 128u);   // the small hole still serves an aligned fit inside it
  EXPECT_EQ(heap.ReservedBytes(128), 128u);
}

TEST(HeapTest, FreeCoalescesWithBothNeighbours) {
  HeapAllocator heap(4096);
  const std::size_t a = MustAllocate(heap, 1024);
  const std::size_t b = MustAllocate(heap, 1024);
  const std::size_t c = MustAllocate(heap, 1024);
  const std::size_t d = MustAllocate(heap, 1024);
  EXPECT_EQ(heap.used(), 4096u);
  EXPECT_EQ(heap.free_block_count(), 0u);
  EXPECT_EQ(heap.largest_free_block(), 0u);

  ASSERT_TRUE(heap.Free(b).ok());   // a middle block
  EXPECT_EQ(heap.free_block_count(), 1u);
  ASSERT_TRUE(heap.Free(d).ok());   // not adjacent to b
  EXPECT_EQ(heap.free_block_count(), 2u);
  ASSERT_TRUE(heap.Free(c).ok());   // joins b and d
  EXPECT_EQ(heap.free_block_count(), 1u);
  EXPECT_EQ(heap.largest_free_block(), 3072u);
  ASSERT_TRUE(heap.Free(a).ok());   // joins the rest
  EXPECT_EQ(heap.free_block_count(), 1u);
  EXPECT_EQ(heap.largest_free_block(), 4096u);
  EXPECT_EQ(heap.used(), 0u);
  EXPECT_EQ(MustAllocate(heap, 4096), 0u);   // the whole heap in one block again
}

TEST(HeapTest, FreeInEveryOrderRestoresTheWholeHeap) {
  const std::vector<std::vector<int>> orders = {
      {0, 1, 2, 3, 4}, {4, 3, 2, 1, 0}, {1, 3, 0, 4, 2}, {2, 0, 4, 1, 3}, {3, 1, 4, 0, 2}};
  for (const auto& order : orders) {
    HeapAllocator heap(kMiB);
    std::vector<std::size_t> blocks;
    for (std::size_t bytes : {100, 5000, 64, 70000, 1}) blocks.push_back(MustAllocate(heap, bytes));
    for (int index : order) ASSERT_TRUE(heap.Free(blocks[index]).ok());
    EXPECT_EQ(heap.free_block_count(), 1u);
    EXPECT_EQ(heap.used(), 0u);
    EXPECT_EQ(MustAllocate(heap, kMiB), 0u);
  }
}

TEST(HeapTest, ExhaustionMessage) {
  HeapAllocator heap(kMiB);
  const std::size_t big = MustAllocate(heap, kMiB - 1024);
  EXPECT_EQ(big, 0u);
  Result<std::size_t> result = heap.Allocate(4096, 64);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(result.status().message(),
            "symmetric heap exhausted: requested=4096 alignment=64 largest_free=1024 heap_size=1048576");
  // The effective alignment is reported (small alignments are raised to the granule).
  Result<std::size_t> aligned = heap.Allocate(2048, 8);
  ASSERT_FALSE(aligned.ok());
  EXPECT_EQ(aligned.status().message(),
            "symmetric heap exhausted: requested=2048 alignment=64 largest_free=1024 heap_size=1048576");
  // Fits by size but not by alignment: the free block [kMiB-1024, kMiB) has no 4096-aligned start.
  Result<std::size_t> misaligned = heap.Allocate(512, 4096);
  ASSERT_FALSE(misaligned.ok());
  EXPECT_EQ(misaligned.status().message(),
            "symmetric heap exhausted: requested=512 alignment=4096 largest_free=1024 heap_size=1048576");
  // Failed calls change nothing.
  EXPECT_EQ(heap.used(), kMiB - 1024);
  EXPECT_EQ(MustAllocate(heap, 1024), kMiB - 1024);
}

TEST(HeapTest, HugeRequestsFailWithoutOverflow) {
  HeapAllocator heap(kMiB);
  const std::size_t huge = static_cast<std::size_t>(-1);
  Result<std::size_t> result = heap.Allocate(huge, 64);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(result.status().message(), "symmetric heap exhausted: requested=" + std::to_string(huge) +
                                           " alignment=64 largest_free=1048576 heap_size=1048576");
  Result<std::size_t> over = heap.Allocate(kMiB + 1, 64);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfMemory);
  const std::size_t huge_alignment = std::size_t{1} << 62;
  Result<std::size_t> at_zero = heap.Allocate(64, huge_alignment);   // offset 0 is aligned to anything
  ASSERT_TRUE(at_zero.ok());
  EXPECT_EQ(at_zero.value(), 0u);
  Result<std::size_t> nowhere = heap.Allocate(64, huge_alignment);
  ASSERT_FALSE(nowhere.ok());
  EXPECT_EQ(nowhere.status().code(), StatusCode::kOutOfMemory);
}

TEST(HeapTest, FreeErrors) {
  HeapAllocator heap(kMiB);
  const std::size_t a = MustAllocate(heap, 256);
  EXPECT_EQ(a, 0u);
  for (std::size_t offset : {std::size_t{0x40}, std::size_t{0x100}, std::size_t{0x10}, kMiB, kMiB * 2}) {
    Status status = heap.Free(offset);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), "`offset` must be the start of an allocated block, but got " +
                                    std::string(offset == 0x40    ? "0x40"
                                                : offset == 0x100 ? "0x100"
                                                : offset == 0x10  ? "0x10"
                                                : offset == kMiB  ? "0x100000"
                                                                  : "0x200000"));
  }
  ASSERT_TRUE(heap.Free(a).ok());
  Status twice = heap.Free(a);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.message(), "`offset` must be the start of an allocated block, but got 0x0");
  EXPECT_EQ(heap.used(), 0u);
  EXPECT_EQ(heap.free_block_count(), 1u);
}

// The heap is symmetric because every rank replays the same calls: equal sequences must give equal offsets.
std::vector<std::size_t> Replay(std::size_t capacity) {
  HeapAllocator heap(capacity);
  std::vector<std::size_t> trace;
  std::vector<std::size_t> live;
  std::uint64_t state = 12345;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && next() % 3 == 0) {
      const std::size_t index = next() % live.size();
      EXPECT_TRUE(heap.Free(live[index]).ok());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
      trace.push_back(heap.free_block_count());
    } else {
      const std::size_t bytes = next() % 20000;
      const std::size_t alignment = std::size_t{1} << (next() % 13);
      Result<std::size_t> offset = heap.Allocate(bytes, alignment);
      if (offset.ok()) {
        EXPECT_EQ(offset.value() % alignment, 0u);
        live.push_back(offset.value());
        trace.push_back(offset.value());
      } else {
        EXPECT_EQ(offset.status().code(), StatusCode::kOutOfMemory);
        trace.push_back(static_cast<std::size_t>(-1));
      }
    }
    trace.push_back(heap.used());
  }
  for (std::size_t offset : live) EXPECT_TRUE(heap.Free(offset).ok());
  EXPECT_EQ(heap.used(), 0u);
  EXPECT_EQ(heap.free_block_count(), 1u);
  return trace;
}

TEST(HeapTest, DeterministicAcrossAllocators) {
  const std::vector<std::size_t> first = Replay(4 * kMiB);
  const std::vector<std::size_t> second = Replay(4 * kMiB);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first.size(), 4000u);
}

TEST(HeapTest, UsedNeverExceedsCapacityAndBlocksNeverOverlap) {
  HeapAllocator heap(64 * 1024);
  std::vector<std::pair<std::size_t, std::size_t>> blocks;
  for (std::size_t bytes = 1;; bytes = bytes * 3 % 2000 + 1) {
    Result<std::size_t> offset = heap.Allocate(bytes, 64);
    if (!offset.ok()) break;
    blocks.emplace_back(offset.value(), heap.ReservedBytes(offset.value()));
  }
  std::sort(blocks.begin(), blocks.end());
  std::size_t total = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    total += blocks[i].second;
    if (i + 1 < blocks.size()) {
      EXPECT_LE(blocks[i].first + blocks[i].second, blocks[i + 1].first);
    }
  }
  EXPECT_EQ(total, heap.used());
  EXPECT_LE(heap.used(), heap.capacity());
}

}  // namespace
}  // namespace hp::shmem
