// The ascend device's data plane: init and finalize of CANN SHMEM, symmetric memory, put/get, signals, waits, the
// barrier and streams. The aclnn compute (reductions, casts) is ascend_compute.cc.
#include "runtime/ascend/ascend_device.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
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

// aclshmem_malloc hands out 16-byte granules; larger alignments go through aclshmem_align.
constexpr std::size_t kCannGranule = 16;

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

// What every rank publishes at Init: rank 0's outcome of aclshmemx_get_uniqueid and the id, and every rank's host.
struct UniqueIdWire {
  std::int32_t cann_code;
  aclshmemx_uniqueid_t uid;
  char node[64];
};

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
  nodes_.assign(static_cast<std::size_t>(world_size_), 0);   // CANN SHMEM reaches every PE: one node
  local_mem_size_ = RoundUp(args.heap_size, kHeapPageBytes);
  heap_size_ = local_mem_size_ + ACLSHMEM_EXTRA_SIZE;
  timeout_sec_ = args.timeout_sec;
  const double timeout_ms = std::ceil(args.timeout_sec * 1000.0);
  timeout_ms_ = timeout_ms >= std::numeric_limits<std::int32_t>::max()
                    ? std::numeric_limits<std::int32_t>::max()
                    : std::max<std::int32_t>(1, static_cast<std::int32_t>(timeout_ms));

  // 1. Local preparation: the NPU the caller selected, CANN SHMEM not in use, the config store's TLS off (before
  //    anything that talks to the config store, the unique id included).
  Status prepared = FromAclError(aclrtGetDevice(&device_id_), "aclrtGetDevice",
                                 "rank=" + std::to_string(rank_) + " (select the NPU before acquire_shmem)");
  if (prepared.ok()) {
    const char* soc = aclrtGetSocName();
    soc_name_ = soc != nullptr ? soc : "unknown";
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

  // 2. Rank 0 creates the unique id; one exchange carries it and every rank's host (for RoCE). Bounded by the
  //    bootstrap's timeout, like every exchange before CANN's collective calls.
  UniqueIdWire mine{};
  std::string node = options_.node_name;
  if (node.empty()) {
    char host[sizeof(mine.node)] = {};
    node = gethostname(host, sizeof(host) - 1) == 0 ? host : "unknown";
  }
  std::strncpy(mine.node, node.c_str(), sizeof(mine.node) - 1);
  if (rank_ == 0) mine.cann_code = aclshmemx_get_uniqueid(&mine.uid);
  std::vector<UniqueIdWire> all(static_cast<std::size_t>(world_size_));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(&mine, sizeof(mine), all.data()));
  HP_RETURN_IF_ERROR(FromShmemCode(all[0].cann_code, "aclshmemx_get_uniqueid",
                                   "rank=0 " + EnvFact("SHMEM_UID_SESSION_ID") + " " +
                                       EnvFact("SHMEM_UID_SOCK_IFNAME") +
                                       " (without either, CANN binds the id to rank 0's first non-loopback "
                                       "interface)"));
  auto* uid = reinterpret_cast<aclshmemx_uniqueid_t*>(unique_id_.data());
  std::memcpy(uid, &all[0].uid, sizeof(*uid));
  std::set<std::string> nodes;
  for (const UniqueIdWire& wire : all) nodes.insert(std::string(wire.node, strnlen(wire.node, sizeof(wire.node))));
  uses_roce_ = nodes.size() > 1;

  // 3. Every rank initialises with the id; CANN ends init with a barrier over all PEs, bounded by its own
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
    // MTE inside an HCCS domain, RoCE between hosts: without RoCE only one domain is reachable.
    attributes.option_attr.data_op_engine_type =
        static_cast<data_op_engine_type_t>(ACLSHMEM_DATA_OP_MTE | ACLSHMEM_DATA_OP_ROCE);
  }
  Status initialised = FromShmemCode(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attributes),
                                     "aclshmemx_init_attr",
                                     "my_pe=" + std::to_string(rank_) + " n_pes=" + std::to_string(world_size_) +
                                         " local_mem_size=" + std::to_string(local_mem_size_) +
                                         " device=" + Npu(device_id_) + " hosts=" + std::to_string(nodes.size()));
  const bool cann_initialised = initialised.ok();
  if (!initialised.ok()) initialised = ReleaseHalfInit(std::move(initialised));
  if (initialised.ok()) {
    initialised = FromAclError(aclrtCreateStream(&default_stream_), "aclrtCreateStream", "stream=default");
  }
  if (initialised.ok()) {
    heap_base_ = reinterpret_cast<std::uintptr_t>(aclshmemx_get_heap_base(DEVICE_SIDE));
    if (heap_base_ == 0) initialised = DeviceError("CANN SHMEM has no heap after init: device=" + Npu(device_id_));
  }
  Status agreed = AgreeOnStatus(bootstrap, initialised, "initialising CANN SHMEM");
  if (!agreed.ok()) {
    if (state_ != State::kFailed) AbandonInit(cann_initialised);
    return agreed;
  }
  state_ = State::kInitialized;
  HP_LOG(kInfo, "ascend device initialised: world_size=" + std::to_string(world_size_) + " device=" +
                    Npu(device_id_) + " soc=" + soc_name_ + " local_mem_size=" + std::to_string(local_mem_size_) +
                    " heap_size=" + std::to_string(heap_size_) + " heap_base=" + Hex(heap_base_) +
                    " hosts=" + std::to_string(nodes.size()) + (uses_roce_ ? " engines=mte+roce" : " engines=mte"));
  return Status::Ok();
}

