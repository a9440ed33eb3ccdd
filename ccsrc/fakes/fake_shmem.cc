// The fake CANN SHMEM host API: sessions keyed by the unique id, one heap per PE, stream-enqueued data plane.
//
// Every behaviour names the line of hicann/shmem at v1.5.1 (commit 258bde9b) it models; third_party/shmem_patches/
// README.md collects them.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>

#include "fake_world.h"
#include "shmem.h"

using hp::fakes::FakeCall;
using hp::fakes::InitRecord;
using hp::fakes::kControlBarrier;
using hp::fakes::internal::CurrentProcess;
using hp::fakes::internal::DeviceMemory;
using hp::fakes::internal::HostView;
using hp::fakes::internal::MteReaches;
using hp::fakes::internal::Pe;
using hp::fakes::internal::Process;
using hp::fakes::internal::Session;
using hp::fakes::internal::Stream;
using hp::fakes::internal::Team;
using hp::fakes::internal::World;

namespace {

constexpr char kUidMagic[8] = {'h', 'p', 'f', 'a', 'k', 'e', 'i', 'd'};
// What CANN SHMEM allocates from the heap for itself at init, in its order: the put/get signal word
// (aclshmemi_signal_init, 512 bytes, shmem_init.cpp:249-264), then the sync pool and sync counters of every team
// (aclshmemi_team_init, shmem_team.cpp:82-114). User allocations start after them, about 5.13 MiB into the heap.
constexpr std::size_t kSignalReservation = 512;
constexpr int kKernelFault = ACL_ERROR_RT_AICORE_EXCEPTION;   // what a kernel's bad address reports
constexpr std::size_t kLineBytes = SCALAR_DATA_CACHELINE_SIZE;   // what dcci_cacheline cleans (shmem_common_types.h:164)
static_assert(kLineBytes == std::tuple_size<decltype(Pe::lines)::mapped_type>::value, "a snapshot holds one line");

// The network interfaces of every simulated host, in getifaddrs order: which one the unique id binds to.
enum class Family { kInet4, kInet6 };
struct Interface {
  const char* name;
  Family family;
  bool loopback;        // IFF_LOOPBACK
  bool routable;        // not 0.0.0.0, 127/8, 169.254/16, ::, ::1 or fe80::/10 (store_net_utils.h:289-333)
};
constexpr Interface kInterfaces[] = {
    {"lo", Family::kInet4, true, false},     {"lo", Family::kInet6, true, false},
    {"eth0", Family::kInet4, false, true},   {"eth0", Family::kInet6, false, false},   // fe80:: link-local only
    {"docker0", Family::kInet4, false, true},
};
constexpr std::size_t kMaxIfconfigLength = 23;   // MAX_IFCONFIG_LENGTH, store_net_utils.h:33

FakeCall Named(const char* name, void* stream = nullptr) {
  FakeCall call;
  call.name = name;
  call.stream = reinterpret_cast<std::uintptr_t>(stream);
  return call;
}

// The calling process's PE once init set "initialized" (shmem_init.cpp:517): the data plane works from then on.
Pe* CurrentPe() {
  Pe* pe = CurrentProcess().pe.get();
  return pe != nullptr && pe->initialized ? pe : nullptr;
}

// The calling process's PE once its heap is set up (shmem_init_backend.cpp:593): the memory manager and the peers'
// heap bases exist from then on (shmem_init.cpp:506), also in a half-initialised PE.
Pe* CreatedPe() {
  Pe* pe = CurrentProcess().pe.get();
  return pe != nullptr && pe->created ? pe : nullptr;
}

// Whether SHMEM_UID_SOCK_IFNAME (`ifname`, null or empty: unset) finds an interface to bind the unique id to, as
// v1.5.1's unique-id bootstrap (the config store plugin, shmemi_bootstrap.cpp:126-129) does it in
// aclshmemi_get_ip_from_ifa (store_net_utils.h:395-456).
bool FindsInterface(const char* ifname) {
  if (ifname == nullptr || *ifname == '\0') {
    // Auto-select (:404-407): the first interface not named like a virtual one (:361-367), up, running and not
    // loopback (:374), with a routable address (:380) of either family (:347).
    for (const Interface& interface : kInterfaces) {
      const std::string name(interface.name);
      bool is_virtual = false;
      for (const char* prefix : {"lo", "docker", "veth", "br-", "virbr", "tun", "tap"}) {
        is_virtual = is_virtual || name.rfind(prefix, 0) == 0;
      }
      if (!is_virtual && !interface.loopback && interface.routable) return true;
    }
    return false;
  }
  // "name:family" (parse_interface_with_type, :237-260): a ':' is required, after 1 to MAX_IFCONFIG_LENGTH - 2
  // characters; the name is a prefix; any family but "inet6" means IPv4.
  const char* colon = std::strchr(ifname, ':');
  if (colon == nullptr) return false;
  const std::size_t length = static_cast<std::size_t>(colon - ifname);
  if (length == 0 || length >= kMaxIfconfigLength - 1) return false;
  const Family family = std::strcmp(colon + 1, "inet6") == 0 ? Family::kInet6 : Family::kInet4;
  for (const Interface& interface : kInterfaces) {
    if (interface.family != family) continue;                                 // :343
    if (std::strncmp(interface.name, ifname, length) != 0) continue;          // :352
    if (interface.loopback) continue;                                         // :374
    if (family == Family::kInet6 && !interface.routable) continue;            // link-local, :385-390
    return true;
  }
  return false;
}

// CANN's control-plane barrier over every PE of `self`'s session (aclshmemi_control_barrier_all, which is the config
// store's group barrier in unique-id mode: shmem_init_backend.cpp:706-709). Returns its code: an injected failure
// (kControlBarrier, or kControlBarrier:<stage>), or ACLSHMEM_SMEM_ERROR when the barrier times out
// (shmemi_bootstrap_config_store.cpp:206-209), the bootstrap's timeout being DEFAULT_TIMEOUT in unique-id mode
// (:302-305). One PE skips it (:193-196). `lock` holds world.mu.
int ControlBarrier(World& world, Pe& self, std::unique_lock<std::mutex>& lock, const char* stage) {
  if (const int code = world.TakeFailure(kControlBarrier)) return code;
  if (const int code = world.TakeFailure(std::string(kControlBarrier) + ":" + stage)) return code;
  Session& session = *self.session;
  if (session.n_pes == 1) return ACLSHMEM_SUCCESS;
  const std::uint64_t epoch = ++self.control_epoch;
  ++session.control_arrivals;
  world.changed.notify_all();
  const std::uint64_t target = epoch * static_cast<std::uint64_t>(session.n_pes);
  if (!world.changed.wait_for(lock, world.cann_default_timeout, [&] { return session.control_arrivals >= target; })) {
    return ACLSHMEM_SMEM_ERROR;
  }
  return ACLSHMEM_SUCCESS;
}

// aclshmem_malloc's body (shmem_mm.cpp:37-62, :96-114): a local best-fit block, then the control barrier; a failed
// barrier releases the block and answers nothing; a failed local allocation still joins the barrier. The offset, or
// nullopt. `lock` holds world.mu.
std::optional<std::size_t> AllocateThenBarrier(World& world, Pe& self, std::unique_lock<std::mutex>& lock,
                                               std::size_t size, std::size_t alignment, const char* stage,
                                               bool refused, std::size_t zero_bytes = 0) {
  std::optional<std::size_t> offset;
  if (!refused) offset = self.allocator.Allocate(size, alignment);
  if (offset && zero_bytes > 0) {
    const HostView view = HostView::Of(self.heap + *offset, zero_bytes);
    if (view) std::memset(view.host, 0, zero_bytes);
  }
  if (ControlBarrier(world, self, lock, stage) != ACLSHMEM_SUCCESS && offset) {
    (void)self.allocator.Free(*offset);
    offset.reset();
  }
  return offset;
}

// Leaves `pe`'s slot in its session; the session dies with its last PE. Mu held.
void LeaveSession(World& world, Pe& pe) {
  if (!pe.joined) return;
  pe.joined = false;
  std::shared_ptr<Session> session = pe.session;
  session->pes[static_cast<std::size_t>(pe.my_pe)] = nullptr;
  if (--session->joined == 0) world.sessions.erase(session->id);
}

// How `self`'s kernels reach `pe` (topo_list, filled by reach_info_init: shmem_init_backend.cpp:363-380).
enum class Transport { kNone, kMte, kRoce };
Transport TransportTo(const World& world, const Pe& self, int pe) {
  if (pe < 0 || pe >= self.session->n_pes) return Transport::kNone;
  const Pe* peer = self.session->pes[static_cast<std::size_t>(pe)];
  if (peer == nullptr) return Transport::kNone;
  if (MteReaches(world, self, *peer)) return Transport::kMte;
  // RDMA reaches every PE once opted in (mem_entity_default.cpp:846-848); the peer must have opened it too.
  const bool roce = (self.engines & ACLSHMEM_DATA_OP_ROCE) != 0 && (peer->engines & ACLSHMEM_DATA_OP_ROCE) != 0;
  return roce ? Transport::kRoce : Transport::kNone;
}

// aclshmem_ptr's translation (shmem_host_rma.cpp:36-57, and the device's shmem_device_mte.hpp:46-56): `local`'s heap
// offset in `pe`'s heap, for every valid PE whether or not this NPU maps it (p2p_device_heap_base is filled for every
// PE, shmem_init_backend.cpp:370); nullptr for a bad pe or an address outside the caller's heap.
char* Translate(const Pe& self, const void* local, std::size_t bytes, int pe) {
  const auto* address = static_cast<const char*>(local);
  if (pe < 0 || pe >= self.session->n_pes) return nullptr;
  if (address < self.heap || address >= self.heap + self.heap_size) return nullptr;
  const std::size_t offset = static_cast<std::size_t>(address - self.heap);
  if (bytes > self.heap_size - offset) return nullptr;
  const std::shared_ptr<DeviceMemory>& heap = self.session->heaps[static_cast<std::size_t>(pe)];
  return heap ? heap->device_base() + offset : nullptr;
}

// The host view of a put/get's local buffer, empty unless it is memory of the NPU that runs the copy (`device`):
// the copy kernel cannot read or write host memory.
HostView LocalBuffer(const void* address, std::size_t bytes, int device) {
  HostView view = HostView::Of(address, bytes);
  if (view && view.memory->device() != device) return {};
  return view;
}

// The wait kernels' comparison (shmem_device_p2p_sync.hpp:74-90): an op outside the switch is handled by the caller.
bool Compare(int32_t observed, int cmp, int32_t expected) {
  switch (cmp) {
    case ACLSHMEM_CMP_EQ: return observed == expected;
    case ACLSHMEM_CMP_NE: return observed != expected;
    case ACLSHMEM_CMP_GT: return observed > expected;
    case ACLSHMEM_CMP_GE: return observed >= expected;
    case ACLSHMEM_CMP_LT: return observed < expected;
    case ACLSHMEM_CMP_LE: return observed <= expected;
    default: return true;
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

// A SET through MTE (aclshmemi_signal_set, shmem_device_so.hpp:256-265): a scalar store, then dcci_cacheline
// (shmemi_device_cc.h:341-351), which cleans the whole 64-byte line back to memory. The store lands in the writer's
// cached copy of the line, and what goes back is that copy: a flag another PE wrote into the same line since the
// writer's copy was taken is lost, the race CANN's comment describes (shmemi_device_cc.h:134-164) and why it pads
// every flag to 64 bytes (shmem_common_types.h:164, 194). On the chip the copy is taken shortly before the store;
// the fake takes it at the writer's previous SET into the line (or at this one, the first time), so that a layout
// putting two writers' flags in one line loses an update every time instead of once a week. Mu held.
int SetThroughLine(World& world, Pe& writer, char* target, int32_t value) {
  const auto at = reinterpret_cast<std::uintptr_t>(target);
  const std::uintptr_t line = at / kLineBytes * kLineBytes;
  // Heaps are 2 MiB aligned and sized: a line never leaves its heap.
  const HostView view = HostView::Of(reinterpret_cast<const void*>(line), kLineBytes);
  if (!view) return kKernelFault;
  auto known = writer.lines.find(line);
  std::array<char, kLineBytes> copy{};
  if (known != writer.lines.end()) {
    copy = known->second;
  } else {
    for (std::size_t word = 0; word < kLineBytes; word += sizeof(int32_t)) {
      const int32_t current = __atomic_load_n(reinterpret_cast<const int32_t*>(view.host + word), __ATOMIC_SEQ_CST);
      std::memcpy(copy.data() + word, &current, sizeof(current));
    }
  }
  std::memcpy(copy.data() + (at - line), &value, sizeof(value));
  for (std::size_t word = 0; word < kLineBytes; word += sizeof(int32_t)) {
    int32_t written;
    std::memcpy(&written, copy.data() + word, sizeof(written));
    __atomic_store_n(reinterpret_cast<int32_t*>(view.host + word), written, __ATOMIC_SEQ_CST);
  }
  writer.lines[line] = copy;
  world.changed.notify_all();
  return ACL_SUCCESS;
}

// A barrier kernel of `self` over `team` (aclshmemi_barrier_npu_v3, shmemi_device_cc.h:290-330, the one
// aclshmemi_barrier runs: :332-339): every member reads every other member's sync word in place through aclshmem_ptr
// (:322), so a member this NPU does not map faults the kernel, RoCE or not. The team's index is read when the kernel
// runs; ACLSHMEM_TEAM_INVALID returns at once (:335-337).
hp::fakes::internal::Task TeamBarrierTask(World& world, std::shared_ptr<Pe> self, aclshmem_team_t team) {
  return [&world, self, team](const Stream& self_stream) {
    if (team == ACLSHMEM_TEAM_INVALID) return static_cast<int>(ACL_SUCCESS);
    std::unique_lock<std::mutex> wait_lock(world.mu);
    auto found = self->teams.find(team);
    if (found == self->teams.end()) return kKernelFault;
    const Team members = found->second;
    for (int i = 0; i < members.size; ++i) {
      const Pe* peer = self->session->pes[static_cast<std::size_t>(members.start + i * members.stride)];
      if (peer == nullptr || !MteReaches(world, *self, *peer)) return kKernelFault;
    }
    Session& session = *self->session;
    const auto key = std::make_tuple(members.start, members.stride, members.size);
    const std::uint64_t epoch = ++self->barrier_epochs[key];
    ++session.barrier_arrivals[key];
    world.changed.notify_all();
    const std::uint64_t target = epoch * static_cast<std::uint64_t>(members.size);
    world.WaitInTask(self_stream, wait_lock, [&] { return session.barrier_arrivals[key] >= target; });
    return static_cast<int>(ACL_SUCCESS);
  };
}

// aclshmemx_barrier_on_stream and aclshmemx_barrier_all_on_stream: one kernel each (shmemi_device_cc_kernel.cpp:19-30).
void EnqueueTeamBarrier(const char* name, aclshmem_team_t team, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named(name, stream);
  call.value = team;
  world.Record(call);
  std::shared_ptr<Pe> self = CurrentPe() != nullptr ? CurrentProcess().pe : nullptr;
  EnqueueCall(world, name, stream, self ? TeamBarrierTask(world, self, team) : hp::fakes::internal::Task{});
}

}  // namespace

extern "C" {

int aclshmemx_init_status(void) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_init_status"));
  // shmem_init.cpp:193-203
  const Pe* pe = CurrentProcess().pe.get();
  if (pe == nullptr || !pe->created) return ACLSHMEM_STATUS_NOT_INITIALIZED;
  return pe->initialized ? ACLSHMEM_STATUS_IS_INITIALIZED : ACLSHMEM_STATUS_SHM_CREATED;
}

int32_t aclshmemx_set_conf_store_tls(bool enable, const char* tls_info, const uint32_t tls_info_len) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmemx_set_conf_store_tls");
  call.value = enable ? 1 : 0;
  call.bytes = tls_info_len;
  if (const int code = world.Enter(call)) return code;
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
  if (const int code = world.Enter(Named("aclshmemx_get_uniqueid"))) return code;
  if (uid == nullptr) return ACLSHMEM_INVALID_PARAM;
  // PE 0's listening socket (config_store_get_unique_id, shmemi_bootstrap_config_store.cpp:47-68):
  // SHMEM_UID_SESSION_ID (ip:port) wins, else an interface chosen by SHMEM_UID_SOCK_IFNAME; no interface found is
  // ACLSHMEM_INVALID_PARAM (:61-63).
  const char* session_id = std::getenv("SHMEM_UID_SESSION_ID");
  const char* ifname = std::getenv("SHMEM_UID_SOCK_IFNAME");
  if (session_id == nullptr && !FindsInterface(ifname)) return ACLSHMEM_INVALID_PARAM;
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
  if (const int code = world.Enter(call)) return code;
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

// aclshmemx_init_attr in v1.5.1's order (shmem_init.cpp:467-523), with its states and leaks: what a failing step
// built stays until aclshmem_finalize (nothing is rolled back).
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
  if (attributes == nullptr) {
    // The release reads attributes->instance_id (:471) before its NULL check (:478).
    std::fprintf(stderr, "fake aclshmemx_init_attr: NULL attributes dereferenced, as v1.5.1 does\n");
    std::abort();
  }
  Process& process = CurrentProcess();
  if (const int code = world.TakeFailure("aclshmemx_init_attr")) return code;
  // "SHMEM has been initialized, do not call init interface repeatedly!" (:479-481): once the heap exists, also
  // after a failed init, since the release rolls nothing back.
  if (CreatedPe() != nullptr) return ACLSHMEM_INNER_ERROR;
  const aclshmemx_init_attr_t& attr = *attributes;
  // check_attr (:157-182)
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
  if (process.pe) {
    // A retry after an init that failed before its heap (still NOT_INITIALIZED, so allowed): the earlier attempt's
    // stream stays behind for good, as g_state_host.default_stream is overwritten (:142-144).
    LeaveSession(world, *process.pe);
    process.pe.reset();
  }
  if (session->pes[static_cast<std::size_t>(attr.my_pe)] != nullptr) return ACLSHMEM_BOOTSTRAP_ERROR;

  // The bootstrap plugin of unique-id mode sets both of its timeouts to DEFAULT_TIMEOUT
  // (shmemi_bootstrap_config_store.cpp:302-305) and turns the config store's TLS off (init_config_store, :227),
  // whatever option_attr and aclshmemx_set_conf_store_tls said.
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

  // 1. aclshmemi_state_init_attr (:135-148): CANN's own stream.
  auto pe = std::make_shared<Pe>();
  pe->session = session;
  pe->my_pe = attr.my_pe;
  pe->node = process.node;
  pe->logical_device = hp::fakes::internal::LogicalDevice(process.device);
  pe->engines = static_cast<int>(engines);
  pe->heap_size = attr.local_mem_size + ACLSHMEM_EXTRA_SIZE;   // :140
  pe->default_stream = world.CreateStream(process.device);
  session->pes[static_cast<std::size_t>(attr.my_pe)] = pe.get();
  ++session->joined;
  pe->joined = true;
  process.pe = pe;
  world.changed.notify_all();
  // 2. init_device_state: any barrier failure is ACLSHMEM_SMEM_ERROR (shmem_init_backend.cpp:121-125). A missing peer
  //    fails here, before the heap: the status stays NOT_INITIALIZED.
  if (ControlBarrier(world, *pe, lock, "init_device_state") != ACLSHMEM_SUCCESS) return ACLSHMEM_SMEM_ERROR;
  // 3. setup_heap (:506-595): the heap, the slice and entity exchanges with a barrier each (:440-444, :498-502,
  //    their codes as they are), then "created" (:593).
  std::shared_ptr<DeviceMemory> heap = DeviceMemory::Create(pe->heap_size, ACLSHMEM_PAGE_SIZE, process.device);
  if (!heap) return ACLSHMEM_SMEM_ERROR;   // :533-537
  heap->MarkHeapOf(session->id, attr.my_pe);
  pe->heap = heap->device_base();
  session->heaps[static_cast<std::size_t>(attr.my_pe)] = std::move(heap);
  if (const int code = ControlBarrier(world, *pe, lock, "exchange_slice")) return code;
  if (const int code = ControlBarrier(world, *pe, lock, "exchange_entity")) return code;
  pe->created = true;
  // 4. The memory manager (shmem_init.cpp:506), then CANN's allocations through aclshmem_malloc, whose barrier
  //    failing makes them answer ACLSHMEM_INNER_ERROR (:249-256, shmem_team.cpp:84-89, :101-106): SHM_CREATED.
  pe->allocator = hp::fakes::FakeHeap(pe->heap_size);
  const std::size_t granule = hp::fakes::FakeHeap::kGranule;
  if (!AllocateThenBarrier(world, *pe, lock, kSignalReservation, granule, "aclshmemi_signal_init", false)) {
    return ACLSHMEM_INNER_ERROR;
  }
  if (!AllocateThenBarrier(world, *pe, lock, SYNC_POOL_SIZE, granule, "aclshmemi_team_init", false) ||
      !AllocateThenBarrier(world, *pe, lock, SYNC_COUNTERS_SIZE, granule, "aclshmemi_team_init", false)) {
    return ACLSHMEM_INNER_ERROR;
  }
  Team world_team;   // ACLSHMEM_TEAM_WORLD (shmem_team.cpp:164-170)
  world_team.size = attr.n_pes;
  pe->teams[ACLSHMEM_TEAM_WORLD] = world_team;
  // 5. "initialized" is set before the last barrier (:517-520): a failure there leaves IS_INITIALIZED.
  pe->initialized = true;
  if (const int code = ControlBarrier(world, *pe, lock, "aclshmemx_init_attr")) return code;
  return ACLSHMEM_SUCCESS;
}

int aclshmem_finalize(void) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclshmem_finalize"))) return code;
  Process& process = CurrentProcess();
  if (!process.pe) return ACLSHMEM_SUCCESS;   // no init manager: nothing to release (shmem_init.cpp:536-541)
  // Whatever a failed init left is released too: each step skips what was never built (:542-579,
  // shmem_init_backend.cpp:611-615, :676-679).
  std::shared_ptr<Pe> pe = std::move(process.pe);
  // Releasing the heap under a kernel that still runs (a timed-out wait spinning on a stream of this NPU) hangs on
  // an NPU: the fake waits for the NPU's streams, bounded, and counts a hang.
  (void)world.DrainDevice(process.device, lock);
  // CANN synchronizes and destroys its default stream (:558-568).
  (void)world.Synchronize(pe->default_stream, -1, lock);
  world.DestroyStream(pe->default_stream, lock);
  LeaveSession(world, *pe);
  return ACLSHMEM_SUCCESS;
}

