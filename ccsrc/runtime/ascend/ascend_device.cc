// The ascend device's data plane: init and finalize of CANN SHMEM, the topology, symmetric memory, put/get, signals,
// waits, the node barrier, streams, and staging and reads in stream order (page-locked buffers and events, pooled).
// The aclnn compute (reductions, casts, the streams' workspaces) is ascend_compute.cc.
#include "runtime/ascend/ascend_device.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <type_traits>

#include "runtime/agreement.h"
#include "runtime/ascend/cann_api.h"
#include "runtime/ascend/cann_status.h"
#include "runtime/logging.h"

namespace hp::shmem::ascend {

static_assert(std::is_same<aclrtStream, void*>::value && std::is_same<aclrtEvent, void*>::value,
              "the device stores ACL streams and events as void*");
static_assert(sizeof(aclshmemx_uniqueid_t) == 136, "CANN SHMEM v1.5 documents a 136-byte unique id");
static_assert(sizeof(aclshmemx_init_attr_t) == 120, "CANN SHMEM v1.5 documents 120-byte init attributes");
static_assert(ACLSHMEM_EXTRA_SIZE == std::size_t{6} << 20, "CANN SHMEM v1.5.1 maps 6 MiB beyond local_mem_size");

namespace {

// aclshmem_malloc hands out 16-byte granules (allocated_size_align_up, shmem_mgr.cpp:241-246); larger alignments go
// through aclshmem_align.
constexpr std::size_t kCannGranule = 16;
// What init allocates from the heap before any user allocation, contiguously from offset 0: the 512-byte signal word
// (shmem_init.cpp:251-252), the sync pool and the sync counters (shmem_team.cpp:84, 101).
constexpr std::size_t kCannInitBytes = 512 + SYNC_POOL_SIZE + SYNC_COUNTERS_SIZE;
// On a 910B, hybm maps a peer's heap only within a group of this many logical NPUs (ASC910B_CONN_RANKS,
// hybm_device_mem_segment.h:28; IsSdmaAccessible, hybm_mem_segment.cpp:168-173).
constexpr int kHccsGroupSize = 8;

std::size_t RoundUp(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string Npu(int id) { return "npu:" + std::to_string(id); }

int ToCannSignalOp(SignalOp op) { return op == SignalOp::kSet ? ACLSHMEM_SIGNAL_SET : ACLSHMEM_SIGNAL_ADD; }

int ToCannCompare(CompareOp cmp) {
  switch (cmp) {
    case CompareOp::kEq: return ACLSHMEM_CMP_EQ;
    case CompareOp::kNe: return ACLSHMEM_CMP_NE;
    case CompareOp::kGt: return ACLSHMEM_CMP_GT;
    case CompareOp::kGe: return ACLSHMEM_CMP_GE;
    case CompareOp::kLt: return ACLSHMEM_CMP_LT;
    case CompareOp::kLe: return ACLSHMEM_CMP_LE;
  }
  return ACLSHMEM_CMP_EQ;
}

// What every rank publishes at Init: rank 0's outcome of aclshmemx_get_uniqueid and the id, and every rank's host and
// HCCS group.
struct UniqueIdWire {
  std::int32_t cann_code;
  aclshmemx_uniqueid_t uid;
  char host[64];
  std::int32_t hccs_group;
};

bool ValidSignalOp(SignalOp op) { return op == SignalOp::kSet || op == SignalOp::kAdd; }

bool ValidCompareOp(CompareOp cmp) {
  switch (cmp) {
    case CompareOp::kEq: case CompareOp::kNe: case CompareOp::kGt: case CompareOp::kGe: case CompareOp::kLt:
    case CompareOp::kLe:
      return true;
  }
  return false;
}

// The logical id of user device `device` as ACL documents it (aclrtGetLogicDevIdByUserDevId): the device-th entry of
// ASCEND_RT_VISIBLE_DEVICES when it is set, else `device`. hybm decides which heaps it maps by the logical id
// (hybm_mem_segment.cpp:86).
Result<int> LogicalDevice(int device) {
  const char* visible = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  if (visible == nullptr || *visible == '\0') return device;
  const std::string list(visible);
  std::size_t start = 0;
  for (int index = 0; start <= list.size(); ++index) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    if (index == device) {
      const std::string entry = list.substr(start, comma - start);
      char* end = nullptr;
      const long id = std::strtol(entry.c_str(), &end, 10);
      if (!entry.empty() && *end == '\0' && id >= 0 && id <= std::numeric_limits<int>::max()) {
        return static_cast<int>(id);
      }
      break;
    }
    start = comma + 1;
  }
  return InvalidArgument("`ASCEND_RT_VISIBLE_DEVICES` must list the logical NPU of device " + std::to_string(device) +
                         " as a number, but got \"" + list + "\"");
}

const char* InitStatusName(int status) {
  switch (status) {
    case ACLSHMEM_STATUS_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case ACLSHMEM_STATUS_SHM_CREATED: return "SHM_CREATED";
    case ACLSHMEM_STATUS_IS_INITIALIZED: return "IS_INITIALIZED";
    default: return "INVALID";
  }
}

// Members of `node` (PEs with that node number) as CANN's strided team (start, stride, size), or false when they are
// not evenly spaced.
bool StridedMembers(const std::vector<int>& nodes, int node, int* start, int* stride, int* size) {
  std::vector<int> members;
  for (std::size_t pe = 0; pe < nodes.size(); ++pe) {
    if (nodes[pe] == node) members.push_back(static_cast<int>(pe));
  }
  *start = members.front();
  *size = static_cast<int>(members.size());
  *stride = members.size() > 1 ? members[1] - members[0] : 1;
  for (std::size_t i = 1; i < members.size(); ++i) {
    if (members[i] - members[i - 1] != *stride) return false;
  }
  return true;
}

std::string EnvFact(const char* name) {
  const char* value = std::getenv(name);
  return std::string(name) + "=" + (value != nullptr ? value : "unset");
}

// A value that makes `observed cmp value` true, or false when none exists in int32.
bool Satisfying(CompareOp cmp, std::int32_t value, std::int32_t* out) {
  constexpr auto kMax = std::numeric_limits<std::int32_t>::max();
  constexpr auto kMin = std::numeric_limits<std::int32_t>::min();
  switch (cmp) {
    case CompareOp::kEq: case CompareOp::kGe: case CompareOp::kLe: *out = value; return true;
    case CompareOp::kNe: *out = value == kMax ? value - 1 : value + 1; return true;
    case CompareOp::kGt: if (value == kMax) return false; *out = value + 1; return true;
    case CompareOp::kLt: if (value == kMin) return false; *out = value - 1; return true;
  }
  return false;
}


}  // namespace

AscendDevice::AscendDevice(AscendDeviceOptions options)
    : options_(std::move(options)), unique_id_(sizeof(aclshmemx_uniqueid_t)) {}

AscendDevice::~AscendDevice() {
  if (state_ == State::kInitialized) (void)Finalize();
}

std::string AscendDevice::TimeoutFact() const { return "timeout_sec=" + Decimal(timeout_sec_); }

Status AscendDevice::CheckCurrentDevice() const {
  std::int32_t current = -1;
  HP_RETURN_IF_ERROR(FromAclError(aclrtGetDevice(&current), "aclrtGetDevice", "expected_device=" + Npu(device_id_)));
  if (current == device_id_) return Status::Ok();
  return InvalidArgument("current device must be " + Npu(device_id_) + " (fixed at acquire_shmem), but got " +
                         Npu(current));
}

Status AscendDevice::RequireReady(const char* op) const {
  if (state_ == State::kFailed) {
    return StateError(std::string("ascend device failed to finalize and cannot be used again: op=") + op);
  }
  if (state_ != State::kInitialized) {
    return StateError(std::string("ascend device is not initialised: op=") + op);
  }
  return CheckCurrentDevice();
}

Status AscendDevice::CheckPe(int pe) const {
  if (pe >= 0 && pe < world_size_) return Status::Ok();
  return InvalidArgument("`pe` must be in [0, " + std::to_string(world_size_) + "), but got " + std::to_string(pe));
}

Status AscendDevice::CheckSignal(SignalWidth width, std::int64_t value, const char* value_name) const {
  if (width != SignalWidth::k32) {
    return TypeError("`signal_tensor` must be int32 on the ascend device (CANN SHMEM signals are int32), but got " +
                     std::to_string(8 * static_cast<int>(width)) + "-bit signals");
  }
  if (value < std::numeric_limits<std::int32_t>::min() || value > std::numeric_limits<std::int32_t>::max()) {
    return InvalidArgument(std::string("`") + value_name + "` must fit in int32 on the ascend device, but got " +
                           std::to_string(value));
  }
  return Status::Ok();
}

Status AscendDevice::Init(const DeviceInitArgs& args, Bootstrap& bootstrap) {
  if (state_ == State::kInitialized) {
    return StateError("ascend device is already initialised: rank=" + std::to_string(rank_) + " device=" +
                      Npu(device_id_));
  }
  if (state_ == State::kFailed) return StateError("ascend device failed to finalize and cannot be used again: op=Init");
  rank_ = args.rank;
  world_size_ = args.world_size;
  local_mem_size_ = RoundUp(args.heap_size, kHeapPageBytes);
  heap_size_ = local_mem_size_ + ACLSHMEM_EXTRA_SIZE;
  timeout_sec_ = args.timeout_sec;
  const double timeout_ms = std::ceil(args.timeout_sec * 1000.0);
  timeout_ms_ = timeout_ms >= std::numeric_limits<std::int32_t>::max()
                    ? std::numeric_limits<std::int32_t>::max()
                    : std::max<std::int32_t>(1, static_cast<std::int32_t>(timeout_ms));

  // 1. Local preparation: the NPU the caller selected and its logical id, CANN SHMEM not in use, the config store's
  //    TLS off (before anything that talks to the config store, the unique id included).
  Status prepared = FromAclError(aclrtGetDevice(&device_id_), "aclrtGetDevice",
                                 "rank=" + std::to_string(rank_) + " (select the NPU before acquire_shmem)");
  if (prepared.ok()) {
    const char* soc = aclrtGetSocName();
    soc_name_ = soc != nullptr ? soc : "unknown";
    Result<int> logical = LogicalDevice(device_id_);
    prepared = logical.status();
    if (logical.ok()) logical_device_ = logical.value();
  }
  if (prepared.ok()) {
    const int init_status = aclshmemx_init_status();
    if (init_status != ACLSHMEM_STATUS_NOT_INITIALIZED) {
      prepared = StateError("CANN SHMEM is already initialised in this process: init_status=" +
                            std::to_string(init_status) + " device=" + Npu(device_id_));
    }
  }
  if (prepared.ok() && !options_.tls_info.empty()) {
    // v1.5.1's bootstrap plugin calls init_config_store(), which sets the store's TLS to off after applying what
    // aclshmemx_set_conf_store_tls and aclshmemx_set_config_store_tls_key gave it: TLS cannot be had.
    prepared = InvalidArgument(
        "`HYPER_PARALLEL_SHMEM_TLS_INFO` must be unset with CANN SHMEM v1.5.1 (its unique-id bootstrap runs the "
        "config store without TLS whatever aclshmemx_set_conf_store_tls says: init_config_store() turns it off), "
        "but got " + std::to_string(options_.tls_info.size()) + " characters");
  }
  if (prepared.ok()) {
    HP_LOG(kWarning, "CANN SHMEM's config store runs without TLS (v1.5.1 has no TLS in unique-id mode): keep the "
                     "bootstrap network trusted");
    prepared = FromShmemCode(aclshmemx_set_conf_store_tls(false, nullptr, 0), "aclshmemx_set_conf_store_tls",
                             "enable=false");
  }
  HP_RETURN_IF_ERROR(AgreeOnStatus(bootstrap, prepared, "preparing CANN SHMEM"));

  // 2. Rank 0 creates the unique id; one exchange carries it and every rank's host and HCCS group (the topology).
  //    Bounded by the bootstrap's timeout, like every exchange before CANN's collective calls.
  UniqueIdWire mine{};
  std::string host = options_.node_name;
  if (host.empty()) {
    char name[sizeof(mine.host)] = {};
    host = gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown";
  }
  std::strncpy(mine.host, host.c_str(), sizeof(mine.host) - 1);
  // hybm applies the group rule on a 910B only (dl_api.cpp:67-78: "Ascend910B" in the SoC name).
  mine.hccs_group = soc_name_.find("Ascend910B") != std::string::npos ? logical_device_ / kHccsGroupSize : 0;
  if (rank_ == 0) mine.cann_code = aclshmemx_get_uniqueid(&mine.uid);
  std::vector<UniqueIdWire> all(static_cast<std::size_t>(world_size_));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(&mine, sizeof(mine), all.data()));
  const std::string uid_env = EnvFact("SHMEM_UID_SESSION_ID") + " " + EnvFact("SHMEM_UID_SOCK_IFNAME");
  if (all[0].cann_code == ACLSHMEM_INVALID_PARAM) {
    // What CANN answers when it finds no address to bind the id to (shmemi_bootstrap_config_store.cpp:54-64).
    return InvalidArgument(
        "`SHMEM_UID_SESSION_ID` or `SHMEM_UID_SOCK_IFNAME` must let CANN find an address of rank 0's host (ip:port, or "
        "an interface-name prefix with its family after a colon, e.g. eth0:inet4; with neither, CANN takes the first "
        "up, running, non-loopback, non-virtual interface), but got " + uid_env +
        " (aclshmemx_get_uniqueid failed on rank 0: cann_error_code=-1 (ACLSHMEM_INVALID_PARAM))");
  }
  HP_RETURN_IF_ERROR(FromShmemCode(all[0].cann_code, "aclshmemx_get_uniqueid", "rank=0 " + uid_env));
  auto* uid = reinterpret_cast<aclshmemx_uniqueid_t*>(unique_id_.data());
  std::memcpy(uid, &all[0].uid, sizeof(*uid));
  std::vector<std::string> hosts;
  std::vector<int> groups;
  for (const UniqueIdWire& wire : all) {
    hosts.emplace_back(wire.host, strnlen(wire.host, sizeof(wire.host)));
    groups.push_back(wire.hccs_group);
  }
  const std::set<std::string> distinct_hosts(hosts.begin(), hosts.end());
  uses_roce_ = distinct_hosts.size() > 1;
  HP_RETURN_IF_ERROR(DeriveNodes(hosts, groups));

