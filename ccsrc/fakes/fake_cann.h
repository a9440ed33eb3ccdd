// Test control of the fake ACL runtime, fake aclnn operators and fake CANN SHMEM (ccsrc/fakes): what the calls
// recorded and cost, which calls fail next, how late streams run, and a reset between tests.
//
// The fakes behave as CANN SHMEM v1.5.1 does on the chip, and fail where the chip fails (third_party/shmem_patches/
// README.md lists the facts; the code names the source line of each):
// - The heap is local_mem_size + ACLSHMEM_EXTRA_SIZE with CANN's own 5.13 MiB taken at init; malloc/calloc/align
//   end with a control-plane barrier over every PE, which fails with ACLSHMEM_SMEM_ERROR (injectable by FailNext,
//   see kControlBarrier); calloc(nmemb, size) zeroes only `size` bytes; unique-id mode bounds the barriers by
//   DEFAULT_TIMEOUT and runs the config store without TLS.
// - A failed aclshmemx_init_attr keeps what it built until aclshmem_finalize: before the heap is set up the status
//   stays NOT_INITIALIZED, after it SHM_CREATED, and a failure of init's last barrier leaves IS_INITIALIZED.
// - Streams run after the host enqueued (SetStreamLag: by default a millisecond later); a timed-out wait keeps spinning, and destroying its stream or
//   finalizing hangs (counted, see SetHangLimit); streams under graph capture (aclmdlRICaptureBegin) record instead of
//   running, and refuse synchronization and blocking copies.
// - A signal SET writes back its whole 64-byte line as the writer last wrote it; unknown compare and signal ops are
//   ignored by the kernels.
// - Reachability is the chip's: PEs reach each other over MTE (mapped heaps) on one host and, on a 910B, in one group
//   of 8 logical NPUs; aclshmem_ptr answers an address for every PE, and a kernel touching an unmapped one faults;
//   put, get and SET to a PE with no transport do nothing; RoCE (opted in at init) reaches every other PE for put,
//   get and SET, never for ADD or barriers.
//
// The fakes simulate several PEs inside one process. Each thread is one simulated process: it has its own current
// ACL device (aclrtSetDevice) and, once aclshmemx_init_attr returned, its own PE. PEs find each other through the
// unique id (aclshmemx_get_uniqueid opens a session, every PE that initialises with that id joins it). Every PE
// owns a heap of local_mem_size bytes (2 MiB aligned) with a best-fit allocator that hands a freed address out
// again, as CANN's does. Streams are ordered queues, each run by a worker thread of its own, so that enqueued calls
// complete asynchronously as on an NPU; failures surface at the next synchronize.
//
// NPU memory is honest: the heaps and aclrtMalloc's buffers sit at addresses the host cannot touch (PROT_NONE: a
// host load or store there crashes the test). Only aclrtMemcpy and the stream-enqueued calls reach the bytes, and
// they reject host memory where the real ones need device memory: aclrtMemcpy with ACL_ERROR_RT_PARAM_INVALID, a
// put/get whose local buffer is not NPU memory of the caller's device with ACL_ERROR_RT_AICORE_EXCEPTION at the
// stream's next synchronize (the copy kernel faults).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "host/shmem_host_def.h"
#include "host_device/shmem_common_types.h"

