// The host device's transport to the PEs of other nodes: one-sided reads, writes and atomics on their heaps over
// the network, where no shared memory reaches them.
//
// One implementation today, UCX (ucx_transport.cc), built when CMake finds UCX (HP_WITH_UCX); a build without it
// opens no transport, says why (RemoteTransportAbsence) and the host device reaches its own node only. The host
// device owns the transport: it opens it at Init when the world spans nodes and closes it at Finalize.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/bootstrap.h"
#include "runtime/device.h"
#include "runtime/peer_losses.h"
#include "runtime/status.h"

namespace hp::shmem::host {

struct RemoteTransportArgs {
  int rank = 0;
  int world_size = 0;
  std::vector<int> nodes;              // the node of every PE (Device::nodes): endpoints go to other nodes only
  void* heap = nullptr;                // this rank's heap, registered for the peers' one-sided calls
  std::size_t heap_bytes = 0;
  std::chrono::nanoseconds timeout{0};   // the longest any call waits for its completion
  // Called by the transport's progress thread after it carried out peers' operations on this rank's heap (a remote
  // atomic on a signal), and once a PE of another node is found gone (lost_pes): waiters on this rank's signals must
  // look again, since neither wakes a futex.
  std::function<void()> on_remote_write;
};

class RemoteTransport {
 public:
  virtual ~RemoteTransport() = default;

  // The transport and what carries it, for diagnostics (e.g. "ucx").
  virtual std::string name() const = 0;
  // Collective over the bootstrap (every rank of the world, each with its own opened transport): exchanges the
  // addresses and keys of the heaps and connects to every PE of another node. Bounded like every bootstrap step; on
  // failure of any rank, every rank fails alike.
  virtual Status Connect(Bootstrap& bootstrap) = 0;
  // Whether `pe` is reached through this transport (connected, and on another node). Local and immediate.
  virtual bool reaches(int pe) const = 0;
  // The PEs of other nodes found gone (their process exited or their node died: their connection broke). Once lost,
  // a PE stays lost: every later call to it fails at once naming it, and a call in flight to it fails as soon as the
  // loss is seen. Never null; the record outlives the transport for whoever holds it (the runtime's diagnostics).
  virtual std::shared_ptr<const PeerLosses> losses() const = 0;

  // Each completes before it returns (a put is visible on `pe`, a get's bytes are in `dst`), or fails naming `pe`
  // within the timeout. `heap_offset` + `bytes` must lie inside `pe`'s registered heap: checked before anything is
  // sent.
  virtual Status Put(int pe, std::size_t heap_offset, const void* src, std::size_t bytes) = 0;
  virtual Status Get(int pe, std::size_t heap_offset, void* dst, std::size_t bytes) = 0;
  // Atomically sets (swap) or adds `value` to the signal of `width` at `heap_offset` on `pe`.
  virtual Status Signal(int pe, std::size_t heap_offset, SignalWidth width, std::int64_t value, SignalOp op) = 0;
  // Put, then Signal, as one operation with one completion: the signal is ordered after the data on the wire (the
  // peer never sees the new signal before the bytes), and the call waits once for both (a single round trip instead
  // of Put's and Signal's two). Both ranges are checked before anything is sent; zero bytes send the signal alone.
  virtual Status PutWithSignal(int pe, std::size_t heap_offset, const void* src, std::size_t bytes,
                               std::size_t signal_offset, SignalWidth width, std::int64_t value, SignalOp op) = 0;

  // Two-sided messages, for the phase across nodes of the teams that span nodes (Device::ExchangeMessages): every
  // exchange's receive and send posted at once, then all waited for within one timeout. Each PE's outcome is its
  // exchange's `status`; the call itself refuses, posting nothing, a `pe` it does not reach or a `tag` of
  // kMessageTagBits or more.
  static constexpr int kMessageTagBits = 40;
  virtual Status ExchangeMessages(std::uint64_t tag, MessageExchange* exchanges, std::size_t count) = 0;

  // Local: closes the endpoints, stops the progress thread, deregisters the heap. The caller makes sure no peer
  // still targets this rank's heap (the runtime's shutdown passes the bootstrap's barrier first). Bounded by the
  // timeout per live peer; the endpoints of lost PEs are released at once.
  virtual Status Close() = 0;
};

// This rank's transport, opened locally (no peer involved yet; Connect follows on every rank): null with
// `absence` set when this build has none or it cannot open here. Never waits.
Result<std::unique_ptr<RemoteTransport>> OpenRemoteTransport(const RemoteTransportArgs& args, std::string* absence);

}  // namespace hp::shmem::host