  // 3. Every rank initialises with the id; CANN's init has several control barriers over all PEs, bounded by its own
  //    DEFAULT_TIMEOUT (120 s) in unique-id mode whatever option_attr says (set anyway, for other modes).
  aclshmemx_init_attr_t attributes{};
  Status configured = FromShmemCode(
      aclshmemx_set_attr_uniqueid_args(rank_, world_size_, static_cast<std::int64_t>(local_mem_size_), uid,
                                       &attributes),
      "aclshmemx_set_attr_uniqueid_args",
      "my_pe=" + std::to_string(rank_) + " n_pes=" + std::to_string(world_size_) +
          " local_mem_size=" + std::to_string(local_mem_size_));
  HP_RETURN_IF_ERROR(AgreeOnStatus(bootstrap, configured, "configuring CANN SHMEM"));
  const auto timeout_s = static_cast<std::uint32_t>(std::min(std::ceil(timeout_sec_), 86400.0));
  attributes.option_attr.shm_init_timeout = timeout_s;
  attributes.option_attr.shm_create_timeout = timeout_s;
  attributes.option_attr.control_operation_timeout = timeout_s;
  if (uses_roce_) {
    // MTE inside a node, RoCE to every other PE (mem_entity_default.cpp:846-848): without it, other nodes are out of
    // reach.
    attributes.option_attr.data_op_engine_type =
        static_cast<data_op_engine_type_t>(ACLSHMEM_DATA_OP_MTE | ACLSHMEM_DATA_OP_ROCE);
  }
  const int init_code = aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attributes);
  Status initialised = FromShmemCode(init_code, "aclshmemx_init_attr",
                                     "my_pe=" + std::to_string(rank_) + " n_pes=" + std::to_string(world_size_) +
                                         " local_mem_size=" + std::to_string(local_mem_size_) +
                                         " device=" + Npu(device_id_) + " hosts=" +
                                         std::to_string(distinct_hosts.size()));
  const bool cann_initialised = initialised.ok();
  if (!initialised.ok()) initialised = ReleaseHalfInit(std::move(initialised), init_code);
  if (initialised.ok()) {
    initialised = FromAclError(aclrtCreateStream(&default_stream_), "aclrtCreateStream", "stream=default");
  }
  if (initialised.ok()) {
    heap_base_ = reinterpret_cast<std::uintptr_t>(aclshmemx_get_heap_base(DEVICE_SIDE));
    if (heap_base_ == 0) initialised = DeviceError("CANN SHMEM has no heap after init: device=" + Npu(device_id_));
  }
  if (initialised.ok()) initialised = CreateNodeTeam();
  Status agreed = AgreeOnStatus(bootstrap, initialised, "initialising CANN SHMEM");
  if (!agreed.ok()) {
    if (state_ != State::kFailed) AbandonInit(cann_initialised);
    return agreed;
  }
  state_ = State::kInitialized;
  const int nodes = static_cast<int>(std::set<int>(nodes_.begin(), nodes_.end()).size());
  HP_LOG(kInfo, "ascend device initialised: world_size=" + std::to_string(world_size_) + " device=" +
                    Npu(device_id_) + " logical_device=" + std::to_string(logical_device_) + " soc=" + soc_name_ +
                    " local_mem_size=" + std::to_string(local_mem_size_) + " heap_size=" + std::to_string(heap_size_) +
                    " heap_base=" + Hex(heap_base_) + " hosts=" + std::to_string(distinct_hosts.size()) +
                    " nodes=" + std::to_string(nodes) + (uses_roce_ ? " engines=mte+roce" : " engines=mte"));
  return Status::Ok();
}

