// The fake ACL runtime: devices per simulated process (thread), streams as ordered queues, events, device memory,
// page-locked host memory and graph capture.
#include <cstring>

#include "acl/acl.h"
#include "fake_world.h"

using hp::fakes::FakeCall;
using hp::fakes::FakeCounters;
using hp::fakes::internal::Capture;
using hp::fakes::internal::CurrentProcess;
using hp::fakes::internal::DeviceMemory;
using hp::fakes::internal::Event;
using hp::fakes::internal::HostView;
using hp::fakes::internal::Model;
using hp::fakes::internal::Stream;
using hp::fakes::internal::World;

namespace {

constexpr int32_t kDeviceCount = 16;
// What aclrtMalloc aligns buffers to (the release documents 32 bytes at least; its pages are larger).
constexpr std::size_t kMallocAlignment = 512;

FakeCall Named(const char* name, void* stream = nullptr) {
  FakeCall call;
  call.name = name;
  call.stream = reinterpret_cast<std::uintptr_t>(stream);
  return call;
}

// What ACL answers a synchronization of a stream under capture (mu held). The code is not documented in the public
// headers; a first run on a 910B must confirm it (third_party/shmem_patches/README.md): third-party logs of
// torch_npu graph capture show "synchronize stream failed, runtime result = 107027" (ACL_ERROR_RT_STREAM_CAPTURED).
// The capture is invalidated, as CUDA does for a forbidden call.
int RefuseSynchronizeUnderCapture(World& world, void* stream) {
  auto found = world.streams.find(stream);
  if (found == world.streams.end() || !found->second->capture) return ACL_SUCCESS;
  found->second->capture->invalidated = true;
  return ACL_ERROR_RT_STREAM_CAPTURED;
}

// The same for a blocking copy: "synchronized memcpy failed ... runtime result = 107030" in the same logs
// (ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, "the current capture mode does not support this operation"), in the
// capture modes that forbid it (not RELAXED). Mu held.
int RefuseBlockingCopyUnderCapture(World& world) {
  Capture* capture = world.BlockingCallCapture();
  if (capture == nullptr) return ACL_SUCCESS;
  capture->invalidated = true;
  return ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT;
}

}  // namespace

extern "C" {

aclError aclrtSetDevice(int32_t deviceId) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtSetDevice");
  call.value = deviceId;
  if (const int code = world.Enter(call)) return code;
  if (deviceId < 0 || deviceId >= kDeviceCount) return ACL_ERROR_RT_INVALID_DEVICEID;
  CurrentProcess().device = deviceId;
  return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t* deviceId) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtGetDevice"))) return code;
  if (deviceId == nullptr) return ACL_ERROR_RT_PARAM_INVALID;
  if (CurrentProcess().device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  *deviceId = CurrentProcess().device;
  return ACL_SUCCESS;
}

const char* aclrtGetSocName() {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named("aclrtGetSocName"));
  if (world.TakeFailure("aclrtGetSocName")) return nullptr;
  return world.soc_name.c_str();
}

