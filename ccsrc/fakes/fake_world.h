// The state behind the fake ACL runtime and fake CANN SHMEM (internal to ccsrc/fakes). One mutex guards it all and
// one condition variable announces every change: the fakes favour obviously correct over fast.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fake_cann.h"
#include "fake_heap.h"
#include "fake_memory.h"
#include "host/shmem_host_def.h"

namespace hp::fakes::internal {

struct Stream;
struct Process;
// A task runs on its stream's worker; it returns ACL_SUCCESS or the error the stream reports at the next synchronize.
using Task = std::function<int(const Stream&)>;
using Clock = std::chrono::steady_clock;

struct QueuedTask {
  Task task;
  Clock::time_point ready_at;   // when the worker runs it unless someone waits for it earlier (FakeCann::SetStreamLag)
};

// aclmdlRICaptureBegin .. aclmdlRICaptureEnd on one stream: what is enqueued meanwhile is recorded, not run.
struct Capture {
  void* model = nullptr;            // its handle (aclmdlRICaptureGetInfo, aclmdlRICaptureEnd)
  int mode = 0;                     // aclmdlRICaptureMode
  bool invalidated = false;         // an operation the capture forbids ran meanwhile
  const Process* owner = nullptr;   // the simulated process that began it
  std::vector<Task> tasks;
};

struct Stream {
  int device = -1;
  std::deque<QueuedTask> tasks;
  std::uint64_t enqueued = 0;
  std::uint64_t completed = 0;
  std::uint64_t demanded = 0;   // tasks up to here run at once: someone waits for them (synchronize, event, drain)
  int error = 0;             // the first failure since the last synchronize
  bool cancelled = false;    // destroyed: the worker stops, queued tasks are dropped
  std::shared_ptr<Capture> capture;   // being captured (aclmdlRICaptureBegin)
  std::thread worker;
};

struct Event {
  std::shared_ptr<Stream> stream;   // where it was last recorded (none: complete)
  std::uint64_t position = 0;       // that stream's enqueued count at the record
};

// A captured model (aclmdlRICaptureEnd): its tasks, run again by aclmdlRIExecuteAsync.
struct Model {
  std::vector<Task> tasks;
};

struct Session;

// A CANN team of one PE (aclshmem_team_split_strided): world PEs start, start + stride, ... (size of them).
struct Team {
  int start = 0;
  int stride = 1;
  int size = 0;
};

struct Pe {
  std::shared_ptr<Session> session;
  int my_pe = -1;
  // v1.5.1's two flags (shmem_init_backend.cpp:593, shmem_init.cpp:517): `created` once the heap is set up,
  // `initialized` just before init's last barrier. aclshmemx_init_status reads them (shmem_init.cpp:193-203).
  bool created = false;
  bool initialized = false;
  bool joined = false;              // holds its slot in the session
  std::string node;                 // the simulated host it runs on
  int logical_device = -1;          // the NPU's logical id (ASCEND_RT_VISIBLE_DEVICES[user id], else the user id)
  int engines = ACLSHMEM_DATA_OP_MTE;   // option_attr.data_op_engine_type at init
  std::uint64_t control_epoch = 0;  // control-plane barriers this PE entered
  char* heap = nullptr;             // the device address of the heap (not host-accessible)
  std::size_t heap_size = 0;
  FakeHeap allocator;
  void* default_stream = nullptr;   // CANN creates one at init; a NULL stream argument means it
  std::map<int, Team> teams;        // by team index; ACLSHMEM_TEAM_WORLD is the world
  // Barrier kernels this PE ran, by team members (start, stride, size).
  std::map<std::tuple<int, int, int>, std::uint64_t> barrier_epochs;
  // The 64-byte lines this PE's SETs wrote, as it wrote them (by line address): what its next SET into the same line
  // writes back whole (see aclshmemx_signal_op_on_stream in fake_shmem.cc).
  std::map<std::uintptr_t, std::array<char, 64>> lines;
};

struct Session {
  std::uint64_t id = 0;
  int n_pes = 0;
  std::uint64_t local_mem_size = 0;
  std::vector<Pe*> pes;                 // by my_pe; null until joined
  // By my_pe; kept until the session dies (peers may still write).
  std::vector<std::shared_ptr<DeviceMemory>> heaps;
  int joined = 0;
  std::uint64_t control_arrivals = 0;   // control barrier e is complete at e * n_pes arrivals
  // Team barriers by team (start, stride, size): arrivals so far, complete at epoch * size.
  std::map<std::tuple<int, int, int>, std::uint64_t> barrier_arrivals;
};

// One simulated process: a thread's ACL device, CANN SHMEM state and pending failure injections.
struct Process {
  int device = -1;
  std::string node = "node0";
  bool tls_decided = false;
  bool tls_enable = true;
  const char* tls_info = nullptr;
  std::uint32_t tls_info_len = 0;
  std::shared_ptr<Pe> pe;
  std::map<std::string, std::deque<int>> failures;
  std::optional<InitRecord> last_init;
  std::string uid_sock_ifname;   // the environment aclshmemx_get_uniqueid read
  std::string uid_session_id;
  FakeCounters counters;
};

class World {
 public:
  static World& Get();