Status AscendDevice::DeriveNodes(const std::vector<std::string>& hosts, const std::vector<int>& groups) {
  // A node is a (host, HCCS group), numbered by its lowest PE: the same list on every rank.
  hosts_ = hosts;
  hccs_groups_ = groups;
  nodes_.assign(static_cast<std::size_t>(world_size_), 0);
  for (int pe = 0; pe < world_size_; ++pe) {
    for (int lowest = 0; lowest <= pe; ++lowest) {
      if (hosts[static_cast<std::size_t>(lowest)] == hosts[static_cast<std::size_t>(pe)] &&
          groups[static_cast<std::size_t>(lowest)] == groups[static_cast<std::size_t>(pe)]) {
        nodes_[static_cast<std::size_t>(pe)] = lowest;
        break;
      }
    }
  }
  // Barrier runs over a CANN team of the node, and CANN's teams are strided.
  int start = 0, stride = 1, size = 0;
  for (int pe = 0; pe < world_size_; ++pe) {
    if (nodes_[static_cast<std::size_t>(pe)] != pe) continue;
    if (!StridedMembers(nodes_, pe, &start, &stride, &size)) {
      return InvalidArgument("the ranks of each node must be evenly spaced (CANN's teams are strided, and the node "
                             "barrier is one), but got a node that is not: " + NodeFact("node", pe) +
                             " (order the ranks by host and NPU)");
    }
  }
  return Status::Ok();
}

Status AscendDevice::CreateNodeTeam() {
  int start = 0, stride = 1, size = 0;
  (void)StridedMembers(nodes_, nodes_[static_cast<std::size_t>(rank_)], &start, &stride, &size);
  if (size == world_size_) {
    node_team_ = ACLSHMEM_TEAM_WORLD;
    return Status::Ok();
  }
  aclshmem_team_t team = ACLSHMEM_TEAM_INVALID;
  HP_RETURN_IF_ERROR(FromShmemCode(aclshmem_team_split_strided(ACLSHMEM_TEAM_WORLD, start, stride, size, &team),
                                   "aclshmem_team_split_strided",
                                   "pe_start=" + std::to_string(start) + " pe_stride=" + std::to_string(stride) +
                                       " pe_size=" + std::to_string(size) + " (the node barrier's team)"));
  if (team == ACLSHMEM_TEAM_INVALID) {
    return Internal("this rank is not a member of its own node's team: rank=" + std::to_string(rank_) + " " +
                    NodeFact("node", rank_));
  }
  node_team_ = team;
  return Status::Ok();
}

std::string AscendDevice::NodeFact(const char* key, int pe) const {
  const auto at = static_cast<std::size_t>(pe);
  return std::string(key) + "=" + std::to_string(nodes_[at]) + " (host=" + hosts_[at] +
         " hccs_group=" + std::to_string(hccs_groups_[at]) + ")";
}

Status AscendDevice::CheckOnNode(int pe, const char* op, const std::string& reason) const {
  if (nodes_[static_cast<std::size_t>(pe)] == nodes_[static_cast<std::size_t>(rank_)]) return Status::Ok();
  return StateError("pe lies outside this rank's node (" + reason + "): op=" + op + " pe=" + std::to_string(pe) +
                    " " + NodeFact("pe_node", pe) + " rank=" + std::to_string(rank_) + " " + NodeFact("node", rank_));
}

Status AscendDevice::CheckReach(int pe, const char* op, bool remote_ok) const {
  if (remote_ok && reaches_remotely(pe)) return Status::Ok();
  if (!remote_ok) {
    return CheckOnNode(pe, op, "signal add is an MTE atomic at aclshmem_ptr's address, which reaches this node only, "
                               "RoCE or not");
  }
  return CheckOnNode(pe, op, "this NPU reaches other nodes over RoCE only, which is on only when the ranks span "
                             "several hosts; without it put, get and signal do nothing on the NPU");
}

bool AscendDevice::reaches_remotely(int pe) const {
  return uses_roce_ && pe >= 0 && pe < world_size_ &&
         nodes_[static_cast<std::size_t>(pe)] != nodes_[static_cast<std::size_t>(rank_)];
}

Status AscendDevice::ReleaseHalfInit(Status failure, int cann_code) {
  // v1.5.1 rolls a failed aclshmemx_init_attr back at no step: it leaves NOT_INITIALIZED (failed before the heap, e.g.
  // a peer missing at init_device_state's barrier, shmem_init_backend.cpp:121-125), SHM_CREATED (after it,
  // :593) or IS_INITIALIZED (its last barrier, shmem_init.cpp:517-520), and in every case its bootstrap, its stream
  // (shmem_init.cpp:142-144) and hybm stay until aclshmem_finalize, which skips what was never built.
  const int left = aclshmemx_init_status();
  std::string hint;
  if (cann_code == ACLSHMEM_SMEM_ERROR) {
    hint = "; ACLSHMEM_SMEM_ERROR is how v1.5.1 reports a control barrier that failed (a peer missing, or later than "
           "CANN's 120 s) or its memory layer failing";
  }
  Status finalized = FromShmemCode(aclshmem_finalize(), "aclshmem_finalize", "after a failed init");
  const int after = aclshmemx_init_status();
  if (finalized.ok() && after == ACLSHMEM_STATUS_NOT_INITIALIZED) {
    return Status(failure.code(), failure.message() + " (CANN left init_status=" + InitStatusName(left) +
                                      " behind, released by aclshmem_finalize" + hint + ")");
  }
  state_ = State::kFailed;
  return Status(failure.code(),
                failure.message() + " (CANN left init_status=" + InitStatusName(left) +
                    " behind, which aclshmem_finalize did not release: init_status=" + InitStatusName(after) +
                    "; CANN SHMEM cannot be initialised again in this process" +
                    (finalized.ok() ? "" : ": " + finalized.message()) + hint + ")");
}

