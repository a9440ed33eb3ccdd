// The fake CANN SHMEM host API: sessions keyed by the unique id, one heap per PE, stream-enqueued data plane.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

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
// What CANN SHMEM allocates from the heap for itself at init, in its order (src/host/init/shmem_init.cpp): the
// put/get signal word (aclshmemi_signal_init, 512 bytes), then every team's sync pool and sync counters
// (aclshmemi_team_init). User allocations start after them, about 5.13 MiB into the heap.
constexpr std::size_t kSignalReservation = 512;
// The interfaces of every simulated host (SHMEM_UID_SOCK_IFNAME must name one of them).
constexpr const char* kInterfaces[] = {"lo", "eth0"};

FakeCall Named(const char* name, void* stream = nullptr) {
  FakeCall call;
  call.name = name;
  call.stream = reinterpret_cast<std::uintptr_t>(stream);
  return call;
}

// The calling process's PE once init succeeded (a half-initialised one is not usable).
Pe* CurrentPe() {
  Pe* pe = CurrentProcess().pe.get();
  return pe != nullptr && pe->initialized ? pe : nullptr;
}

// CANN's control-plane barrier over every PE of `self`'s session (init's last step, every malloc/calloc/align):
// bounded by the control-operation timeout, which unique-id mode fixes at DEFAULT_TIMEOUT. Returns the code
// aclshmemi_control_barrier_all would (an injected failure, or a timeout). `lock` holds world.mu.
int ControlBarrier(World& world, Pe& self, std::unique_lock<std::mutex>& lock) {
  if (const int code = world.TakeFailure("aclshmemi_control_barrier_all")) return code;
  Session& session = *self.session;
  const std::uint64_t epoch = ++self.control_epoch;
  ++session.control_arrivals;
  world.changed.notify_all();
  const std::uint64_t target = epoch * static_cast<std::uint64_t>(session.n_pes);
  if (!world.changed.wait_for(lock, world.cann_default_timeout, [&] { return session.control_arrivals >= target; })) {
    return ACLSHMEM_TIMEOUT_ERROR;
  }
  return ACLSHMEM_SUCCESS;
}

// Whether `self`'s copy engines reach `pe`: PEs on another host need RoCE (option_attr.data_op_engine_type).
bool Reaches(const Pe& self, int pe) {
  if (pe < 0 || pe >= self.session->n_pes) return false;
  const Pe* peer = self.session->pes[static_cast<std::size_t>(pe)];
  if (peer == nullptr || peer->node == self.node) return true;
  return (self.engines & ACLSHMEM_DATA_OP_ROCE) != 0;
}

// The device address at `local`'s heap offset in `pe`'s heap, or nullptr when `local` is outside the caller's heap.
char* Translate(const Pe& self, const void* local, std::size_t bytes, int pe) {
  const auto* address = static_cast<const char*>(local);
  if (pe < 0 || pe >= self.session->n_pes) return nullptr;
  if (address < self.heap || address >= self.heap + self.heap_size) return nullptr;
  const std::size_t offset = static_cast<std::size_t>(address - self.heap);
  if (bytes > self.heap_size - offset) return nullptr;
  if (!Reaches(self, pe)) return nullptr;
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
  const Pe* pe = CurrentProcess().pe.get();
  if (pe == nullptr) return ACLSHMEM_STATUS_NOT_INITIALIZED;
  return pe->initialized ? ACLSHMEM_STATUS_IS_INITIALIZED : ACLSHMEM_STATUS_SHM_CREATED;
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

int32_t aclshmemx_set_config_store_tls_key(const char* tls_pk, const uint32_t tls_pk_len, const char* tls_pk_pw,
                                           const uint32_t tls_pk_pw_len,
                                           const aclshmem_decrypt_handler decrypt_handler) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_set_config_store_tls_key");
  call.bytes = tls_pk_len;
  call.value = tls_pk_pw_len;
  call.address = reinterpret_cast<std::uintptr_t>(tls_pk);
  call.op = decrypt_handler != nullptr ? 1 : 0;
  world.Record(call);
  (void)tls_pk_pw;
  if (const int code = world.TakeFailure("aclshmemx_set_config_store_tls_key")) return code;
  return ACLSHMEM_SUCCESS;   // stored and, in unique-id mode, never used: the store runs without TLS
}

