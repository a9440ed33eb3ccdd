"""HyperParallel Symmetric Memory: one-sided communication for training code (seeds 000 and 004).

::

    import torch.distributed as dist
    import hyper_parallel.core.symmetric_memory as symm

    dist.init_process_group("gloo")
    data = symm.empty(4096, dtype=torch.float16)     # the first call acquires the runtime over WORLD
    signal = symm.empty(1, dtype=torch.int32)
    signal.zero_()
    symm.barrier()
    if dist.get_rank() == 0:                          # push: write into rank 1's copy, then raise its signal
        symm.shmem_put_with_signal(data, 0, torch.randn(4096, dtype=torch.float16), 0, 4096,
                                   signal, 0, 1, 0, target_rank=1)
    else:
        symm.shmem_wait_for_signal(data, signal, 0, 1, 0)   # EQ 1: the data has arrived

Primitives take offsets and sizes in elements (Python ints or one-element integer tensors). Collectives accept
ordinary tensors (staged through the library's symmetric workspace) and take a copy-free path when the tensor
peers must address is symmetric. Every call takes ``group=``: any ProcessGroup of ranks inside the root, with
ranks counted inside that group. Runs on the runtime :mod:`hyper_parallel.core.multicore.shmem`.

The collectives, the primitives and the fused ops run as torch operators of the namespace
``hyper_parallel_shmem`` (:mod:`~hyper_parallel.core.symmetric_memory._ops`): ``torch.compile(fullgraph=True)``
traces code that calls them.

Upstream hyper-parallel's setup calls exist too: ``is_shmem_available()``, ``rendezvous(tensor, group)`` (a
handle over every rank's copy), and ``set_signal_pad_size``/``get_signal_pad_size`` (NotImplementedError, as
upstream: signals are symmetric tensors here).
"""

from hyper_parallel.core.symmetric_memory._framework import FRAMEWORK

if FRAMEWORK == "torch":
    from hyper_parallel.core.symmetric_memory._collectives import (
        shmem_allgather,
        shmem_allreduce,
        shmem_alltoall,
        shmem_recv,
        shmem_reduce_scatter,
        shmem_send,
    )
    from hyper_parallel.core.symmetric_memory._fused import fused_all_gather_matmul, fused_matmul_reduce_scatter
    from hyper_parallel.core.symmetric_memory._setup import (
        SymmetricMemory,
        get_signal_pad_size,
        is_shmem_available,
        rendezvous,
        set_signal_pad_size,
    )
    from hyper_parallel.core.symmetric_memory._primitives import (
        barrier,
        empty,
        free,
        shmem_get,
        shmem_put,
        shmem_put_with_signal,
        shmem_signal_op,
        shmem_wait_for_signal,
        shutdown,
    )
    from hyper_parallel.core.symmetric_memory import _ops  # noqa: F401  (registers the torch operators)
else:
    from hyper_parallel.core.symmetric_memory._on_mindspore import (
        barrier,
        debug_state,
        empty,
        free,
        fused_all_gather_matmul,
        fused_matmul_reduce_scatter,
        shmem_allgather,
        shmem_allreduce,
        shmem_alltoall,
        shmem_get,
        shmem_put,
        shmem_put_with_signal,
        shmem_recv,
        shmem_reduce_scatter,
        shmem_send,
        shmem_signal_op,
        shmem_wait_for_signal,
        shutdown,
        is_shmem_available,
        get_signal_pad_size,
        set_signal_pad_size,
        rendezvous,
        SymmetricMemory,
    )

_PUBLIC = [
    "SymmetricMemory",
    "barrier",
    "empty",
    "free",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
    "get_signal_pad_size",
    "is_shmem_available",
    "rendezvous",
    "set_signal_pad_size",
    "shmem_allgather",
    "shmem_allreduce",
    "shmem_alltoall",
    "shmem_get",
    "shmem_put",
    "shmem_put_with_signal",
    "shmem_recv",
    "shmem_reduce_scatter",
    "shmem_send",
    "shmem_signal_op",
    "shmem_wait_for_signal",
    "shutdown",
]
__all__ = [name for name in _PUBLIC if name in globals()]
