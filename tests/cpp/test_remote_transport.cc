// The host device's transport to other nodes (remote_transport.h): with UCX, two thread-ranks that the arguments
// put on two nodes reach each other's heaps over TCP on loopback; without it, no transport opens and the reason
// names the remedy. Then the host device itself on two simulated nodes: one thread-rank in a mount namespace of its
// own with a private /dev/shm, so that the ranks cannot open each other's shared memory.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/host/host_device.h"
#include "runtime/host/remote_transport.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem::host {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

// Moves the calling thread into a mount namespace of its own with an empty private /dev/shm: another node, as the
// host device sees it. "" on success, else why not (namespaces need CAP_SYS_ADMIN).
std::string BecomeAnotherNode() {
  if (unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m") != 0) {
    return std::string("mounting a private /dev/shm: ") + std::strerror(errno);
  }
  return "";
}

// Runs `body` on 2 thread-ranks of two simulated nodes (rank 1 in its own mount namespace), each with an
// initialised host device; skips the test where namespaces are refused.
template <typename Body>
void OnTwoNodes(Body&& body) {
  std::mutex mu;
  std::string refused;
  RunRanks(2, [&](int rank, Bootstrap& bootstrap) {
    const std::string mine = rank == 1 ? BecomeAnotherNode() : "";
    std::vector<char> verdicts(2);
    const char ok = mine.empty() ? 1 : 0;
    ASSERT_TRUE(IsOk(bootstrap.AllGather(&ok, 1, verdicts.data())));
    if (!mine.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      refused = mine;
    }
    if (verdicts[0] == 0 || verdicts[1] == 0) return;
    HostDevice device;
    DeviceInitArgs args;
    args.rank = rank;
    args.world_size = 2;
    args.heap_size = 1 << 20;
    args.timeout_sec = 10.0;
    ASSERT_TRUE(IsOk(device.Init(args, bootstrap)));
    EXPECT_EQ(device.nodes(), (std::vector<int>{0, 1}));
    body(rank, bootstrap, device);
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));   // the runtime's shutdown passes the bootstrap's barrier first too
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
  if (!refused.empty()) GTEST_SKIP() << "simulated nodes need a mount namespace: " << refused;
}

// One exchange with `pe` through the batched ExchangeMessages of a transport or a device: its refusal, else the
// exchange's own outcome.
template <typename Exchanger>
Status ExchangeOne(Exchanger& exchanger, int pe, std::uint64_t tag, const void* send, std::size_t send_bytes,
                   void* receive, std::size_t receive_capacity, std::size_t* received) {
  MessageExchange exchange;
  exchange.pe = pe;
  exchange.send = send;
  exchange.send_bytes = send_bytes;
  exchange.receive = receive;
  exchange.receive_capacity = receive_capacity;
  HP_RETURN_IF_ERROR(exchanger.ExchangeMessages(tag, &exchange, 1));
  if (received != nullptr) *received = exchange.received;
  return exchange.status;
}

#ifdef HP_WITH_UCX

constexpr std::size_t kHeapBytes = 4096;

// UCX over TCP on loopback, unless the environment chose otherwise (UCX's own variables).
void UseLoopbackTcp() {
  setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0);
}

constexpr std::chrono::milliseconds kTimeout{10000};

// Rank `rank` of `ranks`, each on a node of its own.
RemoteTransportArgs OwnNodes(int rank, int ranks, std::vector<char>& heap, std::atomic<int>* remote_writes,
                             std::chrono::milliseconds timeout) {
  RemoteTransportArgs args;
  args.rank = rank;
  args.world_size = ranks;
  for (int pe = 0; pe < ranks; ++pe) args.nodes.push_back(pe);
  args.heap = heap.data();
  args.heap_bytes = heap.size();
  args.timeout = timeout;
  args.on_remote_write = [remote_writes] { remote_writes->fetch_add(1); };
  return args;
}

std::unique_ptr<RemoteTransport> OpenAndConnect(const RemoteTransportArgs& args, Bootstrap& bootstrap) {
  std::string absence;
  auto opened = OpenRemoteTransport(args, &absence);
  EXPECT_TRUE(opened.ok());
  EXPECT_EQ(absence, "");
  if (!opened.ok() || opened.value() == nullptr) return nullptr;
  std::unique_ptr<RemoteTransport> transport = std::move(opened).value();
  EXPECT_TRUE(IsOk(transport->Connect(bootstrap)));
  return transport;
}