void aclshmem_info_get_version(int* major, int* minor) {
  *major = 1;
  *minor = 1;
}

}  // extern "C"

namespace {

// aclshmem_malloc and aclshmem_align as the release has them (shmem_mm.cpp:37-62, :96-114): nothing without a
// memory manager ("Memory Heap Not Initialized."), else AllocateThenBarrier.
void* CollectiveAllocate(const char* name, std::size_t size, std::size_t alignment) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  FakeCall call = Named(name);
  call.bytes = size;
  call.value = static_cast<std::int64_t>(alignment);
  world.Record(call);
  const bool injected = world.TakeFailure(name) != 0;
  Pe* self = CreatedPe();
  if (self == nullptr) return nullptr;
  const std::optional<std::size_t> offset = AllocateThenBarrier(world, *self, lock, size, alignment, name, injected);
  return offset ? self->heap + *offset : nullptr;
}

}  // namespace

extern "C" {

void* aclshmem_align(size_t alignment, size_t size) { return CollectiveAllocate("aclshmem_align", size, alignment); }

void* aclshmem_malloc(size_t size) {
  return CollectiveAllocate("aclshmem_malloc", size, hp::fakes::FakeHeap::kGranule);
}

void* aclshmem_calloc(size_t nmemb, size_t size) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_calloc");
  call.bytes = size;
  call.value = static_cast<std::int64_t>(nmemb);
  world.Record(call);
  const bool injected = world.TakeFailure("aclshmem_calloc") != 0;
  Pe* self = CreatedPe();
  if (self == nullptr) return nullptr;
  // SHM_ASSERT_MULTIPLY_OVERFLOW (shmem_mm.cpp:70, shmemi_logger.h:154-163): a zero or overflowing product returns
  // at once, without the barrier its peers then wait in.
  if (nmemb == 0 || size == 0 || nmemb > self->heap_size / size) return nullptr;
  // Only the first `size` bytes are zeroed: aclrtMemset(ptr, size, 0, size) (shmem_mm.cpp:75).
  const std::optional<std::size_t> offset = AllocateThenBarrier(
      world, *self, lock, nmemb * size, hp::fakes::FakeHeap::kGranule, "aclshmem_calloc", injected, size);
  return offset ? self->heap + *offset : nullptr;
}

