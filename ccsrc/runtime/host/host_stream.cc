#include "runtime/host/host_stream.h"

namespace hp::shmem::host {

HostStream::HostStream() : worker_([this] { Run(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

std::uint64_t HostStream::Enqueue(Task task) {
  std::uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ticket = ++enqueued_;
  }
  work_cv_.notify_one();
  return ticket;
}

std::uint64_t HostStream::last_ticket() const {
  std::lock_guard<std::mutex> lock(mu_);
  return enqueued_;
}

std::uint64_t HostStream::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

void HostStream::WaitFor(std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
}

Status HostStream::pending_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_error_;
}

bool HostStream::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ == enqueued_;
}

Status HostStream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t ticket = enqueued_;
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
  Status error = std::move(first_error_);
  first_error_ = Status::Ok();
  return error;
}

void HostStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;   // stopping and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !first_error_.ok();
    lock.unlock();
    Status status = skip ? Status::Ok() : task();
    task = nullptr;   // drop what the task kept alive before reporting completion
    lock.lock();
    if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
    ++completed_;
    done_cv_.notify_all();
  }
}

}  // namespace hp::shmem::host