void AscendDevice::AbandonInit(bool cann_initialised) {
  if (default_stream_ != nullptr) {
    (void)aclrtDestroyStream(default_stream_);
    default_stream_ = nullptr;
  }
  if (cann_initialised) {
    Status finalized = FromShmemCode(aclshmem_finalize(), "aclshmem_finalize", "after a failed init");
    if (!finalized.ok()) HP_LOG(kWarning, finalized.ToString());
  }
  node_team_ = ACLSHMEM_TEAM_INVALID;
  heap_base_ = 0;
  heap_size_ = 0;
  state_ = State::kUninitialized;
}

Status AscendDevice::Finalize() {
  if (state_ == State::kUninitialized) return Status::Ok();
  if (state_ == State::kFailed) return StateError("ascend device failed to finalize and cannot be used again: op=Finalize");
  // Shutdown must not strand CANN's resources: release them on the frozen NPU even when the caller moved away.
  std::int32_t current = device_id_;
  const bool moved = aclrtGetDevice(&current) == ACL_SUCCESS && current != device_id_;
  if (moved) {
    HP_LOG(kWarning, "finalizing the ascend device on its own NPU: device=" + Npu(device_id_) +
                         " current_device=" + Npu(current));
    (void)aclrtSetDevice(device_id_);
  }
  Status quiesced = Quiesce();
  if (!quiesced.ok()) HP_LOG(kWarning, "a stream operation failed and was never synchronized: " + quiesced.ToString());
  std::vector<void*> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stuck_.empty()) {
      // Destroying such a stream, or CANN's finalize under its kernel, would hang: leave CANN as it is.
      state_ = State::kFailed;
      if (moved) (void)aclrtSetDevice(current);
      return StateError("a stream of the ascend device still runs a kernel that never ends (a wait or barrier that "
                        "timed out and could not be released), so CANN SHMEM cannot be finalized in this process: "
                        "stuck_streams=" + std::to_string(stuck_.size()) + " device=" + Npu(device_id_));
    }
    streams.assign(own_streams_.begin(), own_streams_.end());
    own_streams_.clear();
    foreign_streams_.clear();
    kept_.clear();
    pending_.clear();
    reserved_.clear();
    waits_.clear();
  }
  Status events = DestroyEvents();
  if (!events.ok()) HP_LOG(kWarning, events.ToString());
  ReleasePools();
  streams.push_back(default_stream_);
  default_stream_ = nullptr;
  for (void* stream : streams) {
    Status destroyed = FromAclError(aclrtDestroyStream(stream), "aclrtDestroyStream", "stream=" + Hex(reinterpret_cast<std::uintptr_t>(stream)));
    if (!destroyed.ok()) HP_LOG(kWarning, destroyed.ToString());
  }
  Status finalized = FromShmemCode(aclshmem_finalize(), "aclshmem_finalize", "device=" + Npu(device_id_));
  if (moved) (void)aclrtSetDevice(current);
  heap_base_ = 0;
  node_team_ = ACLSHMEM_TEAM_INVALID;
  if (!finalized.ok()) {
    state_ = State::kFailed;
    return finalized;
  }
  heap_size_ = 0;
  state_ = State::kUninitialized;
  return Status::Ok();
}

Status AscendDevice::CheckAllocate(std::size_t /*bytes*/, std::size_t /*alignment*/) const {
  return RequireReady("Allocate");
}

