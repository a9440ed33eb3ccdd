"""The user API on MindSpore: the framework-free path of :mod:`._over_c_abi` over MindSpore's handler.

::

    import mindspore as ms
    from mindspore.communication import init
    import hyper_parallel.core.symmetric_memory as symm

    init()                                            # msrun or the MS_* environment: the mccl backend on CPU
    data = symm.empty(4096, dtype=ms.float16)        # the first call starts the runtime over the world group
    signal = symm.empty(1, dtype=ms.int32)

Tensors from :func:`empty` are MindSpore tensors over the symmetric heap (no copy). MindSpore cannot invalidate a
tensor, so after :func:`free` the tensor still reads the heap's memory: the runtime refuses it in every
``symm`` call, but reading it directly gives whatever the heap holds. Ops run on the calling thread (no streams).
"""

from __future__ import annotations

from hyper_parallel.core.symmetric_memory._over_c_abi import Api, PeerBuffers, differentiable_backward, run_forward
from hyper_parallel.platform.mindspore.handler import Handler

API = Api(Handler(run_forward, differentiable_backward))

empty = API.empty
free = API.free
shutdown = API.shutdown
barrier = API.barrier
shmem_put = API.shmem_put
shmem_get = API.shmem_get
shmem_signal_op = API.shmem_signal_op
shmem_wait_for_signal = API.shmem_wait_for_signal
shmem_put_with_signal = API.shmem_put_with_signal
shmem_allgather = API.shmem_allgather
shmem_allreduce = API.shmem_allreduce
shmem_reduce_scatter = API.shmem_reduce_scatter
shmem_alltoall = API.shmem_alltoall
shmem_send = API.shmem_send
shmem_recv = API.shmem_recv
fused_all_gather_matmul = API.fused_all_gather_matmul
fused_matmul_reduce_scatter = API.fused_matmul_reduce_scatter
debug_state = API.debug_state
is_shmem_available = API.is_shmem_available
set_signal_pad_size = API.set_signal_pad_size
get_signal_pad_size = API.get_signal_pad_size
rendezvous = API.rendezvous
SymmetricMemory = PeerBuffers