aclError aclrtCreateStream(aclrtStream* stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtCreateStream"))) return code;
  if (stream == nullptr) return ACL_ERROR_RT_PARAM_INVALID;
  if (CurrentProcess().device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  *stream = world.CreateStream(CurrentProcess().device);
  return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtDestroyStream", stream))) return code;
  if (world.streams.count(stream) == 0) return ACL_ERROR_RT_PARAM_INVALID;
  // An NPU would block here for good; the fake reports the hang (FakeCann::Hangs) instead.
  return world.DestroyStream(stream, lock) ? ACL_SUCCESS : ACL_ERROR_RT_INTERNAL_ERROR;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  world.Record(Named("aclrtSynchronizeStream", stream));
  world.Count(&FakeCounters::stream_synchronizations);
  if (const int code = world.TakeFailure("aclrtSynchronizeStream")) return code;
  if (const int code = RefuseSynchronizeUnderCapture(world, stream)) return code;
  return world.Synchronize(stream, -1, lock);
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtSynchronizeStreamWithTimeout", stream);
  call.value = timeout;
  world.Record(call);
  world.Count(&FakeCounters::stream_synchronizations);
  if (const int code = world.TakeFailure("aclrtSynchronizeStreamWithTimeout")) return code;
  if (timeout < -1 || timeout == 0) return ACL_ERROR_RT_PARAM_INVALID;
  if (const int code = RefuseSynchronizeUnderCapture(world, stream)) return code;
  return world.Synchronize(stream, timeout, lock);
}

aclError aclrtCreateEvent(aclrtEvent* event) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtCreateEvent"))) return code;
  if (event == nullptr) return ACL_ERROR_RT_PARAM_INVALID;
  auto created = std::make_shared<Event>();
  *event = created.get();
  world.events.emplace(created.get(), std::move(created));
  return ACL_SUCCESS;
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtDestroyEvent"))) return code;
  return world.events.erase(event) == 1 ? ACL_SUCCESS : ACL_ERROR_RT_PARAM_INVALID;
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtRecordEvent", stream))) return code;
  auto found_event = world.events.find(event);
  auto found_stream = world.streams.find(stream);
  if (found_event == world.events.end() || found_stream == world.streams.end()) return ACL_ERROR_RT_PARAM_INVALID;
  world.Count(&FakeCounters::device_tasks);   // an event record is a task of the stream
  found_event->second->stream = found_stream->second;
  found_event->second->position = found_stream->second->enqueued;
  return ACL_SUCCESS;
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclrtStreamWaitEvent", stream))) return code;
  auto found_event = world.events.find(event);
  if (found_event == world.events.end() || world.streams.count(stream) == 0) return ACL_ERROR_RT_PARAM_INVALID;
  // The wait captures the event as recorded now: a later record does not move it.
  std::shared_ptr<Stream> waited = found_event->second->stream;
  const std::uint64_t position = found_event->second->position;
  world.Enqueue(stream, [&world, waited, position](const Stream& self) {
    if (!waited) return ACL_SUCCESS;
    std::unique_lock<std::mutex> wait_lock(world.mu);
    world.Demand(*waited, position);   // a stream that waits for another one makes it run
    world.WaitInTask(self, wait_lock, [&] { return waited->cancelled || waited->completed >= position; });
    return ACL_SUCCESS;
  });
  return ACL_SUCCESS;
}

aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtMalloc");
  call.bytes = size;
  call.op = static_cast<int>(policy);
  world.Record(call);
  world.Count(&FakeCounters::device_mallocs);
  if (const int code = world.TakeFailure("aclrtMalloc")) return code;
  if (devPtr == nullptr || size == 0) return ACL_ERROR_RT_PARAM_INVALID;
  if (CurrentProcess().device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  std::shared_ptr<DeviceMemory> memory = DeviceMemory::Create(size, kMallocAlignment, CurrentProcess().device);
  if (!memory) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  *devPtr = memory->device_base();
  world.device_allocations.emplace(*devPtr, std::move(memory));
  return ACL_SUCCESS;
}

