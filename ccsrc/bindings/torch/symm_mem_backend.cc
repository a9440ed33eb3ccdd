#include "bindings/torch/symm_mem_backend.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/version.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "runtime/interrupt.h"
#include "runtime/runtime.h"

namespace py = pybind11;

// torch checks the rank of get_signal_pad (a non-virtual of its own, c10d::symmetric_memory::check_rank) from 2.14
// on; on 2.13 the Python side checks it for this backend's handles (platform/torch/symm_mem_backend.py).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
#define HP_SYMM_MEM_TORCH_CHECKS_PAD_RANK 1
#else
#define HP_SYMM_MEM_TORCH_CHECKS_PAD_RANK 0
#endif

namespace hp::shmem::torch_binding {

void ThrowStatus(const Status& status) { TORCH_CHECK(false, status.message()); }

SymmMemWithoutGil::SymmMemWithoutGil() {
  if (Py_IsInitialized() && PyGILState_Check()) saved_ = PyEval_SaveThread();
}

SymmMemWithoutGil::~SymmMemWithoutGil() {
  if (saved_ != nullptr) PyEval_RestoreThread(saved_);
}

// One symmetric allocation as torch's API sees it: its buffer and its signal pad.
struct SymmMemBlock {
  std::uint64_t lifecycle = 0;
  std::uint64_t allocation_id = 0;   // the runtime allocation of the buffer
  bool owned = false;                // allocated by torch's API: freed once its storage and handles are gone
  char* base = nullptr;
  std::size_t offset = 0;            // heap offset, the same on every rank
  std::size_t buffer_bytes = 0;      // what torch asked for (get_buffer_size)
  std::optional<std::string> alloc_group;
  char* pad = nullptr;
  std::size_t pad_bytes = 0;
  std::uint64_t pad_allocation_id = 0;   // the pad's own allocation (tensors of shmem.empty / symm.empty), else 0
  std::size_t pad_offset = 0;            // its heap offset
  ~SymmMemBlock();
};

namespace {

using Clock = std::chrono::steady_clock;

// The largest signal pad torch may configure is far below this; the pad starts at a cache line.
constexpr std::size_t kPadAlignment = 64;

std::size_t RoundUp(std::size_t value, std::size_t unit) { return (value + unit - 1) / unit * unit; }

using WithoutGil = SymmMemWithoutGil;

template <typename T>
T ValueOrThrowStatus(Result<T> result) {
  if (!result.ok()) ThrowStatus(result.status());
  return std::move(result).value();
}

void ThrowIfNotOk(const Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

// "TypeError: message", the first line of a Python error, for the RuntimeError that carries it through torch.
std::string DescribePython(const py::error_already_set& e) {
  std::string text = py::str(e.value());
  return py::str(e.type().attr("__name__")).cast<std::string>() + ": " + text;
}

class Backend {
 public:
  static Backend& Get() {
    static auto* backend = new Backend();   // never destroyed: storages may die after static destruction began
    return *backend;
  }

  void SetHooks(py::object ensure_runtime, py::object team_for_group) {
    ensure_runtime_ = std::move(ensure_runtime);
    team_for_group_ = std::move(team_for_group);
  }

  void* Alloc(std::size_t size, const std::optional<std::string>& group_name) {
    EnsureRuntime();
    const SymmMemTeam root = Team(std::nullopt);
    Flush(root);
    Runtime& runtime = Runtime::Instance();
    const std::size_t pad_at = RoundUp(size, kPadAlignment);
    const std::size_t pad_bytes = c10d::symmetric_memory::get_signal_pad_size();
    AllocationInfo info;
    {
      WithoutGil nogil;
      info = ValueOrThrowStatus(runtime.Allocate(pad_at + pad_bytes, 0, "symm_mem.empty"));
    }
    auto block = std::make_shared<SymmMemBlock>();
    block->lifecycle = info.lifecycle;
    block->allocation_id = info.id;
    block->owned = true;
    block->base = reinterpret_cast<char*>(info.base);
    block->offset = info.offset;
    block->buffer_bytes = size;
    block->alloc_group = group_name;
    block->pad = block->base + pad_at;
    block->pad_bytes = pad_bytes;
    // Zeroed as torch's CUDA backend zeroes its blocks: the signal protocol starts from zero pads.
    std::memset(block->base, 0, pad_at + pad_bytes);
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert_or_assign(info.base, Entry{std::move(block), {}});
    return reinterpret_cast<void*>(info.base);
  }

  // The storage let go (any thread): the allocation is freed at the next collective allocation once the handles
  // on it are gone too.
  void Free(void* ptr) {
    std::optional<Entry> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
      if (it == live_.end() || !it->second.block->owned) return;
      dropped.emplace(std::move(it->second));
      live_.erase(it);
    }
    // The entry's handles and block die here, outside the lock (a block's destructor queues its free).
  }

  std::size_t AllocSize(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    TORCH_CHECK(it != live_.end(), "symmetric allocation not found: ptr=", ptr, " (", kSymmMemBackendName, ")");
    return it->second.block->buffer_bytes;
  }

  bool Has(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
      if (it != live_.end() && it->second.block->owned) return true;
    }
    return StartsForeignAllocation(ptr);
  }

