// The host device as torch's own symmetric-memory backend for CPU tensors (torch.distributed._symmetric_memory).
//
// A c10d::symmetric_memory::SymmetricMemoryAllocator registered for DeviceType::CPU, and under the name
// kSymmMemBackendName for `symm_mem.set_backend`, over the runtime and heap of shmem.empty / symm.empty:
//
// - alloc (symm_mem.empty, empty_strided_p2p) is collective over the root, like every allocation of the runtime:
//   every rank allocates in the same order and the runtime checks that the sizes and heap offsets agree. Each
//   allocation holds its buffer and, after it, its signal pad (torch's get_signal_pad_size(), zeroed).
// - free (the tensor's storage died) is local and never waits: the allocation is freed on every rank at the next
//   collective allocation once every rank has let go of it and of every handle on it.
// - rendezvous(tensor, group) is collective over the group (any ProcessGroup of ranks of the root, resolved with
//   c10d::resolve_process_group as torch's own backends do); its handle (HostSymmetricMemory) is cached per
//   allocation and group. Tensors of shmem.empty / symm.empty are symmetric to torch as well: their handle's signal
//   pad is a separate allocation, made when they are first rendezvoused over the whole root (a handle made first
//   over a smaller group has none: its barrier runs the team's, and the signal-pad calls say so).
//
// The handle follows torch's CUDA backend: a signal pad is get_signal_pad_size() bytes of uint32 slots, slot
// channel * world_size + peer; put_signal(dst) waits until its slot on dst is 0 and sets it to 1 (release),
// wait_signal(src) waits until its own slot for src is 1 and resets it to 0 (acquire), and barrier(channel) is a
// put_signal to every peer followed by a wait_signal from every peer. Every wait ends at `timeout_ms` (0: the
// runtime's timeout) with a RuntimeError naming the rank, the peer and the channel.
#pragma once

#include <torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "bindings/torch/symm_mem_register.h"
#include "runtime/status.h"

namespace hp::shmem::torch_binding {

// The name `symm_mem.set_backend` takes.
inline constexpr const char* kSymmMemBackendName = "HYPER_PARALLEL_SHMEM";

struct SymmMemBlock;

// A runtime team of a group, as the Python side made it (shmem.Team): its id, its members' PEs, this rank.
struct SymmMemTeam {
  std::uint64_t id = 0;
  std::vector<int> pes;
  int me = -1;
};

class HostSymmetricMemory final : public c10d::symmetric_memory::SymmetricMemory {
 public:
  HostSymmetricMemory(std::shared_ptr<SymmMemBlock> block, SymmMemTeam team, std::string group_name,
                      std::vector<void*> buffers, std::vector<void*> pads);

  std::vector<void*> get_buffer_ptrs() override;
  std::vector<void*> get_signal_pad_ptrs() override;
  void** get_buffer_ptrs_dev() override;
  void** get_signal_pad_ptrs_dev() override;
  size_t get_buffer_size() override;
  size_t get_offset() override { return 0; }
  bool has_multicast_support() override { return false; }
  void* get_multicast_ptr() override { return nullptr; }
  void barrier(int channel, size_t timeout_ms) override;
  void put_signal(int dst_rank, int channel, size_t timeout_ms) override;
  void wait_signal(int src_rank, int channel, size_t timeout_ms) override;
  int get_rank() override { return team_.me; }
  int get_world_size() override { return static_cast<int>(team_.pes.size()); }
  c10::Device get_device() override { return c10::Device(c10::DeviceType::CPU); }
  const std::vector<int>& get_rank_to_global_rank() override { return team_.pes; }
  int* get_rank_to_global_rank_dev() override { return team_.pes.data(); }
  bool world_within_direct_access() override { return true; }

  // For the symm_mem operators.
  const SymmMemTeam& team() const { return team_; }
  const std::string& group_name() const { return group_name_; }
  const SymmMemBlock& block() const { return *block_; }
  // Raises when the allocation is no longer live (freed through the other API, or an ended lifecycle).
  void CheckLive(const char* op) const;
  // The heap offset of `address`, a byte of this handle's buffer on this rank (the same on every rank).
  std::int64_t HeapOffsetOf(const void* address) const;

 private:
  // The pad slot of `peer` on `channel`, after checking both (torch's messages: "must be in [0", "maximum
  // supported channel").
  std::size_t Slot(int peer, int channel, const char* op, const char* peer_name) const;
  void RequirePad(const char* op) const;

  std::shared_ptr<SymmMemBlock> block_;
  SymmMemTeam team_;
  std::string group_name_;
  std::vector<void*> buffers_;
  std::vector<void*> pads_;
};

// The handle of `tensor` (a symmetric CPU tensor) over `group_name`, as torch's rendezvous gives it; `op` names the
// caller in errors ("<op>: input must be allocated with empty_strided_p2p()." when the tensor is not symmetric).
c10::intrusive_ptr<HostSymmetricMemory> SymmMemHandle(const at::Tensor& tensor, const std::string& group_name,
                                                      const char* op, const char* what);

// SymmMemHandle's handle, or null when `tensor` is not symmetric (any other failure raises).
c10::intrusive_ptr<HostSymmetricMemory> SymmMemHandleIfSymmetric(const at::Tensor& tensor,
                                                                 const std::string& group_name, const char* op,
                                                                 const char* what);

// The team of a group, made on first use (collective over the group then).
SymmMemTeam SymmMemTeamOf(const std::string& group_name);

// Raises a Status as torch's ops do (c10::Error: RuntimeError in Python).
[[noreturn]] void ThrowStatus(const Status& status);

inline void CheckStatus(const Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

// Releases the GIL around a wait when this thread holds it (torch's bindings call in with and without it).
class SymmMemWithoutGil {
 public:
  SymmMemWithoutGil();
  ~SymmMemWithoutGil();
  SymmMemWithoutGil(const SymmMemWithoutGil&) = delete;
  SymmMemWithoutGil& operator=(const SymmMemWithoutGil&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};

// Registers the CPU kernels of the symm_mem operators, and meta kernels where torch has none, for the operators
// this torch declares (symm_mem_ops.cc). Called once torch.distributed._symmetric_memory has defined its own.
void RegisterSymmMemOps();

}  // namespace hp::shmem::torch_binding
