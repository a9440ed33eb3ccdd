// The host device through the Device interface, with thread-ranks: initialisation over POSIX shared memory,
// capacity checks, the data plane between the ranks' mappings, signals, barriers and streams.
#include "runtime/host/host_device.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "private_shm.h"
#include "runtime/host/process_memory.h"
#include "runtime/logging.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem::host {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

DeviceInitArgs Args(Bootstrap& bootstrap, std::size_t heap_size = kMiB, double timeout_sec = 10.0) {
  DeviceInitArgs args;
  args.rank = bootstrap.rank();
  args.world_size = bootstrap.world_size();
  args.heap_size = heap_size;
  args.timeout_sec = timeout_sec;
  return args;
}

// Entries of /dev/shm that segments of this process would have.
std::vector<std::string> OwnShmEntries() {
  std::vector<std::string> found;
  const std::string prefix = std::string(kSegmentPrefix) + std::to_string(getpid()) + "-";
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return found;
  while (dirent* entry = readdir(dir)) {
    if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) found.emplace_back(entry->d_name);
  }
  closedir(dir);
  return found;
}

std::size_t PageSize() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

void* At(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

// The reach table of `world` ranks on the nodes `node_of` describes (a rank opens the probes of its own node).
std::vector<std::uint8_t> ReachOf(const std::vector<int>& node_of) {
  const std::size_t world = node_of.size();
  std::vector<std::uint8_t> reach(world * world);
  for (std::size_t a = 0; a < world; ++a) {
    for (std::size_t b = 0; b < world; ++b) reach[a * world + b] = node_of[a] == node_of[b] ? 1 : 0;
  }
  return reach;
}

TEST(NodesFromReachTest, NumbersEachNodeByItsLowestRank) {
  // Nodes need not be contiguous in rank order: ranks 0 and 2 on one machine, 1 and 3 on another.
  auto nodes = NodesFromReach(ReachOf({7, 9, 7, 9}), 4);
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  EXPECT_EQ(nodes.value(), (std::vector<int>{0, 1, 0, 1}));
  auto one = NodesFromReach(ReachOf({5, 5, 5}), 3);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one.value(), (std::vector<int>{0, 0, 0}));
  auto apart = NodesFromReach(ReachOf({1, 2, 3}), 3);
  ASSERT_TRUE(apart.ok());
  EXPECT_EQ(apart.value(), (std::vector<int>{0, 1, 2}));
}

TEST(NodesFromReachTest, RefusesATableThatIsNotAPartition) {
  // Rank 0 opens rank 1's probe, rank 1 does not open rank 0's.
  std::vector<std::uint8_t> asymmetric = ReachOf({0, 0, 2});
  asymmetric[1 * 3 + 0] = 0;
  auto one_way = NodesFromReach(asymmetric, 3);
  ASSERT_EQ(one_way.status().code(), StatusCode::kDeviceError);
  EXPECT_NE(one_way.status().message().find("ranks disagree about which ranks share memory: rank=0 opens_rank_1=true"),
            std::string::npos)
      << one_way.status().message();
  // 0 shares with 1 and 1 with 2, but 0 not with 2.
  std::vector<std::uint8_t> chain = ReachOf({0, 0, 0});
  chain[0 * 3 + 2] = chain[2 * 3 + 0] = 0;
  auto not_transitive = NodesFromReach(chain, 3);
  ASSERT_EQ(not_transitive.status().code(), StatusCode::kDeviceError);
  EXPECT_NE(not_transitive.status().message().find("node_of_"), std::string::npos);
  auto wrong_size = NodesFromReach(std::vector<std::uint8_t>(5, 1), 2);
  ASSERT_EQ(wrong_size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_size.status().message().find("`reach` must be a world_size x world_size table, but got 5 entries"),
            std::string::npos);
}

TEST(HostDeviceTest, RanksOfOneMachineFormOneNode) {
  RunRanks(3, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    DeviceInitArgs args;
    args.rank = rank;
    args.world_size = 3;
    args.heap_size = 1 << 20;
    ASSERT_TRUE(device.Init(args, bootstrap).ok());
    EXPECT_EQ(device.nodes(), (std::vector<int>{0, 0, 0}));
    ASSERT_TRUE(device.Finalize().ok());
  });
}