aclError aclrtFree(void* devPtr) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtFree");
  call.address = reinterpret_cast<std::uintptr_t>(devPtr);
  if (const int code = world.Enter(call)) return code;
  return world.device_allocations.erase(devPtr) == 1 ? ACL_SUCCESS : ACL_ERROR_RT_PARAM_INVALID;
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtMallocHost");
  call.bytes = size;
  if (const int code = world.Enter(call)) return code;
  if (hostPtr == nullptr || size == 0) return ACL_ERROR_RT_PARAM_INVALID;
  World::PinnedBuffer buffer;
  buffer.bytes.reset(new char[size]());
  buffer.size = size;
  *hostPtr = buffer.bytes.get();
  world.host_allocations.emplace(reinterpret_cast<std::uintptr_t>(*hostPtr), std::move(buffer));
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void* hostPtr) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtFreeHost");
  call.address = reinterpret_cast<std::uintptr_t>(hostPtr);
  if (const int code = world.Enter(call)) return code;
  const bool known = world.host_allocations.erase(call.address) == 1;
  return known ? ACL_SUCCESS : ACL_ERROR_RT_PARAM_INVALID;
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtMemcpy");
  call.address = reinterpret_cast<std::uintptr_t>(dst);
  call.bytes = count;
  call.op = static_cast<int>(kind);
  world.Record(call);
  world.Count(&FakeCounters::blocking_copies);
  if (const int code = world.TakeFailure("aclrtMemcpy")) return code;
  if (CurrentProcess().device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  if (const int code = RefuseBlockingCopyUnderCapture(world)) return code;
  if (dst == nullptr || src == nullptr || count > destMax || kind < ACL_MEMCPY_HOST_TO_HOST ||
      kind > ACL_MEMCPY_DEVICE_TO_DEVICE) {
    return ACL_ERROR_RT_PARAM_INVALID;
  }
  if (count == 0) return ACL_SUCCESS;
  const bool dst_on_device = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  const bool src_on_device = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  // Each side must be what `kind` says: the whole range in memory of the current device (reached through its host
  // view), or host memory (used as it is).
  const int device = CurrentProcess().device;
  const HostView to = HostView::Of(dst, count);
  const HostView from = HostView::Of(src, count);
  const bool dst_ok = dst_on_device ? to && to.memory->device() == device : !HostView::Of(dst, 1);
  const bool src_ok = src_on_device ? from && from.memory->device() == device : !HostView::Of(src, 1);
  if (!dst_ok || !src_ok) return ACL_ERROR_RT_PARAM_INVALID;
  std::memmove(dst_on_device ? to.host : static_cast<char*>(dst),
               src_on_device ? from.host : static_cast<const char*>(src), count);
  return ACL_SUCCESS;
}

}  // extern "C"

// ---- aclrtMemcpyAsync ---------------------------------------------------------------------------------------------

extern "C" {

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream) {
  World& world = World::Get();
  std::unique_lock<std::mutex> lock(world.mu);
  FakeCall call = Named("aclrtMemcpyAsync", stream);
  call.address = reinterpret_cast<std::uintptr_t>(dst);
  call.bytes = count;
  call.op = static_cast<int>(kind);
  if (const int code = world.Enter(call)) return code;
  if (CurrentProcess().device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  if (dst == nullptr || src == nullptr || count > destMax || kind < ACL_MEMCPY_HOST_TO_HOST ||
      kind > ACL_MEMCPY_DEVICE_TO_DEVICE) {
    return ACL_ERROR_RT_PARAM_INVALID;
  }
  // The release has no asynchronous copy inside the host (EP form).
  if (kind == ACL_MEMCPY_HOST_TO_HOST) return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
  auto found = world.streams.find(stream);
  if (found == world.streams.end()) return ACL_ERROR_RT_PARAM_INVALID;   // the fake has no ACL default stream
  if (count == 0) return ACL_SUCCESS;
  const bool dst_on_device = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  const bool src_on_device = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  // The runtime checks each side against `kind` when the copy is submitted, as aclrtMemcpy does.
  const int device = CurrentProcess().device;
  auto side_ok = [device](const void* address, std::size_t bytes, bool on_device) {
    const HostView view = HostView::Of(address, bytes);
    return on_device ? view && view.memory->device() == device : !HostView::Of(address, 1);
  };
  if (!side_ok(dst, count, dst_on_device) || !side_ok(src, count, src_on_device)) return ACL_ERROR_RT_PARAM_INVALID;
  // A host side in aclrtMallocHost memory is copied by the stream like device memory; a pageable one makes the call
  // wait for the stream, which a stream under capture never runs (the code is a guess: README's first-run list).
  const bool pageable = (!dst_on_device && !world.IsPinned(dst, count)) || (!src_on_device && !world.IsPinned(src, count));
  if (pageable) {
    world.Count(&FakeCounters::blocking_copies);
    if (found->second->capture) {
      found->second->capture->invalidated = true;
      return ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT;
    }
  }
  // The bytes are reached when the stream runs the copy: memory freed before then faults the stream.
  auto outcome = std::make_shared<int>(ACL_SUCCESS);
  world.Enqueue(stream, [dst, src, count, dst_on_device, src_on_device, outcome](const Stream&) {
    const HostView to = dst_on_device ? HostView::Of(dst, count) : HostView{};
    const HostView from = src_on_device ? HostView::Of(src, count) : HostView{};
    if ((dst_on_device && !to) || (src_on_device && !from)) {
      *outcome = ACL_ERROR_RT_PARAM_INVALID;
      return *outcome;
    }
    std::memmove(dst_on_device ? to.host : static_cast<char*>(dst),
                 src_on_device ? from.host : static_cast<const char*>(src), count);
    return static_cast<int>(ACL_SUCCESS);
  });
  if (!pageable) return ACL_SUCCESS;
  // Pageable host memory: the call returns once the stream ran the copy (bounded like a hang of the real one).
  std::shared_ptr<Stream> on = found->second;
  const std::uint64_t position = on->enqueued;
  world.Demand(*on, position);
  if (!world.changed.wait_for(lock, world.hang_limit, [&] { return on->cancelled || on->completed >= position; })) {
    ++world.hangs;
    return ACL_ERROR_RT_INTERNAL_ERROR;
  }
  return *outcome;
}

}  // extern "C"

