// The fake CANN SHMEM host API: sessions keyed by the unique id, one heap per PE, stream-enqueued data plane.
#include <chrono>
#include <cstring>

#include "fake_world.h"
#include "shmem.h"

using hp::fakes::FakeCall;
using hp::fakes::InitRecord;
using hp::fakes::internal::CurrentProcess;
using hp::fakes::internal::DeviceMemory;
using hp::fakes::internal::HostView;
using hp::fakes::internal::Pe;
using hp::fakes::internal::Process;
using hp::fakes::internal::Session;
using hp::fakes::internal::Stream;
using hp::fakes::internal::World;

namespace {

constexpr char kUidMagic[8] = {'h', 'p', 'f', 'a', 'k', 'e', 'i', 'd'};
// What CANN SHMEM allocates from the heap for itself at init (its put/get signal word, 512 bytes).
constexpr std::size_t kInternalReservation = 512;

FakeCall Named(const char* name, void* stream = nullptr) {
  FakeCall call;
  call.name = name;
  call.stream = reinterpret_cast<std::uintptr_t>(stream);
  return call;
}

Pe* CurrentPe() { return CurrentProcess().pe.get(); }

// The device address at `local`'s heap offset in `pe`'s heap, or nullptr when `local` is outside the caller's heap.
char* Translate(const Pe& self, const void* local, std::size_t bytes, int pe) {
  const auto* address = static_cast<const char*>(local);
  if (pe < 0 || pe >= self.session->n_pes) return nullptr;
  if (address < self.heap || address >= self.heap + self.heap_size) return nullptr;
  const std::size_t offset = static_cast<std::size_t>(address - self.heap);
  if (bytes > self.heap_size - offset) return nullptr;
  return self.session->heaps[static_cast<std::size_t>(pe)]->device_base() + offset;
}

// The host view of a put/get's local buffer, empty unless it is memory of the NPU that runs the copy (`device`):
// the copy kernel cannot read or write host memory.
HostView LocalBuffer(const void* address, std::size_t bytes, int device) {
  HostView view = HostView::Of(address, bytes);
  if (view && view.memory->device() != device) return {};
  return view;
}

constexpr int kKernelFault = ACL_ERROR_RT_AICORE_EXCEPTION;   // what a copy kernel's bad address reports

bool Compare(int32_t observed, int cmp, int32_t expected) {
  switch (cmp) {
    case ACLSHMEM_CMP_EQ: return observed == expected;
    case ACLSHMEM_CMP_NE: return observed != expected;
    case ACLSHMEM_CMP_GT: return observed > expected;
    case ACLSHMEM_CMP_GE: return observed >= expected;
    case ACLSHMEM_CMP_LT: return observed < expected;
    case ACLSHMEM_CMP_LE: return observed <= expected;
    default: return false;
  }
}

// Enqueues `task` on `stream` (NULL: the PE's default stream) for a stream-enqueued call. The call returns void,
// so every problem becomes an error of the stream: an injected failure, no PE, an unknown stream (recorded only).
void EnqueueCall(World& world, const char* name, void* stream, hp::fakes::internal::Task task) {
  Pe* self = CurrentPe();
  void* target = stream != nullptr ? stream : (self != nullptr ? self->default_stream : nullptr);
  if (const int code = world.TakeFailure(name)) {
    task = [code](const Stream&) { return code; };
  } else if (self == nullptr) {
    task = [](const Stream&) { return kKernelFault; };
  }
  world.Enqueue(target, std::move(task));
}

}  // namespace

extern "C" {

int aclshmemx_init_status(void) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_init_status"));
  return CurrentPe() != nullptr ? ACLSHMEM_STATUS_IS_INITIALIZED : ACLSHMEM_STATUS_NOT_INITIALIZED;
}