TEST(HostDeviceTest, NotInitialised) {
  HostDevice device;
  EXPECT_STREQ(device.name(), "host");
  EXPECT_EQ(device.heap_base(), 0u);
  EXPECT_EQ(device.heap_size(), 0u);
  EXPECT_EQ(device.max_transfer_bytes(), 0u);
  const Result<void*> allocated = device.Allocate(64, 64);
  EXPECT_TRUE(HasError(allocated.status(), StatusCode::kStateError, "host device is not initialised: op=Allocate"));
  char byte = 0;
  EXPECT_TRUE(HasError(device.Free(&byte), StatusCode::kStateError, "host device is not initialised: op=Free"));
  EXPECT_EQ(device.ReservedBytes(&byte), 0u);
  EXPECT_TRUE(HasError(device.CopyToHeap(&byte, &byte, 1), StatusCode::kStateError,
                       "host device is not initialised: op=CopyToHeap"));
  EXPECT_TRUE(HasError(device.CopyFromHeap(&byte, &byte, 1), StatusCode::kStateError,
                       "host device is not initialised: op=CopyFromHeap"));
  EXPECT_TRUE(HasError(device.Copy(&byte, &byte, 1, kDefaultStream, nullptr), StatusCode::kStateError,
                       "host device is not initialised: op=Copy"));
  EXPECT_TRUE(IsOk(device.Quiesce()));
  EXPECT_TRUE(IsOk(device.Finalize()));
}

TEST(HostDeviceTest, InitLeavesNothingInDevShm) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap, kMiB + 1), bootstrap)));
    // Every rank has mapped every segment and unlinked its own: /dev/shm holds nothing of ours.
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_EQ(OwnShmEntries(), std::vector<std::string>{});
    EXPECT_EQ(device.heap_size(), kMiB + PageSize());   // rounded up to whole pages
    EXPECT_NE(device.heap_base(), 0u);
    EXPECT_EQ(device.heap_base() % PageSize(), 0u);
    // Every rank maps its own segment at its own address.
    const std::vector<std::uintptr_t> bases = GatherValue(bootstrap, device.heap_base());
    for (int r = 0; r < 4; ++r) {
      if (r != rank) {
        EXPECT_NE(bases[static_cast<std::size_t>(r)], device.heap_base());
      }
    }
    EXPECT_TRUE(HasError(device.Init(Args(bootstrap), bootstrap), StatusCode::kStateError,
                         "host device is already initialised: rank=" + std::to_string(rank)));
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(device.Finalize()));
    EXPECT_EQ(device.heap_base(), 0u);
    EXPECT_TRUE(HasError(device.Allocate(64, 64).status(), StatusCode::kStateError, "op=Allocate"));
  });
  EXPECT_EQ(OwnShmEntries(), std::vector<std::string>{});
}

