// The state behind the fake ACL runtime and fake CANN SHMEM (internal to ccsrc/fakes). One mutex guards it all and
// one condition variable announces every change: the fakes favour obviously correct over fast.
#pragma once

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
#include <vector>

#include "fake_cann.h"
#include "fake_heap.h"
#include "fake_memory.h"
#include "host/shmem_host_def.h"

namespace hp::fakes::internal {

struct Stream;
// A task runs on its stream's worker; it returns ACL_SUCCESS or the error the stream reports at the next synchronize.
using Task = std::function<int(const Stream&)>;

struct Stream {
  int device = -1;
  std::deque<Task> tasks;
  std::uint64_t enqueued = 0;
  std::uint64_t completed = 0;
  int error = 0;             // the first failure since the last synchronize
  bool cancelled = false;    // destroyed: the worker stops, queued tasks are dropped
  std::thread worker;
};

struct Event {
  std::shared_ptr<Stream> stream;   // where it was last recorded (none: complete)
  std::uint64_t position = 0;       // that stream's enqueued count at the record
};

struct Session;

struct Pe {
  std::shared_ptr<Session> session;
  int my_pe = -1;
  // False while init has not returned success: v1.5.1 does not roll a failed init back, so a PE whose heap exists
  // stays "created" (aclshmemx_init_status: ACLSHMEM_STATUS_SHM_CREATED) until aclshmem_finalize.
  bool initialized = false;
  std::string node;                 // the simulated host it runs on
  int engines = ACLSHMEM_DATA_OP_MTE;   // option_attr.data_op_engine_type at init
  std::uint64_t control_epoch = 0;  // control-plane barriers this PE entered
  char* heap = nullptr;             // the device address of the heap (not host-accessible)
  std::size_t heap_size = 0;
  FakeHeap allocator;
  std::uint64_t barrier_epoch = 0;
  void* default_stream = nullptr;   // CANN creates one at init; a NULL stream argument means it
};

struct Session {
  std::uint64_t id = 0;
  int n_pes = 0;
  std::uint64_t local_mem_size = 0;
  std::vector<Pe*> pes;                 // by my_pe; null until joined
  // By my_pe; kept until the session dies (peers may still write).
  std::vector<std::shared_ptr<DeviceMemory>> heaps;
  int joined = 0;
  std::uint64_t barrier_arrivals = 0;   // barrier e is complete at e * n_pes arrivals
  std::uint64_t control_arrivals = 0;   // the same for the control-plane barriers (init, malloc)
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
  std::map<void*, std::shared_ptr<DeviceMemory>> device_allocations;   // of aclrtMalloc, by address
  std::map<std::uint64_t, std::shared_ptr<Session>> sessions;
  std::uint64_t next_session = 1;
  std::chrono::milliseconds cann_default_timeout{std::chrono::seconds(DEFAULT_TIMEOUT)};
  std::chrono::milliseconds hang_limit{std::chrono::seconds(10)};
  std::size_t hangs = 0;
  std::size_t live_aclnn_objects = 0;   // tensors and scalars not destroyed yet

  // Records `call` with the calling thread's device and PE (mu held).
  void Record(FakeCall call);
  // The injected failure for the calling thread's next `name`, or 0 (mu held).
  int TakeFailure(const std::string& name);

  // Creates a stream with its worker (mu held).
  void* CreateStream(int device);
  // Stops and joins a stream's worker; `lock` holds mu and is released while joining. As ACL does, a stream is
  // destroyed only once its queue has run: a task that never ends (a wait nobody satisfies) would block forever.
  // The fake gives up after hang_limit, counts a hang (FakeCann::Hangs) and returns false; `drain` false (Reset)
  // drops the queue at once.
  bool DestroyStream(void* handle, std::unique_lock<std::mutex>& lock, bool drain = true);
  // Waits (bounded by hang_limit, counted as a hang) until every stream of `device` has run its queue.
  bool DrainDevice(int device, std::unique_lock<std::mutex>& lock);
  // Appends `task` to `handle`'s queue (mu held); false for an unknown stream.
  bool Enqueue(void* handle, Task task);
  // Waits until everything enqueued so far on `handle` ran; returns and clears its error (lock holds mu).
  int Synchronize(void* handle, std::int32_t timeout_ms, std::unique_lock<std::mutex>& lock);

  // Blocks a task on `stream` until done() holds or the stream is cancelled (lock holds mu).
  void WaitInTask(const Stream& stream, std::unique_lock<std::mutex>& lock, const std::function<bool()>& done);
};

Process& CurrentProcess();

}  // namespace hp::fakes::internal
