#include "runtime/host/host_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "ops/host/codec.h"
#include "ops/host/reduce.h"
#include "runtime/agreement.h"
#include "runtime/host/atomics.h"
#include "runtime/host/process_memory.h"
#include "runtime/logging.h"

namespace hp::shmem::host {

// Each field a cache line of its own: ranks hammer different words without false sharing.
struct alignas(64) HostDevice::ControlBlock {
  std::uint64_t magic;
  std::int64_t pid;
  std::uint64_t own_address;                    // this block's address in its own process: peers probe reading it
  alignas(64) std::uint64_t barrier_arrivals;   // meaningful in rank 0's block: arrivals over all barriers
  alignas(64) std::uint32_t barrier_sleepers;   // rank 0's block: ranks asleep in a barrier
  alignas(64) std::uint64_t barrier_epoch;      // the last barrier this rank entered
  alignas(64) std::uint32_t sleepers;           // waiters of this rank asleep on a signal
};
static_assert(sizeof(HostDevice::ControlBlock) <= HostDevice::kControlBytes, "control block too large");
static_assert(offsetof(HostDevice::ControlBlock, barrier_arrivals) % 64 == 0 &&
                  offsetof(HostDevice::ControlBlock, barrier_sleepers) % 64 == 0 &&
                  offsetof(HostDevice::ControlBlock, barrier_epoch) % 64 == 0 &&
                  offsetof(HostDevice::ControlBlock, sleepers) % 64 == 0,
              "every word that ranks poll sits on a cache line of its own");

namespace {

constexpr std::uint64_t kMagic = 0x68707368'6d656d31ull;   // "hpshmem1"

std::size_t RoundUp(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

template <typename T>
bool Compare(T observed, CompareOp cmp, T expected) {
  switch (cmp) {
    case CompareOp::kEq: return observed == expected;
    case CompareOp::kNe: return observed != expected;
    case CompareOp::kGt: return observed > expected;
    case CompareOp::kGe: return observed >= expected;
    case CompareOp::kLt: return observed < expected;
    case CompareOp::kLe: return observed <= expected;
  }
  return false;
}

// Creates a segment of `bytes` on every rank of `bootstrap` alike: the segment, or on every rank the failure of the
// lowest rank that failed (a rank whose creation failed never leaves its peers waiting in the next step).
Result<ShmSegment> CreateOnEveryRank(Bootstrap& bootstrap, std::size_t bytes, const char* step) {
  auto segment = ShmSegment::Create(bytes);
  HP_RETURN_IF_ERROR(AgreeOnStatus(bootstrap, segment.ok() ? Status::Ok() : segment.status(), step));
  return segment;
}

// Every rank's segment name, in rank order.
Result<std::vector<std::string>> GatherNames(Bootstrap& bootstrap, const ShmSegment& own) {
  char name[64] = {};
  std::strncpy(name, own.name().c_str(), sizeof(name) - 1);
  std::vector<char> gathered(sizeof(name) * static_cast<std::size_t>(bootstrap.world_size()));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(name, sizeof(name), gathered.data()));
  std::vector<std::string> names;
  for (std::size_t at = 0; at < gathered.size(); at += sizeof(name)) names.emplace_back(&gathered[at]);
  return names;
}

template <typename T>
void ApplySignal(T* address, T value, SignalOp op) {
  if (op == SignalOp::kSet) {
    StoreSeqCst(address, value);
  } else {
    FetchAddSeqCst(address, value);
  }
}

}  // namespace

HostDevice::HostDevice(PeerMemory peer_memory) : peer_memory_(peer_memory) {}

HostDevice::~HostDevice() {
  if (!segments_.empty()) (void)Finalize();
}

HostDevice::ControlBlock* HostDevice::control(int pe) const {
  return reinterpret_cast<ControlBlock*>(bases_[static_cast<std::size_t>(pe)] + heap_size_);
}

char* HostDevice::Remote(const void* local, int pe) const {
  const std::size_t offset = static_cast<const char*>(local) - bases_[static_cast<std::size_t>(rank_)];
  return bases_[static_cast<std::size_t>(pe)] + offset;
}

std::uintptr_t HostDevice::heap_base() const {
  return bases_.empty() ? 0 : reinterpret_cast<std::uintptr_t>(bases_[static_cast<std::size_t>(rank_)]);
}

Status HostDevice::CheckOnNode(int pe, const char* op) const {
  if (pe < 0 || pe >= world_size_) {
    return InvalidArgument("`pe` must be in [0, " + std::to_string(world_size_) + "), but got " + std::to_string(pe));
  }
  if (nodes_[static_cast<std::size_t>(pe)] != nodes_[static_cast<std::size_t>(rank_)]) {
    return StateError(std::string("pe lies on another node (the host device maps its own node's heaps only): op=") +
                      op + " pe=" + std::to_string(pe) + " pe_node=" + std::to_string(nodes_[static_cast<std::size_t>(pe)]) +
                      " rank=" + std::to_string(rank_) + " node=" + std::to_string(nodes_[static_cast<std::size_t>(rank_)]));
  }
  return Status::Ok();
}

std::chrono::steady_clock::time_point HostDevice::Deadline() const {
  return std::chrono::steady_clock::now() + timeout_;
}

Result<std::vector<int>> NodesFromReach(const std::vector<std::uint8_t>& reach, int world_size) {
  const auto world = static_cast<std::size_t>(world_size);
  if (world_size < 1 || reach.size() != world * world) {
    return InvalidArgument("`reach` must be a world_size x world_size table, but got " + std::to_string(reach.size()) +
                           " entries for world_size=" + std::to_string(world_size));
  }
  std::vector<int> nodes(world);
  for (std::size_t a = 0; a < world; ++a) {
    std::size_t lowest = a;
    for (std::size_t b = 0; b < a; ++b) {
      if (reach[a * world + b]) {
        lowest = b;
        break;
      }
    }
    nodes[a] = static_cast<int>(lowest);
  }
  // Sharing memory must be a partition: reflexive, symmetric, and transitive through each node's lowest rank.
  for (std::size_t a = 0; a < world; ++a) {
    for (std::size_t b = 0; b < world; ++b) {
      if ((reach[a * world + b] != 0) != (nodes[a] == nodes[b])) {
        return DeviceError("ranks disagree about which ranks share memory: rank=" + std::to_string(a) +
                           " opens_rank_" + std::to_string(b) + "=" + (reach[a * world + b] ? "true" : "false") +
                           " node_of_" + std::to_string(a) + "=" + std::to_string(nodes[a]) + " node_of_" +
                           std::to_string(b) + "=" + std::to_string(nodes[b]) +
                           " (every rank must see the same /dev/shm as exactly the ranks of its machine)");
      }
    }
  }
  return nodes;
}

Status HostDevice::Init(const DeviceInitArgs& args, Bootstrap& bootstrap) {
  if (!segments_.empty()) return StateError("host device is already initialised: rank=" + std::to_string(rank_));
  rank_ = args.rank;
  world_size_ = args.world_size;
  heap_size_ = RoundUp(args.heap_size, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  timeout_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(args.timeout_sec));
  const std::size_t segment_bytes = heap_size_ + kControlBytes;

  RemoveStaleSegments();

  // 1. Which ranks share our shared memory: our node.
  HP_RETURN_IF_ERROR(DiscoverNodes(bootstrap));
  spin_ = SpinPolicy::For(static_cast<int>(node_pes_.size()));

  // 2. Create our segment, once every rank has checked that the machine can hold the segments of its node's ranks:
  //    creation reserves the pages, so a rank checking after a peer created would count that peer's heap twice.
  //    The reservation itself is the last word (another program may take /dev/shm between the check and it).
  HP_RETURN_IF_ERROR(AgreeOnStatus(bootstrap, CheckShmCapacity(segment_bytes * node_pes_.size()),
                                   "creating the symmetric heap"));
  HP_ASSIGN_OR_RETURN(ShmSegment own, CreateOnEveryRank(bootstrap, segment_bytes, "creating the symmetric heap"));

  // 3. Learn every rank's segment name and map those of our node.
  HP_ASSIGN_OR_RETURN(std::vector<std::string> names, GatherNames(bootstrap, own));
  std::vector<ShmSegment> segments(static_cast<std::size_t>(world_size_));
  Status mapped = Status::Ok();
  for (int r : node_pes_) {
    if (r == rank_ || !mapped.ok()) continue;
    auto peer = ShmSegment::Open(names[static_cast<std::size_t>(r)], segment_bytes);
    if (peer.ok()) {
      segments[static_cast<std::size_t>(r)] = std::move(peer).value();
    } else {
      mapped = peer.status();
    }
  }
  // Everyone has mapped everything once this agreement returns: the names can go.
  HP_RETURN_IF_ERROR(AgreeOnStatus(bootstrap, mapped, "mapping the peers' symmetric heaps"));
  HP_RETURN_IF_ERROR(own.Unlink());
  segments[static_cast<std::size_t>(rank_)] = std::move(own);

  segments_ = std::move(segments);
  bases_.clear();
  for (const ShmSegment& segment : segments_) bases_.push_back(static_cast<char*>(segment.data()));
  ControlBlock* mine = control(rank_);
  mine->magic = kMagic;
  mine->pid = getpid();
  mine->own_address = reinterpret_cast<std::uintptr_t>(mine);
  barrier_epoch_.store(0);
  heap_ = std::make_unique<HeapAllocator>(heap_size_);
  // Our control block must be initialised before any peer uses it.
  HP_RETURN_IF_ERROR(bootstrap.Barrier());

  // 4. Whether every rank may read every peer's memory outside the heap.
  HP_RETURN_IF_ERROR(ProbePeerMemory(bootstrap));
  // 5. The other nodes, when there are any.
  HP_RETURN_IF_ERROR(OpenRemote(bootstrap));
  HP_LOG(kInfo, "host device initialised: world_size=" + std::to_string(world_size_) +
                    " node=" + std::to_string(nodes_[static_cast<std::size_t>(rank_)]) +
                    " node_size=" + std::to_string(node_pes_.size()) + " heap_size=" + std::to_string(heap_size_) +
                    " heap_base=" + Hex(heap_base()) +
                    " reaches_peer_memory=" + (reaches_peer_memory_ ? "true" : "false") +
                    " remote_transport=" + remote_transport());
  return Status::Ok();
}

Status HostDevice::OpenRemote(Bootstrap& bootstrap) {
  remote_.reset();
  remote_absence_.clear();
  if (node_pes_.size() == static_cast<std::size_t>(world_size_)) return Status::Ok();
  RemoteTransportArgs args;
  args.rank = rank_;
  args.world_size = world_size_;
  args.nodes = nodes_;
  args.heap = bases_[static_cast<std::size_t>(rank_)];   // the heap only: the control block stays this node's
  args.heap_bytes = heap_size_;
  args.timeout = timeout_;
  args.on_remote_write = [this] { WakeRemoteWaiters(); };
  std::string absence;
  auto opened = OpenRemoteTransport(args, &absence);
  std::unique_ptr<RemoteTransport> transport;
  if (opened.ok()) transport = std::move(opened).value();
  else absence = opened.status().message();
  // Every rank connects, or none does: a rank without a transport would leave the others waiting in the exchange.
  const std::uint8_t ready = transport != nullptr ? 1 : 0;
  std::vector<std::uint8_t> readiness(static_cast<std::size_t>(world_size_));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(&ready, sizeof(ready), readiness.data()));
  const auto missing = std::find(readiness.begin(), readiness.end(), std::uint8_t{0});
  if (missing != readiness.end()) {
    if (transport != nullptr) (void)transport->Close();
    remote_absence_ = !absence.empty() ? absence
                                       : "rank " + std::to_string(missing - readiness.begin()) +
                                             " has no transport to other nodes (that rank's log says why)";
    return Status::Ok();
  }
  Status connected = transport->Connect(bootstrap);
  if (!connected.ok()) {
    // Agreed on every rank: the job still runs, one-sided calls stop at the node and say why.
    (void)transport->Close();
    remote_absence_ = "connecting to the other nodes failed: " + connected.message();
    HP_LOG(kWarning, "one-sided calls reach this rank's node only: " + remote_absence_);
    return Status::Ok();
  }
  remote_ = std::move(transport);
  return Status::Ok();
}