TEST(HostDeviceTest, InitFailsOnEveryRankWhenDevShmIsTooSmall) {
  struct statvfs vfs;
  ASSERT_EQ(statvfs("/dev/shm", &vfs), 0);
  const std::size_t available = static_cast<std::size_t>(vfs.f_bavail) * static_cast<std::size_t>(vfs.f_frsize);
  // Larger than the free space, and never written: the check comes before any segment exists.
  const std::size_t heap_size = available + 64 * kMiB;
  const std::size_t segment_bytes = (heap_size + PageSize() - 1) / PageSize() * PageSize() + HostDevice::kControlBytes;
  RunRanks(2, [&](int, Bootstrap& bootstrap) {
    HostDevice device;
    const Status status = device.Init(Args(bootstrap, heap_size), bootstrap);
    EXPECT_TRUE(HasError(status, StatusCode::kOutOfMemory,
                         "creating the symmetric heap failed: rank=0 (shared-memory filesystem too small for the "
                         "symmetric heaps: path=/dev/shm required=" +
                             std::to_string(2 * segment_bytes) + " available="));
    EXPECT_EQ(device.heap_base(), 0u);
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_EQ(OwnShmEntries(), std::vector<std::string>{});
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));   // every rank has looked before anyone creates a segment again
    // The device is still usable with a heap that fits.
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    EXPECT_EQ(device.heap_size(), kMiB);
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, FinalizeLeavesEscapedPointersHarmless) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    Result<void*> allocated = device.Allocate(4096, 64);
    ASSERT_TRUE(allocated.ok()) << allocated.status().ToString();
    // Pointers that escape the runtime's bookkeeping: into our heap and into the peer's mapping.
    auto* own = static_cast<unsigned char*>(allocated.value());
    Result<void*> peer_address = device.PeerAddress(own, 1 - rank);
    ASSERT_TRUE(peer_address.ok()) << peer_address.status().ToString();
    auto* peer = static_cast<unsigned char*>(peer_address.value());
    std::memset(own, 0x10 + rank, 4096);
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_EQ(peer[4095], 0x10 + (1 - rank));
    const std::uintptr_t old_base = device.heap_base();
    const std::size_t heap_size = device.heap_size();
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    ASSERT_TRUE(IsOk(device.Finalize()));

    // After Finalize they read zeros and keep what is written through them to this process: no fault.
    EXPECT_EQ(own[0], 0);
    EXPECT_EQ(peer[4095], 0);
    own[0] = 0x5A;
    peer[4095] = 0x6B;
    EXPECT_EQ(own[0], 0x5A);
    EXPECT_EQ(peer[4095], 0x6B);
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));   // both ranks wrote through their stale pointers

    // A new lifecycle's heap never lies under them, and nothing written through them reaches it.
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    const std::uintptr_t base = device.heap_base();
    EXPECT_TRUE(base + device.heap_size() <= old_base || old_base + heap_size <= base)
        << "new heap at " << base << " overlaps the retired one at " << old_base;
    Result<void*> again = device.Allocate(4096, 64);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    const auto* fresh = static_cast<const unsigned char*>(again.value());
    Result<void*> fresh_peer = device.PeerAddress(fresh, 1 - rank);
    ASSERT_TRUE(fresh_peer.ok()) << fresh_peer.status().ToString();
    EXPECT_EQ(fresh[0], 0);
    EXPECT_EQ(fresh[4095], 0);
    EXPECT_EQ(static_cast<const unsigned char*>(fresh_peer.value())[4095], 0);
    EXPECT_EQ(own[0], 0x5A);   // still this process's private page
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(device.Free(again.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, InitChecksDevShmBeforeAnyRankReservesItsHeap) {
  // Room for the 4 heaps, not for 4 more: a rank that checked after its peers had reserved theirs would refuse.
  const std::size_t segment_bytes = kMiB + HostDevice::kControlBytes;
  const ChildReport report = InSmallShm(6 * segment_bytes, []() -> std::string {
    RunRanks(4, [](int rank, Bootstrap& bootstrap) {
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));   // the last to arrive
      HostDevice device;
      EXPECT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      EXPECT_TRUE(IsOk(device.Finalize()));
    });
    return ::testing::Test::HasFailure() ? "a rank failed (printed above)" : "";
  });
  if (report.skipped) GTEST_SKIP() << report.text;
  EXPECT_EQ(report.text, "");
}