  void Release(const SymmMemBlock& block) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (block.owned) pending_.push_back({block.lifecycle, block.allocation_id, block.offset});
    if (block.pad_allocation_id != 0) pending_.push_back({block.lifecycle, block.pad_allocation_id, block.pad_offset});
  }

  c10::intrusive_ptr<HostSymmetricMemory> Rendezvous(void* ptr, const std::optional<std::string>& requested) {
    Runtime& runtime = Runtime::Instance();
    if (runtime.state() != LifecycleState::kInitialized) return nullptr;
    // Every symm_mem operator rendezvouses its tensor on every call: the handle made before is found first.
    if (auto cached = Cached(ptr, requested)) return cached;
    std::shared_ptr<SymmMemBlock> block = BlockOf(ptr);
    if (!block) return nullptr;   // not symmetric: torch's rendezvous answers None
    const std::optional<std::string> chosen = requested.has_value() ? requested : block->alloc_group;
    TORCH_CHECK(chosen.has_value(), "rendezvous: `group_name` must name a ProcessGroup (the tensor was allocated "
                "without one), but got None");
    const std::string& group_name = *chosen;
    // Resolved as torch's own backends resolve it: an unknown name is torch's error. A name torch gave again to a
    // new group (after destroy_process_group) is another group: its handle is made anew.
    const c10::intrusive_ptr<c10d::ProcessGroup> group = c10d::resolve_process_group(group_name);
    const SymmMemTeam team = Team(group_name);
    const int n = static_cast<int>(team.pes.size());
    // Every member must pass the same allocation (its offset and size) in the same state.
    const std::vector<std::int64_t> mine = {static_cast<std::int64_t>(block->offset),
                                            static_cast<std::int64_t>(block->buffer_bytes),
                                            block->pad != nullptr ? 1 : 0};
    if (n > 1) {
      Fingerprint fingerprint{};
      fingerprint.collective = static_cast<std::uint32_t>(Collective::kBarrier);
      fingerprint.peer = -1;
      std::snprintf(fingerprint.dtype, sizeof(fingerprint.dtype), "%s", "symm_mem_rendezvous");
      std::vector<std::vector<std::int64_t>> rows;
      {
        WithoutGil nogil;
        rows = ValueOrThrowStatus(runtime.Agree(team.id, fingerprint, mine, kDefaultStream));
      }
      for (int r = 0; r < n; ++r) {
        const auto& row = rows[static_cast<std::size_t>(r)];
        TORCH_CHECK(row == mine, "rendezvous: the ranks of group ", group_name,
                    " must pass the same symmetric allocation, but got heap_offset=", row.at(0), " bytes=", row.at(1),
                    " on rank ", r, " and heap_offset=", mine[0], " bytes=", mine[1], " on rank ", team.me);
      }
    }
    if (block->pad == nullptr && n == runtime.world_size()) {
      AddPad(*block);
      // Every member's pad is zeroed before any member's handle may signal into it.
      WithoutGil nogil;
      ThrowIfNotOk(runtime.TeamBarrier(team.id, kDefaultStream));
    }
    std::vector<void*> buffers(static_cast<std::size_t>(n)), pads;
    for (int r = 0; r < n; ++r) {
      const int pe = team.pes[static_cast<std::size_t>(r)];
      buffers[static_cast<std::size_t>(r)] = ValueOrThrowStatus(
          runtime.PeerAddress(block->base, std::max<std::size_t>(block->buffer_bytes, 1), pe, "tensor"));
      if (block->pad != nullptr) {
        pads.push_back(ValueOrThrowStatus(runtime.PeerAddress(block->pad, block->pad_bytes, pe, "signal_pad")));
      }
    }
    auto handle = c10::make_intrusive<HostSymmetricMemory>(block, team, group_name, std::move(buffers), std::move(pads));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it != live_.end() && it->second.block == block) {
      it->second.handles.insert_or_assign(group_name,
                                          CachedHandle{handle, c10::weak_intrusive_ptr<c10d::ProcessGroup>(group)});
    }
    return handle;
  }

  // The team of `group_name` (nullopt: the root), made by the Python side on first use.
  SymmMemTeam Team(const std::optional<std::string>& group_name) {
    if (group_name.has_value()) (void)c10d::resolve_process_group(*group_name);   // torch's error for a bad name
    py::gil_scoped_acquire gil;
    TORCH_CHECK(team_for_group_, "the torch handler of ", kSymmMemBackendName,
                " is not initialised: import hyper_parallel.platform.torch.symm_mem_backend first");
    try {
      py::tuple team = team_for_group_(group_name.has_value() ? py::object(py::str(*group_name)) : py::none());
      SymmMemTeam result;
      result.id = team[0].cast<std::uint64_t>();
      result.pes = team[1].cast<std::vector<int>>();
      result.me = team[2].cast<int>();
      return result;
    } catch (py::error_already_set& e) {
      TORCH_CHECK(false, DescribePython(e));
    }
  }

  // Collective over the root: frees, on every rank, the allocations every rank has let go of.
  void Flush(const SymmMemTeam& root) {
    Runtime& runtime = Runtime::Instance();
    // The count and 2n offsets fit in Agree's count row, which travels with the fingerprint: one sync per round.
    const std::size_t listed = 2 * root.pes.size();
    for (;;) {
      std::vector<Pending> mine;
      {
        std::lock_guard<std::mutex> lock(pending_mu_);
        const std::uint64_t lifecycle = runtime.lifecycle();
        pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                      [&](const Pending& p) { return p.lifecycle != lifecycle; }),
                       pending_.end());
        mine = pending_;
      }
      std::sort(mine.begin(), mine.end(), [](const Pending& a, const Pending& b) { return a.offset < b.offset; });
      std::vector<std::int64_t> values(listed + 1, -1);
      values[0] = static_cast<std::int64_t>(mine.size());
      for (std::size_t i = 0; i < std::min(listed, mine.size()); ++i) values[i + 1] = static_cast<std::int64_t>(mine[i].offset);
      std::vector<std::vector<std::int64_t>> rows;
      if (root.pes.size() > 1) {
        Fingerprint fingerprint{};
        fingerprint.collective = static_cast<std::uint32_t>(Collective::kRelease);
        fingerprint.peer = -1;
        std::snprintf(fingerprint.dtype, sizeof(fingerprint.dtype), "%s", "symm_mem_free");
        WithoutGil nogil;
        rows = ValueOrThrowStatus(runtime.Agree(root.id, fingerprint, values, kDefaultStream));
      } else {
        rows.push_back(values);
      }
      // The offsets every rank listed, in the order every rank sees them.
      std::vector<std::int64_t> common(values.begin() + 1, values.end());
      bool more = false;
      for (const auto& row : rows) {
        std::set<std::int64_t> theirs(row.begin() + 1, row.end());
        common.erase(std::remove_if(common.begin(), common.end(),
                                    [&](std::int64_t o) { return o < 0 || theirs.count(o) == 0; }),
                     common.end());
        more |= row[0] > static_cast<std::int64_t>(listed);
      }
      for (std::int64_t offset : common) {
        auto it = std::find_if(mine.begin(), mine.end(),
                               [&](const Pending& p) { return static_cast<std::int64_t>(p.offset) == offset; });
        {
          WithoutGil nogil;
          ThrowIfNotOk(runtime.Free(it->allocation_id, "symm_mem free"));
        }
        std::lock_guard<std::mutex> lock(pending_mu_);
        pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                      [&](const Pending& p) { return p.allocation_id == it->allocation_id; }),
                       pending_.end());
      }
      if (common.empty() || !more) return;
    }
  }

  py::dict State() {
    py::dict state;
    std::size_t owned = 0, foreign = 0, handles = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [base, entry] : live_) {
        (entry.block->owned ? owned : foreign) += 1;
        handles += entry.handles.size();
      }
    }
    std::size_t pending = 0;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      pending = pending_.size();
    }
    state["live_allocations"] = owned;
    state["foreign_allocations"] = foreign;
    state["cached_handles"] = handles;
    state["pending_frees"] = pending;
    return state;
  }

  // Drops every cached handle (their teams are about to be released) and the entries of foreign allocations.
  void Forget() {
    std::vector<Entry> dropped;   // destroyed after the lock is released
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = live_.begin(); it != live_.end();) {
      if (!it->second.block->owned) {
        dropped.push_back(std::move(it->second));
        it = live_.erase(it);
      } else {
        dropped.push_back(Entry{nullptr, std::move(it->second.handles)});
        it->second.handles.clear();
        ++it;
      }
    }
  }

  // The runtime's timeout (a wait given timeout_ms=0 ends there), read once per lifecycle.
  double TimeoutSec() {
    Runtime& runtime = Runtime::Instance();
    std::lock_guard<std::mutex> lock(mu_);
    if (timeout_lifecycle_ != runtime.lifecycle()) {
      timeout_sec_ = runtime.Snapshot().config.timeout_sec;
      timeout_lifecycle_ = runtime.lifecycle();
    }
    return timeout_sec_;
  }

 private:
  struct CachedHandle {
    c10::intrusive_ptr<HostSymmetricMemory> handle;
    c10::weak_intrusive_ptr<c10d::ProcessGroup> group;   // the group the name stood for
  };
  struct Entry {
    std::shared_ptr<SymmMemBlock> block;
    std::map<std::string, CachedHandle> handles;   // by group name
  };
  struct Pending {
    std::uint64_t lifecycle;
    std::uint64_t allocation_id;
    std::size_t offset;
  };
  Backend() = default;

  void EnsureRuntime() {
    py::gil_scoped_acquire gil;
    TORCH_CHECK(ensure_runtime_, "the torch handler of ", kSymmMemBackendName,
                " is not initialised: import hyper_parallel.platform.torch.symm_mem_backend first");
    try {
      ensure_runtime_();
    } catch (py::error_already_set& e) {
      TORCH_CHECK(false, DescribePython(e));
    }
  }

  // Whether an active allocation starts at `ptr` (the byte before it lies outside that allocation).
  static bool StartsForeignAllocation(void* ptr) {
    Runtime& runtime = Runtime::Instance();
    if (runtime.state() != LifecycleState::kInitialized || ptr == nullptr) return false;
    auto range = runtime.ResolveSymmetric(ptr, 1, "tensor");
    if (!range.ok()) return false;
    auto before = runtime.ResolveSymmetric(static_cast<char*>(ptr) - 1, 1, "tensor");
    return !before.ok() || before->allocation_id != range->allocation_id;
  }

  // The active allocation of the other API that starts at `ptr`, if any.
  static std::optional<AllocationInfo> ForeignAllocation(void* ptr) {
    if (!StartsForeignAllocation(ptr)) return std::nullopt;
    const auto id = Runtime::Instance().ResolveSymmetric(ptr, 1, "tensor")->allocation_id;
    for (const AllocationInfo& info : Runtime::Instance().Snapshot().active) {
      if (info.id == id) return info;
    }
    return std::nullopt;
  }

  // The handle made before for the allocation starting at `ptr` over `requested` (else the allocation's group),
  // while that allocation is still the one it was made for (of this lifecycle; for the other API's allocation, not
  // freed since) and the group's name still stands for the group it was made over; else null. One lock, one
  // lookup in torch's group registry, no copy of a name.
  c10::intrusive_ptr<HostSymmetricMemory> Cached(void* ptr, const std::optional<std::string>& requested) {
    std::optional<CachedHandle> found;
    const std::string* group_name = nullptr;   // in `requested`, or in the block `found->handle` keeps alive
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
      if (it == live_.end() || it->second.block->lifecycle != Runtime::Instance().lifecycle()) return nullptr;
      const std::optional<std::string>& chosen = requested.has_value() ? requested : it->second.block->alloc_group;
      if (!chosen.has_value()) return nullptr;
      auto cached = it->second.handles.find(*chosen);
      if (cached == it->second.handles.end()) return nullptr;
      found.emplace(cached->second);
      group_name = &*chosen;
    }
    const SymmMemBlock& block = found->handle->block();
    if (!block.owned) {
      auto range = Runtime::Instance().ResolveSymmetric(ptr, 1, "tensor");
      if (!range.ok() || range->allocation_id != block.allocation_id) return nullptr;
    }
    // An unknown name is torch's error, as on the first rendezvous. The handle's team is not looked up again: it is
    // released only once its group is destroyed or its name given to another group (both seen here), at the end of
    // the lifecycle (seen above) or after Forget dropped the handle.
    const c10::intrusive_ptr<c10d::ProcessGroup> group = c10d::resolve_process_group(*group_name);
    if (found->group.lock().get() != group.get()) return nullptr;
    return found->handle;
  }

  // The block of the allocation starting at `ptr`: one of torch's API, or one of the other API (made on first use,
  // dropped once that allocation is freed).
  std::shared_ptr<SymmMemBlock> BlockOf(void* ptr) {
    const auto key = reinterpret_cast<std::uintptr_t>(ptr);
    const std::uint64_t lifecycle = Runtime::Instance().lifecycle();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(key);
      if (it != live_.end() && it->second.block->lifecycle == lifecycle) {
        if (it->second.block->owned) return it->second.block;
      }
    }
    std::optional<AllocationInfo> info = ForeignAllocation(ptr);
    std::optional<Entry> stale;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(key);
    if (it != live_.end() && it->second.block->owned && it->second.block->lifecycle == lifecycle) {
      return it->second.block;
    }
    if (it != live_.end() && info.has_value() && it->second.block->allocation_id == info->id &&
        it->second.block->lifecycle == lifecycle) {
      return it->second.block;
    }
    if (it != live_.end()) {   // freed through the other API, or an ended lifecycle
      stale.emplace(std::move(it->second));
      live_.erase(it);
    }
    if (!info.has_value()) return nullptr;
    auto block = std::make_shared<SymmMemBlock>();
    block->lifecycle = info->lifecycle;
    block->allocation_id = info->id;
    block->base = reinterpret_cast<char*>(info->base);
    block->offset = info->offset;
    block->buffer_bytes = info->bytes;
    live_.insert_or_assign(key, Entry{block, {}});
    return block;
  }

  // Collective over the root (the group of this rendezvous): a signal pad for an allocation of the other API.
  void AddPad(SymmMemBlock& block) {
    const std::size_t pad_bytes = c10d::symmetric_memory::get_signal_pad_size();
    AllocationInfo info;
    {
      WithoutGil nogil;
      info = ValueOrThrowStatus(Runtime::Instance().Allocate(pad_bytes, kPadAlignment, "symm_mem signal pad"));
    }
    std::memset(reinterpret_cast<void*>(info.base), 0, pad_bytes);
    block.pad = reinterpret_cast<char*>(info.base);
    block.pad_bytes = pad_bytes;
    block.pad_allocation_id = info.id;
    block.pad_offset = info.offset;
  }

  std::mutex mu_;
  std::map<std::uintptr_t, Entry> live_;
  std::mutex pending_mu_;
  std::vector<Pending> pending_;
  py::object ensure_runtime_;
  py::object team_for_group_;
  double timeout_sec_ = 0;
  std::uint64_t timeout_lifecycle_ = 0;
};