void HostDevice::WakeRemoteWaiters() {
  if (watched_count_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(watched_mu_);
  for (const void* word : watched_) FutexWakeAll(word);
}

Status HostDevice::DiscoverNodes(Bootstrap& bootstrap) {
  // Every rank creates a one-page probe segment holding a word of its own and tries to open every peer's: the ranks
  // whose probes it can read share its shared-memory filesystem. Every rank gathers every rank's answers, so all of
  // them derive the same nodes from the same table, or fail alike when the table is not a partition.
  struct ProbeWord {
    std::uint64_t magic;
    std::int64_t rank;
  };
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  HP_ASSIGN_OR_RETURN(ShmSegment probe, CreateOnEveryRank(bootstrap, page, "probing which ranks share memory"));
  *static_cast<ProbeWord*>(probe.data()) = ProbeWord{kMagic, rank_};
  HP_ASSIGN_OR_RETURN(std::vector<std::string> names, GatherNames(bootstrap, probe));
  const auto world = static_cast<std::size_t>(world_size_);
  std::vector<std::uint8_t> mine(world, 0);
  for (std::size_t r = 0; r < world; ++r) {
    if (static_cast<int>(r) == rank_) {
      mine[r] = 1;
      continue;
    }
    // A probe this rank cannot open lies in another node's shared memory (no such name here).
    auto peer = ShmSegment::Open(names[r], page);
    if (!peer.ok()) continue;
    const ProbeWord word = *static_cast<const ProbeWord*>(peer.value().data());
    mine[r] = word.magic == kMagic && word.rank == static_cast<std::int64_t>(r) ? 1 : 0;
  }
  std::vector<std::uint8_t> reach(world * world);
  HP_RETURN_IF_ERROR(bootstrap.AllGather(mine.data(), world, reach.data()));
  // Every rank has opened every probe it could once the table is gathered: the probe can go.
  HP_RETURN_IF_ERROR(probe.Unlink());

  HP_ASSIGN_OR_RETURN(std::vector<int> nodes, NodesFromReach(reach, world_size_));
  nodes_ = std::move(nodes);
  node_pes_.clear();
  for (std::size_t r = 0; r < world; ++r) {
    if (nodes_[r] == nodes_[static_cast<std::size_t>(rank_)]) node_pes_.push_back(static_cast<int>(r));
  }
  return Status::Ok();
}

Status HostDevice::ProbePeerMemory(Bootstrap& bootstrap) {
  // Each rank reads every peer's control block at the address the peer published: the magic word proves that the
  // kernel copied the peer's memory. Every rank takes the same paths only if all of them can, so the verdicts are
  // gathered and every rank combines the same list.
  std::string refused;
  if (peer_memory_ == PeerMemory::kCrossMemoryAttach) {
    for (int r : node_pes_) {
      if (r == rank_ || !refused.empty()) continue;
      std::uint64_t magic = 0;
      Status read = ReadProcessMemory(control(r)->pid, &magic, control(r)->own_address, sizeof(magic));
      if (!read.ok()) refused = read.message();
      else if (magic != kMagic) refused = "the probe read another word: pe=" + std::to_string(r) + " word=" + Hex(magic);
    }
  } else {
    refused = "off by construction";
  }
  const std::uint8_t mine = refused.empty() ? 1 : 0;
  std::vector<std::uint8_t> verdicts(static_cast<std::size_t>(world_size_));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(&mine, sizeof(mine), verdicts.data()));
  reaches_peer_memory_ = std::all_of(verdicts.begin(), verdicts.end(), [](std::uint8_t v) { return v == 1; });
  if (!refused.empty() && peer_memory_ == PeerMemory::kCrossMemoryAttach) {
    HP_LOG(kInfo, "collectives on ordinary tensors stage through shared memory: cross-memory attach is refused here (" +
                      refused + ")");
  }
  return Status::Ok();
}

