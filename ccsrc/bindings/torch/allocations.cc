#include "bindings/torch/allocations.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

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
// The storages of PeerTensor's tensors, by allocation id: they own no memory, and die with the allocation.
std::map<std::uint64_t, std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>> g_peer_storages;

// Makes every later access to `storage`'s data raise `message` (views of the dead storage can still be formed by
// indexing; touching their data raises). nbytes stays.
void Invalidate(c10::StorageImpl& storage, const std::string& message) {
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, storage.device()));
  storage.release_data_and_set_meta_custom_data_ptr_error_msg_(message);
}

// Invalidates the peer tensors of allocation `id` (g_mu held).
void InvalidatePeers(std::uint64_t id, const std::string& message) {
  auto it = g_peer_storages.find(id);
  if (it == g_peer_storages.end()) return;
  for (auto& weak : it->second) {
    if (auto storage = weak.lock()) Invalidate(*storage, message);
  }
  g_peer_storages.erase(it);
}

std::string FreedMessage(std::uint64_t id, std::uint64_t lifecycle) {
  return "symmetric allocation was freed: allocation_id=" + std::to_string(id) + " lifecycle=" +
         std::to_string(lifecycle) +
         " (this tensor and every view of it are invalid once freed, by symm.free or shmem.free)";
}

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
  const std::string message = FreedMessage(tracked->id, tracked->lifecycle);
  if (storage) Invalidate(*storage, message);
  std::lock_guard<std::mutex> lock(g_mu);
  InvalidatePeers(tracked->id, message);
}

at::Tensor PeerTensor(const at::Tensor& tensor, int pe) {
  (void)DataPointer(tensor, "tensor");   // a freed tensor: "freed" with the allocation named
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_by_storage.find(storage);
    if (it == g_by_storage.end()) {
      throw StatusError(InvalidArgument(
          "`tensor` must be a symmetric tensor (from shmem.empty, or a view of one), but got a tensor whose storage "
          "is not a symmetric allocation (data_ptr=" + Hex(reinterpret_cast<std::uintptr_t>(tensor.data_ptr())) +
          ")"));
    }
    id = it->second.id;
  }
  // The whole allocation, so that the view keeps its storage offset and strides; the runtime checks the pe.
  void* base = storage->mutable_data();
  const std::size_t nbytes = storage->nbytes();
  void* peer_base = ValueOrThrow(Runtime::Instance().PeerAddress(base, nbytes, pe, "tensor"));
  const TensorDevice& device = ActiveTensorDevice();
  const std::int64_t elements = static_cast<std::int64_t>(nbytes / tensor.element_size());
  at::Tensor whole = device.wrap(peer_base, {elements}, tensor.options(), [](void*) {});   // owns nothing
  std::lock_guard<std::mutex> lock(g_mu);
  auto& storages = g_peer_storages[id];
  // Peer tensors made per call (say, one per fused op) must not pile up until free: drop the dead ones first.
  storages.erase(std::remove_if(storages.begin(), storages.end(), [](const auto& weak) { return weak.expired(); }),
                 storages.end());
  storages.push_back(
      c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
          whole.storage().unsafeGetStorageImpl())));
  return whole.as_strided(tensor.sizes(), tensor.strides(), tensor.storage_offset());
}

void ForgetAll() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_by_storage.clear();
  for (auto& [id, storages] : g_peer_storages) {
    for (auto& weak : storages) {
      if (auto storage = weak.lock()) {
        Invalidate(*storage, "the shmem runtime shut down: allocation_id=" + std::to_string(id) +
                                 " (a peer tensor is invalid once its allocation is freed or the runtime shuts down)");
      }
    }
  }
  g_peer_storages.clear();
}

}  // namespace hp::shmem::torch_binding
