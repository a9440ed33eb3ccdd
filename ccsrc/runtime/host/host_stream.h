// A host stream: an ordered queue of operations run by one worker thread, like a CUDA stream on the CPU.
//
// Enqueue returns at once; operations run in order. The first failure is kept and every later operation is
// skipped until Synchronize() reports the failure, as a CUDA stream's sticky error would be.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/status.h"

namespace hp::shmem::host {

class HostStream {
 public:
  using Task = std::function<Status()>;

  HostStream();
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;
  ~HostStream();   // runs what is queued, then joins the worker

  // Queues `task`; returns its ticket (1 for the first task, then 2, ...).
  std::uint64_t Enqueue(Task task);
  // The ticket of the last task queued so far (0 when none).
  std::uint64_t last_ticket() const;
  // The ticket of the last task that has run (tasks run in ticket order).
  std::uint64_t completed() const;
  // Blocks until every task up to `ticket` has run.
  void WaitFor(std::uint64_t ticket);
  // Blocks until everything queued so far has run; returns (and clears) the first failure since the last call.
  Status Synchronize();
  // Whether everything queued so far has run.
  bool idle() const;
  // The first failure since the last Synchronize, left in place for it (OK when none).
  Status pending_error() const;

 private:
  void Run();

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Task> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  Status first_error_;
  bool stopping_ = false;
  std::thread worker_;   // last: starts after every other member exists
};

}  // namespace hp::shmem::host
