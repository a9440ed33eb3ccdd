// Symmetric allocations as torch tensors: wrapping, resolving a tensor back to its allocation, and the guards.
//
// The key of an allocation on the torch side is its StorageImpl, shared by the tensor and all its views. On free
// the storage is invalidated, so every view raises a clear RuntimeError on any torch op instead of touching
// memory that the heap may hand out again.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hp::shmem::torch_binding {

// Collective: allocates a tensor of `sizes` and `dtype` from the symmetric heap, on the active tensor device
// (tensor_device.h): a CPU tensor on the host device, an npu tensor on the ascend device.
at::Tensor Empty(const std::vector<std::int64_t>& sizes, c10::ScalarType dtype, std::size_t alignment,
                 std::string call_site);

// Collective: frees the allocation of `tensor` (the very tensor Empty returned) and invalidates its storage.
void Free(const at::Tensor& tensor, const std::string& call_site);

// A tensor over `tensor`'s copy on `pe` (a rank of the root): the same sizes, strides, storage offset and dtype, on
// the whole allocation as `pe` holds it, so torch ops read and write the peer's memory directly. `tensor` is a
// symmetric tensor or a view of one. Free invalidates it together with the allocation's own storage, and so does
// shutdown (the peer's mapping goes away).
at::Tensor PeerTensor(const at::Tensor& tensor, int pe);

// The data pointer of `tensor`, or a StatusError naming `what` when its allocation was freed.
void* DataPointer(const at::Tensor& tensor, const char* what);

// Bytes the tensor's elements span (numel * itemsize); tensors reaching here are contiguous.
std::size_t ByteSize(const at::Tensor& tensor);

// Forgets every tracked allocation and invalidates the peer tensors still alive (the runtime shut down; every
// allocation was freed or leaked).
void ForgetAll();

}  // namespace hp::shmem::torch_binding