class HostSymmetricMemoryAllocator final : public c10d::symmetric_memory::SymmetricMemoryAllocator {
 public:
  void* alloc(size_t size, int /*device_idx*/, const std::optional<std::string>& group_name) override {
    return Backend::Get().Alloc(size, group_name);
  }
  void free(void* ptr) override { Backend::Get().Free(ptr); }
  size_t get_alloc_size(void* ptr) override { return Backend::Get().AllocSize(ptr); }
#ifdef HP_SYMM_MEM_HAS_ALLOC_ID
  // torch checks at rendezvous that every rank reuses the same slot: the heap offset is the same on every rank.
  int64_t get_alloc_id(void* ptr) override {
    return Backend::Get().Has(ptr) ? static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(ptr)) : -1;
  }
#endif
  c10::intrusive_ptr<c10d::symmetric_memory::SymmetricMemory> rendezvous(
      void* ptr, const std::optional<std::string>& group_name) override {
    return Backend::Get().Rendezvous(ptr, group_name);
  }
  bool has_multicast_support(int /*device_idx*/) override { return false; }
  c10::DeviceType supported_device_type() override { return c10::DeviceType::CPU; }
  std::string name() override { return kSymmMemBackendName; }
  bool has_allocation(void* ptr) override { return Backend::Get().Has(ptr); }
};

