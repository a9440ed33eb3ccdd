#include "fake_world.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "acl/acl.h"

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

int World::Enter(const FakeCall& call) {
  Record(call);
  return TakeFailure(call.name);
}

int World::TakeFailure(const std::string& name) {
  auto& failures = CurrentProcess().failures;
  auto it = failures.find(name);
  if (it == failures.end() || it->second.empty()) return 0;
  const int code = it->second.front();
  it->second.pop_front();
  return code;
}

void World::Count(std::size_t FakeCounters::*field) {
  ++(CurrentProcess().counters.*field);
  ++(total_counters.*field);
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
      // The NPU runs the task once its lag passed, or at once when someone waits for it.
      const Clock::time_point ready_at = raw->tasks.front().ready_at;
      if (raw->demanded <= raw->completed && Clock::now() < ready_at) {
        if (ready_at == Clock::time_point::max()) {
          changed.wait(lock);
        } else {
          changed.wait_until(lock, ready_at);
        }
        continue;
      }
      Task task = std::move(raw->tasks.front().task);
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
    Demand(*stream, target);
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
  for (auto& entry : streams) {
    if (entry.second->device == device) Demand(*entry.second, entry.second->enqueued);
  }
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
  Count(&FakeCounters::device_tasks);
  Stream& stream = *it->second;
  if (stream.capture) {   // recorded into the graph, run by aclmdlRIExecuteAsync
    stream.capture->tasks.push_back(std::move(task));
    return true;
  }
  const Clock::time_point now = Clock::now();
  const Clock::time_point ready_at = stream_lag == FakeCann::kLagUntilDemanded ? Clock::time_point::max()
                                                                              : now + stream_lag;
  stream.tasks.push_back(QueuedTask{std::move(task), ready_at});
  ++stream.enqueued;
  changed.notify_all();
  return true;
}

void World::Demand(Stream& stream, std::uint64_t position) {
  if (position <= stream.demanded) return;
  stream.demanded = position;
  changed.notify_all();
}

Capture* World::BlockingCallCapture() {
  const Process* self = &CurrentProcess();
  for (auto& entry : streams) {
    Capture* capture = entry.second->capture.get();
    if (capture != nullptr && capture->owner == self && !capture->invalidated &&
        capture->mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED) {
      return capture;
    }
  }
  return nullptr;
}

int World::Synchronize(void* handle, std::int32_t timeout_ms, std::unique_lock<std::mutex>& lock) {
  auto it = streams.find(handle);
  if (it == streams.end()) return ACL_ERROR_RT_PARAM_INVALID;
  std::shared_ptr<Stream> stream = it->second;
  const std::uint64_t target = stream->enqueued;
  Demand(*stream, target);
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

bool World::IsPinned(const void* address, std::size_t bytes) const {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  auto it = host_allocations.upper_bound(at);
  if (it == host_allocations.begin()) return false;
  --it;
  const std::size_t offset = at - it->first;
  return offset < it->second.size && bytes <= it->second.size - offset;
}

bool World::Accessible(const Pe* self, int device, const HostView& view) {
  if (!view) return false;
  const DeviceMemory& memory = *view.memory;
  if (memory.device() == device) return true;
  if (self == nullptr || memory.heap_session() != self->session->id) return false;
  const Pe* owner = self->session->pes[static_cast<std::size_t>(memory.heap_pe())];
  return owner != nullptr && MteReaches(*this, *self, *owner);
}

bool MteReaches(const World& world, const Pe& self, const Pe& peer) {
  if (&self == &peer) return true;
  if (self.node != peer.node) return false;
  constexpr int kHccsGroup = 8;   // ASC910B_CONN_RANKS
  const bool is_910b = world.soc_name.find("Ascend910B") != std::string::npos;
  return !is_910b || self.logical_device / kHccsGroup == peer.logical_device / kHccsGroup;
}

int LogicalDevice(int user_device) {
  const char* visible = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  if (visible == nullptr || *visible == '\0') return user_device;
  const std::string list(visible);
  std::size_t start = 0;
  for (int index = 0; start <= list.size(); ++index) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    if (index == user_device) return std::atoi(list.substr(start, comma - start).c_str());
    start = comma + 1;
  }
  return -1;
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
  world.models.clear();
  world.device_allocations.clear();
  world.host_allocations.clear();
  world.sessions.clear();
  world.calls.clear();
  world.soc_name = "Ascend910B1";
  world.cann_default_timeout = std::chrono::seconds(DEFAULT_TIMEOUT);
  world.hang_limit = std::chrono::seconds(10);
  world.hangs = 0;
  world.stream_lag = FakeCann::kDefaultStreamLag;
  world.total_counters = FakeCounters{};
  CurrentProcess() = internal::Process{};
}

void FakeCann::SetStreamLag(std::chrono::milliseconds lag) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.stream_lag = lag;
}

FakeCounters FakeCann::Counters() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return CurrentProcess().counters;
}

FakeCounters FakeCann::TotalCounters() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  return world.total_counters;
}

void FakeCann::ResetCounters() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  CurrentProcess().counters = FakeCounters{};
  world.total_counters = FakeCounters{};
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