Result<void*> AscendDevice::Allocate(std::size_t bytes, std::size_t alignment) {
  HP_RETURN_IF_ERROR(RequireReady("Allocate"));
  const std::size_t size = std::max<std::size_t>(bytes, 1);   // CANN refuses zero bytes
  const bool aligned = alignment > kCannGranule;
  const char* call = aligned ? "aclshmem_align" : "aclshmem_malloc";
  void* ptr = aligned ? aclshmem_align(alignment, size) : aclshmem_malloc(size);
  const std::string facts = "requested=" + std::to_string(bytes) + " alignment=" + std::to_string(alignment) +
                            " local_mem_size=" + std::to_string(local_mem_size_) +
                            " heap_size=" + std::to_string(heap_size_);
  if (ptr == nullptr && HeapHasRoom(size, std::max(alignment, kCannGranule))) {
    // CANN answers NULL for a full heap and for a failed closing barrier alike, and only logs which
    // (shmem_mm.cpp:46-53, :104-111); a barrier fails with ACLSHMEM_SMEM_ERROR (shmemi_bootstrap_config_store.cpp:
    // 206-209). The runtime agreed on the request, and the heap has room for it: the barrier failed.
    return Timeout(std::string(call) + " failed: cann_error_code=" + std::to_string(ACLSHMEM_SMEM_ERROR) +
                   " (ACLSHMEM_SMEM_ERROR) " + facts + " (the heap has room for it, so CANN's closing control "
                   "barrier failed: a peer missing or later than CANN's 120 s control timeout, or its config store "
                   "failing; CANN only logs it)");
  }
  if (ptr == nullptr) {
    return FromShmemCode(ACLSHMEM_MALLOC_FAILED, call,
                         facts + " (the symmetric heap has no gap that large; CANN's own structures take about "
                                 "5.13 MiB of it)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  reserved_[reinterpret_cast<std::uintptr_t>(ptr)] = RoundUp(size, kCannGranule);
  return ptr;
}

bool AscendDevice::HeapHasRoom(std::size_t bytes, std::size_t alignment) const {
  // CANN's allocator finds a block whenever some free range holds the request at an aligned offset
  // (memory_manager::allocate / aligned_allocate, shmem_mgr.cpp:36-124): walk the gaps between what is taken.
  const std::size_t need = RoundUp(bytes, kCannGranule);
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t free_from = kCannInitBytes;
  auto fits = [&](std::size_t begin, std::size_t end) {
    const std::size_t start = RoundUp(begin, alignment);
    return start <= end && end - start >= need;
  };
  for (const auto& [address, reserved] : reserved_) {
    const std::size_t offset = address - heap_base_;
    if (offset > free_from && fits(free_from, offset)) return true;
    free_from = std::max(free_from, offset + reserved);
  }
  return free_from < heap_size_ && fits(free_from, heap_size_);
}

Status AscendDevice::Free(void* ptr) {
  HP_RETURN_IF_ERROR(RequireReady("Free"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reserved_.erase(reinterpret_cast<std::uintptr_t>(ptr)) == 0) {
      return InvalidArgument("`ptr` must be an allocation of the ascend device, but got " +
                             Hex(reinterpret_cast<std::uintptr_t>(ptr)));
    }
  }
  aclshmem_free(ptr);
  return Status::Ok();
}

std::size_t AscendDevice::ReservedBytes(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reserved_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == reserved_.end() ? 0 : it->second;
}

Result<void*> AscendDevice::PeerAddress(const void* symmetric, int pe) const {
  HP_RETURN_IF_ERROR(RequireReady("PeerAddress"));
  HP_RETURN_IF_ERROR(CheckPe(pe));
  return PeerInPlace(symmetric, pe, "PeerAddress");
}

Result<void*> AscendDevice::PeerInPlace(const void* symmetric, int pe, const char* op) const {
  // aclshmem_ptr answers p2p_device_heap_base[pe] + offset for every valid PE (shmem_host_rma.cpp:36-57,
  // shmem_init_backend.cpp:370), but hybm maps only the heaps of MTE-reachable peers
  // (hybm_acl_device_mem_segment.cpp:315-318): an address on another node faults the kernel that touches it.
  HP_RETURN_IF_ERROR(CheckOnNode(pe, op, "this NPU maps the heaps of its own node only (MTE: the same host and HCCS "
                                         "group), and a kernel touching another node's address faults"));
  void* peer = aclshmem_ptr(const_cast<void*>(symmetric), pe);
  if (peer == nullptr) {
    return InvalidArgument("`symmetric` must be an address inside the symmetric heap, but got " +
                           Hex(reinterpret_cast<std::uintptr_t>(symmetric)) + " (aclshmem_ptr found none on pe=" +
                           std::to_string(pe) + ")");
  }
  return peer;
}

void* AscendDevice::Resolve(StreamHandle stream) {
  if (stream == kDefaultStream) return default_stream_;
  void* acl_stream = reinterpret_cast<void*>(stream);
  std::lock_guard<std::mutex> lock(mu_);
  if (own_streams_.count(acl_stream) == 0) foreign_streams_.insert(acl_stream);
  return acl_stream;
}

Status AscendDevice::Synchronize(void* acl_stream, const std::string& what) {
  bool stuck = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stuck = stuck_.count(acl_stream) != 0;
  }
  const int code = aclrtSynchronizeStreamWithTimeout(acl_stream, timeout_ms_);
  if (stuck) {
    // A barrier can still complete once the late peers arrive; a wait once its signal comes.
    if (code == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) {
      return StateError("stream still runs a kernel that never ends (a wait or barrier that timed out): " + what);
    }
    std::lock_guard<std::mutex> lock(mu_);
    stuck_.erase(acl_stream);
  }
  Status synced = FromAclError(code, "aclrtSynchronizeStreamWithTimeout", what + " " + TimeoutFact());
  if (code == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) {
    const bool drained = ReleaseAndDrain(acl_stream);
    return Status(synced.code(), synced.message() + (drained ? " (the device released the stream's waits by writing "
                                                               "each awaited value into its local signal, and "
                                                               "drained the stream)"
                                                             : " (the stream could not be drained: it is never "
                                                               "destroyed, and CANN SHMEM cannot be finalized)"));
  }
  if (synced.ok()) Drained(acl_stream);
  return synced;
}

bool AscendDevice::ReleaseAndDrain(void* acl_stream) {
  std::vector<PendingWait> waits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waits_.find(acl_stream);
    if (it != waits_.end()) waits = it->second;
  }
  // A timed-out wait keeps its kernel spinning: only the awaited value ends it. Writing it into the local signal
  // (a host-to-device copy, outside the stream) is what the peer would have done; the signal keeps that value.
  for (const PendingWait& wait : waits) {
    std::int32_t value = 0;
    if (!Satisfying(wait.cmp, wait.value, &value)) continue;
    Status written = FromAclError(aclrtMemcpy(wait.signal, sizeof(value), &value, sizeof(value),
                                              ACL_MEMCPY_HOST_TO_DEVICE),
                                  "aclrtMemcpy", "op=ReleaseWait");
    if (!written.ok()) HP_LOG(kWarning, written.ToString());
  }
  const int drained = aclrtSynchronizeStreamWithTimeout(acl_stream, timeout_ms_);
  if (drained == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) {
    std::lock_guard<std::mutex> lock(mu_);
    stuck_.insert(acl_stream);
    HP_LOG(kWarning, "a stream of the ascend device could not be drained after a timeout: stream=" +
                         Hex(reinterpret_cast<std::uintptr_t>(acl_stream)) + " released_waits=" +
                         std::to_string(waits.size()));
    return false;
  }
  Drained(acl_stream);
  return true;
}

Status AscendDevice::Completed(StreamHandle stream, void* acl_stream, KeepAlive keep, const std::string& what) {
  if (stream == kDefaultStream) return Synchronize(acl_stream, what);
  if (keep != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_[acl_stream].push_back(std::move(keep));
  }
  return Status::Ok();
}

Status AscendDevice::CopyLocal(const char* op, void* dst, const void* src, std::size_t bytes, bool to_heap) {
  HP_RETURN_IF_ERROR(RequireReady(op));
  const void* symmetric = to_heap ? dst : src;
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*this, symmetric, bytes, to_heap ? "symmetric_dst" : "symmetric_src"));
  if (bytes == 0) return Status::Ok();
  HP_RETURN_IF_ERROR(RefuseIfAnyCaptured(op, "run a blocking aclrtMemcpy"));
  return FromAclError(
      aclrtMemcpy(dst, bytes, src, bytes, to_heap ? ACL_MEMCPY_HOST_TO_DEVICE : ACL_MEMCPY_DEVICE_TO_HOST),
      "aclrtMemcpy",
      std::string("op=") + op + " kind=" + (to_heap ? "host_to_device" : "device_to_host") +
          " bytes=" + std::to_string(bytes) +
          " heap_offset=" + Hex(reinterpret_cast<std::uintptr_t>(symmetric) - heap_base_));
}

Status AscendDevice::RefuseIfCaptured(void* acl_stream, const char* op, const char* would,
                                      const char* because) const {
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI model = nullptr;
  // A runtime that cannot tell (an error) has no capture going on this stream for us to protect.
  if (aclmdlRICaptureGetInfo(acl_stream, &status, &model) != ACL_SUCCESS ||
      status == ACL_MODEL_RI_CAPTURE_STATUS_NONE) {
    return Status::Ok();
  }
  return StateError(std::string(op) + " cannot run while stream " + Hex(reinterpret_cast<std::uintptr_t>(acl_stream)) +
                    " is being captured (aclmdlRICaptureBegin): it would " + would + ", " + because +
                    ": capture_status=" +
                    (status == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE ? "active" : "invalidated"));
}

Status AscendDevice::RefuseIfAnyCaptured(const char* op, const char* would) const {
  std::vector<void*> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams.assign(own_streams_.begin(), own_streams_.end());
    streams.insert(streams.end(), foreign_streams_.begin(), foreign_streams_.end());
  }
  for (void* stream : streams) HP_RETURN_IF_ERROR(RefuseIfCaptured(stream, op, would));
  return Status::Ok();
}

Status AscendDevice::CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) {
  return CopyLocal("CopyToHeap", symmetric_dst, host_src, bytes, true);
}

Status AscendDevice::CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) {
  return CopyLocal("CopyFromHeap", host_dst, symmetric_src, bytes, false);
}

Status AscendDevice::CheckCopy(const char* op, int pe, std::size_t bytes) const {
  HP_RETURN_IF_ERROR(RequireReady(op));
  HP_RETURN_IF_ERROR(CheckPe(pe));
  HP_RETURN_IF_ERROR(CheckReach(pe, op, /*remote_ok=*/true));
  if (bytes > options_.max_transfer_bytes) {
    return InvalidArgument("`bytes` of one device call must be at most " + std::to_string(options_.max_transfer_bytes) +
                           ", but got " + std::to_string(bytes));
  }
  return Status::Ok();
}

Status AscendDevice::Put(void* symmetric_dst, const void* src, std::size_t bytes, int pe, StreamHandle stream,
                         KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckCopy("Put", pe, bytes));
  if (bytes == 0) return Status::Ok();
  void* acl_stream = Resolve(stream);
  aclshmemx_putmem_on_stream(symmetric_dst, const_cast<void*>(src), bytes, pe, acl_stream);
  return Completed(stream, acl_stream, std::move(keep),
                   "op=Put bytes=" + std::to_string(bytes) + " pe=" + std::to_string(pe));
}