  std::mutex mu;
  std::condition_variable changed;
  std::string soc_name = "Ascend910B1";
  std::vector<FakeCall> calls;
  std::map<void*, std::shared_ptr<Stream>> streams;
  std::map<void*, std::shared_ptr<Event>> events;
  std::map<void*, std::shared_ptr<Model>> models;
  std::map<void*, std::shared_ptr<DeviceMemory>> device_allocations;   // of aclrtMalloc, by address
  struct PinnedBuffer {
    std::unique_ptr<char[]> bytes;
    std::size_t size = 0;
  };
  std::map<std::uintptr_t, PinnedBuffer> host_allocations;   // of aclrtMallocHost, by address
  std::map<std::uint64_t, std::shared_ptr<Session>> sessions;
  std::uint64_t next_session = 1;
  std::chrono::milliseconds cann_default_timeout{std::chrono::seconds(DEFAULT_TIMEOUT)};
  std::chrono::milliseconds hang_limit{std::chrono::seconds(10)};
  std::chrono::milliseconds stream_lag = FakeCann::kDefaultStreamLag;
  std::size_t hangs = 0;
  std::size_t live_aclnn_objects = 0;   // tensors and scalars not destroyed yet
  FakeCounters total_counters;

  // Records `call` with the calling thread's device and PE (mu held).
  void Record(FakeCall call);
  // Records `call` and takes the injected failure of its name: that code, or 0 (mu held).
  int Enter(const FakeCall& call);
  // The injected failure for the calling thread's next `name`, or 0 (mu held).
  int TakeFailure(const std::string& name);
  // Counts for the calling thread and in total (mu held): `field` of FakeCounters.
  void Count(std::size_t FakeCounters::*field);

  // Creates a stream with its worker (mu held).
  void* CreateStream(int device);
  // Stops and joins a stream's worker; `lock` holds mu and is released while joining. As ACL does, a stream is
  // destroyed only once its queue has run: a task that never ends (a wait nobody satisfies) would block forever.
  // The fake gives up after hang_limit, counts a hang (FakeCann::Hangs) and returns false; `drain` false (Reset)
  // drops the queue at once.
  bool DestroyStream(void* handle, std::unique_lock<std::mutex>& lock, bool drain = true);
  // Waits (bounded by hang_limit, counted as a hang) until every stream of `device` has run its queue.
  bool DrainDevice(int device, std::unique_lock<std::mutex>& lock);
  // Appends `task` to `handle`'s queue, or to its capture while it is being captured (mu held); counts a device task;
  // false for an unknown stream.
  bool Enqueue(void* handle, Task task);
  // Someone waits for `stream`'s tasks up to `position`: they run now, whatever the lag (mu held).
  void Demand(Stream& stream, std::uint64_t position);
  // Waits until everything enqueued so far on `handle` ran; returns and clears its error (lock holds mu).
  int Synchronize(void* handle, std::int32_t timeout_ms, std::unique_lock<std::mutex>& lock);
  // The calling process's capture that forbids a blocking call (GLOBAL or THREAD_LOCAL mode), or null (mu held).
  Capture* BlockingCallCapture();

  // [address, address + bytes) lies inside one aclrtMallocHost buffer (mu held).
  bool IsPinned(const void* address, std::size_t bytes) const;

  // Blocks a task on `stream` until done() holds or the stream is cancelled (lock holds mu).
  void WaitInTask(const Stream& stream, std::unique_lock<std::mutex>& lock, const std::function<bool()>& done);

  // Whether a kernel of `self` (null: a process without a PE) on NPU `device` may touch `view`: memory of its own NPU,
  // or the heap of a PE whose heap `self` maps (MteReaches). Anything else is an unmapped address: the kernel faults.
  bool Accessible(const Pe* self, int device, const HostView& view);
};

// Whether `self`'s NPU maps `peer`'s heap, i.e. reaches it over MTE: as hybm decides (CanMapRemote,
// hybm_acl_device_mem_segment.cpp:446-449 -> IsSdmaAccessible, hybm_mem_segment.cpp:168-173): the same server, and on
// a 910B SoC (dl_api.cpp:67-78, "Ascend910B" in the SoC name) the same group of 8 logical device ids
// (ASC910B_CONN_RANKS, hybm_device_mem_segment.h:28). Other hosts are never mapped (no superpods here). Mu held.
bool MteReaches(const World& world, const Pe& self, const Pe& peer);
// The logical device id of user device `user_device` (aclrtSetDevice's): ASCEND_RT_VISIBLE_DEVICES lists the logical
// ids in user order, unset means equal (ACL's aclrtGetLogicDevIdByUserDevId documentation); -1 when the list has no
// such entry.
int LogicalDevice(int user_device);

Process& CurrentProcess();

}  // namespace hp::fakes::internal
