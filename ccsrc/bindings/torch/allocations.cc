#include "bindings/torch/allocations.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <map>
#include <mutex>
#include <optional>

#include "bindings/torch/status_error.h"
#include "bindings/torch/tensor_device.h"
#include "runtime/logging.h"
#include "runtime/runtime.h"

namespace hp::shmem::torch_binding {
namespace {

struct Tracked {
  Tracked(std::uint64_t id, std::uint64_t lifecycle, const c10::intrusive_ptr<c10::StorageImpl>& storage,
          const c10::intrusive_ptr<c10::TensorImpl>& tensor)
      : id(id), lifecycle(lifecycle), storage(storage), tensor(tensor) {}
  std::uint64_t id;
  std::uint64_t lifecycle;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;   // the tensor Empty returned: free() takes only it
};

std::mutex g_mu;
std::map<const c10::StorageImpl*, Tracked> g_by_storage;

// Forgets the allocation's entry; returns whether its storage is still alive (it was given other memory).
bool Untrack(const c10::StorageImpl* storage, std::uint64_t id) {
  std::optional<Tracked> tracked;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_by_storage.find(storage);
    if (it == g_by_storage.end() || it->second.id != id) return false;
    tracked.emplace(std::move(it->second));
    g_by_storage.erase(it);
  }
  return static_cast<bool>(tracked->storage.lock());   // null while the storage is being destroyed
}

std::string Shape(const at::Tensor& tensor) {
  std::string text = "[";
  for (std::int64_t i = 0; i < tensor.dim(); ++i) text += (i ? ", " : "") + std::to_string(tensor.size(i));
  return text + "]";
}

}  // namespace

std::size_t ByteSize(const at::Tensor& tensor) {
  return static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
}

void* DataPointer(const at::Tensor& tensor, const char* what) {
  try {
    // From the storage, not tensor.data_ptr(): that is null for a tensor without elements, and a zero-byte view
    // of a symmetric tensor still has to be recognised as symmetric.
    auto* base = static_cast<char*>(tensor.storage().mutable_data());
    return base == nullptr ? nullptr : base + tensor.storage_offset() * static_cast<std::int64_t>(tensor.element_size());
  } catch (const c10::Error& e) {
    // Only an invalidated (freed) storage refuses data_ptr(); its message names the allocation.
    throw StatusError(StateError(std::string("tensor of a freed symmetric allocation: argument=") + what + " (" +
                                 e.what_without_backtrace() + ")"));
  }
}

at::Tensor Empty(const std::vector<std::int64_t>& sizes, c10::ScalarType dtype, std::size_t alignment,
                 std::string call_site) {
  std::string shape = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) shape += (i ? ", " : "") + std::to_string(sizes[i]);
  shape += "]";
  std::size_t bytes = c10::elementSize(dtype);
  bool overflow = false;
  for (std::int64_t size : sizes) {
    if (size < 0) throw StatusError(InvalidArgument("`size` must contain non-negative dimensions, but got " + shape));
    overflow |= __builtin_mul_overflow(bytes, static_cast<std::size_t>(size), &bytes);
  }
  if (overflow || bytes > static_cast<std::size_t>(INT64_MAX)) {
    throw StatusError(InvalidArgument("`size` must describe at most 2**63 - 1 bytes, but got " + shape));
  }
  Runtime& runtime = Runtime::Instance();
  AllocationInfo info = ValueOrThrow(runtime.Allocate(bytes, alignment, std::move(call_site)));
  const std::uint64_t id = info.id;
  // The deleter learns its storage's address once the tensor exists.
  auto storage_key = std::make_shared<const c10::StorageImpl*>(nullptr);
  const TensorDevice& device = ActiveTensorDevice();
  at::Tensor tensor = device.wrap(
      reinterpret_cast<void*>(info.base), sizes,
      at::TensorOptions().dtype(dtype).device(device.device),
      [id, storage_key](void*) {
        // The storage let go of the memory: on free (already freed, nothing to do), or before free because its
        // last reference died or torch moved it to other memory (a leak either way, which the runtime reports).
        const bool storage_alive = Untrack(*storage_key, id);
        Runtime::Instance().OnStorageReleased(id, storage_alive);
      });
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  *storage_key = storage;
  std::lock_guard<std::mutex> lock(g_mu);
  g_by_storage.insert_or_assign(
      storage, Tracked(id, info.lifecycle, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage),
                       tensor.getIntrusivePtr()));
  return tensor;
}

void Free(const at::Tensor& tensor, const std::string& call_site) {
  (void)DataPointer(tensor, "tensor");   // a freed tensor: "already freed" with the allocation named
  c10::StorageImpl* storage_impl = tensor.storage().unsafeGetStorageImpl();
  std::optional<Tracked> tracked;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_by_storage.find(storage_impl);
    if (it == g_by_storage.end()) {
      throw StatusError(InvalidArgument(
          "`tensor` must be a tensor returned by shmem.empty, but got a tensor whose storage is not a symmetric "
          "allocation (data_ptr=" + Hex(reinterpret_cast<std::uintptr_t>(tensor.data_ptr())) + ")"));
    }
    tracked.emplace(it->second);
  }
  if (tracked->tensor.lock().get() != tensor.unsafeGetTensorImpl()) {
    throw StatusError(InvalidArgument(
        "`tensor` must be the tensor returned by shmem.empty, not a view of it, but got a view of allocation_id=" +
        std::to_string(tracked->id) + " (storage_offset=" + std::to_string(tensor.storage_offset()) +
        ", shape=" + Shape(tensor) + ")"));
  }
  ThrowIfError(Runtime::Instance().Free(tracked->id, call_site));

  // Invalidate the storage that the tensor and all its views share: any later access raises this message.
  c10::intrusive_ptr<c10::StorageImpl> storage = tracked->storage.lock();
  (void)Untrack(storage_impl, tracked->id);
  if (storage) {
    const std::string message = "symmetric allocation was freed: allocation_id=" + std::to_string(tracked->id) +
                                " lifecycle=" + std::to_string(tracked->lifecycle) +
                                " (this tensor and every view of it are invalid after shmem.free)";
    // nbytes stays: views of the dead storage can still be formed (indexing), and touching their data raises.
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
    storage->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
  }
}

void ForgetAll() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_by_storage.clear();
}

}  // namespace hp::shmem::torch_binding