Status AscendDevice::Get(void* dst, const void* symmetric_src, std::size_t bytes, int pe, StreamHandle stream,
                         KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckCopy("Get", pe, bytes));
  if (bytes == 0) return Status::Ok();
  void* acl_stream = Resolve(stream);
  aclshmemx_getmem_on_stream(dst, const_cast<void*>(symmetric_src), bytes, pe, acl_stream);
  return Completed(stream, acl_stream, std::move(keep),
                   "op=Get bytes=" + std::to_string(bytes) + " pe=" + std::to_string(pe));
}

Status AscendDevice::Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(RequireReady("Copy"));
  if (bytes == 0) return Status::Ok();
  void* acl_stream = Resolve(stream);
  const std::string what = "op=Copy kind=device_to_device bytes=" + std::to_string(bytes) +
                           " dst=" + Hex(reinterpret_cast<std::uintptr_t>(dst)) +
                           " src=" + Hex(reinterpret_cast<std::uintptr_t>(src));
  // The DMA engine copies on the stream, in its order; a refused argument comes back at once.
  HP_RETURN_IF_ERROR(FromAclError(aclrtMemcpyAsync(dst, bytes, src, bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, acl_stream),
                                  "aclrtMemcpyAsync", what));
  return Completed(stream, acl_stream, std::move(keep), what);
}

namespace {
Status NoPeerMemory(const char* op) {
  return DeviceError(std::string("the ascend device does not reach peers' memory outside the symmetric heap: op=") + op +
                     " (ordinary tensors stage through the heap; reaches_peer_memory() is false)");
}
}  // namespace

Status AscendDevice::GetPeerMemory(void* /*dst*/, std::uint64_t /*peer_address*/, std::size_t /*bytes*/, int /*pe*/,
                                   StreamHandle /*stream*/, KeepAlive /*keep*/) {
  return NoPeerMemory("GetPeerMemory");
}

Status AscendDevice::ReducePeerMemory(void* /*dst*/, const std::vector<std::uint64_t>& /*addresses*/,
                                      const std::vector<int>& /*pes*/, std::size_t /*count*/, DataType /*dtype*/,
                                      ReduceOp /*op*/, StreamHandle /*stream*/, KeepAlive /*keep*/) {
  return NoPeerMemory("ReducePeerMemory");
}

Status AscendDevice::Signal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                            StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("Signal"));
  HP_RETURN_IF_ERROR(CheckPe(pe));
  HP_RETURN_IF_ERROR(CheckSignal(width, value, "value"));
  // The kernel ignores an op it does not know (shmem_device_so.hpp:333-343, no default case): refused here instead.
  if (!ValidSignalOp(op)) {
    return InvalidArgument("`op` must be set or add, but got " + std::to_string(static_cast<int>(op)));
  }
  HP_RETURN_IF_ERROR(CheckReach(pe, op == SignalOp::kSet ? "Signal(set)" : "Signal(add)", op == SignalOp::kSet));
  void* acl_stream = Resolve(stream);
  // One kernel, no quiet before it: every put and get before it on the stream was a blocking one
  // (aclshmemx_putmem_on_stream launches aclshmemi_putmem, shmemi_device_rma.cpp:150-155), which quiets on every
  // transport before its kernel ends (shmem_device_rma.hpp:116-151, 341-374), and local copies and operators ran
  // before it in stream order: a peer that sees the signal sees the data.
  aclshmemx_signal_op_on_stream(static_cast<std::int32_t*>(symmetric_signal), static_cast<std::int32_t>(value),
                                ToCannSignalOp(op), pe, acl_stream);
  return Completed(stream, acl_stream, nullptr,
                   std::string("op=Signal signal=") + Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal)) +
                       " sig_op=" + SignalOpName(op) + " value=" + std::to_string(value) + " pe=" + std::to_string(pe));
}

Status AscendDevice::WaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                                StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("WaitSignal"));
  HP_RETURN_IF_ERROR(CheckSignal(width, value, "value"));
  // The kernel returns at once for an op it does not know (shmem_device_p2p_sync.hpp:74-90, no default case).
  if (!ValidCompareOp(cmp)) {
    return InvalidArgument("`cmp` must be eq, ne, gt, ge, lt or le, but got " + std::to_string(static_cast<int>(cmp)));
  }
  void* acl_stream = Resolve(stream);
  aclshmemx_signal_wait_until_on_stream(static_cast<std::int32_t*>(symmetric_signal), ToCannCompare(cmp),
                                        static_cast<std::int32_t>(value), acl_stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    waits_[acl_stream].push_back({symmetric_signal, cmp, static_cast<std::int32_t>(value)});
  }
  return Completed(stream, acl_stream, nullptr,
                   std::string("op=WaitSignal signal=") + Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal)) +
                       " heap_offset=" + Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal) - heap_base_) +
                       " cmp=" + CompareOpName(cmp) + " expected=" + std::to_string(value));
}

Status AscendDevice::Barrier(StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("Barrier"));
  void* acl_stream = Resolve(stream);
  // One kernel over the node's team; CANN's barrier reads every member's word in place (shmemi_device_cc.h:314-324),
  // so it cannot span nodes, RoCE or not.
  aclshmemx_barrier_on_stream(node_team_, acl_stream);
  return Completed(stream, acl_stream, nullptr,
                   "op=Barrier team=" + std::to_string(node_team_) + " " + NodeFact("node", rank_));
}

Result<StreamHandle> AscendDevice::CreateStream() {
  HP_RETURN_IF_ERROR(RequireReady("CreateStream"));
  void* stream = nullptr;
  HP_RETURN_IF_ERROR(FromAclError(aclrtCreateStream(&stream), "aclrtCreateStream", "device=" + Npu(device_id_)));
  std::lock_guard<std::mutex> lock(mu_);
  own_streams_.insert(stream);
  return reinterpret_cast<StreamHandle>(stream);
}

Status AscendDevice::DestroyStream(StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("DestroyStream"));
  void* acl_stream = reinterpret_cast<void*>(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (own_streams_.erase(acl_stream) == 0) {
      return InvalidArgument("`stream` must be a live stream of the ascend device, but got handle " + Hex(stream));
    }
  }
  // ACL destroys only drained streams: the queued work finishes first (bounded); a failure of it is logged.
  Status drained = Synchronize(acl_stream, "op=DestroyStream");
  if (!drained.ok()) HP_LOG(kWarning, "an operation of a destroyed stream failed: " + drained.ToString());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stuck_.count(acl_stream) != 0) {
      // aclrtDestroyStream would block for good behind the kernel that never ends: the stream is left alone.
      own_streams_.insert(acl_stream);
      return StateError("stream still runs a kernel that never ends and cannot be destroyed: stream=" + Hex(stream));
    }
    pending_.erase(acl_stream);
    waits_.erase(acl_stream);
  }
  Status destroyed = FromAclError(aclrtDestroyStream(acl_stream), "aclrtDestroyStream", "stream=" + Hex(stream));
  if (destroyed.ok()) {   // ACL ran its queue first: what its calls kept, its fences and its buffers can go
    Drained(acl_stream);
    FreeStreamBuffers(acl_stream);
  }
  return destroyed;
}

Status AscendDevice::SynchronizeStream(StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("SynchronizeStream"));
  void* acl_stream = Resolve(stream);
  HP_RETURN_IF_ERROR(RefuseIfCaptured(acl_stream, "SynchronizeStream", "synchronize the stream"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(acl_stream);
    if (it != pending_.end()) {
      Status pending = std::move(it->second);
      pending_.erase(it);
      return pending;
    }
  }
  return Synchronize(acl_stream, "op=SynchronizeStream stream=" + Hex(stream));
}