Status HostDevice::Finalize() {
  Status quiesced = Quiesce();
  if (!quiesced.ok()) {
    HP_LOG(kWarning, "a stream operation failed and was never synchronized: " + quiesced.ToString());
  }
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_.clear();
    released_.clear();
  }
  if (remote_ != nullptr) {
    // The runtime's shutdown passed the bootstrap's barrier: no peer targets this heap any more.
    Status closed = remote_->Close();
    if (!closed.ok()) HP_LOG(kWarning, "closing the transport to other nodes failed: " + closed.ToString());
    remote_.reset();
  }
  heap_.reset();
  bases_.clear();
  nodes_.clear();
  node_pes_.clear();
  // Tensors that escaped invalidation (numpy arrays, DLPack capsules) may still point into any rank's mapping:
  // retired segments turn such pointers harmless instead of unmapping memory under them.
  for (ShmSegment& segment : segments_) segment.Retire();
  segments_.clear();
  return Status::Ok();
}

Result<void*> HostDevice::Allocate(std::size_t bytes, std::size_t alignment) {
  if (!heap_) return StateError("host device is not initialised: op=Allocate");
  HP_ASSIGN_OR_RETURN(std::size_t offset, heap_->Allocate(bytes, alignment));
  return static_cast<void*>(bases_[static_cast<std::size_t>(rank_)] + offset);
}

Status HostDevice::Free(void* ptr) {
  if (!heap_) return StateError("host device is not initialised: op=Free");
  return heap_->Free(static_cast<std::size_t>(static_cast<char*>(ptr) - bases_[static_cast<std::size_t>(rank_)]));
}

std::size_t HostDevice::ReservedBytes(const void* ptr) const {
  if (!heap_) return 0;
  return heap_->ReservedBytes(
      static_cast<std::size_t>(static_cast<const char*>(ptr) - bases_[static_cast<std::size_t>(rank_)]));
}