int32_t aclshmemx_set_conf_store_tls(bool enable, const char* tls_info, const uint32_t tls_info_len) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_set_conf_store_tls");
  call.value = enable ? 1 : 0;
  call.bytes = tls_info_len;
  world.Record(call);
  if (const int code = world.TakeFailure("aclshmemx_set_conf_store_tls")) return code;
  Process& process = CurrentProcess();
  process.tls_decided = true;
  process.tls_enable = enable;
  process.tls_info = tls_info;   // CANN keeps the pointer, not a copy
  process.tls_info_len = tls_info_len;
  return ACLSHMEM_SUCCESS;
}

int aclshmemx_get_uniqueid(aclshmemx_uniqueid_t* uid) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_get_uniqueid"));
  if (const int code = world.TakeFailure("aclshmemx_get_uniqueid")) return code;
  if (uid == nullptr) return ACLSHMEM_INVALID_PARAM;
  auto session = std::make_shared<Session>();
  session->id = world.next_session++;
  world.sessions.emplace(session->id, session);
  *uid = aclshmemx_uniqueid_t{};
  uid->version = ACLSHMEM_UNIQUEID_VERSION;
  std::memcpy(uid->internal, kUidMagic, sizeof(kUidMagic));
  std::memcpy(uid->internal + sizeof(kUidMagic), &session->id, sizeof(session->id));
  return ACLSHMEM_SUCCESS;
}

int aclshmemx_set_attr_uniqueid_args(int my_pe, int n_pes, int64_t local_mem_size, aclshmemx_uniqueid_t* uid,
                                     aclshmemx_init_attr_t* aclshmem_attr) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_set_attr_uniqueid_args");
  call.target_pe = my_pe;
  call.value = n_pes;
  call.bytes = static_cast<std::size_t>(local_mem_size);
  world.Record(call);
  if (const int code = world.TakeFailure("aclshmemx_set_attr_uniqueid_args")) return code;
  if (local_mem_size > static_cast<int64_t>(ACLSHMEM_MAX_LOCAL_SIZE) || n_pes > ACLSHMEM_MAX_PES ||
      my_pe >= ACLSHMEM_MAX_PES) {
    return ACLSHMEM_INVALID_VALUE;
  }
  aclshmem_attr->comm_args = uid;
  aclshmem_attr->my_pe = my_pe;
  aclshmem_attr->n_pes = n_pes;
  aclshmem_attr->local_mem_size = static_cast<uint64_t>(local_mem_size);
  return ACLSHMEM_SUCCESS;
}