// Waits until the word at `word` holds `expected`, then swaps in `desired`; false once `deadline` passed.
bool SwapWhenEqual(std::uint32_t* word, std::uint32_t expected, std::uint32_t desired, std::memory_order order,
                   Clock::time_point deadline) {
  std::atomic_ref<std::uint32_t> ref(*word);
  for (std::uint64_t spin = 0;; ++spin) {
    std::uint32_t seen = expected;
    if (ref.load(std::memory_order_relaxed) == expected &&
        ref.compare_exchange_strong(seen, desired, order, std::memory_order_relaxed)) {
      return true;
    }
    if (spin < 64) continue;
    if (Clock::now() >= deadline) return false;
    if (spin % 4096 == 0 && InterruptRequested()) TORCH_CHECK(false, "interrupted while waiting on a signal pad");
    // Ranks share the cores: yield first, then sleep, so that a late peer gets to run.
    if (spin < 1024) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

Clock::time_point Deadline(std::size_t timeout_ms) {
  if (timeout_ms == 0) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(Backend::Get().TimeoutSec()));
  }
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

}  // namespace

SymmMemBlock::~SymmMemBlock() { Backend::Get().Release(*this); }

HostSymmetricMemory::HostSymmetricMemory(std::shared_ptr<SymmMemBlock> block, SymmMemTeam team,
                                         std::string group_name, std::vector<void*> buffers, std::vector<void*> pads)
    : block_(std::move(block)),
      team_(std::move(team)),
      group_name_(std::move(group_name)),
      buffers_(std::move(buffers)),
      pads_(std::move(pads)) {}