int aclshmemx_get_uniqueid(aclshmemx_uniqueid_t* uid) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_get_uniqueid"));
  if (const int code = world.TakeFailure("aclshmemx_get_uniqueid")) return code;
  if (uid == nullptr) return ACLSHMEM_INVALID_PARAM;
  // PE 0's listening socket: SHMEM_UID_SESSION_ID (ip:port) wins, then SHMEM_UID_SOCK_IFNAME (name:inet4|inet6),
  // else the first non-loopback interface. An interface the host lacks fails the bootstrap's pre-init.
  const char* session_id = std::getenv("SHMEM_UID_SESSION_ID");
  const char* ifname = std::getenv("SHMEM_UID_SOCK_IFNAME");
  if (session_id == nullptr && ifname != nullptr) {
    const std::string text(ifname);
    const std::size_t colon = text.find(':');
    const std::string name = text.substr(0, colon);
    const std::string family = colon == std::string::npos ? "" : text.substr(colon + 1);
    bool known = false;
    for (const char* interface : kInterfaces) known = known || name == interface;
    if (!known || (family != "inet4" && family != "inet6")) return ACLSHMEM_BOOTSTRAP_ERROR;
  }
  auto session = std::make_shared<Session>();
  session->id = world.next_session++;
  world.sessions.emplace(session->id, session);
  *uid = aclshmemx_uniqueid_t{};
  uid->version = ACLSHMEM_UNIQUEID_VERSION;
  std::memcpy(uid->internal, kUidMagic, sizeof(kUidMagic));
  std::memcpy(uid->internal + sizeof(kUidMagic), &session->id, sizeof(session->id));
  Process& process = CurrentProcess();
  process.uid_sock_ifname = ifname != nullptr ? ifname : "";
  process.uid_session_id = session_id != nullptr ? session_id : "";
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
  // "SHMEM has been initialized, do not call init interface repeatedly!": also after a failed init whose heap
  // exists, since the release does not roll one back.
  if (process.pe) return ACLSHMEM_INNER_ERROR;
  if (attributes == nullptr) return ACLSHMEM_INVALID_PARAM;
  const aclshmemx_init_attr_t& attr = *attributes;
  // check_attr
  if (attr.my_pe < 0 || attr.n_pes <= 0 || attr.n_pes > ACLSHMEM_MAX_PES) return ACLSHMEM_INVALID_VALUE;
  if (attr.my_pe >= attr.n_pes) return ACLSHMEM_INVALID_PARAM;
  if (attr.local_mem_size == 0 || attr.local_mem_size > ACLSHMEM_MAX_LOCAL_SIZE) return ACLSHMEM_INVALID_VALUE;
  if (attr.option_attr.shm_init_timeout == 0 || attr.option_attr.control_operation_timeout == 0) {
    return ACLSHMEM_INVALID_VALUE;
  }
  const auto engines = static_cast<std::uint32_t>(attr.option_attr.data_op_engine_type);
  if (engines == 0 || (engines & ~((static_cast<std::uint32_t>(ACLSHMEM_DATA_OP_MAX) << 1) - 1)) != 0) {
    return ACLSHMEM_INVALID_VALUE;
  }
  // Stricter than the release, which rounds up: the fake insists on whole pages so that callers round themselves.
  if (attr.local_mem_size % ACLSHMEM_PAGE_SIZE != 0) return ACLSHMEM_INVALID_VALUE;
  if (bootstrap_flags != ACLSHMEMX_INIT_WITH_UNIQUEID) return ACLSHMEM_NOT_SUPPORTED;   // the only mode faked
  const auto* uid = static_cast<const aclshmemx_uniqueid_t*>(attr.comm_args);
  if (uid == nullptr || uid->version != ACLSHMEM_UNIQUEID_VERSION ||
      std::memcmp(uid->internal, kUidMagic, sizeof(kUidMagic)) != 0) {
    return ACLSHMEM_INVALID_PARAM;   // "BootStrap UID Mode Must Have UID !"
  }
  if (process.device < 0) return ACLSHMEM_INNER_ERROR;   // CANN needs aclrtSetDevice first
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

  // The bootstrap plugin of unique-id mode sets both of its timeouts to DEFAULT_TIMEOUT and turns the config
  // store's TLS off (init_config_store), whatever option_attr and aclshmemx_set_conf_store_tls said.
  InitRecord record;
  record.bootstrap_flags = static_cast<int>(bootstrap_flags);
  record.attr = attr;
  record.uid = *uid;
  record.tls_decided = process.tls_decided;
  record.tls_enable = process.tls_enable;
  if (process.tls_enable && process.tls_info != nullptr) record.tls_info.assign(process.tls_info, process.tls_info_len);
  record.tls_effective = false;
  record.init_timeout_s = DEFAULT_TIMEOUT;
  record.control_timeout_s = DEFAULT_TIMEOUT;
  record.uid_sock_ifname = process.uid_sock_ifname;
  record.uid_session_id = process.uid_session_id;
  process.last_init = record;

  // The heap: local_mem_size plus CANN's own extra; from here on a failure leaves the PE "created".
  auto pe = std::make_shared<Pe>();
  pe->session = session;
  pe->my_pe = attr.my_pe;
  pe->node = process.node;
  pe->engines = static_cast<int>(engines);
  pe->heap_size = attr.local_mem_size + ACLSHMEM_EXTRA_SIZE;
  std::shared_ptr<DeviceMemory> heap = DeviceMemory::Create(pe->heap_size, ACLSHMEM_PAGE_SIZE, process.device);
  if (!heap) return ACLSHMEM_SMEM_ERROR;
  pe->heap = heap->device_base();
  pe->allocator = hp::fakes::FakeHeap(pe->heap_size);
  // aclshmemi_signal_init, then aclshmemi_team_init: through the allocator, as aclshmem_malloc does.
  (void)pe->allocator.Allocate(kSignalReservation, hp::fakes::FakeHeap::kGranule);
  (void)pe->allocator.Allocate(SYNC_POOL_SIZE, hp::fakes::FakeHeap::kGranule);
  (void)pe->allocator.Allocate(SYNC_COUNTERS_SIZE, hp::fakes::FakeHeap::kGranule);
  pe->default_stream = world.CreateStream(process.device);
  session->heaps[static_cast<std::size_t>(attr.my_pe)] = std::move(heap);
  session->pes[static_cast<std::size_t>(attr.my_pe)] = pe.get();
  ++session->joined;
  process.pe = pe;
  world.changed.notify_all();
  // Init ends with a control-plane barrier over every PE. A failure there keeps the heap: no rollback.
  if (const int code = ControlBarrier(world, *pe, lock)) return code;
  pe->initialized = true;
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
  // Releasing the heap under a kernel that still runs (a timed-out wait spinning on a stream of this NPU) hangs on
  // an NPU: the fake waits for the NPU's streams, bounded, and counts a hang.
  (void)world.DrainDevice(process.device, lock);
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

}  // extern "C"