TEST(HostDeviceTest, SymmetricHeapAndDataPlane) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    // The same sequence of allocations yields the same offsets on every rank.
    Result<void*> a = device.Allocate(1000, 64);
    Result<void*> b = device.Allocate(4096, 4096);
    ASSERT_TRUE(a.ok() && b.ok());
    const std::size_t offset_a = reinterpret_cast<std::uintptr_t>(a.value()) - device.heap_base();
    const std::size_t offset_b = reinterpret_cast<std::uintptr_t>(b.value()) - device.heap_base();
    EXPECT_EQ(offset_a, 0u);
    EXPECT_EQ(offset_b % 4096, 0u);
    EXPECT_EQ(device.ReservedBytes(a.value()), 1024u);
    EXPECT_EQ(device.ReservedBytes(b.value()), 4096u);
    EXPECT_EQ(GatherValue(bootstrap, offset_b), std::vector<std::size_t>(4, offset_b));
    std::memset(b.value(), 0, 4096);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));

    // Each rank writes its 1 KiB block into slot `rank` of every peer's b, then reads slot `rank` of a peer back.
    std::vector<unsigned char> block(1024, static_cast<unsigned char>(0x10 + rank));
    for (int pe = 0; pe < 4; ++pe) {
      ASSERT_TRUE(IsOk(device.Put(At(b.value(), 1024 * static_cast<std::size_t>(rank)), block.data(), 1024, pe,
                                  kDefaultStream, nullptr)));
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    for (int r = 0; r < 4; ++r) {
      const auto* slot = static_cast<const unsigned char*>(At(b.value(), 1024 * static_cast<std::size_t>(r)));
      EXPECT_EQ(slot[0], 0x10 + r);
      EXPECT_EQ(slot[1023], 0x10 + r);
    }
    std::vector<unsigned char> got(1024, 0);
    ASSERT_TRUE(IsOk(device.Get(got.data(), At(b.value(), 1024 * static_cast<std::size_t>(rank)), 1024,
                                (rank + 2) % 4, kDefaultStream, nullptr)));
    EXPECT_EQ(got, block);

    EXPECT_TRUE(IsOk(device.Free(a.value())));
    EXPECT_TRUE(HasError(device.Free(a.value()), StatusCode::kInvalidArgument, ""));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Free(b.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, LocalCopiesStayInsideTheOwnHeap) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    auto buffer = device.Allocate(64, 64);
    ASSERT_TRUE(buffer.ok());
    const char text[] = "local copy";
    ASSERT_TRUE(IsOk(device.CopyToHeap(At(buffer.value(), 4), text, sizeof(text))));
    EXPECT_STREQ(static_cast<const char*>(At(buffer.value(), 4)), "local copy");   // host memory: the same bytes
    char back[sizeof(text)] = {};
    ASSERT_TRUE(IsOk(device.CopyFromHeap(back, At(buffer.value(), 4), sizeof(text))));
    EXPECT_STREQ(back, "local copy");

    const std::string heap = "must lie inside this rank's symmetric heap [" + Hex(device.heap_base()) + "," +
                             Hex(device.heap_base() + device.heap_size()) + "), but got [";
    EXPECT_TRUE(HasError(device.CopyToHeap(back, text, 4), StatusCode::kInvalidArgument, "`symmetric_dst` " + heap));
    void* last = reinterpret_cast<void*>(device.heap_base() + device.heap_size() - 2);
    EXPECT_TRUE(HasError(device.CopyFromHeap(back, last, 4), StatusCode::kInvalidArgument, "`symmetric_src` " + heap));
    EXPECT_TRUE(IsOk(device.CopyFromHeap(back, last, 2)));   // the heap's last bytes
    ASSERT_TRUE(IsOk(device.Free(buffer.value())));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, CopyIsALocalCopyBetweenAnyTwoBuffersInStreamOrder) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    Result<void*> heap = device.Allocate(4096, 64);
    ASSERT_TRUE(heap.ok());
    std::memset(heap.value(), 0, 4096);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));

    // Host memory to the heap, heap to heap, heap to host memory, host to host: on the default stream each
    // completes before it returns.
    std::vector<unsigned char> mine(1024);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<unsigned char>(i * 7 + rank);
    ASSERT_TRUE(IsOk(device.Copy(heap.value(), mine.data(), 1024, kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(device.Copy(At(heap.value(), 2048), heap.value(), 1024, kDefaultStream, nullptr)));
    std::vector<unsigned char> back(1024, 0);
    ASSERT_TRUE(IsOk(device.Copy(back.data(), At(heap.value(), 2048), 1024, kDefaultStream, nullptr)));
    EXPECT_EQ(back, mine);
    std::vector<unsigned char> host_copy(1024, 0);
    ASSERT_TRUE(IsOk(device.Copy(host_copy.data(), back.data(), 1024, kDefaultStream, nullptr)));
    EXPECT_EQ(host_copy, mine);
    // Zero bytes touch nothing, whatever the pointers.
    EXPECT_TRUE(IsOk(device.Copy(nullptr, nullptr, 0, kDefaultStream, nullptr)));

    // On a stream: in order with the work around it (a copy, then a put of what it wrote to the peer), the source
    // kept alive until it ran, nothing done before the stream is synchronized that the test can see.
    Result<StreamHandle> stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    auto source = std::make_shared<std::vector<unsigned char>>(512, static_cast<unsigned char>(0xA0 + rank));
    ASSERT_TRUE(IsOk(device.StreamWaitStream(stream.value(), kDefaultStream)));
    ASSERT_TRUE(IsOk(device.Copy(At(heap.value(), 1024), source->data(), 512, stream.value(), source)));
    std::weak_ptr<std::vector<unsigned char>> watched = source;
    source.reset();
    ASSERT_TRUE(IsOk(device.Put(At(heap.value(), 3072 + 512 * static_cast<std::size_t>(rank)), At(heap.value(), 1024),
                                512, 1 - rank, stream.value(), nullptr)));
    ASSERT_TRUE(IsOk(device.Barrier(stream.value())));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_TRUE(watched.expired());
    const auto* from_peer = static_cast<const unsigned char*>(At(heap.value(), 3072 + 512 * static_cast<std::size_t>(1 - rank)));
    EXPECT_EQ(from_peer[0], 0xA0 + (1 - rank));
    EXPECT_EQ(from_peer[511], 0xA0 + (1 - rank));
    EXPECT_TRUE(HasError(device.Copy(back.data(), mine.data(), 8, 0x1234, nullptr), StatusCode::kInvalidArgument,
                         "`stream` must be a live stream of the host device, but got handle 0x1234"));
    EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Free(heap.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

// Peers' memory outside the heap: each rank reads the other's ordinary buffer at the address the peer published, and
// reduces from both ranks' buffers, in blocks (the buffers span several of ReducePeerMemory's blocks), out of place
// and in place. Thread-ranks share a process, which the kernel always lets read itself.
TEST(HostDeviceTest, PeerMemoryIsReadAtThePeersOwnAddresses) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    EXPECT_TRUE(device.reaches_peer_memory());
    const std::size_t count = 40000;   // 160 KB of float32: three blocks
    std::vector<float> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(rank * 100000 + static_cast<int>(i));
    const std::vector<std::uint64_t> addresses = GatherValue(bootstrap, reinterpret_cast<std::uint64_t>(mine.data()));
    const int peer = 1 - rank;

    std::vector<float> theirs(count, -1.0f);
    ASSERT_TRUE(IsOk(device.GetPeerMemory(theirs.data(), addresses[static_cast<std::size_t>(peer)], count * 4, peer,
                                          kDefaultStream, nullptr)));
    EXPECT_EQ(theirs[0], static_cast<float>(peer * 100000));
    EXPECT_EQ(theirs[count - 1], static_cast<float>(peer * 100000 + static_cast<int>(count - 1)));

    std::vector<float> sum(count, 0.0f);
    ASSERT_TRUE(IsOk(device.ReducePeerMemory(sum.data(), addresses, {0, 1}, count, DataType::kFloat32, ReduceOp::kSum,
                                             kDefaultStream, nullptr)));
    for (std::size_t i : {std::size_t{0}, std::size_t{16383}, std::size_t{16384}, count - 1}) {
      EXPECT_EQ(sum[i], static_cast<float>(100000 + 2 * static_cast<int>(i))) << "i=" << i;
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));   // both read the other's buffer before either changes its own

    // In place, on a stream: this rank's source is the destination itself; its half only, which the peer does not read.
    Result<StreamHandle> stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    const std::size_t half = count / 2;
    const std::size_t lo = static_cast<std::size_t>(rank) * half;
    std::vector<std::uint64_t> sources = {addresses[0] + lo * 4, addresses[1] + lo * 4};
    ASSERT_TRUE(IsOk(device.ReducePeerMemory(mine.data() + lo, sources, {0, 1}, half, DataType::kFloat32, ReduceOp::kMax,
                                             stream.value(), nullptr)));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_EQ(mine[lo], static_cast<float>(100000 + static_cast<int>(lo)));
    EXPECT_EQ(mine[lo + half - 1], static_cast<float>(100000 + static_cast<int>(lo + half - 1)));
    EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));

    EXPECT_TRUE(HasError(device.ReducePeerMemory(sum.data(), {addresses[0]}, {0, 1}, count, DataType::kFloat32,
                                                 ReduceOp::kSum, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`addresses` must have one address per pe, but got 1 addresses for 2 pes"));
    EXPECT_TRUE(HasError(device.GetPeerMemory(theirs.data(), addresses[0], 4, 2, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`pe` must be in [0, 2), but got 2"));
    EXPECT_TRUE(HasError(device.ReducePeerMemory(sum.data(), addresses, {0, -1}, count, DataType::kFloat32,
                                                 ReduceOp::kSum, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`pe` must be in [0, 2), but got -1"));
    // A range the peer has not mapped fails, naming it; nothing else breaks.
    EXPECT_TRUE(HasError(device.GetPeerMemory(theirs.data(), 4096, 64, peer, kDefaultStream, nullptr),
                         StatusCode::kDeviceError, "cross-memory read failed: pid=" + std::to_string(getpid()) +
                                                       " address=0x1000 bytes=64 copied=0 errno=" + std::to_string(EFAULT)));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

// Built not to reach peers' memory, the device says so on every rank and refuses to read a peer's (its own is fine).
TEST(HostDeviceTest, ADeviceThroughTheHeapDoesNotReachPeersMemory) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device(PeerMemory::kThroughHeap);
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    EXPECT_FALSE(device.reaches_peer_memory());
    std::uint64_t word = 7;
    std::uint64_t copy = 0;
    EXPECT_TRUE(IsOk(device.GetPeerMemory(&copy, reinterpret_cast<std::uint64_t>(&word), sizeof(word), rank,
                                          kDefaultStream, nullptr)));
    EXPECT_EQ(copy, 7u);
    EXPECT_TRUE(HasError(device.GetPeerMemory(&copy, reinterpret_cast<std::uint64_t>(&word), sizeof(word), 1 - rank,
                                              kDefaultStream, nullptr),
                         StatusCode::kStateError, "host device does not reach peers' memory: op=GetPeerMemory pe=" +
                                                      std::to_string(1 - rank)));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

// A real second process: the child changes its copy of a buffer after fork (copy on write), the parent reads the
// child's copy at the same address. A partly unmapped range fails on the missing page, saying how much it copied.
TEST(ProcessMemoryTest, ReadsAnotherProcessAndNamesWhatItCouldNotRead) {
  const std::size_t page = PageSize();
  auto* pages = static_cast<unsigned char*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  std::memset(pages, 0x11, 2 * page);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::memset(pages, 0x22, page);
    munmap(pages + page, page);
    const char done = 1;
    (void)!write(ready[1], &done, 1);
    pause();
    _exit(0);
  }
  char done = 0;
  ASSERT_EQ(read(ready[0], &done, 1), 1);
  std::vector<unsigned char> copy(page, 0);
  const Status whole = ReadProcessMemory(child, copy.data(), reinterpret_cast<std::uint64_t>(pages), page);
  const Status partial = ReadProcessMemory(child, copy.data(), reinterpret_cast<std::uint64_t>(pages + page / 2), page);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  EXPECT_TRUE(IsOk(whole));
  EXPECT_EQ(copy[0], 0x22);          // the child's page, not this process's
  EXPECT_EQ(copy[page - 1], 0x22);
  EXPECT_EQ(pages[0], 0x11);
  EXPECT_TRUE(HasError(partial, StatusCode::kDeviceError,
                       "bytes=" + std::to_string(page) + " copied=" + std::to_string(page / 2) + " errno="));
  // The process is gone: the read says so.
  EXPECT_TRUE(HasError(ReadProcessMemory(child, copy.data(), reinterpret_cast<std::uint64_t>(pages), 8),
                       StatusCode::kDeviceError, "errno=" + std::to_string(ESRCH)));
  munmap(pages, 2 * page);
}

TEST(HostDeviceTest, SignalsWakeWaitersOnOtherRanks) {
  // Four ranks outnumber the cores of small CI machines: waiters sleep in the futex rather than spin.
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    Result<void*> signals = device.Allocate(64, 64);
    ASSERT_TRUE(signals.ok());
    std::memset(signals.value(), 0, 64);
    auto* counter = static_cast<std::int64_t*>(signals.value());
    auto* flag = static_cast<std::int32_t*>(At(signals.value(), 8));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    if (rank == 0) {
      // Every other rank adds its rank; then rank 0 releases them all with a set.
      EXPECT_TRUE(IsOk(device.WaitSignal(counter, SignalWidth::k64, CompareOp::kEq, 1 + 2 + 3, kDefaultStream)));
      for (int pe = 1; pe < 4; ++pe) {
        EXPECT_TRUE(IsOk(device.Signal(flag, SignalWidth::k32, -5, SignalOp::kSet, pe, kDefaultStream)));
      }
    } else {
      EXPECT_TRUE(IsOk(device.Signal(counter, SignalWidth::k64, rank, SignalOp::kAdd, 0, kDefaultStream)));
      EXPECT_TRUE(IsOk(device.WaitSignal(flag, SignalWidth::k32, CompareOp::kEq, -5, kDefaultStream)));
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_EQ(*counter, rank == 0 ? 6 : 0);
    EXPECT_EQ(*flag, rank == 0 ? 0 : -5);
    EXPECT_TRUE(IsOk(device.Free(signals.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, PutWithSignalWithinANodeShowsTheDataBeforeTheSignal) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    Result<void*> data = device.Allocate(4096, 64);
    Result<void*> signals = device.Allocate(64, 64);
    ASSERT_TRUE(data.ok() && signals.ok());
    std::memset(data.value(), 0, 4096);
    std::memset(signals.value(), 0, 64);
    auto* round = static_cast<std::int64_t*>(signals.value());
    auto* count = static_cast<std::int32_t*>(At(signals.value(), 8));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    constexpr int kRounds = 50;
    if (rank == 0) {
      // Each round's bytes differ, so that a signal seen before its data would find the last round's.
      Result<StreamHandle> stream = device.CreateStream();
      ASSERT_TRUE(stream.ok());
      std::vector<char> src(4096);
      for (int k = 1; k <= kRounds; ++k) {
        std::memset(src.data(), k, src.size());
        const StreamHandle on = k % 2 == 0 ? kDefaultStream : stream.value();
        EXPECT_TRUE(IsOk(device.PutWithSignal(data.value(), src.data(), src.size(), round, SignalWidth::k64, k,
                                              SignalOp::kSet, 1, on, nullptr)));
        EXPECT_TRUE(IsOk(device.SynchronizeStream(on)));
        // The peer read this round before the next one overwrites it.
        EXPECT_TRUE(IsOk(device.WaitSignal(count, SignalWidth::k32, CompareOp::kEq, k, kDefaultStream)));
      }
      EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));
    } else {
      for (int k = 1; k <= kRounds; ++k) {
        EXPECT_TRUE(IsOk(device.WaitSignal(round, SignalWidth::k64, CompareOp::kEq, k, kDefaultStream)));
        const auto* bytes = static_cast<const unsigned char*>(data.value());
        EXPECT_TRUE(bytes[0] == k && bytes[4095] == k) << "round " << k << ": " << int(bytes[0]);
        // Zero bytes: the signal alone (an add).
        EXPECT_TRUE(IsOk(device.PutWithSignal(data.value(), nullptr, 0, count, SignalWidth::k32, 1, SignalOp::kAdd,
                                              0, kDefaultStream, nullptr)));
      }
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_EQ(*count, rank == 0 ? kRounds : 0);
    EXPECT_TRUE(IsOk(device.Free(signals.value())));
    EXPECT_TRUE(IsOk(device.Free(data.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, BarrierTimeoutNamesEveryMissingRank) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap, kMiB, 0.25), bootstrap)));
    if (rank < 2) {
      const Status status = device.Barrier(kDefaultStream);
      EXPECT_EQ(status.code(), StatusCode::kTimeout);
      EXPECT_EQ(status.message(), "barrier timed out: epoch=1 expected_arrivals=4 observed_arrivals=2 "
                                  "missing_ranks=[2,3] timeout_sec=" + Decimal(0.25));
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    // The late ranks complete barrier 1 between themselves; then all four are in step.
    if (rank >= 2) {
      EXPECT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    }
    EXPECT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, RetriedBarrierTimeoutsCountArrivalsWithoutWrapping) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap, kMiB, 0.05), bootstrap)));
    if (rank == 0) {
      // Rank 1 never comes: each retry runs one epoch further ahead of the arrivals counted.
      for (int attempt = 1; attempt <= 3; ++attempt) {
        const Status status = device.Barrier(kDefaultStream);
        EXPECT_EQ(status.code(), StatusCode::kTimeout);
        EXPECT_EQ(status.message(), "barrier timed out: epoch=" + std::to_string(attempt) +
                                        " expected_arrivals=2 observed_arrivals=" + (attempt == 1 ? "1" : "0") +
                                        " missing_ranks=[1] timeout_sec=" + Decimal(0.05));
      }
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    if (rank == 1) {
      // Rank 1 catches up with rank 0's three arrivals.
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    }
    EXPECT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostDeviceTest, StreamsOrderWorkAndReportErrors) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap, kMiB, 0.1), bootstrap)));
    Result<void*> buffer = device.Allocate(4096, 64);
    ASSERT_TRUE(buffer.ok());
    std::memset(buffer.value(), 0, 4096);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));

    Result<StreamHandle> stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    auto data = std::make_shared<std::vector<unsigned char>>(2048, static_cast<unsigned char>(rank + 1));
    // put to the peer, then a barrier, all on the stream.
    ASSERT_TRUE(IsOk(device.Put(At(buffer.value(), 2048 * static_cast<std::size_t>(rank)), data->data(), 2048,
                                1 - rank, stream.value(), data)));
    ASSERT_TRUE(IsOk(device.Barrier(stream.value())));
    data.reset();
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    const auto* peer_block = static_cast<const unsigned char*>(At(buffer.value(), 2048 * static_cast<std::size_t>(1 - rank)));
    EXPECT_EQ(peer_block[0], 2 - rank);
    EXPECT_EQ(peer_block[2047], 2 - rank);

    // A failing wait on the stream: Quiesce reports it and leaves it for SynchronizeStream; later work was
    // skipped.
    Result<void*> signals = device.Allocate(64, 64);
    ASSERT_TRUE(signals.ok());
    std::memset(signals.value(), 0, 64);
    ASSERT_TRUE(IsOk(device.WaitSignal(signals.value(), SignalWidth::k32, CompareOp::kEq, 1, stream.value())));
    ASSERT_TRUE(IsOk(device.Signal(At(signals.value(), 8), SignalWidth::k32, 9, SignalOp::kSet, rank,
                                   stream.value())));
    EXPECT_TRUE(HasError(device.Quiesce(), StatusCode::kTimeout,
                         "signal wait timed out: signal=" + Hex(reinterpret_cast<std::uintptr_t>(signals.value()))));
    EXPECT_EQ(*static_cast<const std::int32_t*>(At(signals.value(), 8)), 0);
    EXPECT_TRUE(HasError(device.Quiesce(), StatusCode::kTimeout, "signal wait timed out"));   // still pending
    EXPECT_TRUE(HasError(device.SynchronizeStream(stream.value()), StatusCode::kTimeout, "signal wait timed out"));
    EXPECT_TRUE(IsOk(device.Quiesce()));
    ASSERT_TRUE(IsOk(device.Signal(At(signals.value(), 8), SignalWidth::k32, 9, SignalOp::kSet, rank,
                                   stream.value())));
    EXPECT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_EQ(*static_cast<const std::int32_t*>(At(signals.value(), 8)), 9);

    // Unknown handles.
    const StreamHandle bogus = 0x1234;
    const std::string unknown = "`stream` must be a live stream of the host device, but got handle 0x1234";
    EXPECT_TRUE(HasError(device.SynchronizeStream(bogus), StatusCode::kInvalidArgument, unknown));
    EXPECT_TRUE(HasError(device.DestroyStream(bogus), StatusCode::kInvalidArgument, unknown));
    EXPECT_TRUE(HasError(device.StreamWaitStream(stream.value(), bogus), StatusCode::kInvalidArgument, unknown));
    EXPECT_TRUE(HasError(device.StreamWaitStream(bogus, stream.value()), StatusCode::kInvalidArgument, unknown));
    EXPECT_TRUE(HasError(device.Put(buffer.value(), buffer.value(), 8, rank, bogus, nullptr),
                         StatusCode::kInvalidArgument, unknown));
    EXPECT_TRUE(IsOk(device.SynchronizeStream(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.StreamWaitStream(stream.value(), kDefaultStream)));
    EXPECT_TRUE(IsOk(device.StreamWaitStream(stream.value(), stream.value())));
    EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));
    EXPECT_TRUE(HasError(device.DestroyStream(stream.value()), StatusCode::kInvalidArgument, "`stream` must be"));

    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Free(signals.value())));
    EXPECT_TRUE(IsOk(device.Free(buffer.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

// A failure nobody synchronized is logged; it does not make Finalize (and so the runtime's shutdown) fail.
TEST(HostDeviceTest, FinalizeSucceedsDespiteAFailedStreamOperation) {
  ThreadGroup group(1);
  ThreadBootstrap bootstrap(group, 0);
  HostDevice device;
  ASSERT_TRUE(IsOk(device.Init(Args(bootstrap, kMiB, 0.02), bootstrap)));
  Result<void*> signal = device.Allocate(8, 64);
  ASSERT_TRUE(signal.ok());
  Result<StreamHandle> stream = device.CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(IsOk(device.WaitSignal(signal.value(), SignalWidth::k64, CompareOp::kEq, 1, stream.value())));
  EXPECT_TRUE(HasError(device.Quiesce(), StatusCode::kTimeout,
                       "cmp=eq expected=1 observed=0 timeout_sec=" + Decimal(0.02)));
  EXPECT_TRUE(IsOk(device.Finalize()));
  EXPECT_EQ(device.heap_base(), 0u);
}


// Like cudaStreamDestroy: destroying a stream returns at once, its queued work still runs, and Quiesce waits
// for it.
TEST(HostDeviceTest, DestroyedStreamStillRunsItsQueuedWork) {
  ThreadGroup group(1);
  ThreadBootstrap bootstrap(group, 0);
  HostDevice device;
  ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
  Result<void*> signals = device.Allocate(128, 64);
  ASSERT_TRUE(signals.ok());
  std::memset(signals.value(), 0, 128);
  void* gate = signals.value();
  void* done = At(signals.value(), 64);
  Result<StreamHandle> stream = device.CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(IsOk(device.WaitSignal(gate, SignalWidth::k32, CompareOp::kEq, 1, stream.value())));
  ASSERT_TRUE(IsOk(device.Signal(done, SignalWidth::k32, 7, SignalOp::kSet, 0, stream.value())));

  EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));   // returns while the stream waits on the gate
  EXPECT_EQ(*static_cast<const std::int32_t*>(done), 0);
  EXPECT_TRUE(HasError(device.SynchronizeStream(stream.value()), StatusCode::kInvalidArgument, "`stream` must be"));

  ASSERT_TRUE(IsOk(device.Signal(gate, SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream)));
  EXPECT_TRUE(IsOk(device.Quiesce()));   // waits for the destroyed stream too
  EXPECT_EQ(*static_cast<const std::int32_t*>(done), 7);
  EXPECT_TRUE(IsOk(device.Free(signals.value())));
  EXPECT_TRUE(IsOk(device.Finalize()));
}

}  // namespace
}  // namespace hp::shmem::host