void HostSymmetricMemory::CheckLive(const char* op) const {
  Runtime& runtime = Runtime::Instance();
  bool live = runtime.state() == LifecycleState::kInitialized && runtime.lifecycle() == block_->lifecycle;
  if (live && !block_->owned) {
    auto range = runtime.ResolveSymmetric(block_->base, 1, "tensor");
    live = range.ok() && range->allocation_id == block_->allocation_id;
  }
  TORCH_CHECK(live, op, ": the symmetric allocation of this handle was freed: allocation_id=", block_->allocation_id,
              " lifecycle=", block_->lifecycle, " (a handle of a shmem.empty / symm.empty tensor dies with its free)");
}

std::vector<void*> HostSymmetricMemory::get_buffer_ptrs() {
  CheckLive("get_buffer_ptrs");
  return buffers_;
}

std::vector<void*> HostSymmetricMemory::get_signal_pad_ptrs() {
  RequirePad("get_signal_pad_ptrs");
  return pads_;
}

void** HostSymmetricMemory::get_buffer_ptrs_dev() {
  CheckLive("get_buffer_ptrs_dev");
  return buffers_.data();
}

void** HostSymmetricMemory::get_signal_pad_ptrs_dev() {
  RequirePad("get_signal_pad_ptrs_dev");
  return pads_.data();
}