Status AscendDevice::StreamWaitStream(StreamHandle waiter, StreamHandle waited) {
  HP_RETURN_IF_ERROR(RequireReady("StreamWaitStream"));
  if (waiter == waited) return Status::Ok();
  void* waiter_stream = Resolve(waiter);
  void* waited_stream = Resolve(waited);
  void* event = nullptr;
  HP_RETURN_IF_ERROR(FromAclError(aclrtCreateEvent(&event), "aclrtCreateEvent", "op=StreamWaitStream"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
  }
  HP_RETURN_IF_ERROR(FromAclError(aclrtRecordEvent(event, waited_stream), "aclrtRecordEvent",
                                  "op=StreamWaitStream stream=" + Hex(waited)));
  HP_RETURN_IF_ERROR(FromAclError(aclrtStreamWaitEvent(waiter_stream, event), "aclrtStreamWaitEvent",
                                  "op=StreamWaitStream stream=" + Hex(waiter)));
  return Completed(waiter, waiter_stream, nullptr, "op=StreamWaitStream");
}

Status AscendDevice::DestroyEvents() {
  std::vector<void*> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(events_);
  }
  Status first = Status::Ok();
  for (void* event : events) {
    Status destroyed = FromAclError(aclrtDestroyEvent(event), "aclrtDestroyEvent", "");
    if (first.ok()) first = destroyed;
  }
  return first;
}

Status AscendDevice::Quiesce() {
  if (state_ != State::kInitialized) return Status::Ok();
  HP_RETURN_IF_ERROR(CheckCurrentDevice());
  std::vector<void*> streams{default_stream_};
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams.insert(streams.end(), own_streams_.begin(), own_streams_.end());
    streams.insert(streams.end(), foreign_streams_.begin(), foreign_streams_.end());
  }
  for (void* stream : streams) HP_RETURN_IF_ERROR(RefuseIfCaptured(stream, "Quiesce", "synchronize the stream"));
  Status first = Status::Ok();
  std::vector<void*> forgotten;
  for (void* stream : streams) {
    Status synced = Synchronize(stream, "op=Quiesce stream=" + Hex(reinterpret_cast<std::uintptr_t>(stream)));
    std::lock_guard<std::mutex> lock(mu_);
    auto pending = pending_.find(stream);
    if (!synced.ok() && pending == pending_.end()) pending = pending_.emplace(stream, synced).first;
    if (first.ok() && pending != pending_.end()) first = pending->second;
    // Foreign streams belong to the caller: forget them once drained, so that a stale handle is never synced, and
    // free their workspaces (the next call on the stream grows new ones).
    if (synced.ok() && foreign_streams_.erase(stream) == 1) forgotten.push_back(stream);
  }
  for (void* stream : forgotten) FreeStreamBuffers(stream);
  // Every stream drained: no wait can still refer to an event.
  if (first.ok()) HP_RETURN_IF_ERROR(DestroyEvents());
  return first;
}

// ---- staging and reads in stream order: page-locked buffers, events, and what completes with them ---------------------

namespace {

// Page-locked buffers come in powers of two from this size, so that rows of similar sizes share them.
constexpr std::size_t kMinPinnedBytes = 256;

// Why a captured stream refuses StageFromHost and ReadLater (ascend_device.h).
constexpr const char* kReplayedCopy =
    "which every replay of the graph would copy again long after this call (stale bytes, or the bytes of a later call "
    "the buffer went to); the engine's collectives cannot be captured";

std::size_t PinnedCapacity(std::size_t bytes) {
  std::size_t capacity = kMinPinnedBytes;
  while (capacity < bytes && capacity <= std::numeric_limits<std::size_t>::max() / 2) capacity *= 2;
  return std::max(capacity, bytes);
}

}  // namespace

Result<AscendDevice::PinnedBuffer> AscendDevice::TakePinned(std::size_t bytes) {
  auto free = free_pinned_.lower_bound(bytes);
  if (free != free_pinned_.end()) {
    PinnedBuffer buffer{free->second, free->first};
    free_pinned_.erase(free);
    return buffer;
  }
  PinnedBuffer buffer;
  buffer.bytes = PinnedCapacity(bytes);
  HP_RETURN_IF_ERROR(FromAclError(aclrtMallocHost(&buffer.data, buffer.bytes), "aclrtMallocHost",
                                  "bytes=" + std::to_string(buffer.bytes) + " (page-locked staging)"));
  return buffer;
}

Result<void*> AscendDevice::TakeEvent() {
  if (!free_events_.empty()) {
    void* event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  void* event = nullptr;
  HP_RETURN_IF_ERROR(FromAclError(aclrtCreateEvent(&event), "aclrtCreateEvent", "(staging and reads)"));
  return event;
}

void AscendDevice::Recycle(PinnedBuffer buffer, void* event) {
  if (buffer.data != nullptr) free_pinned_.emplace(buffer.bytes, buffer.data);
  if (event != nullptr) free_events_.push_back(event);
}

Status AscendDevice::CopyThroughPinned(const char* op, void* acl_stream, void* symmetric, std::size_t bytes,
                                       bool to_heap, const void* host_src, PinnedBuffer* buffer, void** event,
                                       std::vector<KeepAlive>* sealed) {
  const std::string what = std::string("op=") + op + " bytes=" + std::to_string(bytes) +
                           " heap_offset=" + Hex(reinterpret_cast<std::uintptr_t>(symmetric) - heap_base_) +
                           " stream=" + Hex(reinterpret_cast<std::uintptr_t>(acl_stream));
  {
    std::lock_guard<std::mutex> lock(mu_);
    HP_ASSIGN_OR_RETURN(*buffer, TakePinned(bytes));
    Result<void*> taken = TakeEvent();
    if (!taken.ok()) {
      Recycle(*buffer, nullptr);
      *buffer = PinnedBuffer{};
      return taken.status();
    }
    *event = taken.value();
  }
  // The host's bytes are taken now: the caller may reuse host_src once this returns.
  if (to_heap) std::memcpy(buffer->data, host_src, bytes);
  // Page-locked on the host side: the copy only enqueues (a pageable one would return once the stream ran it).
  Status copied =
      to_heap ? FromAclError(aclrtMemcpyAsync(symmetric, bytes, buffer->data, bytes, ACL_MEMCPY_HOST_TO_DEVICE,
                                              acl_stream),
                             "aclrtMemcpyAsync", what + " kind=host_to_device")
              : FromAclError(aclrtMemcpyAsync(buffer->data, bytes, symmetric, bytes, ACL_MEMCPY_DEVICE_TO_HOST,
                                              acl_stream),
                             "aclrtMemcpyAsync", what + " kind=device_to_host");
  // The record and the seal under one lock: whatever a call put into kept_ before was enqueued before the event.
  std::lock_guard<std::mutex> lock(mu_);
  Status recorded =
      copied.ok() ? FromAclError(aclrtRecordEvent(*event, acl_stream), "aclrtRecordEvent", what) : Status::Ok();
  if (copied.ok() && recorded.ok()) {
    auto kept = kept_.find(acl_stream);
    if (sealed != nullptr && kept != kept_.end()) {
      *sealed = std::move(kept->second);
      kept_.erase(kept);
    }
    return Status::Ok();
  }
  if (copied.ok()) {
    // The copy is enqueued but no event tells when it ran: its buffer stays with the stream's calls until the stream
    // has run past them.
    kept_[acl_stream].push_back(std::shared_ptr<void>(buffer->data, [](void* data) { (void)aclrtFreeHost(data); }));
    *buffer = PinnedBuffer{};
  }
  Recycle(*buffer, *event);   // an event whose record failed keeps its last, completed one
  *buffer = PinnedBuffer{};
  *event = nullptr;
  return copied.ok() ? recorded : copied;
}

Status AscendDevice::StageFromHost(void* symmetric_dst, const void* host_src, std::size_t bytes, StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("StageFromHost"));
  // The heap or a tensor of this NPU (MoE's split tables): aclrtMemcpyAsync reaches both.
  if (symmetric_dst == nullptr && bytes > 0) return InvalidArgument("`symmetric_dst` must not be null");
  if (bytes == 0) return Status::Ok();
  void* acl_stream = Resolve(stream);
  HP_RETURN_IF_ERROR(
      RefuseIfCaptured(acl_stream, "StageFromHost", "record a copy from a page-locked buffer", kReplayedCopy));
  HP_RETURN_IF_ERROR(ReleaseFences(nullptr, /*drained=*/false));   // buffers whose copy ran come back first
  Fence fence;
  // The event also tells when the calls enqueued before the copy have run: what they keep alive goes with it.
  HP_RETURN_IF_ERROR(CopyThroughPinned("StageFromHost", acl_stream, symmetric_dst, bytes, /*to_heap=*/true, host_src,
                                       &fence.staging, &fence.event, &fence.kept));
  {
    std::lock_guard<std::mutex> lock(mu_);
    fences_[acl_stream].push_back(std::move(fence));
  }
  return Completed(stream, acl_stream, nullptr,
                   "op=StageFromHost bytes=" + std::to_string(bytes) +
                       " heap_offset=" + Hex(reinterpret_cast<std::uintptr_t>(symmetric_dst) - heap_base_));
}

