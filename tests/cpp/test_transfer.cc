#include "runtime/transfer.h"

#include <gtest/gtest.h>

#include <limits>
#include <utility>
#include <vector>

#include "runtime/status.h"

namespace hp::shmem {
namespace {

// (offset, bytes) pairs: comparable and printable by googletest.
using Chunks = std::vector<std::pair<std::size_t, std::size_t>>;

Chunks Collect(std::size_t total, std::size_t limit) {
  Chunks out;
  Status status = ForEachChunk(total, limit, [&](const Chunk& chunk) {
    out.emplace_back(chunk.offset, chunk.bytes);
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok());
  return out;
}

TEST(TransferTest, ZeroBytesYieldNoChunk) {
  EXPECT_TRUE(Collect(0, 0).empty());
  EXPECT_TRUE(Collect(0, 1024).empty());
}

TEST(TransferTest, ExactMultiple) {
  const Chunks expected = {{0, 1024}, {1024, 1024}, {2048, 1024}, {3072, 1024}};
  EXPECT_EQ(Collect(4096, 1024), expected);
}

TEST(TransferTest, RemainderGoesLast) {
  const Chunks expected = {{0, 1000}, {1000, 1000}, {2000, 1000}, {3000, 96}};
  EXPECT_EQ(Collect(3096, 1000), expected);
}

TEST(TransferTest, SmallerThanTheLimitIsOneChunk) {
  const Chunks expected = {{0, 10}};
  EXPECT_EQ(Collect(10, 1024), expected);
  EXPECT_EQ(Collect(10, 10), expected);
}

TEST(TransferTest, LimitZeroMeansOneChunk) {
  const Chunks expected = {{0, 123456789}};
  EXPECT_EQ(Collect(123456789, 0), expected);
}

TEST(TransferTest, OneByteChunks) {
  const Chunks expected = {{0, 1}, {1, 1}, {2, 1}};
  EXPECT_EQ(Collect(3, 1), expected);
}

TEST(TransferTest, ChunksCoverTheTransferContiguously) {
  for (std::size_t total : {1u, 7u, 64u, 1000u, 4097u}) {
    for (std::size_t limit : {0u, 1u, 3u, 64u, 1000u, 5000u}) {
      const Chunks chunks = Collect(total, limit);
      std::size_t next = 0;
      for (const auto& [offset, bytes] : chunks) {
        EXPECT_EQ(offset, next);
        EXPECT_GT(bytes, 0u);
        if (limit != 0) {
          EXPECT_LE(bytes, limit);
        }
        next += bytes;
      }
      EXPECT_EQ(next, total);
    }
  }
}

TEST(TransferTest, NoWrapNearTheTopOfTheAddressSpace) {
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  const std::size_t half = max / 2 + 1;
  const Chunks expected = {{0, half}, {half, max - half}};
  EXPECT_EQ(Collect(max, half), expected);
  const Chunks whole = {{0, max}};
  EXPECT_EQ(Collect(max, 0), whole);
  EXPECT_EQ(Collect(max, max), whole);
}

TEST(TransferTest, ForEachChunkStopsAtTheFirstError) {
  std::vector<std::size_t> offsets;
  Status status = ForEachChunk(10000, 1000, [&](const Chunk& chunk) -> Status {
    offsets.push_back(chunk.offset);
    if (chunk.offset == 3000) return DeviceError("copy failed: offset=3000 bytes=1000");
    if (chunk.offset == 5000) return Internal("must not be reached");
    return Status::Ok();
  });
  EXPECT_EQ(status.code(), StatusCode::kDeviceError);
  EXPECT_EQ(status.message(), "copy failed: offset=3000 bytes=1000");
  EXPECT_EQ(offsets, (std::vector<std::size_t>{0, 1000, 2000, 3000}));
}

TEST(TransferTest, ForEachChunkFirstChunkError) {
  int calls = 0;
  Status status = ForEachChunk(100, 0, [&](const Chunk&) {
    ++calls;
    return Timeout("copy timed out: waited_sec=1");
  });
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace hp::shmem