size_t HostSymmetricMemory::get_buffer_size() { return block_->buffer_bytes; }

void HostSymmetricMemory::RequirePad(const char* op) const {
  CheckLive(op);
  TORCH_CHECK(!pads_.empty(), op, ": this handle has no signal pad: group=", group_name_,
              " (a tensor of shmem.empty / symm.empty gets one when it is first rendezvoused over every rank of the "
              "root; this one was first rendezvoused over a smaller group)");
}

std::size_t HostSymmetricMemory::Slot(int peer, int channel, const char* op, const char* peer_name) const {
  const int world = static_cast<int>(team_.pes.size());
  TORCH_CHECK(peer >= 0 && peer < world, op, ": ", peer_name, " must be in [0, ", world, ") (got ", peer, ")");
  const std::size_t channels = block_->pad_bytes / sizeof(std::uint32_t) / static_cast<std::size_t>(world);
  TORCH_CHECK(channel >= 0, op, ": channel for barrier(), put_signal() and wait_signal() must be greater than or "
              "equal to 0 (got ", channel, ")");
  TORCH_CHECK(static_cast<std::size_t>(channel) < channels,
              "The maximum supported channel for barrier(), put_signal() and wait_signal() is ", channels - 1,
              " (got ", channel, ")");
  return static_cast<std::size_t>(channel) * static_cast<std::size_t>(world) + static_cast<std::size_t>(peer);
}