Status HostDevice::CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) {
  if (!heap_) return StateError("host device is not initialised: op=CopyToHeap");
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric_dst, bytes, "symmetric_dst"));
  if (bytes > 0) std::memcpy(symmetric_dst, host_src, bytes);   // the heap is host memory
  return Status::Ok();
}

Status HostDevice::CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) {
  if (!heap_) return StateError("host device is not initialised: op=CopyFromHeap");
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric_src, bytes, "symmetric_src"));
  if (bytes > 0) std::memcpy(host_dst, symmetric_src, bytes);
  return Status::Ok();
}

Status HostDevice::StageFromHost(void* symmetric_dst, const void* host_src, std::size_t bytes, StreamHandle stream) {
  if (!heap_) return StateError("host device is not initialised: op=StageFromHost");
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric_dst, bytes, "symmetric_dst"));
  if (stream == kDefaultStream) {
    if (bytes > 0) std::memcpy(symmetric_dst, host_src, bytes);
    return Status::Ok();
  }
  auto taken = std::make_shared<std::vector<char>>(static_cast<const char*>(host_src),
                                                   static_cast<const char*>(host_src) + bytes);
  return Enqueue(stream, [symmetric_dst, taken] {
    if (!taken->empty()) std::memcpy(symmetric_dst, taken->data(), taken->size());
    return Status::Ok();
  });
}

Result<std::uint64_t> HostDevice::ReadLater(const void* symmetric_src, std::size_t bytes, StreamHandle stream) {
  if (!heap_) return StateError("host device is not initialised: op=ReadLater");
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric_src, bytes, "symmetric_src"));
  auto read = std::make_shared<PendingRead>();
  read->bytes.resize(bytes);
  if (stream == kDefaultStream) {
    if (bytes > 0) std::memcpy(read->bytes.data(), symmetric_src, bytes);
  } else {
    HP_ASSIGN_OR_RETURN(read->stream, FindStream(stream));
    read->ticket = read->stream->Enqueue([symmetric_src, read] {
      if (!read->bytes.empty()) std::memcpy(read->bytes.data(), symmetric_src, read->bytes.size());
      return Status::Ok();
    });
  }
  std::lock_guard<std::mutex> lock(reads_mu_);
  const std::uint64_t token = next_read_++;
  reads_[token] = std::move(read);
  return token;
}

Result<bool> HostDevice::TakeRead(std::uint64_t token, void* host_dst) {
  std::shared_ptr<PendingRead> read;
  {
    std::lock_guard<std::mutex> lock(reads_mu_);
    auto it = reads_.find(token);
    if (it == reads_.end()) {
      return InvalidArgument("`token` must be a read started by ReadLater and not taken yet, but got " +
                             std::to_string(token));
    }
    read = it->second;
  }
  if (read->stream != nullptr && read->stream->completed() < read->ticket) return false;
  if (read->stream != nullptr) HP_RETURN_IF_ERROR(read->stream->pending_error());
  if (!read->bytes.empty()) std::memcpy(host_dst, read->bytes.data(), read->bytes.size());
  std::lock_guard<std::mutex> lock(reads_mu_);
  reads_.erase(token);
  return true;
}

Result<std::shared_ptr<HostStream>> HostDevice::FindStream(StreamHandle stream) const {
  std::lock_guard<std::mutex> lock(streams_mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    return InvalidArgument("`stream` must be a live stream of the host device, but got handle " + Hex(stream));
  }
  return it->second;
}

Status HostDevice::Enqueue(StreamHandle stream, std::function<Status()> op) {
  HP_ASSIGN_OR_RETURN(std::shared_ptr<HostStream> host_stream, FindStream(stream));
  host_stream->Enqueue(std::move(op));
  return Status::Ok();
}

Status HostDevice::Put(void* symmetric_dst, const void* src, std::size_t bytes, int pe, StreamHandle stream,
                       KeepAlive keep) {
  if (IsRemote(pe)) {
    const std::size_t offset = HeapOffset(symmetric_dst);
    return Submit(stream, [this, pe, offset, src, bytes, keep = std::move(keep)] {
      return remote_->Put(pe, offset, src, bytes);
    });
  }
  char* remote = Remote(symmetric_dst, pe);
  return Submit(stream, [remote, src, bytes, keep = std::move(keep)] {
    std::memcpy(remote, src, bytes);
    return Status::Ok();
  });
}

Status HostDevice::Get(void* dst, const void* symmetric_src, std::size_t bytes, int pe, StreamHandle stream,
                       KeepAlive keep) {
  if (IsRemote(pe)) {
    const std::size_t offset = HeapOffset(symmetric_src);
    return Submit(stream, [this, pe, offset, dst, bytes, keep = std::move(keep)] {
      return remote_->Get(pe, offset, dst, bytes);
    });
  }
  const char* remote = Remote(symmetric_src, pe);
  return Submit(stream, [dst, remote, bytes, keep = std::move(keep)] {
    std::memcpy(dst, remote, bytes);
    return Status::Ok();
  });
}

Status HostDevice::RequireRemote(int pe, const char* op) const {
  if (IsRemote(pe)) return Status::Ok();
  return StateError("`pe` must lie on another node and be reached by a remote transport, but got pe=" +
                    std::to_string(pe) + " (op=" + op + " transport=" + (remote_ != nullptr ? "node" : "none") +
                    (remote_absence_.empty() ? "" : " reason=" + remote_absence_) + ")");
}

Status HostDevice::RemoteTransportTransfer(bool put, void* symmetric, void* local, std::size_t bytes, int pe) {
  HP_RETURN_IF_ERROR(RequireRemote(pe, put ? "remote_transport_put" : "remote_transport_get"));
  const std::size_t offset = HeapOffset(symmetric);
  return put ? remote_->Put(pe, offset, local, bytes) : remote_->Get(pe, offset, local, bytes);
}

Status HostDevice::ExchangeMessages(std::uint64_t tag, MessageExchange* exchanges, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) HP_RETURN_IF_ERROR(RequireRemote(exchanges[i].pe, "exchange_messages"));
  if (count == 0) return Status::Ok();
  return remote_->ExchangeMessages(tag, exchanges, count);
}