Status AscendDevice::ReleaseHalfInit(Status failure) {
  // v1.5.1 does not roll a failed aclshmemx_init_attr back once the heap exists (init_status stays
  // ACLSHMEM_STATUS_SHM_CREATED and a retry answers ACLSHMEM_INNER_ERROR): finalize what is left.
  const int left = aclshmemx_init_status();
  if (left == ACLSHMEM_STATUS_NOT_INITIALIZED) return failure;
  Status finalized = FromShmemCode(aclshmem_finalize(), "aclshmem_finalize", "after a failed init");
  const int after = aclshmemx_init_status();
  if (finalized.ok() && after == ACLSHMEM_STATUS_NOT_INITIALIZED) {
    return Status(failure.code(), failure.message() + " (CANN kept a half-initialised heap: init_status=" +
                                      std::to_string(left) + ", released by aclshmem_finalize)");
  }
  state_ = State::kFailed;
  return Status(failure.code(),
                failure.message() + " (CANN kept a half-initialised heap that aclshmem_finalize did not release: "
                                    "init_status=" + std::to_string(after) +
                                    "; CANN SHMEM cannot be initialised again in this process" +
                                    (finalized.ok() ? "" : ": " + finalized.message()) + ")");
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
  streams.push_back(default_stream_);
  default_stream_ = nullptr;
  for (void* stream : streams) {
    Status destroyed = FromAclError(aclrtDestroyStream(stream), "aclrtDestroyStream", "stream=" + Hex(reinterpret_cast<std::uintptr_t>(stream)));
    if (!destroyed.ok()) HP_LOG(kWarning, destroyed.ToString());
  }
  Status finalized = FromShmemCode(aclshmem_finalize(), "aclshmem_finalize", "device=" + Npu(device_id_));
  if (moved) (void)aclrtSetDevice(current);
  heap_base_ = 0;
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
  void* ptr = aligned ? aclshmem_align(alignment, size) : aclshmem_malloc(size);
  if (ptr == nullptr) {
    // CANN only logs why; its code for the failure is ACLSHMEM_MALLOC_FAILED.
    return FromShmemCode(ACLSHMEM_MALLOC_FAILED, aligned ? "aclshmem_align" : "aclshmem_malloc",
                         "requested=" + std::to_string(bytes) + " alignment=" + std::to_string(alignment) +
                             " local_mem_size=" + std::to_string(local_mem_size_) + " heap_size=" +
                             std::to_string(heap_size_) + " (the symmetric heap is exhausted; CANN's own "
                             "structures take about 5.13 MiB of it)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  reserved_[reinterpret_cast<std::uintptr_t>(ptr)] = RoundUp(size, kCannGranule);
  return ptr;
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
  if (synced.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.erase(acl_stream);
    waits_.erase(acl_stream);
  }
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
  std::lock_guard<std::mutex> lock(mu_);
  if (drained == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) {
    stuck_.insert(acl_stream);
    HP_LOG(kWarning, "a stream of the ascend device could not be drained after a timeout: stream=" +
                         Hex(reinterpret_cast<std::uintptr_t>(acl_stream)) + " released_waits=" +
                         std::to_string(waits.size()));
    return false;
  }
  kept_.erase(acl_stream);
  waits_.erase(acl_stream);
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
  return FromAclError(
      aclrtMemcpy(dst, bytes, src, bytes, to_heap ? ACL_MEMCPY_HOST_TO_DEVICE : ACL_MEMCPY_DEVICE_TO_HOST),
      "aclrtMemcpy",
      std::string("op=") + op + " kind=" + (to_heap ? "host_to_device" : "device_to_host") +
          " bytes=" + std::to_string(bytes) +
          " heap_offset=" + Hex(reinterpret_cast<std::uintptr_t>(symmetric) - heap_base_));
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
  void* acl_stream = Resolve(stream);
  // The quiet completes every earlier put of this PE, so that a peer that sees the signal sees the data too.
  aclshmemx_quiet_on_stream(acl_stream);
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
  aclshmemx_barrier_all_on_stream(acl_stream);
  return Completed(stream, acl_stream, nullptr, "op=Barrier world_size=" + std::to_string(world_size_));
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
    kept_.erase(acl_stream);
    pending_.erase(acl_stream);
    waits_.erase(acl_stream);
  }
  return FromAclError(aclrtDestroyStream(acl_stream), "aclrtDestroyStream", "stream=" + Hex(stream));
}

Status AscendDevice::SynchronizeStream(StreamHandle stream) {
  HP_RETURN_IF_ERROR(RequireReady("SynchronizeStream"));
  void* acl_stream = Resolve(stream);
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
  Status first = Status::Ok();
  for (void* stream : streams) {
    Status synced = Synchronize(stream, "op=Quiesce stream=" + Hex(reinterpret_cast<std::uintptr_t>(stream)));
    std::lock_guard<std::mutex> lock(mu_);
    auto pending = pending_.find(stream);
    if (!synced.ok() && pending == pending_.end()) pending = pending_.emplace(stream, synced).first;
    if (first.ok() && pending != pending_.end()) first = pending->second;
    // Foreign streams belong to the caller: forget them once drained, so that a stale handle is never synced.
    if (synced.ok()) foreign_streams_.erase(stream);
  }
  // Every stream drained: no wait can still refer to an event.
  if (first.ok()) HP_RETURN_IF_ERROR(DestroyEvents());
  return first;
}

}  // namespace hp::shmem::ascend