void HostSymmetricMemory::put_signal(int dst_rank, int channel, size_t timeout_ms) {
  RequirePad("put_signal");
  (void)Slot(dst_rank, channel, "put_signal", "dst_rank");
  const std::size_t slot = Slot(team_.me, channel, "put_signal", "rank");
  auto* word = static_cast<std::uint32_t*>(pads_[static_cast<std::size_t>(dst_rank)]) + slot;
  WithoutGil nogil;
  TORCH_CHECK(SwapWhenEqual(word, 0, 1, std::memory_order_release, Deadline(timeout_ms)),
              "put_signal timed out: rank=", team_.me, " dst_rank=", dst_rank, " channel=", channel, " timeout_ms=",
              timeout_ms, " (rank ", dst_rank, " has not waited for this rank's previous signal on the channel)");
}

void HostSymmetricMemory::wait_signal(int src_rank, int channel, size_t timeout_ms) {
  RequirePad("wait_signal");
  const std::size_t slot = Slot(src_rank, channel, "wait_signal", "src_rank");
  auto* word = static_cast<std::uint32_t*>(pads_[static_cast<std::size_t>(team_.me)]) + slot;
  WithoutGil nogil;
  TORCH_CHECK(SwapWhenEqual(word, 1, 0, std::memory_order_acquire, Deadline(timeout_ms)),
              "wait_signal timed out: rank=", team_.me, " src_rank=", src_rank, " channel=", channel, " timeout_ms=",
              timeout_ms, " (no signal arrived from rank ", src_rank, ")");
}

void HostSymmetricMemory::barrier(int channel, size_t timeout_ms) {
  if (pads_.empty()) {   // no signal pad (see RequirePad): the team's own barrier, with the runtime's timeout
    CheckLive("barrier");
    WithoutGil nogil;
    ThrowIfNotOk(Runtime::Instance().TeamBarrier(team_.id, kDefaultStream));
    return;
  }
  CheckLive("barrier");
  const int world = get_world_size();
  const std::size_t mine = Slot(team_.me, channel, "barrier", "rank");
  const Clock::time_point deadline = Deadline(timeout_ms);
  WithoutGil nogil;
  for (int step = 1; step < world; ++step) {
    const int peer = (team_.me + step) % world;
    auto* word = static_cast<std::uint32_t*>(pads_[static_cast<std::size_t>(peer)]) + mine;
    TORCH_CHECK(SwapWhenEqual(word, 0, 1, std::memory_order_release, deadline), "barrier timed out: rank=", team_.me,
                " peer=", peer, " channel=", channel, " timeout_ms=", timeout_ms,
                " step=signal (rank ", peer, " has not taken this rank's signal of the previous barrier)");
  }
  for (int step = 1; step < world; ++step) {
    const int peer = (team_.me + world - step) % world;
    const std::size_t slot = static_cast<std::size_t>(channel) * static_cast<std::size_t>(world) +
                             static_cast<std::size_t>(peer);
    auto* word = static_cast<std::uint32_t*>(pads_[static_cast<std::size_t>(team_.me)]) + slot;
    TORCH_CHECK(SwapWhenEqual(word, 1, 0, std::memory_order_acquire, deadline), "barrier timed out: rank=", team_.me,
                " peer=", peer, " channel=", channel, " timeout_ms=", timeout_ms, " step=wait (rank ", peer,
                " did not arrive)");
  }
}