// ---- graph capture (acl_mdl.h) ------------------------------------------------------------------------------------

extern "C" {

aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named("aclmdlRICaptureBegin", stream);
  call.op = static_cast<int>(mode);
  if (const int code = world.Enter(call)) return code;
  auto found = world.streams.find(stream);
  if (found == world.streams.end() || mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL ||
      mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED) {
    return ACL_ERROR_RT_PARAM_INVALID;
  }
  if (found->second->capture) return ACL_ERROR_RT_STREAM_CAPTURED;
  auto model = std::make_shared<Model>();
  auto capture = std::make_shared<Capture>();
  capture->model = model.get();
  capture->mode = static_cast<int>(mode);
  capture->owner = &CurrentProcess();
  world.models.emplace(model.get(), std::move(model));
  found->second->capture = std::move(capture);
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus* status, aclmdlRI* modelRI) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclmdlRICaptureGetInfo", stream))) return code;
  auto found = world.streams.find(stream);
  if (found == world.streams.end() || status == nullptr || modelRI == nullptr) return ACL_ERROR_RT_PARAM_INVALID;
  const Capture* capture = found->second->capture.get();
  *status = capture == nullptr       ? ACL_MODEL_RI_CAPTURE_STATUS_NONE
            : capture->invalidated ? ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED
                                   : ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE;
  *modelRI = capture != nullptr ? capture->model : nullptr;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclmdlRICaptureEnd", stream))) return code;
  auto found = world.streams.find(stream);
  if (found == world.streams.end() || modelRI == nullptr) return ACL_ERROR_RT_PARAM_INVALID;
  std::shared_ptr<Capture> capture = std::move(found->second->capture);
  if (!capture) return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  *modelRI = nullptr;
  if (capture->invalidated) {
    world.models.erase(capture->model);
    return ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED;
  }
  world.models[capture->model]->tasks = std::move(capture->tasks);
  *modelRI = capture->model;
  return ACL_SUCCESS;
}

aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclmdlRIExecuteAsync", stream))) return code;
  auto model = world.models.find(modelRI);
  if (model == world.models.end() || world.streams.count(stream) == 0) return ACL_ERROR_RT_PARAM_INVALID;
  // One launch: the captured tasks run in their order, the first failure is the stream's.
  std::shared_ptr<Model> graph = model->second;
  world.Enqueue(stream, [graph](const Stream& on) {
    for (const auto& task : graph->tasks) {
      if (const int rc = task(on)) return rc;
    }
    return static_cast<int>(ACL_SUCCESS);
  });
  return ACL_SUCCESS;
}

aclError aclmdlRIDestroy(aclmdlRI modelRI) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (const int code = world.Enter(Named("aclmdlRIDestroy"))) return code;
  return world.models.erase(modelRI) == 1 ? ACL_SUCCESS : ACL_ERROR_RT_PARAM_INVALID;
}

}  // extern "C"