Status HostDevice::Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) {
  if (!heap_) return StateError("host device is not initialised: op=Copy");
  if (bytes == 0) return Status::Ok();
  return Submit(stream, [dst, src, bytes, keep = std::move(keep)] {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  });
}

Status HostDevice::GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int pe, StreamHandle stream,
                                 KeepAlive keep) {
  if (!heap_) return StateError("host device is not initialised: op=GetPeerMemory");
  HP_RETURN_IF_ERROR(CheckOnNode(pe, "GetPeerMemory"));
  if (!reaches_peer_memory_ && pe != rank_) {
    return StateError("host device does not reach peers' memory: op=GetPeerMemory pe=" + std::to_string(pe));
  }
  if (bytes == 0) return Status::Ok();
  const std::int64_t pid = control(pe)->pid;
  const bool own = pe == rank_;
  return Submit(stream, [dst, peer_address, bytes, pid, own, keep = std::move(keep)] {
    if (own) {
      std::memcpy(dst, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(peer_address)), bytes);
      return Status::Ok();
    }
    return ReadProcessMemory(pid, dst, peer_address, bytes);
  });
}

namespace {
// Bytes of each source a ReducePeerMemory block reads: the blocks of 8 sources and the result stay in L2.
constexpr std::size_t kPeerReduceBlockBytes = 64 << 10;
}  // namespace

Status HostDevice::ReducePeerMemory(void* dst, const std::vector<std::uint64_t>& addresses, const std::vector<int>& pes,
                                    std::size_t count, DataType dtype, ReduceOp op, StreamHandle stream,
                                    KeepAlive keep) {
  if (!heap_) return StateError("host device is not initialised: op=ReducePeerMemory");
  if (addresses.size() != pes.size() || pes.empty()) {
    return InvalidArgument("`addresses` must have one address per pe, but got " + std::to_string(addresses.size()) +
                           " addresses for " + std::to_string(pes.size()) + " pes");
  }
  std::vector<std::int64_t> pids;   // -1: this rank's own memory, read in place
  for (int pe : pes) {
    HP_RETURN_IF_ERROR(CheckOnNode(pe, "ReducePeerMemory"));
    if (pe != rank_ && !reaches_peer_memory_) {
      return StateError("host device does not reach peers' memory: op=ReducePeerMemory pe=" + std::to_string(pe));
    }
    pids.push_back(pe == rank_ ? -1 : control(pe)->pid);
  }
  if (count == 0) return Status::Ok();
  const std::size_t element = DataTypeSize(dtype);
  return Submit(stream, [=, keep = std::move(keep)] {
    // Peers' blocks land in a buffer of this thread that outlives the call: no allocation or page fault per call.
    thread_local std::vector<char> blocks;
    const std::size_t nsrc = addresses.size();
    blocks.resize(std::max(blocks.size(), nsrc * kPeerReduceBlockBytes));
    const std::size_t block_count = kPeerReduceBlockBytes / element;
    std::vector<const void*> sources(nsrc);
    for (std::size_t done = 0; done < count; done += block_count) {
      const std::size_t length = std::min(block_count, count - done);
      for (std::size_t k = 0; k < nsrc; ++k) {
        const std::uint64_t at = addresses[k] + done * element;
        if (pids[k] < 0) {
          sources[k] = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(at));
          continue;
        }
        char* block = blocks.data() + k * kPeerReduceBlockBytes;
        HP_RETURN_IF_ERROR(ReadProcessMemory(pids[k], block, at, length * element));
        sources[k] = block;
      }
      if (!ops::HostReduce(dtype, op, static_cast<char*>(dst) + done * element, sources.data(), static_cast<int>(nsrc),
                           length)) {
        return Internal(std::string("host reduction cannot compute this: dtype=") + DataTypeName(dtype) +
                        " op=" + ReduceOpName(op) + " sources=" + std::to_string(nsrc));
      }
    }
    return Status::Ok();
  });
}

Status HostDevice::Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                          const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) {
  std::vector<const void*> sources;
  sources.reserve(pes.size());
  for (int pe : pes) sources.push_back(Remote(symmetric_src, pe));
  // Straight from the peers' mappings into dst: the kernel is memory bound, a staging copy would only cost.
  return Submit(stream, [dst, sources = std::move(sources), count, dtype, op, keep = std::move(keep)] {
    if (!ops::HostReduce(dtype, op, dst, sources.data(), static_cast<int>(sources.size()), count)) {
      return Internal(std::string("host reduction cannot compute this: dtype=") + DataTypeName(dtype) +
                      " op=" + ReduceOpName(op) + " sources=" + std::to_string(sources.size()));
    }
    return Status::Ok();
  });
}

// ---- low-precision wire formats: the host codec, reading peers' runs in place -------------------------------------

namespace {
std::string WireWhat(const char* op, ops::LowFormat format, DataType dtype, std::size_t count) {
  return std::string("op=") + op + " format=" + ops::LowFormatName(format) + " dtype=" + DataTypeName(dtype) +
         " count=" + std::to_string(count);
}
}  // namespace

Status HostDevice::CheckWireFormat(ops::LowFormat format) const {
  if (!ops::IsLowFormat(static_cast<int>(format))) {
    return InvalidArgument("`format` must be a wire format, but got " + std::to_string(static_cast<int>(format)));
  }
  return Status::Ok();   // the codec encodes every format on every CPU (a portable variant beside the vector ones)
}

Status HostDevice::Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                          StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireFormat(format));
  return Submit(stream, [=, keep = std::move(keep)] {
    if (!ops::HostEncode(format, dtype, src, count, {static_cast<float*>(dst.scales), dst.codes})) {
      return Internal("host codec cannot encode this: " + WireWhat("Encode", format, dtype, count));
    }
    return Status::Ok();
  });
}