c10::intrusive_ptr<HostSymmetricMemory> SymmMemHandleIfSymmetric(const at::Tensor& tensor,
                                                                 const std::string& group_name, const char* op,
                                                                 const char* what) {
  TORCH_CHECK(tensor.device().is_cpu(), op, ": ", what, " must be a CPU tensor, but got ", tensor.device());
  auto handle = c10d::symmetric_memory::rendezvous(tensor, group_name);
  if (!handle) return nullptr;
  auto* host = dynamic_cast<HostSymmetricMemory*>(handle.get());
  TORCH_CHECK(host != nullptr, op, ": ", what, " must be a tensor of the ", kSymmMemBackendName,
              " backend (the CPU backend), but got one of ",
              c10d::symmetric_memory::get_backend(tensor.device()).value_or("no backend"));
  host->CheckLive(op);
  return c10::intrusive_ptr<HostSymmetricMemory>::reclaim_copy(host);
}

c10::intrusive_ptr<HostSymmetricMemory> SymmMemHandle(const at::Tensor& tensor, const std::string& group_name,
                                                      const char* op, const char* what) {
  auto handle = SymmMemHandleIfSymmetric(tensor, group_name, op, what);
  TORCH_CHECK(handle, op, ": ", what, " must be allocated with empty_strided_p2p().");
  return handle;
}

std::int64_t HostSymmetricMemory::HeapOffsetOf(const void* address) const {
  return static_cast<std::int64_t>(block_->offset) + (static_cast<const char*>(address) - block_->base);
}

SymmMemTeam SymmMemTeamOf(const std::string& group_name) { return Backend::Get().Team(group_name); }

void RegisterSymmMemBackend(py::module_& m) {
  auto allocator = c10::make_intrusive<HostSymmetricMemoryAllocator>();
  c10d::symmetric_memory::register_allocator(c10::DeviceType::CPU, allocator);
  c10d::symmetric_memory::register_availability(kSymmMemBackendName, allocator);
  m.attr("symm_mem_backend_name") = kSymmMemBackendName;
  m.attr("symm_mem_torch_checks_pad_rank") = static_cast<bool>(HP_SYMM_MEM_TORCH_CHECKS_PAD_RANK);
  m.def(
      "symm_mem_set_hooks",
      [](py::object ensure_runtime, py::object team_for_group) {
        Backend::Get().SetHooks(std::move(ensure_runtime), std::move(team_for_group));
      },
      py::arg("ensure_runtime"), py::arg("team_for_group"),
      "ensure_runtime() acquires the runtime; team_for_group(name or None) -> (team id, pes, group rank).");
  m.def(
      "symm_mem_flush", [] { Backend::Get().Flush(Backend::Get().Team(std::nullopt)); },
      "Collective over the root: frees the allocations of torch's API that every rank has let go of.");
  m.def(
      "symm_mem_forget", [] { Backend::Get().Forget(); },
      "Drops the cached handles (their teams are released next).");
  m.def("symm_mem_state", [] { return Backend::Get().State(); });
  m.def("symm_mem_register_ops", &RegisterSymmMemOps,
        "Registers the CPU kernels of the symm_mem operators (once torch's Python module defined its own).");
}

}  // namespace hp::shmem::torch_binding