Result<std::uint64_t> AscendDevice::ReadLater(const void* symmetric_src, std::size_t bytes, StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("ReadLater"));
  if (symmetric_src == nullptr && bytes > 0) return InvalidArgument("`symmetric_src` must not be null");
  PendingRead read;
  read.bytes = bytes;
  if (bytes > 0) {
    read.acl_stream = Resolve(stream);
    HP_RETURN_IF_ERROR(
        RefuseIfCaptured(read.acl_stream, "ReadLater", "record a copy into a page-locked buffer", kReplayedCopy));
    HP_RETURN_IF_ERROR(ReleaseFences(nullptr, /*drained=*/false));
    HP_RETURN_IF_ERROR(CopyThroughPinned("ReadLater", read.acl_stream, const_cast<void*>(symmetric_src), bytes,
                                         /*to_heap=*/false, nullptr, &read.buffer, &read.event, nullptr));
  }
  void* acl_stream = read.acl_stream;
  std::uint64_t token = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    token = next_read_++;
    reads_.emplace(token, read);
  }
  if (bytes > 0) {
    HP_RETURN_IF_ERROR(Completed(stream, acl_stream, nullptr,
                                 "op=ReadLater bytes=" + std::to_string(bytes) + " heap_offset=" +
                                     Hex(reinterpret_cast<std::uintptr_t>(symmetric_src) - heap_base_)));
  }
  return token;
}

Result<bool> AscendDevice::TakeRead(std::uint64_t token, void* host_dst) {
  HP_RETURN_IF_ERROR(RequireReady("TakeRead"));
  PendingRead read;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = reads_.find(token);
    if (found == reads_.end()) {
      return InvalidArgument("`token` must be a read started by ReadLater and not taken yet, but got " +
                             std::to_string(token));
    }
    read = found->second;
    // A failure Quiesce met on the stream: the bytes may be stale; its SynchronizeStream reports it too.
    auto failed = pending_.find(read.acl_stream);
    if (failed != pending_.end()) return failed->second;
  }
  if (read.event != nullptr) {
    aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    HP_RETURN_IF_ERROR(FromAclError(aclrtQueryEventStatus(read.event, &status), "aclrtQueryEventStatus",
                                    "op=TakeRead token=" + std::to_string(token)));
    if (status != ACL_EVENT_RECORDED_STATUS_COMPLETE) return false;
  }
  if (read.bytes > 0) std::memcpy(host_dst, read.buffer.data, read.bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (reads_.erase(token) == 1) Recycle(read.buffer, read.event);
  return true;
}

Status AscendDevice::ReleaseFences(void* acl_stream, bool drained) {
  std::vector<std::vector<KeepAlive>> released;   // let go of after mu_ (a deleter may free NPU memory)
  Status asked = Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto stream = fences_.begin(); stream != fences_.end();) {
    if (acl_stream != nullptr && stream->first != acl_stream) {
      ++stream;
      continue;
    }
    std::deque<Fence>& fences = stream->second;
    while (!fences.empty()) {
      if (!drained) {   // fences complete in the order they were recorded: the first one not complete ends the walk
        aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
        asked = FromAclError(aclrtQueryEventStatus(fences.front().event, &status), "aclrtQueryEventStatus",
                             "stream=" + Hex(reinterpret_cast<std::uintptr_t>(stream->first)));
        if (!asked.ok() || status != ACL_EVENT_RECORDED_STATUS_COMPLETE) break;
      }
      Fence& fence = fences.front();
      Recycle(fence.staging, fence.event);
      released.push_back(std::move(fence.kept));
      fences.pop_front();
    }
    if (!asked.ok()) break;
    stream = fences.empty() ? fences_.erase(stream) : std::next(stream);
  }
  return asked;
}

void AscendDevice::Drained(void* acl_stream) {
  std::vector<KeepAlive> kept;   // let go of after mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = kept_.find(acl_stream);
    if (found != kept_.end()) {
      kept = std::move(found->second);
      kept_.erase(found);
    }
    waits_.erase(acl_stream);
  }
  (void)ReleaseFences(acl_stream, /*drained=*/true);   // never asks ACL: it cannot fail
}

void AscendDevice::FreeStreamBuffers(void* acl_stream) {
  std::array<DeviceBuffer, 2> buffers{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = stream_buffers_.find(acl_stream);
    if (found == stream_buffers_.end()) return;
    buffers = found->second;
    stream_buffers_.erase(found);
  }
  for (const DeviceBuffer& buffer : buffers) {
    if (buffer.data == nullptr) continue;
    Status freed = FromAclError(aclrtFree(buffer.data), "aclrtFree", "op=FreeStreamBuffers");
    if (!freed.ok()) HP_LOG(kWarning, freed.ToString());
  }
}

void AscendDevice::ReleasePools() {
  std::vector<void*> streams;
  std::vector<PinnedBuffer> buffers;
  std::vector<void*> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& entry : stream_buffers_) streams.push_back(entry.first);
    for (auto& entry : fences_) {
      for (Fence& fence : entry.second) {
        buffers.push_back(fence.staging);
        events.push_back(fence.event);
      }
    }
    fences_.clear();
    for (const auto& entry : reads_) {
      buffers.push_back(entry.second.buffer);
      events.push_back(entry.second.event);
    }
    reads_.clear();
    for (const auto& entry : free_pinned_) buffers.push_back(PinnedBuffer{entry.second, entry.first});
    free_pinned_.clear();
    events.insert(events.end(), free_events_.begin(), free_events_.end());
    free_events_.clear();
  }
  for (void* stream : streams) FreeStreamBuffers(stream);
  for (const PinnedBuffer& buffer : buffers) {
    if (buffer.data == nullptr) continue;
    Status freed = FromAclError(aclrtFreeHost(buffer.data), "aclrtFreeHost", "op=Finalize");
    if (!freed.ok()) HP_LOG(kWarning, freed.ToString());
  }
  for (void* event : events) {
    if (event == nullptr) continue;
    Status destroyed = FromAclError(aclrtDestroyEvent(event), "aclrtDestroyEvent", "op=Finalize");
    if (!destroyed.ok()) HP_LOG(kWarning, destroyed.ToString());
  }
}

}  // namespace hp::shmem::ascend