Status HostDevice::Decode(ops::LowFormat format, WireRun symmetric_src, int pe, std::size_t count, DataType dtype,
                          void* out, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireFormat(format));
  const ops::EncodedRun run{reinterpret_cast<const float*>(symmetric_src.scales == nullptr ? nullptr
                                                                                          : Remote(symmetric_src.scales, pe)),
                            Remote(symmetric_src.codes, pe)};
  return Submit(stream, [=, keep = std::move(keep)] {
    if (!ops::HostDecode(format, run, count, dtype, out, /*accumulate=*/false)) {
      return Internal("host codec cannot decode this: " + WireWhat("Decode", format, dtype, count));
    }
    return Status::Ok();
  });
}

Status HostDevice::EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows,
                              std::size_t row_elems, void* dst, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireFormat(format));
  return Submit(stream, [=, keep = std::move(keep)] {
    if (!ops::HostEncodeRows(format, dtype, src, rows, row_elems, dst)) {
      return Internal("host codec cannot encode this: " + WireWhat("EncodeRows", format, dtype, rows * row_elems));
    }
    return Status::Ok();
  });
}

Status HostDevice::DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                              DataType dtype, void* out, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireFormat(format));
  return Submit(stream, [=, keep = std::move(keep)] {
    if (!ops::HostDecodeRows(format, src, rows, row_elems, dtype, out)) {
      return Internal("host codec cannot decode this: " + WireWhat("DecodeRows", format, dtype, rows * row_elems));
    }
    return Status::Ok();
  });
}

Status HostDevice::ReduceEncoded(ops::LowFormat format, DataType dtype, ReduceOp op, const void* own,
                                 WireRun symmetric_src, const std::vector<int>& pes, std::size_t count, void* out,
                                 WireRun reencode, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireFormat(format));
  std::vector<ops::EncodedRun> sources;
  sources.reserve(pes.size());
  for (int pe : pes) {
    sources.push_back({reinterpret_cast<const float*>(symmetric_src.scales == nullptr ? nullptr
                                                                                      : Remote(symmetric_src.scales, pe)),
                       Remote(symmetric_src.codes, pe)});
  }
  // One pass, straight from the peers' mappings (decode, sum, divide, re-encode a block at a time in L1).
  return Submit(stream, [=, sources = std::move(sources), keep = std::move(keep)] {
    const ops::MutableEncodedRun again{static_cast<float*>(reencode.scales), reencode.codes};
    if (!ops::HostReduceEncoded(format, dtype, op, own, sources.data(), static_cast<int>(sources.size()), count, out,
                                again)) {
      return Internal("host codec cannot reduce this: " + WireWhat("ReduceEncoded", format, dtype, count) +
                      " reduce_op=" + ReduceOpName(op) + " sources=" + std::to_string(sources.size()));
    }
    return Status::Ok();
  });
}

Status HostDevice::DoSignal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe) {
  if (IsRemote(pe)) {
    // Every earlier write into this node's heaps is visible before the signal is (remote writes completed each).
    FullFence();
    return remote_->Signal(pe, HeapOffset(symmetric_signal), width, value, op);
  }
  char* remote = Remote(symmetric_signal, pe);
  // Publish every earlier write (memcpy may use non-temporal stores) before the signal can be seen.
  FullFence();
  if (width == SignalWidth::k32) {
    ApplySignal(reinterpret_cast<std::int32_t*>(remote), static_cast<std::int32_t>(value), op);
  } else {
    ApplySignal(reinterpret_cast<std::int64_t*>(remote), value, op);
  }
  WakeIfSleeping(remote, &control(pe)->sleepers);
  return Status::Ok();
}

Status HostDevice::Signal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                          StreamHandle stream) {
  return Submit(stream, [=] { return DoSignal(symmetric_signal, width, value, op, pe); });
}

Status HostDevice::PutWithSignal(void* symmetric_dst, const void* src, std::size_t bytes, void* symmetric_signal,
                                 SignalWidth width, std::int64_t value, SignalOp op, int pe, StreamHandle stream,
                                 KeepAlive keep) {
  if (IsRemote(pe)) {
    const std::size_t offset = HeapOffset(symmetric_dst);
    const std::size_t signal_offset = HeapOffset(symmetric_signal);
    return Submit(stream, [=, keep = std::move(keep)] {
      FullFence();   // as DoSignal: every earlier write into this node's heaps is visible before the signal is
      return remote_->PutWithSignal(pe, offset, src, bytes, signal_offset, width, value, op);
    });
  }
  char* remote = Remote(symmetric_dst, pe);
  return Submit(stream, [=, keep = std::move(keep)] {
    if (bytes > 0) std::memcpy(remote, src, bytes);
    return DoSignal(symmetric_signal, width, value, op, pe);   // its fence publishes the bytes first
  });
}