void aclshmem_free(void* ptr) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_free");
  call.address = reinterpret_cast<std::uintptr_t>(ptr);
  world.Record(call);
  Pe* self = CreatedPe();
  if (self == nullptr || ptr == nullptr) return;
  const auto* address = static_cast<const char*>(ptr);
  if (address < self->heap || address >= self->heap + self->heap_size) return;   // the release only logs
  (void)self->allocator.Free(static_cast<std::size_t>(address - self->heap));
}

void* aclshmemx_get_heap_base(aclshmem_mem_type_t mem_type) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclshmemx_get_heap_base"));
  Pe* self = CreatedPe();
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
  Pe* self = CreatedPe();
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

// A put's kernel (ACLSHMEM_PUT_TYPENAME_MEM, shmem_device_rma.hpp:341-374) takes the first transport topo_list has
// for the PE; with none it does nothing at all and reports nothing.
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
  const Transport transport = self != nullptr ? TransportTo(world, *self, pe) : Transport::kNone;
  EnqueueCall(world, "aclshmemx_putmem_on_stream", stream, [remote, src, elem_size, transport](const Stream& on) {
    if (transport == Transport::kNone && remote != nullptr) return static_cast<int>(ACL_SUCCESS);
    const HostView to = HostView::Of(remote, elem_size);
    const HostView from = LocalBuffer(src, elem_size, on.device);
    if (!to || !from) return kKernelFault;
    std::memmove(to.host, from.host, elem_size);
    return static_cast<int>(ACL_SUCCESS);
  });
}