namespace hp::fakes {

// One call into the fakes, as the caller made it.
struct FakeCall {
  std::string name;              // e.g. "aclshmemx_putmem_on_stream"
  int device = -1;               // the caller's current ACL device (-1: none set)
  int pe = -1;                   // the caller's PE (-1: not initialised)
  std::uintptr_t stream = 0;     // the stream argument (0: none or NULL)
  std::uintptr_t address = 0;    // dst / sig_addr / ptr argument
  std::size_t bytes = 0;         // byte count / size argument
  int target_pe = -1;            // pe argument
  std::int64_t value = 0;        // signal value, compare value, alignment, TLS enable
  int op = -1;                   // sig_op / cmp / bootstrap flags
};

// What CANN SHMEM saw at the calling thread's last aclshmemx_init_attr.
struct InitRecord {
  int bootstrap_flags = 0;
  aclshmemx_init_attr_t attr{};
  aclshmemx_uniqueid_t uid{};
  bool tls_decided = false;      // aclshmemx_set_conf_store_tls was called before init
  bool tls_enable = true;        // what aclshmemx_set_conf_store_tls asked for (CANN's default is on)
  std::string tls_info;          // read through the stored pointer at init, as CANN does
  // What the config store really ran with: v1.5.1's init_config_store() turns TLS off whatever was asked.
  bool tls_effective = false;
  // The bootstrap timeouts CANN really used (seconds): fixed at DEFAULT_TIMEOUT (120) in unique-id mode, whatever
  // option_attr says.
  std::uint32_t init_timeout_s = 0;
  std::uint32_t control_timeout_s = 0;
  std::string uid_sock_ifname;   // SHMEM_UID_SOCK_IFNAME / SHMEM_UID_SESSION_ID as aclshmemx_get_uniqueid read them
  std::string uid_session_id;
};

// What the calls of the fakes cost, counted per calling thread (simulated process) and in total, so that tests can
// assert what a collective costs on an NPU.
struct FakeCounters {
  // aclrtSynchronizeStream and aclrtSynchronizeStreamWithTimeout: the host waits for the NPU.
  std::size_t stream_synchronizations = 0;
  // aclrtMemcpy, and aclrtMemcpyAsync with a side in pageable host memory (it returns once the stream ran it).
  std::size_t blocking_copies = 0;
  // Every call that enqueues on a stream (run later or captured): CANN's *_on_stream calls, aclrtMemcpyAsync,
  // aclrtRecordEvent, aclrtStreamWaitEvent, aclnn launches, aclmdlRIExecuteAsync.
  std::size_t device_tasks = 0;
  std::size_t device_mallocs = 0;   // aclrtMalloc
};

// The control-plane barrier of CANN SHMEM (aclshmemi_control_barrier_all). FailNext(kControlBarrier, code) fails the
// calling thread's next one, wherever it is; FailNext(kControlBarrier + ":" + stage, code) the next one of that stage:
// init's "init_device_state" (shmem_init_backend.cpp:121), "exchange_slice" (:440), "exchange_entity" (:498),
// "aclshmemi_signal_init" and "aclshmemi_team_init" (their aclshmem_mallocs), "aclshmemx_init_attr" (its last,
// shmem_init.cpp:520); and "aclshmem_malloc", "aclshmem_calloc", "aclshmem_align".
constexpr const char* kControlBarrier = "aclshmemi_control_barrier_all";

// aclnn's status codes the fake returns (CANN: ACLNN_ERR_PARAM_NULLPTR, ACLNN_ERR_PARAM_INVALID).
constexpr int kAclnnErrParamNullptr = 161001;
constexpr int kAclnnErrParamInvalid = 161002;
// What every aclnn operator of the fake asks for as workspace, so that callers exercise the workspace path.
constexpr std::uint64_t kAclnnWorkspaceBytes = 1024;

class FakeCann {
 public:
  // Back to a fresh process: stops every stream, drops every session, event, aclrtMalloc buffer, record and
  // injection, and clears the calling thread's device and PE.
  static void Reset();

  static std::vector<FakeCall> Calls();
  static std::vector<FakeCall> CallsNamed(const std::string& name);
  static void ClearCalls();

  // The calling thread's next call named `name` fails with `code`: a call returning a code returns it, one
  // returning a pointer returns NULL, a stream-enqueued call makes its stream report `code` at the next synchronize.
  static void FailNext(const std::string& name, int code);

  // Default "Ascend910B1": a 910B, whose NPUs reach each other over MTE in groups of 8 logical ids only.
  static void SetSocName(const std::string& soc_name);
  static std::optional<InitRecord> LastInit();           // of the calling thread
  static std::size_t LiveStreams();
  static std::size_t LiveEvents();
  static std::size_t LiveSessions();
  // [address, address + bytes) lies inside one live piece of fake NPU memory (a heap or an aclrtMalloc buffer), which
  // the host cannot dereference.
  static bool IsDeviceMemory(const void* address, std::size_t bytes = 1);
  static std::size_t LiveDeviceAllocations();   // aclrtMalloc buffers not freed yet
  static std::size_t LiveAclnnObjects();        // aclCreateTensor/aclCreateScalar objects not destroyed yet

  // The simulated host the calling thread runs on (default "node0"). PEs on different hosts, or in different groups of
  // 8 logical NPUs of a 910B host, do not map each other's heaps: put, get and signal SET between them need
  // ACLSHMEM_DATA_OP_ROCE in both PEs' data_op_engine_type at init, and without it do nothing.
  static void SetNode(const std::string& node);
  // The release fixes both bootstrap timeouts of unique-id mode at DEFAULT_TIMEOUT (120 s): the fake uses this
  // instead, so that a test can make a PE miss a CANN barrier without waiting two minutes. Reset restores 120 s.
  static void SetCannDefaultTimeout(std::chrono::milliseconds timeout);
  // Destroying a stream whose queue never drains (a timed-out wait still spinning) or finalizing with such a stream
  // hangs on an NPU. The fake waits this long (default 10 s), then counts a hang and carries on.
  static void SetHangLimit(std::chrono::milliseconds limit);
  static std::size_t Hangs();

  // How late a stream runs what the host enqueued: each task runs `lag` after it was enqueued, or as soon as someone
  // waits for it (a synchronize, an event wait, a blocking async copy, destroying the stream, finalize), whichever
  // comes first; kLagUntilDemanded waits for the latter only, so that a host read without synchronization sees stale
  // data every time. The default, kDefaultStreamLag (restored by Reset), is short but never zero, as on an NPU: no
  // task runs the instant the host enqueued it, and a read right after the enqueue is stale; it costs the tests little
  // because every synchronize makes the stream run at once.
  static constexpr std::chrono::milliseconds kLagUntilDemanded = std::chrono::milliseconds::max();
  static constexpr std::chrono::milliseconds kDefaultStreamLag{1};
  static void SetStreamLag(std::chrono::milliseconds lag);

  // What the calling thread's calls cost since its last ResetCounters (or Reset), and every thread's since the last
  // ResetCounters of any thread (or Reset).
  static FakeCounters Counters();
  static FakeCounters TotalCounters();
  static void ResetCounters();
};

}  // namespace hp::fakes
