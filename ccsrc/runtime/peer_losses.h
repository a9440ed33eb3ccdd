// The PEs of other nodes that a device's remote transport found gone: a record shared between the transport (which
// marks a PE lost from its progress thread), the device's waits (which look at it on every check), and the runtime's
// diagnostics (debug_state's "transports"), which read it without the runtime's lock and so may outlive the device.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

namespace hp::shmem {

class PeerLosses {
 public:
  explicit PeerLosses(int world_size) : lost_(static_cast<std::size_t>(world_size < 0 ? 0 : world_size)) {}

  // Marks `pe` lost; true the first time only. A PE stays lost.
  bool Mark(int pe) {
    if (!InRange(pe) || lost_[static_cast<std::size_t>(pe)].exchange(true, std::memory_order_acq_rel)) return false;
    count_.fetch_add(1, std::memory_order_acq_rel);
    return true;
  }
  bool lost(int pe) const { return InRange(pe) && lost_[static_cast<std::size_t>(pe)].load(std::memory_order_acquire); }
  // The lost PEs, in rank order.
  std::vector<int> pes() const {
    std::vector<int> lost;
    for (std::size_t pe = 0; pe < lost_.size(); ++pe) {
      if (lost_[pe].load(std::memory_order_acquire)) lost.push_back(static_cast<int>(pe));
    }
    return lost;
  }
  // The size of pes(): cheap enough for a wait's every check.
  std::size_t count() const { return count_.load(std::memory_order_acquire); }

 private:
  bool InRange(int pe) const { return pe >= 0 && static_cast<std::size_t>(pe) < lost_.size(); }

  std::vector<std::atomic<bool>> lost_;   // per PE
  std::atomic<std::size_t> count_{0};
};

}  // namespace hp::shmem