int aclshmemx_init_attr(aclshmemx_bootstrap_t bootstrap_flags, aclshmemx_init_attr_t* attributes) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_init_attr");
  call.op = static_cast<int>(bootstrap_flags);
  if (attributes != nullptr) {
    call.target_pe = attributes->my_pe;
    call.value = attributes->n_pes;
    call.bytes = attributes->local_mem_size;
  }
  world.Record(call);
  Process& process = CurrentProcess();
  if (const int code = world.TakeFailure("aclshmemx_init_attr")) return code;
  if (process.pe) return ACLSHMEM_INNER_ERROR;   // "do not call init interface repeatedly"
  if (attributes == nullptr) return ACLSHMEM_INVALID_PARAM;
  if (bootstrap_flags != ACLSHMEMX_INIT_WITH_UNIQUEID) return ACLSHMEM_NOT_SUPPORTED;   // the only mode faked
  const aclshmemx_init_attr_t& attr = *attributes;
  if (attr.my_pe < 0 || attr.n_pes <= 0 || attr.n_pes > ACLSHMEM_MAX_PES) return ACLSHMEM_INVALID_VALUE;
  if (attr.my_pe >= attr.n_pes) return ACLSHMEM_INVALID_PARAM;
  if (attr.local_mem_size == 0 || attr.local_mem_size > ACLSHMEM_MAX_LOCAL_SIZE) return ACLSHMEM_INVALID_VALUE;
  // Stricter than the release, which rounds up: the fake insists on whole pages so that callers round themselves.
  if (attr.local_mem_size % ACLSHMEM_PAGE_SIZE != 0) return ACLSHMEM_INVALID_VALUE;
  if (attr.option_attr.shm_init_timeout == 0 || attr.option_attr.control_operation_timeout == 0) {
    return ACLSHMEM_INVALID_VALUE;
  }
  if (process.device < 0) return ACLSHMEM_INNER_ERROR;   // CANN needs aclrtSetDevice first
  const auto* uid = static_cast<const aclshmemx_uniqueid_t*>(attr.comm_args);
  if (uid == nullptr || uid->version != ACLSHMEM_UNIQUEID_VERSION ||
      std::memcmp(uid->internal, kUidMagic, sizeof(kUidMagic)) != 0) {
    return ACLSHMEM_BOOTSTRAP_ERROR;
  }
  std::uint64_t session_id = 0;
  std::memcpy(&session_id, uid->internal + sizeof(kUidMagic), sizeof(session_id));
  auto found = world.sessions.find(session_id);
  if (found == world.sessions.end()) return ACLSHMEM_BOOTSTRAP_ERROR;
  std::shared_ptr<Session> session = found->second;
  if (session->n_pes == 0) {
    session->n_pes = attr.n_pes;
    session->local_mem_size = attr.local_mem_size;
    session->pes.assign(static_cast<std::size_t>(attr.n_pes), nullptr);
    session->heaps.assign(static_cast<std::size_t>(attr.n_pes), nullptr);
  }
  if (session->n_pes != attr.n_pes) return ACLSHMEM_INVALID_PARAM;
  if (session->local_mem_size != attr.local_mem_size) return ACLSHMEM_INVALID_VALUE;
  if (session->heaps[static_cast<std::size_t>(attr.my_pe)]) return ACLSHMEM_BOOTSTRAP_ERROR;

  InitRecord record;
  record.bootstrap_flags = static_cast<int>(bootstrap_flags);
  record.attr = attr;
  record.uid = *uid;
  record.tls_decided = process.tls_decided;
  record.tls_enable = process.tls_enable;
  if (process.tls_enable && process.tls_info != nullptr) record.tls_info.assign(process.tls_info, process.tls_info_len);
  process.last_init = record;

  auto pe = std::make_shared<Pe>();
  pe->session = session;
  pe->my_pe = attr.my_pe;
  pe->heap_size = attr.local_mem_size;
  std::shared_ptr<DeviceMemory> heap = DeviceMemory::Create(pe->heap_size, ACLSHMEM_PAGE_SIZE, process.device);
  if (!heap) return ACLSHMEM_SMEM_ERROR;
  pe->heap = heap->device_base();
  pe->allocator = hp::fakes::FakeHeap(pe->heap_size);
  (void)pe->allocator.Allocate(kInternalReservation, hp::fakes::FakeHeap::kGranule);
  pe->default_stream = world.CreateStream(process.device);
  session->heaps[static_cast<std::size_t>(attr.my_pe)] = std::move(heap);
  session->pes[static_cast<std::size_t>(attr.my_pe)] = pe.get();
  ++session->joined;
  world.changed.notify_all();
  // Init ends with a control-plane barrier over every PE.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(attr.option_attr.shm_init_timeout);
  if (!world.changed.wait_until(lock, deadline, [&] {
        for (const auto& joined : session->heaps) {
          if (!joined) return false;
        }
        return true;
      })) {
    session->pes[static_cast<std::size_t>(attr.my_pe)] = nullptr;
    --session->joined;
    world.DestroyStream(pe->default_stream, lock);
    return ACLSHMEM_TIMEOUT_ERROR;
  }
  process.pe = std::move(pe);
  return ACLSHMEM_SUCCESS;
}

int aclshmem_finalize(void) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  world.Record(Named("aclshmem_finalize"));
  if (const int code = world.TakeFailure("aclshmem_finalize")) return code;
  Process& process = CurrentProcess();
  if (!process.pe) return ACLSHMEM_SUCCESS;   // as the release: nothing to release
  std::shared_ptr<Pe> pe = std::move(process.pe);
  // CANN synchronizes and destroys its default stream.
  (void)world.Synchronize(pe->default_stream, -1, lock);
  world.DestroyStream(pe->default_stream, lock);
  std::shared_ptr<Session> session = pe->session;
  session->pes[static_cast<std::size_t>(pe->my_pe)] = nullptr;
  if (--session->joined == 0) world.sessions.erase(session->id);
  return ACLSHMEM_SUCCESS;
}