// Runs `body(rank, bootstrap, transport, heap, remote_writes)` on `ranks` thread-ranks, each on a node of its own
// with its transport connected over TCP on loopback.
template <typename Body>
void OnTransports(int ranks, std::chrono::milliseconds timeout, Body&& body) {
  UseLoopbackTcp();
  RunRanks(ranks, [&](int rank, Bootstrap& bootstrap) {
    std::vector<char> heap(kHeapBytes, 0);
    std::atomic<int> remote_writes{0};
    auto transport = OpenAndConnect(OwnNodes(rank, ranks, heap, &remote_writes, timeout), bootstrap);
    ASSERT_NE(transport, nullptr);
    body(rank, bootstrap, *transport, heap, remote_writes);
  });
}

template <typename Body>
void OnTwoTransports(std::chrono::milliseconds timeout, Body&& body) {
  OnTransports(2, timeout, std::forward<Body>(body));
}

TEST(RemoteTransportTest, PutGetAndBothSignalOpsReachTheOtherNodesHeap) {
  OnTwoTransports(kTimeout, [](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>& heap,
                               std::atomic<int>& remote_writes) {
    const int peer = 1 - rank;
    EXPECT_EQ(transport.name(), "ucx");
    EXPECT_TRUE(transport.reaches(peer));
    EXPECT_FALSE(transport.reaches(rank));   // its own node: mapped memory, not the transport
    for (std::size_t i = 0; i < 256; ++i) heap[1024 + i] = static_cast<char>(rank * 100 + i % 7);
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));

    // Rank 0 writes into rank 1's heap; rank 1 reads rank 0's; each completes before it returns.
    std::vector<char> bytes(300);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 3 + 1);
    std::vector<char> got(256, 0);
    if (rank == 0) {
      EXPECT_TRUE(IsOk(transport.Put(peer, 2000, bytes.data(), bytes.size())));
      EXPECT_TRUE(IsOk(transport.Put(peer, 100, bytes.data(), 0)));   // nothing to move
      EXPECT_TRUE(IsOk(transport.Signal(peer, 0, SignalWidth::k64, 7, SignalOp::kSet)));
      EXPECT_TRUE(IsOk(transport.Signal(peer, 0, SignalWidth::k64, -12, SignalOp::kAdd)));
      EXPECT_TRUE(IsOk(transport.Signal(peer, 8, SignalWidth::k32, -3, SignalOp::kSet)));
      EXPECT_TRUE(IsOk(transport.Signal(peer, 8, SignalWidth::k32, 10, SignalOp::kAdd)));
    } else {
      EXPECT_TRUE(IsOk(transport.Get(peer, 1024, got.data(), got.size())));
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], static_cast<char>(i % 7)) << i;
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    if (rank == 1) {
      EXPECT_EQ(std::memcmp(heap.data() + 2000, bytes.data(), bytes.size()), 0);
      std::int64_t wide = 0;
      std::int32_t narrow = 0;
      std::memcpy(&wide, heap.data(), sizeof(wide));
      std::memcpy(&narrow, heap.data() + 8, sizeof(narrow));
      EXPECT_EQ(wide, 7 - 12);
      EXPECT_EQ(narrow, -3 + 10);
      EXPECT_EQ(heap[12], 0);   // the 32-bit signal's neighbour is untouched
      EXPECT_GT(remote_writes.load(), 0);   // the progress thread told the device to wake its waiters
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

// What the peer's progress thread wrote into `heap` at `offset`, read as the waiter reads a signal.
std::int64_t LoadSignal(const std::vector<char>& heap, std::size_t offset) {
  return __atomic_load_n(reinterpret_cast<const std::int64_t*>(heap.data() + offset), __ATOMIC_ACQUIRE);
}

TEST(RemoteTransportTest, PutWithSignalShowsTheDataOnThePeerBeforeTheSignal) {
  OnTwoTransports(kTimeout, [](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>& heap,
                               std::atomic<int>&) {
    const int peer = 1 - rank;
    constexpr int kRounds = 40;
    constexpr std::size_t kData = 1024;   // [1024, 4096): the data; 0: the round (set); 8: a 32-bit count (add)
    if (rank == 0) {
      std::vector<char> src(kHeapBytes - kData);
      for (int k = 1; k <= kRounds; ++k) {
        // Each round's bytes differ, so that a signal seen before its data would find the last round's.
        std::memset(src.data(), k, src.size());
        EXPECT_TRUE(IsOk(transport.PutWithSignal(peer, kData, src.data(), src.size(), 0, SignalWidth::k64, k,
                                                 SignalOp::kSet)));
        // Complete on return: the peer's copy holds both already.
        ASSERT_TRUE(IsOk(bootstrap.Barrier()));
        ASSERT_TRUE(IsOk(bootstrap.Barrier()));   // the peer checked this round
      }
      // Zero bytes send the signal alone; a 32-bit add.
      EXPECT_TRUE(IsOk(transport.PutWithSignal(peer, kData, src.data(), 0, 8, SignalWidth::k32, 5, SignalOp::kAdd)));
      EXPECT_TRUE(IsOk(transport.PutWithSignal(peer, kData, src.data(), 16, 8, SignalWidth::k32, -2,
                                               SignalOp::kAdd)));
    } else {
      for (int k = 1; k <= kRounds; ++k) {
        // Watches the signal while the put is in flight: whenever it shows this round, so must the data.
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (LoadSignal(heap, 0) != k && std::chrono::steady_clock::now() < deadline) sched_yield();
        ASSERT_EQ(LoadSignal(heap, 0), k);
        const auto* bytes = reinterpret_cast<const unsigned char*>(heap.data());
        EXPECT_TRUE(bytes[kData] == k && bytes[kHeapBytes - 1] == k) << "round " << k << ": " << int(bytes[kData]);
        ASSERT_TRUE(IsOk(bootstrap.Barrier()));
        ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      }
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    if (rank == 1) {
      std::int32_t count = 0;
      std::memcpy(&count, heap.data() + 8, sizeof(count));
      EXPECT_EQ(count, 5 - 2);
      EXPECT_EQ(static_cast<unsigned char>(heap[kData + 15]), kRounds);   // the last call's 16 bytes
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

TEST(RemoteTransportTest, RangesOutsideThePeersHeapAreRefusedBeforeAnythingIsSent) {
  OnTwoTransports(kTimeout, [](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>& heap,
                               std::atomic<int>&) {
    const int peer = 1 - rank;
    const char src[16] = {1, 2, 3};
    char dst[16] = {};
    EXPECT_TRUE(HasError(transport.Put(peer, kHeapBytes - 8, src, 16), StatusCode::kInvalidArgument,
                         "`heap_offset` + `bytes` must lie inside pe " + std::to_string(peer) +
                             "'s heap of 4096 bytes, but got offset 4088 + 16 bytes (op=put)"));
    EXPECT_TRUE(HasError(transport.Get(peer, kHeapBytes + 8, dst, 0), StatusCode::kInvalidArgument,
                         "but got offset 4104 + 0 bytes (op=get)"));
    EXPECT_TRUE(HasError(transport.Signal(peer, kHeapBytes - 4, SignalWidth::k64, 1, SignalOp::kAdd),
                         StatusCode::kInvalidArgument, "but got offset 4092 + 8 bytes (op=signal)"));
    // put_with_signal: either half outside the heap refuses the whole, its data included.
    EXPECT_TRUE(HasError(transport.PutWithSignal(peer, kHeapBytes - 8, src, 16, 0, SignalWidth::k64, 1,
                                                 SignalOp::kSet),
                         StatusCode::kInvalidArgument, "but got offset 4088 + 16 bytes (op=put_with_signal)"));
    EXPECT_TRUE(HasError(transport.PutWithSignal(peer, 0, src, 16, kHeapBytes - 2, SignalWidth::k32, 1,
                                                 SignalOp::kAdd),
                         StatusCode::kInvalidArgument, "but got offset 4094 + 4 bytes (op=put_with_signal)"));
    EXPECT_TRUE(HasError(transport.PutWithSignal(rank, 0, src, 16, 0, SignalWidth::k64, 1, SignalOp::kSet),
                         StatusCode::kStateError, "UCX has no endpoint to this pe: op=put_with_signal pe="));
    EXPECT_TRUE(HasError(transport.Put(rank, 0, src, 16), StatusCode::kStateError,
                         "UCX has no endpoint to this pe: op=put pe=" + std::to_string(rank)));
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    // Nothing of the refused calls arrived.
    EXPECT_EQ(std::vector<char>(heap.begin(), heap.end()), std::vector<char>(kHeapBytes, 0));
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

// `bytes` bytes that tell the message apart: its `seed`, then a pattern of the seed.
std::vector<char> Message(std::size_t bytes, int seed) {
  std::vector<char> message(bytes);
  for (std::size_t i = 0; i < bytes; ++i) message[i] = static_cast<char>(seed * 31 + i * 7);
  return message;
}

TEST(RemoteTransportTest, ExchangeMessagesCarriesEachTagsMessagesInOrderBothWays) {
  OnTwoTransports(kTimeout, [](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>&,
                               std::atomic<int>&) {
    const int peer = 1 - rank;
    // Both ways at once, empty, small (UCX's eager protocol) then 1 MiB (its rendezvous), each rank calling in the
    // same order: no rank waits for the other's order. (An empty message still needs a pointer: null is none.)
    for (const std::size_t bytes : {std::size_t{0}, std::size_t{100}, std::size_t{1} << 20}) {
      std::vector<char> mine = Message(bytes + 1, rank);
      mine.pop_back();
      std::vector<char> theirs(bytes + 64, 0);
      std::size_t received = 12345;
      ASSERT_TRUE(IsOk(ExchangeOne(transport, peer, 5, mine.data(), bytes, theirs.data(), theirs.size(),
                                                  &received)));
      EXPECT_EQ(received, bytes);
      theirs.resize(bytes);
      std::vector<char> expected = Message(bytes + 1, peer);
      expected.pop_back();
      EXPECT_EQ(theirs, expected) << bytes;
    }
    // One way only, under two tags: rank 0 sends under 7 then 8 (twice); rank 1 takes tag 8's first. Each tag keeps
    // its own order, whatever the other does.
    if (rank == 0) {
      for (const int seed : {70, 80, 81}) {
        const std::vector<char> message = Message(16, seed);
        ASSERT_TRUE(IsOk(ExchangeOne(transport, peer, seed / 10, message.data(), 16, nullptr, 0, nullptr)));
      }
    } else {
      for (const int seed : {80, 81, 70}) {
        std::vector<char> got(16, 0);
        std::size_t received = 0;
        ASSERT_TRUE(IsOk(ExchangeOne(transport, peer, seed / 10, nullptr, 0, got.data(), 16, &received)));
        EXPECT_EQ(received, 16u);
        EXPECT_EQ(got, Message(16, seed)) << seed;
      }
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    // Bad requests fail before anything is sent: a tag too wide, this rank's own node.
    const char byte = 1;
    EXPECT_TRUE(HasError(ExchangeOne(transport, peer, std::uint64_t{1} << 40, &byte, 1, nullptr, 0, nullptr),
                         StatusCode::kInvalidArgument, "`tag` must be below 2^40, but got 1099511627776"));
    EXPECT_TRUE(HasError(ExchangeOne(transport, rank, 5, &byte, 1, nullptr, 0, nullptr), StatusCode::kStateError,
                         "UCX has no endpoint to this pe: op=exchange_messages pe=" + std::to_string(rank)));
    // A message longer than the receive's room fails the receive, naming the sender.
    std::vector<char> small(8);
    const std::vector<char> longer = Message(32, rank);
    const Status truncated = ExchangeOne(transport, peer, 9, longer.data(), longer.size(), small.data(),
                                                        small.size(), nullptr);
    EXPECT_EQ(truncated.code(), StatusCode::kDeviceError) << truncated.ToString();
    EXPECT_NE(truncated.message().find("remote exchange_messages (receive) failed: pe=" + std::to_string(peer)),
              std::string::npos) << truncated.ToString();
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

TEST(RemoteTransportTest, AMessageThatNeverComesTimesOutNamingThePeer) {
  const auto timeout = std::chrono::milliseconds(500);
  OnTwoTransports(timeout, [timeout](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>&,
                                     std::atomic<int>&) {
    if (rank == 0) {
      std::vector<char> room(64);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_TRUE(HasError(ExchangeOne(transport, 1, 3, nullptr, 0, room.data(), room.size(), nullptr),
                           StatusCode::kTimeout,
                           "remote exchange_messages (receive) timed out: pe=1 transport=ucx timeout_sec=0.5"));
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_GE(took, timeout);
      EXPECT_LT(took, timeout + std::chrono::seconds(2));
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

// The bytes that `sender` sends `receiver` in the batched tests: empty, eager or rendezvous, by the pair.
std::vector<char> PairMessage(int sender, int receiver) {
  static constexpr std::size_t kSizes[] = {0, 100, (std::size_t{1} << 20) + 3};
  return Message(kSizes[(sender + receiver) % 3] + static_cast<std::size_t>(sender), sender * 8 + receiver);
}

TEST(RemoteTransportTest, ExchangeMessagesWithManyPesPostsThemAllAtOnce) {
  constexpr int kRanks = 4;
  OnTransports(kRanks, kTimeout, [](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>&,
                                    std::atomic<int>&) {
    // Each rank lists its peers from the next rank on: rank 0 waits first for 1, 1 for 2, ..., 3 for 0. Taken one
    // after the other, that is a cycle of waits; posted at once, every exchange completes.
    std::vector<std::vector<char>> sends;
    std::vector<std::vector<char>> rooms;
    std::vector<MessageExchange> exchanges;
    static constexpr char kEmpty = 0;
    for (int step = 1; step < kRanks; ++step) {
      const int peer = (rank + step) % kRanks;
      sends.push_back(PairMessage(rank, peer));
      rooms.emplace_back(PairMessage(peer, rank).size() + 64, 0);
    }
    for (int step = 1; step < kRanks; ++step) {
      MessageExchange& exchange = exchanges.emplace_back();
      exchange.pe = (rank + step) % kRanks;
      exchange.send = sends[step - 1].empty() ? &kEmpty : sends[step - 1].data();   // null would send nothing
      exchange.send_bytes = sends[step - 1].size();
      exchange.receive = rooms[step - 1].data();
      exchange.receive_capacity = rooms[step - 1].size();
    }
    ASSERT_TRUE(IsOk(transport.ExchangeMessages(21, exchanges.data(), exchanges.size())));
    for (int step = 1; step < kRanks; ++step) {
      const MessageExchange& exchange = exchanges[step - 1];
      const std::vector<char> expected = PairMessage(exchange.pe, rank);
      EXPECT_TRUE(IsOk(exchange.status)) << exchange.status.ToString();
      ASSERT_EQ(exchange.received, expected.size()) << "from pe " << exchange.pe;
      EXPECT_EQ(std::vector<char>(rooms[step - 1].begin(), rooms[step - 1].begin() + expected.size()), expected)
          << "from pe " << exchange.pe;
    }
    // A batch with one bad entry is refused whole: the good entry's message is not sent (the next one under the tag
    // is the one that arrives).
    const char stale = 1;
    const char fresh = 2;
    MessageExchange refused[2];
    refused[0].pe = rank ^ 1;
    refused[0].send = &stale;
    refused[0].send_bytes = 1;
    refused[1].pe = rank;
    refused[1].send = &stale;
    refused[1].send_bytes = 1;
    EXPECT_TRUE(HasError(transport.ExchangeMessages(22, refused, 2), StatusCode::kStateError,
                         "UCX has no endpoint to this pe: op=exchange_messages pe=" + std::to_string(rank)));
    char got = 0;
    std::size_t received = 0;
    EXPECT_TRUE(IsOk(ExchangeOne(transport, rank ^ 1, 22, &fresh, 1, &got, 1, &received)));
    EXPECT_EQ(got, fresh);
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

TEST(RemoteTransportTest, ABatchNamesThePeThatNeverAnsweredAndCompletesTheOthers) {
  const auto timeout = std::chrono::milliseconds(500);
  OnTransports(3, timeout, [timeout](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>&,
                                     std::atomic<int>&) {
    const char mine = static_cast<char>(10 + rank);
    if (rank == 0) {
      char rooms[2] = {0, 0};
      MessageExchange exchanges[2];
      for (int i = 0; i < 2; ++i) {
        exchanges[i].pe = i + 1;
        exchanges[i].send = &mine;
        exchanges[i].send_bytes = 1;
        exchanges[i].receive = &rooms[i];
        exchanges[i].receive_capacity = 1;
      }
      const auto start = std::chrono::steady_clock::now();
      ASSERT_TRUE(IsOk(transport.ExchangeMessages(4, exchanges, 2)));
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_TRUE(IsOk(exchanges[0].status)) << exchanges[0].status.ToString();
      EXPECT_EQ(rooms[0], 11);
      EXPECT_TRUE(HasError(exchanges[1].status, StatusCode::kTimeout,
                           "remote exchange_messages (receive) timed out: pe=2 transport=ucx timeout_sec=0.5"));
      EXPECT_GE(took, timeout);
      EXPECT_LT(took, timeout + std::chrono::seconds(2));   // one timeout for the whole batch
    } else if (rank == 1) {
      char room = 0;
      EXPECT_TRUE(IsOk(ExchangeOne(transport, 0, 4, &mine, 1, &room, 1, nullptr)));
      EXPECT_EQ(room, 10);
    }
    // Rank 2 never answers; it takes rank 0's message afterwards, so that nothing is left in flight.
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    if (rank == 2) {
      char room = 0;
      EXPECT_TRUE(IsOk(ExchangeOne(transport, 0, 4, nullptr, 0, &room, 1, nullptr)));
      EXPECT_EQ(room, 10);
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(transport.Close()));
  });
}

TEST(RemoteTransportTest, APeerThatClosedFailsTheNextCallInTimeNamingIt) {
  const auto timeout = std::chrono::milliseconds(3000);
  OnTwoTransports(timeout, [timeout](int rank, Bootstrap& bootstrap, RemoteTransport& transport, std::vector<char>&,
                                     std::atomic<int>&) {
    if (rank == 1) {
      EXPECT_TRUE(IsOk(transport.Close()));
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    if (rank == 0) {
      const char src[8] = {};
      const auto start = std::chrono::steady_clock::now();
      const Status put = transport.Put(1, 0, src, sizeof(src));
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_FALSE(put.ok());
      EXPECT_NE(put.message().find("pe=1"), std::string::npos) << put.ToString();
      EXPECT_LT(took, timeout + std::chrono::seconds(2)) << put.ToString();
      // The closed connection marks the peer lost (at once, or within the put above): later calls fail at once.
      const auto lost_by = std::chrono::steady_clock::now() + timeout;
      const std::shared_ptr<const PeerLosses> losses = transport.losses();
      while (losses->count() == 0 && std::chrono::steady_clock::now() < lost_by) sched_yield();
      EXPECT_EQ(losses->pes(), std::vector<int>{1});
      const auto again = std::chrono::steady_clock::now();
      EXPECT_TRUE(HasError(transport.Signal(1, 0, SignalWidth::k64, 1, SignalOp::kAdd), StatusCode::kDeviceError,
                           "pe of another node is gone (its process exited or its node died): op=signal pe=1 "
                           "pe_node=1 transport=ucx"));
      EXPECT_TRUE(HasError(transport.PutWithSignal(1, 0, src, sizeof(src), 8, SignalWidth::k64, 1, SignalOp::kSet),
                           StatusCode::kDeviceError,
                           "pe of another node is gone (its process exited or its node died): op=put_with_signal "
                           "pe=1 pe_node=1 transport=ucx"));
      std::vector<char> room(8);
      EXPECT_TRUE(HasError(ExchangeOne(transport, 1, 3, src, sizeof(src), room.data(), room.size(), nullptr),
                           StatusCode::kDeviceError,
                           "pe of another node is gone (its process exited or its node died): op=exchange_messages "
                           "pe=1 pe_node=1 transport=ucx"));
      EXPECT_LT(std::chrono::steady_clock::now() - again, std::chrono::milliseconds(100));
      EXPECT_TRUE(IsOk(transport.Close()));
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
  });
}

TEST(RemoteTransportTest, TheHostDeviceReachesAnotherNodeInStreamOrderAndWakesItsWaiters) {
  UseLoopbackTcp();
  OnTwoNodes([](int rank, Bootstrap& bootstrap, HostDevice& device) {
    const int peer = 1 - rank;
    EXPECT_TRUE(device.reaches_remotely(peer));
    EXPECT_TRUE(device.signals_remotely(SignalOp::kAdd));
    EXPECT_EQ(device.remote_transport(), "ucx");
    EXPECT_EQ(device.remote_absence(), "");
    Result<void*> data = device.Allocate(4096, 64);
    Result<void*> signals = device.Allocate(64, 64);
    ASSERT_TRUE(data.ok() && signals.ok());
    std::memset(data.value(), 0, 4096);
    std::memset(signals.value(), 0, 64);
    auto* flag = static_cast<std::int64_t*>(signals.value());
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    std::vector<char> src(4096);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
    if (rank == 0) {
      // On a host stream: the put, then the add that announces it, in stream order.
      Result<StreamHandle> stream = device.CreateStream();
      ASSERT_TRUE(stream.ok());
      EXPECT_TRUE(IsOk(device.Put(data.value(), src.data(), src.size(), peer, stream.value(), nullptr)));
      EXPECT_TRUE(IsOk(device.Signal(flag, SignalWidth::k64, 2, SignalOp::kAdd, peer, stream.value())));
      EXPECT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
      EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));
      // Then the default stream: put_with_signal (one operation), then a set the peer waits for after reading
      // this rank's heap.
      EXPECT_TRUE(IsOk(device.PutWithSignal(static_cast<char*>(data.value()) + 64, src.data() + 64, 64, flag + 2,
                                            SignalWidth::k64, 9, SignalOp::kSet, peer, kDefaultStream, nullptr)));
      EXPECT_TRUE(IsOk(device.Signal(flag + 1, SignalWidth::k64, 40, SignalOp::kSet, peer, kDefaultStream)));
    } else {
      // Woken by the peer's remote atomics: asleep in the futex long before they come.
      EXPECT_TRUE(IsOk(device.WaitSignal(flag, SignalWidth::k64, CompareOp::kEq, 2, kDefaultStream)));
      EXPECT_EQ(std::memcmp(data.value(), src.data(), src.size()), 0);
      EXPECT_TRUE(IsOk(device.WaitSignal(flag + 2, SignalWidth::k64, CompareOp::kEq, 9, kDefaultStream)));
      EXPECT_EQ(std::memcmp(static_cast<char*>(data.value()) + 64, src.data() + 64, 64), 0);
      EXPECT_TRUE(IsOk(device.WaitSignal(flag + 1, SignalWidth::k64, CompareOp::kGe, 40, kDefaultStream)));
      std::vector<char> got(4096, 1);
      EXPECT_TRUE(IsOk(device.Get(got.data(), data.value(), got.size(), peer, kDefaultStream, nullptr)));
      EXPECT_EQ(got, std::vector<char>(4096, 0));   // rank 0's own copy: nobody wrote it
    }
    // The lane exchange's messages, both ways; this rank itself is no PE of another node.
    const std::vector<char> mine = Message(300, rank);
    std::vector<char> theirs(300);
    std::size_t received = 0;
    EXPECT_TRUE(IsOk(ExchangeOne(device, peer, 11, mine.data(), mine.size(), theirs.data(), theirs.size(),
                                             &received)));
    EXPECT_EQ(received, 300u);
    EXPECT_EQ(theirs, Message(300, peer));
    EXPECT_TRUE(HasError(ExchangeOne(device, rank, 11, mine.data(), 1, nullptr, 0, nullptr),
                         StatusCode::kStateError,
                         "`pe` must lie on another node and be reached by a remote transport, but got pe=" +
                             std::to_string(rank) + " (op=exchange_messages transport=node)"));
    EXPECT_TRUE(IsOk(device.Free(signals.value())));
    EXPECT_TRUE(IsOk(device.Free(data.value())));
  });
}

TEST(RemoteTransportTest, AWaitThatAPeerOfAnotherNodeCouldEndFailsAtOnceWhenThatPeerIsGone) {
  UseLoopbackTcp();
  OnTwoNodes([](int rank, Bootstrap& bootstrap, HostDevice& device) {
    Result<void*> signals = device.Allocate(64, 64);
    ASSERT_TRUE(signals.ok());
    std::memset(signals.value(), 0, 64);
    auto* flag = static_cast<std::int64_t*>(signals.value());
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    using Clock = std::chrono::steady_clock;
    if (rank == 1) {
      // Gone while rank 0 sleeps in its wait: its transport closes every connection, as its kernel does for a
      // process that exits or is killed.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_TRUE(IsOk(device.Finalize()));
      return;
    }
    const auto start = Clock::now();
    const Status waited = device.WaitSignal(flag, SignalWidth::k64, CompareOp::kEq, 1, kDefaultStream);
    const auto took = Clock::now() - start;
    EXPECT_TRUE(HasError(waited, StatusCode::kDeviceError,
                         "signal wait failed: pes of another node are gone (their process exited or their node died): "
                         "lost_pes=[1] lost_nodes=[1] rank=0 "));
    EXPECT_NE(waited.message().find(" cmp=eq expected=1 observed=0"), std::string::npos) << waited.ToString();
    EXPECT_LT(took, std::chrono::seconds(3)) << waited.ToString();   // the timeout is 10 s
    // The next operation to it and the next wait fail at once, naming it; a satisfied wait still succeeds.
    const auto again = Clock::now();
    const std::int64_t one = 1;
    EXPECT_TRUE(HasError(device.Put(flag, &one, sizeof(one), 1, kDefaultStream, nullptr), StatusCode::kDeviceError,
                         "pe of another node is gone (its process exited or its node died): op=put pe=1 pe_node=1"));
    EXPECT_TRUE(HasError(device.WaitSignal(flag, SignalWidth::k64, CompareOp::kEq, 1, kDefaultStream),
                         StatusCode::kDeviceError, "lost_pes=[1] lost_nodes=[1]"));
    EXPECT_TRUE(IsOk(device.WaitSignal(flag, SignalWidth::k64, CompareOp::kEq, 0, kDefaultStream)));
    EXPECT_LT(Clock::now() - again, std::chrono::milliseconds(200));
    // The device's record of the loss (debug_state's "lost") names it, and outlives the device's shutdown.
    const std::shared_ptr<const PeerLosses> losses = device.peer_losses();
    ASSERT_NE(losses, nullptr);
    EXPECT_TRUE(losses->lost(1));
    EXPECT_FALSE(losses->lost(0));
    // Shutting down after a peer is gone is bounded too.
    const auto closing = Clock::now();
    EXPECT_TRUE(IsOk(device.Finalize()));
    EXPECT_LT(Clock::now() - closing, std::chrono::seconds(2));
    EXPECT_EQ(device.peer_losses(), nullptr);
    EXPECT_EQ(losses->pes(), std::vector<int>{1});
  });
}

#else   // HP_WITH_UCX

TEST(RemoteTransportTest, WithoutUcxTheHostDeviceReachesItsNodeOnlyAndSaysWhy) {
  OnTwoNodes([](int rank, Bootstrap&, HostDevice& device) {
    EXPECT_FALSE(device.reaches_remotely(1 - rank));
    EXPECT_EQ(device.remote_transport(), "none");
    EXPECT_EQ(device.peer_losses(), nullptr);
    EXPECT_NE(device.remote_absence().find("pip install hyper-parallel-shmem[ucx]"), std::string::npos)
        << device.remote_absence();
    const char byte = 1;
    EXPECT_TRUE(HasError(ExchangeOne(device, 1 - rank, 1, &byte, 1, nullptr, 0, nullptr), StatusCode::kStateError,
                         "(op=exchange_messages transport=none reason=this build of hyper-parallel-shmem has no UCX"));
  });
}

TEST(RemoteTransportTest, ABuildWithoutUcxOpensNoneAndNamesTheRemedy) {
  std::vector<char> heap(64);
  RemoteTransportArgs args;
  args.world_size = 2;
  args.nodes = {0, 1};
  args.heap = heap.data();
  args.heap_bytes = heap.size();
  std::string absence;
  auto opened = OpenRemoteTransport(args, &absence);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened.value(), nullptr);
  EXPECT_NE(absence.find("pip install hyper-parallel-shmem[ucx]"), std::string::npos) << absence;
}

#endif  // HP_WITH_UCX

}  // namespace
}  // namespace hp::shmem::host