// A get's kernel: the same transports as a put (shmem_device_rma.hpp), nothing with none.
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
  const Transport transport = self != nullptr ? TransportTo(world, *self, pe) : Transport::kNone;
  EnqueueCall(world, "aclshmemx_getmem_on_stream", stream, [dst, remote, elem_size, transport](const Stream& on) {
    if (transport == Transport::kNone && remote != nullptr) return static_cast<int>(ACL_SUCCESS);
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

// aclshmemi_signal_op (shmem_device_so.hpp:333-343): its switch has no default, so an unknown op does nothing. A SET
// goes through MTE when topo_list has it (a line written back whole: SetThroughLine), else through RoCE as a 4-byte
// write from a staging word (:267-279), else nowhere. An ADD is an MTE atomic at aclshmem_ptr's address whatever the
// topology (:299-312): to a PE this NPU does not map, the address is unmapped and the kernel faults.
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
  std::shared_ptr<Pe> self = CurrentPe() != nullptr ? CurrentProcess().pe : nullptr;
  char* remote = self ? Translate(*self, sig_addr, sizeof(int32_t), pe) : nullptr;
  const Transport transport = self ? TransportTo(world, *self, pe) : Transport::kNone;
  EnqueueCall(world, "aclshmemx_signal_op_on_stream", stream,
              [&world, self, remote, signal, sig_op, transport](const Stream&) {
                if (sig_op != ACLSHMEM_SIGNAL_SET && sig_op != ACLSHMEM_SIGNAL_ADD) {
                  return static_cast<int>(ACL_SUCCESS);
                }
                const HostView target = HostView::Of(remote, sizeof(int32_t));
                if (!target) return kKernelFault;
                std::lock_guard<std::mutex> signal_lock(world.mu);
                if (sig_op == ACLSHMEM_SIGNAL_ADD) {
                  if (transport != Transport::kMte) return kKernelFault;
                  __atomic_fetch_add(reinterpret_cast<int32_t*>(target.host), signal, __ATOMIC_SEQ_CST);
                  world.changed.notify_all();
                  return static_cast<int>(ACL_SUCCESS);
                }
                if (transport == Transport::kMte) return SetThroughLine(world, *self, remote, signal);
                if (transport == Transport::kRoce) {
                  __atomic_store_n(reinterpret_cast<int32_t*>(target.host), signal, __ATOMIC_SEQ_CST);
                  world.changed.notify_all();
                }
                return static_cast<int>(ACL_SUCCESS);
              });
}

// aclshmemi_wait_until (shmem_device_p2p_sync.hpp:73-90) spins without a timeout; its switch has no default, so an
// unknown compare op returns at once.
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
                if (!inside || !watched) return kKernelFault;
                const auto* word = reinterpret_cast<const int32_t*>(watched.host);
                std::unique_lock<std::mutex> wait_lock(world.mu);
                world.WaitInTask(self_stream, wait_lock,
                                 [&] { return Compare(__atomic_load_n(word, __ATOMIC_SEQ_CST), cmp, cmp_val); });
                return static_cast<int>(ACL_SUCCESS);
              });
}