void aclshmem_info_get_version(int* major, int* minor) {
  *major = 1;
  *minor = 1;
}

void* aclshmem_align(size_t alignment, size_t size) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_align");
  call.bytes = size;
  call.value = static_cast<std::int64_t>(alignment);
  world.Record(call);
  if (world.TakeFailure("aclshmem_align")) return nullptr;
  Pe* self = CurrentPe();
  if (self == nullptr) return nullptr;
  auto offset = self->allocator.Allocate(size, alignment);
  return offset ? self->heap + *offset : nullptr;
}

void* aclshmem_malloc(size_t size) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_malloc");
  call.bytes = size;
  world.Record(call);
  if (world.TakeFailure("aclshmem_malloc")) return nullptr;
  Pe* self = CurrentPe();
  if (self == nullptr) return nullptr;
  auto offset = self->allocator.Allocate(size, hp::fakes::FakeHeap::kGranule);
  return offset ? self->heap + *offset : nullptr;
}

void aclshmem_free(void* ptr) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_free");
  call.address = reinterpret_cast<std::uintptr_t>(ptr);
  world.Record(call);
  Pe* self = CurrentPe();
  if (self == nullptr || ptr == nullptr) return;
  const auto* address = static_cast<const char*>(ptr);
  if (address < self->heap || address >= self->heap + self->heap_size) return;   // the release only logs
  (void)self->allocator.Free(static_cast<std::size_t>(address - self->heap));
}

void* aclshmemx_get_heap_base(aclshmem_mem_type_t mem_type) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_get_heap_base"));
  Pe* self = CurrentPe();
  if (self == nullptr || mem_type != DEVICE_SIDE) return nullptr;
  return self->heap;
}

void* aclshmem_ptr(void* ptr, int pe) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_ptr");
  call.address = reinterpret_cast<std::uintptr_t>(ptr);
  call.target_pe = pe;
  world.Record(call);
  Pe* self = CurrentPe();
  if (self == nullptr) return nullptr;
  return Translate(*self, ptr, 0, pe);
}

int aclshmem_my_pe(void) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return CurrentPe() != nullptr ? CurrentPe()->my_pe : -1;
}

int aclshmem_n_pes(void) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return CurrentPe() != nullptr ? CurrentPe()->session->n_pes : -1;
}

void aclshmemx_putmem_on_stream(void* dst, void* src, size_t elem_size, int32_t pe, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_putmem_on_stream", stream);
  call.address = reinterpret_cast<std::uintptr_t>(dst);
  call.bytes = elem_size;
  call.target_pe = pe;
  world.Record(call);
  Pe* self = CurrentPe();
  char* remote = self != nullptr ? Translate(*self, dst, elem_size, pe) : nullptr;
  EnqueueCall(world, "aclshmemx_putmem_on_stream", stream, [remote, src, elem_size](const Stream& on) {
    const HostView to = HostView::Of(remote, elem_size);
    const HostView from = LocalBuffer(src, elem_size, on.device);
    if (!to || !from) return kKernelFault;
    std::memmove(to.host, from.host, elem_size);
    return static_cast<int>(ACL_SUCCESS);
  });
}

void aclshmemx_getmem_on_stream(void* dst, void* src, size_t elem_size, int32_t pe, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_getmem_on_stream", stream);
  call.address = reinterpret_cast<std::uintptr_t>(src);
  call.bytes = elem_size;
  call.target_pe = pe;
  world.Record(call);
  Pe* self = CurrentPe();
  const char* remote = self != nullptr ? Translate(*self, src, elem_size, pe) : nullptr;
  EnqueueCall(world, "aclshmemx_getmem_on_stream", stream, [dst, remote, elem_size](const Stream& on) {
    const HostView to = LocalBuffer(dst, elem_size, on.device);
    const HostView from = HostView::Of(remote, elem_size);
    if (!to || !from) return kKernelFault;
    std::memmove(to.host, from.host, elem_size);
    return static_cast<int>(ACL_SUCCESS);
  });
}

