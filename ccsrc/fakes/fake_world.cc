#include "fake_world.h"

#include <chrono>

#include "acl/acl_base.h"

namespace hp::fakes::internal {

World& World::Get() {
  static World* world = new World();   // never destroyed: stream workers may outlive static destruction order
  return *world;
}

Process& CurrentProcess() {
  thread_local Process process;
  return process;
}

void World::Record(FakeCall call) {
  const Process& process = CurrentProcess();
  call.device = process.device;
  call.pe = process.pe ? process.pe->my_pe : -1;
  calls.push_back(std::move(call));
}

int World::TakeFailure(const std::string& name) {
  auto& failures = CurrentProcess().failures;
  auto it = failures.find(name);
  if (it == failures.end() || it->second.empty()) return 0;
  const int code = it->second.front();
  it->second.pop_front();
  return code;
}

void* World::CreateStream(int device) {
  auto stream = std::make_shared<Stream>();
  stream->device = device;
  Stream* raw = stream.get();
  raw->worker = std::thread([this, raw] {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      changed.wait(lock, [raw] { return raw->cancelled || !raw->tasks.empty(); });
      if (raw->cancelled) return;
      Task task = std::move(raw->tasks.front());
      raw->tasks.pop_front();
      lock.unlock();
      const int rc = task(*raw);
      lock.lock();
      ++raw->completed;
      if (rc != ACL_SUCCESS && raw->error == ACL_SUCCESS) raw->error = rc;
      changed.notify_all();
    }
  });
  streams.emplace(raw, std::move(stream));
  return raw;
}

bool World::DestroyStream(void* handle, std::unique_lock<std::mutex>& lock, bool drain) {
  auto it = streams.find(handle);
  if (it == streams.end()) return true;
  std::shared_ptr<Stream> stream = it->second;
  bool drained = true;
  if (drain) {
    const std::uint64_t target = stream->enqueued;
    drained = changed.wait_for(lock, hang_limit, [&] { return stream->completed >= target; });
    if (!drained) ++hangs;
  }
  streams.erase(handle);
  stream->cancelled = true;
  changed.notify_all();
  lock.unlock();
  stream->worker.join();
  lock.lock();
  return drained;
}

bool World::DrainDevice(int device, std::unique_lock<std::mutex>& lock) {
  auto idle = [&] {
    for (const auto& entry : streams) {
      if (entry.second->device == device && entry.second->completed < entry.second->enqueued) return false;
    }
    return true;
  };
  if (changed.wait_for(lock, hang_limit, idle)) return true;
  ++hangs;
  return false;
}

bool World::Enqueue(void* handle, Task task) {
  auto it = streams.find(handle);
  if (it == streams.end()) return false;
  it->second->tasks.push_back(std::move(task));
  ++it->second->enqueued;
  changed.notify_all();
  return true;
}

int World::Synchronize(void* handle, std::int32_t timeout_ms, std::unique_lock<std::mutex>& lock) {
  auto it = streams.find(handle);
  if (it == streams.end()) return ACL_ERROR_RT_PARAM_INVALID;
  std::shared_ptr<Stream> stream = it->second;
  const std::uint64_t target = stream->enqueued;
  auto drained = [&] { return stream->cancelled || stream->completed >= target; };
  if (timeout_ms < 0) {
    changed.wait(lock, drained);
  } else if (!changed.wait_for(lock, std::chrono::milliseconds(timeout_ms), drained)) {
    return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
  }
  const int error = stream->error;
  stream->error = ACL_SUCCESS;
  return error;
}

void World::WaitInTask(const Stream& stream, std::unique_lock<std::mutex>& lock, const std::function<bool()>& done) {
  // Polls as well as waits: plain stores into a heap announce nothing.
  while (!stream.cancelled && !done()) changed.wait_for(lock, std::chrono::milliseconds(5));
}

}  // namespace hp::fakes::internal

namespace hp::fakes {

using internal::CurrentProcess;
using internal::World;

void FakeCann::Reset() {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  while (!world.streams.empty()) world.DestroyStream(world.streams.begin()->first, lock, /*drain=*/false);
  world.events.clear();
  world.device_allocations.clear();
  world.sessions.clear();
  world.calls.clear();
  world.soc_name = "Ascend910B1";
  world.cann_default_timeout = std::chrono::seconds(DEFAULT_TIMEOUT);
  world.hang_limit = std::chrono::seconds(10);
  world.hangs = 0;
  CurrentProcess() = internal::Process{};
}

void FakeCann::SetCannDefaultTimeout(std::chrono::milliseconds timeout) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.cann_default_timeout = timeout;
}

void FakeCann::SetHangLimit(std::chrono::milliseconds limit) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.hang_limit = limit;
}

std::size_t FakeCann::Hangs() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.hangs;
}

void FakeCann::SetNode(const std::string& node) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  CurrentProcess().node = node;
}

std::size_t FakeCann::LiveAclnnObjects() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.live_aclnn_objects;
}

std::vector<FakeCall> FakeCann::Calls() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.calls;
}

std::vector<FakeCall> FakeCann::CallsNamed(const std::string& name) {
  std::vector<FakeCall> named;
  for (FakeCall& call : Calls()) {
    if (call.name == name) named.push_back(std::move(call));
  }
  return named;
}

void FakeCann::ClearCalls() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.calls.clear();
}

void FakeCann::FailNext(const std::string& name, int code) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  CurrentProcess().failures[name].push_back(code);
}

void FakeCann::SetSocName(const std::string& soc_name) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.soc_name = soc_name;
}

std::optional<InitRecord> FakeCann::LastInit() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return CurrentProcess().last_init;
}

std::size_t FakeCann::LiveStreams() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.streams.size();
}

std::size_t FakeCann::LiveEvents() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.events.size();
}

bool FakeCann::IsDeviceMemory(const void* address, std::size_t bytes) {
  return static_cast<bool>(internal::HostView::Of(address, bytes));
}

std::size_t FakeCann::LiveDeviceAllocations() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.device_allocations.size();
}

std::size_t FakeCann::LiveSessions() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  std::size_t live = 0;
  for (const auto& entry : world.sessions) live += entry.second->joined > 0 ? 1 : 0;
  return live;
}

}  // namespace hp::fakes