Status HostDevice::DoWaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value) {
  auto observe = [symmetric_signal, width]() -> std::int64_t {
    return width == SignalWidth::k32 ? LoadAcquire(static_cast<const std::int32_t*>(symmetric_signal))
                                     : LoadAcquire(static_cast<const std::int64_t*>(symmetric_signal));
  };
  auto done = [&] { return Compare(observe(), cmp, value); };
  auto describe = [&] {
    const std::size_t offset = static_cast<char*>(symmetric_signal) - bases_[static_cast<std::size_t>(rank_)];
    return std::string("signal wait timed out: signal=") + Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal)) +
           " heap_offset=" + Hex(offset) + " cmp=" + CompareOpName(cmp) + " expected=" + std::to_string(value) +
           " observed=" + std::to_string(observe()) +
           " timeout_sec=" + Decimal(std::chrono::duration<double>(timeout_).count());
  };
  std::uint32_t* sleepers = &control(rank_)->sleepers;
  if (remote_ == nullptr) return WaitUntil(symmetric_signal, sleepers, done, spin_, Deadline(), describe);
  // A peer of another node raises it through the transport's progress thread, which wakes no futex by itself:
  // the word is watched (WakeRemoteWaiters) for as long as the wait lasts. A PE of another node that is gone may
  // have been the one to raise it: the wait ends then too (the transport wakes it), instead of at the timeout.
  {
    std::lock_guard<std::mutex> lock(watched_mu_);
    watched_.insert(symmetric_signal);
    watched_count_.fetch_add(1, std::memory_order_release);
  }
  const PeerLosses& losses = *remote_->losses();
  auto done_or_lost = [&] { return done() || losses.count() > 0; };
  Status waited = WaitUntil(symmetric_signal, sleepers, done_or_lost, spin_, Deadline(), describe);
  {
    std::lock_guard<std::mutex> lock(watched_mu_);
    watched_.erase(watched_.find(symmetric_signal));
    watched_count_.fetch_sub(1, std::memory_order_release);
  }
  if (waited.ok() && !done()) {
    std::string pes;
    std::vector<int> lost_nodes;
    for (int pe : losses.pes()) {
      pes += (pes.empty() ? "" : ",") + std::to_string(pe);
      const int node = nodes_[static_cast<std::size_t>(pe)];
      if (std::find(lost_nodes.begin(), lost_nodes.end(), node) == lost_nodes.end()) lost_nodes.push_back(node);
    }
    std::sort(lost_nodes.begin(), lost_nodes.end());
    std::string nodes;
    for (int node : lost_nodes) nodes += (nodes.empty() ? "" : ",") + std::to_string(node);
    const std::size_t offset = static_cast<char*>(symmetric_signal) - bases_[static_cast<std::size_t>(rank_)];
    return DeviceError("signal wait failed: pes of another node are gone (their process exited or their node died): "
                       "lost_pes=[" + pes + "] lost_nodes=[" + nodes + "] rank=" + std::to_string(rank_) +
                       " signal=" + Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal)) +
                       " heap_offset=" + Hex(offset) + " cmp=" + CompareOpName(cmp) + " expected=" +
                       std::to_string(value) + " observed=" + std::to_string(observe()));
  }
  return waited;
}

Status HostDevice::WaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                              StreamHandle stream) {
  return Submit(stream, [=] { return DoWaitSignal(symmetric_signal, width, cmp, value); });
}

Status HostDevice::DoBarrier() {
  // A counting barrier on one word of the node's lowest rank's block: barrier number e is complete once
  // e * node_size arrivals have been counted. The word only grows, so nothing is ever reset.
  const std::uint64_t epoch = barrier_epoch_.fetch_add(1) + 1;
  const auto node_size = static_cast<std::uint64_t>(node_pes_.size());
  const std::uint64_t target = epoch * node_size;
  ControlBlock* root = control(node_pes_.front());
  StoreSeqCst(&control(rank_)->barrier_epoch, epoch);
  if (FetchAddSeqCst(&root->barrier_arrivals, std::uint64_t{1}) + 1 == target) {
    WakeIfSleeping(&root->barrier_arrivals, &root->barrier_sleepers);
    return Status::Ok();
  }
  auto done = [&] { return LoadAcquire(&root->barrier_arrivals) >= target; };
  auto describe = [&] {
    std::string missing;
    for (int r : node_pes_) {
      if (LoadAcquire(&control(r)->barrier_epoch) < epoch) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    }
    // After an earlier timeout this rank may be epochs ahead of the count: then none of its peers has arrived
    // at this barrier yet (the difference would wrap around).
    const std::uint64_t counted = LoadAcquire(&root->barrier_arrivals);
    const std::uint64_t before = (epoch - 1) * node_size;
    const std::uint64_t arrived = counted > before ? counted - before : 0;
    return "barrier timed out: epoch=" + std::to_string(epoch) + " expected_arrivals=" + std::to_string(node_size) +
           " observed_arrivals=" + std::to_string(arrived) + " missing_ranks=[" + missing + "]" +
           " timeout_sec=" + Decimal(std::chrono::duration<double>(timeout_).count());
  };
  return WaitUntil(&root->barrier_arrivals, &root->barrier_sleepers, done, spin_, Deadline(), describe);
}

namespace {

Status GivenUpBy(std::int64_t word, const std::vector<int>& members) {
  const int member = ArrivalCounter::Member(word);
  const std::string who = member >= 0 && member < static_cast<int>(members.size())
                              ? std::to_string(members[static_cast<std::size_t>(member)])
                              : "?";
  return StateError("sync was given up by rank " + who + " (it " + GiveUpReasonName(ArrivalCounter::Reason(word)) +
                    "): arrived=" + std::to_string(ArrivalCounter::Count(word)) + " of " +
                    std::to_string(members.size()));
}

}  // namespace

Result<std::int64_t*> HostDevice::Counter(const void* symmetric_counter, const std::vector<int>& members,
                                          const char* op) const {
  if (!heap_) return StateError(std::string("host device is not initialised: op=") + op);
  if (members.empty()) return InvalidArgument("`members` must name at least one pe, but got none");
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric_counter, sizeof(std::int64_t), "symmetric_counter"));
  HP_RETURN_IF_ERROR(CheckOnNode(members.front(), op));
  return reinterpret_cast<std::int64_t*>(Remote(symmetric_counter, members.front()));
}