namespace {

// aclshmem_malloc/calloc/align: a local best-fit block, then the control-plane barrier over every PE; a failed
// barrier releases the block and answers NULL, a failed local allocation still joins the barrier.
void* CollectiveAllocate(const char* name, std::size_t size, std::size_t alignment, bool zero) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  FakeCall call = Named(name);
  call.bytes = size;
  call.value = static_cast<std::int64_t>(alignment);
  world.Record(call);
  const bool injected = world.TakeFailure(name) != 0;
  Pe* self = CurrentPe();
  if (self == nullptr) return nullptr;   // "Memory Heap Not Initialized."
  std::optional<std::size_t> offset;
  if (!injected) offset = self->allocator.Allocate(size, alignment);
  if (offset && zero) {
    const HostView view = HostView::Of(self->heap + *offset, size);
    if (view) std::memset(view.host, 0, size);
  }
  if (ControlBarrier(world, *self, lock) != ACLSHMEM_SUCCESS && offset) {
    (void)self->allocator.Free(*offset);
    offset.reset();
  }
  return offset ? self->heap + *offset : nullptr;
}

}  // namespace

extern "C" {

void* aclshmem_align(size_t alignment, size_t size) {
  return CollectiveAllocate("aclshmem_align", size, alignment, false);
}

void* aclshmem_malloc(size_t size) {
  return CollectiveAllocate("aclshmem_malloc", size, hp::fakes::FakeHeap::kGranule, false);
}

void* aclshmem_calloc(size_t nmemb, size_t size) {
  if (size != 0 && nmemb > SIZE_MAX / size) return nullptr;
  return CollectiveAllocate("aclshmem_calloc", nmemb * size, hp::fakes::FakeHeap::kGranule, true);
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
