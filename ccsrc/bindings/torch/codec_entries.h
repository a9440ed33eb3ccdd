// The host codec of low-precision communication (ops/host/codec.h) as the binding's encode, decode and
// reduce_encoded, on the calling thread: what hyper_parallel.core.multicore.shmem.codec exposes.
#pragma once

#include <pybind11/pybind11.h>

namespace hp::shmem::torch_binding {

// Adds encode, decode, reduce_encoded, scale_block and the MoE row codec (encode_rows, decode_rows: on the calling
// thread, or given a stream on the runtime's device in that stream's order; wire_row_bytes) to `m`.
void RegisterCodec(pybind11::module_& m);

}  // namespace hp::shmem::torch_binding