void aclshmemx_barrier_all_on_stream(aclrtStream stream) {
  EnqueueTeamBarrier("aclshmemx_barrier_all_on_stream", ACLSHMEM_TEAM_WORLD, stream);
}

void aclshmemx_barrier_on_stream(aclshmem_team_t team, aclrtStream stream) {
  EnqueueTeamBarrier("aclshmemx_barrier_on_stream", team, stream);
}

// A local call, no barrier (shmem_team.cpp:265-358): the members are world PEs start, start + stride, ... of the
// parent's numbering; a PE outside them gets ACLSHMEM_TEAM_INVALID and success.
int aclshmem_team_split_strided(aclshmem_team_t parent_team, int pe_start, int pe_stride, int pe_size,
                                aclshmem_team_t* new_team) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_team_split_strided");
  call.target_pe = pe_start;
  call.value = pe_stride;
  call.bytes = static_cast<std::size_t>(std::max(pe_size, 0));
  call.op = parent_team;
  if (const int code = world.Enter(call)) return code;
  if (new_team == nullptr) return ACLSHMEM_INVALID_PARAM;
  *new_team = ACLSHMEM_TEAM_INVALID;
  Pe* self = CurrentPe();
  if (self == nullptr) return ACLSHMEM_INVALID_PARAM;
  auto parent = self->teams.find(parent_team);
  if (parent == self->teams.end()) return ACLSHMEM_INVALID_PARAM;
  if (pe_start >= ACLSHMEM_MAX_PES || pe_stride >= ACLSHMEM_MAX_PES || pe_size > ACLSHMEM_MAX_PES) {
    return ACLSHMEM_INVALID_PARAM;
  }
  const Team& source = parent->second;
  if (pe_start < 0 || pe_start >= source.size || pe_size <= 0 || pe_size > source.size || pe_stride < 1) {
    return ACLSHMEM_INVALID_PARAM;
  }
  const int start = source.start + pe_start * source.stride;
  const int stride = source.stride * pe_stride;
  const int end = start + stride * (pe_size - 1);
  if (start >= self->session->n_pes || end >= self->session->n_pes) return ACLSHMEM_INVALID_PARAM;
  const int me = self->my_pe;
  if (me < start || (me - start) % stride != 0 || (me - start) / stride >= pe_size) return ACLSHMEM_SUCCESS;
  for (int index = 0; index < ACLSHMEM_MAX_TEAMS; ++index) {   // first_free_idx_fetch (:194-204)
    if (self->teams.count(index) != 0) continue;
    Team team;
    team.start = start;
    team.stride = stride;
    team.size = pe_size;
    self->teams[index] = team;
    *new_team = index;
    return ACLSHMEM_SUCCESS;
  }
  return ACLSHMEM_INNER_ERROR;   // "team num is full"
}

void aclshmem_team_destroy(aclshmem_team_t team) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclshmem_team_destroy");
  call.value = team;
  world.Record(call);
  Pe* self = CurrentPe();
  if (self != nullptr && team != ACLSHMEM_TEAM_WORLD) self->teams.erase(team);
}

}  // extern "C"