Status HostDevice::Arrive(void* symmetric_counter, const std::vector<int>& members, int member) {
  HP_ASSIGN_OR_RETURN(std::int64_t* word, Counter(symmetric_counter, members, "Arrive"));
  const auto n = static_cast<std::int64_t>(members.size());
  std::uint32_t* sleepers = &control(members.front())->sleepers;
  // 1. Count this arrival, after every earlier write is visible (memcpy may use non-temporal stores).
  FullFence();
  const std::int64_t before = FetchAddSeqCst(word, std::int64_t{1});
  if (ArrivalCounter::GivenUp(before)) return GivenUpBy(before, members);
  if (ArrivalCounter::Count(before) + 1 == n) {
    WakeIfSleeping(word, sleepers);
    return Status::Ok();
  }
  // 2. Wait for the others: a mark makes the word larger than any count, so it ends the wait too.
  auto done = [&] { return LoadAcquire(word) >= n; };
  auto describe = [&] {
    return "sync timed out: arrived=" + std::to_string(ArrivalCounter::Count(LoadAcquire(word))) + " of " +
           std::to_string(n) + " timeout_sec=" + Decimal(std::chrono::duration<double>(timeout_).count());
  };
  const Status waited = WaitUntil(word, sleepers, done, spin_, Deadline(), describe);
  std::int64_t now = LoadAcquire(word);
  if (waited.ok()) return ArrivalCounter::GivenUp(now) ? GivenUpBy(now, members) : Status::Ok();
  // 3. This rank gives up: in one atomic step, unless every member arrived meanwhile (then the sync happened) or
  //    another gave up first.
  const GiveUpReason reason =
      waited.code() == StatusCode::kInterrupted ? GiveUpReason::kInterrupted : GiveUpReason::kTimeout;
  while (true) {
    if (ArrivalCounter::GivenUp(now)) return GivenUpBy(now, members);
    if (ArrivalCounter::Count(now) >= n) return Status::Ok();
    if (__atomic_compare_exchange_n(word, &now, now | ArrivalCounter::Mark(member, reason), false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
      WakeIfSleeping(word, sleepers);
      return Status(waited.code(), waited.message() + " (given up for every member)");
    }
  }
}

Status HostDevice::GiveUp(void* symmetric_counter, const std::vector<int>& members, int member, GiveUpReason reason) {
  HP_ASSIGN_OR_RETURN(std::int64_t* word, Counter(symmetric_counter, members, "GiveUp"));
  const auto n = static_cast<std::int64_t>(members.size());
  std::int64_t now = LoadAcquire(word);
  // Not yet counted here, so the count is below n: the mark always applies unless another member's came first.
  while (!ArrivalCounter::GivenUp(now) && ArrivalCounter::Count(now) < n &&
         !__atomic_compare_exchange_n(word, &now, now | ArrivalCounter::Mark(member, reason), false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_SEQ_CST)) {
  }
  FetchAddSeqCst(word, std::int64_t{1});
  WakeIfSleeping(word, &control(members.front())->sleepers);
  return Status::Ok();
}

Status HostDevice::AwaitArrivals(const void* symmetric_counter, const std::vector<int>& members) {
  HP_ASSIGN_OR_RETURN(std::int64_t* word, Counter(symmetric_counter, members, "AwaitArrivals"));
  const auto n = static_cast<std::int64_t>(members.size());
  auto done = [&] { return ArrivalCounter::Count(LoadAcquire(word)) >= n; };
  auto describe = [&] {
    return "waiting for every member to reach a given-up sync timed out: arrived=" +
           std::to_string(ArrivalCounter::Count(LoadAcquire(word))) + " of " + std::to_string(n) +
           " timeout_sec=" + Decimal(std::chrono::duration<double>(timeout_).count());
  };
  return WaitUntil(word, &control(members.front())->sleepers, done, spin_, Deadline(), describe);
}

Result<std::int64_t> HostDevice::ReadCounter(const void* symmetric_counter, int pe) {
  HP_ASSIGN_OR_RETURN(std::int64_t* word, Counter(symmetric_counter, std::vector<int>{pe}, "ReadCounter"));
  return LoadAcquire(word);
}

Result<void*> HostDevice::PeerAddress(const void* symmetric, int pe) const {
  if (!heap_) return StateError("host device is not initialised: op=PeerAddress");
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric, 0, "symmetric"));
  HP_RETURN_IF_ERROR(CheckOnNode(pe, "PeerAddress"));
  return static_cast<void*>(Remote(symmetric, pe));   // every segment of the node is mapped in this process
}

Status HostDevice::Barrier(StreamHandle stream) {
  return Submit(stream, [this] { return DoBarrier(); });
}

Result<StreamHandle> HostDevice::CreateStream() {
  auto stream = std::make_shared<HostStream>();
  const auto handle = reinterpret_cast<StreamHandle>(stream.get());
  std::lock_guard<std::mutex> lock(streams_mu_);
  ReapReleasedStreams();
  streams_.emplace(handle, std::move(stream));
  return handle;
}

Status HostDevice::DestroyStream(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    return InvalidArgument("`stream` must be a live stream of the host device, but got handle " + Hex(stream));
  }
  released_.push_back(std::move(it->second));
  streams_.erase(it);
  ReapReleasedStreams();
  return Status::Ok();
}

void HostDevice::ReapReleasedStreams() {
  auto finished = [](const std::shared_ptr<HostStream>& stream) {
    if (!stream->idle()) return false;
    Status status = stream->Synchronize();   // returns at once: nothing is queued
    if (!status.ok()) HP_LOG(kWarning, "an operation of a destroyed stream failed: " + status.ToString());
    return true;
  };
  released_.erase(std::remove_if(released_.begin(), released_.end(), finished), released_.end());
}

Status HostDevice::SynchronizeStream(StreamHandle stream) {
  if (stream == kDefaultStream) return Status::Ok();
  HP_ASSIGN_OR_RETURN(std::shared_ptr<HostStream> host_stream, FindStream(stream));
  return host_stream->Synchronize();
}

Status HostDevice::StreamWaitStream(StreamHandle waiter, StreamHandle waited) {
  if (waited == kDefaultStream || waiter == waited) return Status::Ok();   // the default stream never lags
  HP_ASSIGN_OR_RETURN(std::shared_ptr<HostStream> waited_stream, FindStream(waited));
  const std::uint64_t ticket = waited_stream->last_ticket();
  if (waiter == kDefaultStream) {
    waited_stream->WaitFor(ticket);
    return Status::Ok();
  }
  HP_ASSIGN_OR_RETURN(std::shared_ptr<HostStream> waiter_stream, FindStream(waiter));
  waiter_stream->Enqueue([waited_stream, ticket] {
    waited_stream->WaitFor(ticket);
    return Status::Ok();
  });
  return Status::Ok();
}

Status HostDevice::Quiesce() {
  std::vector<std::shared_ptr<HostStream>> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (auto& entry : streams_) streams.push_back(entry.second);
    streams.insert(streams.end(), released_.begin(), released_.end());
  }
  Status first = Status::Ok();
  for (auto& stream : streams) {
    stream->WaitFor(stream->last_ticket());
    Status pending = stream->pending_error();
    if (first.ok() && !pending.ok()) first = std::move(pending);
  }
  return first;
}

}  // namespace hp::shmem::host