void aclshmemx_quiet_on_stream(aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_quiet_on_stream", stream));
  // Copies of the fake complete inside their task: by stream order there is nothing left to wait for.
  EnqueueCall(world, "aclshmemx_quiet_on_stream", stream, [](const Stream&) { return static_cast<int>(ACL_SUCCESS); });
}

void aclshmemx_signal_op_on_stream(int32_t* sig_addr, int32_t signal, int sig_op, int pe, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_signal_op_on_stream", stream);
  call.address = reinterpret_cast<std::uintptr_t>(sig_addr);
  call.bytes = sizeof(int32_t);
  call.target_pe = pe;
  call.value = signal;
  call.op = sig_op;
  world.Record(call);
  Pe* self = CurrentPe();
  const char* remote = self != nullptr ? Translate(*self, sig_addr, sizeof(int32_t), pe) : nullptr;
  EnqueueCall(world, "aclshmemx_signal_op_on_stream", stream, [&world, remote, signal, sig_op](const Stream&) {
    const HostView target = HostView::Of(remote, sizeof(int32_t));
    if (!target || (sig_op != ACLSHMEM_SIGNAL_SET && sig_op != ACLSHMEM_SIGNAL_ADD)) return kKernelFault;
    auto* word = reinterpret_cast<int32_t*>(target.host);
    std::lock_guard<std::mutex> signal_lock(world.mu);
    if (sig_op == ACLSHMEM_SIGNAL_SET) {
      __atomic_store_n(word, signal, __ATOMIC_SEQ_CST);
    } else {
      __atomic_fetch_add(word, signal, __ATOMIC_SEQ_CST);
    }
    world.changed.notify_all();
    return static_cast<int>(ACL_SUCCESS);
  });
}

void aclshmemx_signal_wait_until_on_stream(int32_t* sig_addr, int cmp, int32_t cmp_val, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_signal_wait_until_on_stream", stream);
  call.address = reinterpret_cast<std::uintptr_t>(sig_addr);
  call.bytes = sizeof(int32_t);
  call.value = cmp_val;
  call.op = cmp;
  world.Record(call);
  Pe* self = CurrentPe();
  const bool inside = self != nullptr && Translate(*self, sig_addr, sizeof(int32_t), self->my_pe) != nullptr;
  EnqueueCall(world, "aclshmemx_signal_wait_until_on_stream", stream,
              [&world, inside, sig_addr, cmp, cmp_val](const Stream& self_stream) {
                const HostView watched = HostView::Of(sig_addr, sizeof(int32_t));
                if (!inside || !watched || cmp < ACLSHMEM_CMP_EQ || cmp > ACLSHMEM_CMP_LE) return kKernelFault;
                const auto* word = reinterpret_cast<const int32_t*>(watched.host);
                std::unique_lock<std::mutex> wait_lock(world.mu);
                world.WaitInTask(self_stream, wait_lock,
                                 [&] { return Compare(__atomic_load_n(word, __ATOMIC_SEQ_CST), cmp, cmp_val); });
                return static_cast<int>(ACL_SUCCESS);
              });
}

void aclshmemx_barrier_all_on_stream(aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_barrier_all_on_stream", stream));
  std::shared_ptr<Pe> self = CurrentProcess().pe;
  EnqueueCall(world, "aclshmemx_barrier_all_on_stream", stream, [&world, self](const Stream& self_stream) {
    if (!self) return kKernelFault;
    std::unique_lock<std::mutex> wait_lock(world.mu);
    Session& session = *self->session;
    const std::uint64_t epoch = ++self->barrier_epoch;
    ++session.barrier_arrivals;
    world.changed.notify_all();
    const std::uint64_t target = epoch * static_cast<std::uint64_t>(session.n_pes);
    world.WaitInTask(self_stream, wait_lock, [&] { return session.barrier_arrivals >= target; });
    return static_cast<int>(ACL_SUCCESS);
  });
}

}  // extern "C"
