"""HyperParallel Symmetric Memory: one-sided communication for training code.

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

Every function is defined once (:class:`~hyper_parallel.core.symmetric_memory._api.Api`, over the checks of
:mod:`~hyper_parallel.core.symmetric_memory.checks`) and bound at import to the handler of the framework this
process uses (``HYPER_PARALLEL_PLATFORM``, else the one imported; :mod:`~hyper_parallel.core.symmetric_memory.protocol`
says what a handler provides): torch's (:mod:`hyper_parallel.platform.torch`, whose calls also run as torch operators
of the namespace ``hyper_parallel_shmem``, so that ``torch.compile(fullgraph=True)`` traces code that calls them) or
MindSpore's over the runtime's C ABI (:mod:`hyper_parallel.platform.mindspore`, ``docs/mindspore.md``). This package
imports no framework itself; ``docs/architecture.md`` shows the layers.

Upstream hyper-parallel's setup calls exist too: ``is_shmem_available()``, ``rendezvous(tensor, group)`` (a
handle over every rank's copy), and ``set_signal_pad_size``/``get_signal_pad_size`` (NotImplementedError, as
upstream: signals are symmetric tensors here).
"""

from typing import TYPE_CHECKING

from hyper_parallel.core.symmetric_memory import _framework
from hyper_parallel.core.symmetric_memory._api import Api, SymmetricMemory

if TYPE_CHECKING:
    # For type checkers only (nothing is imported at run time): the functions below as torch's users call them, the
    # package's dependency. On MindSpore the same functions take mindspore.Tensor, its dtypes and group names.
    import torch
    from torch.distributed import ProcessGroup

    API: Api[torch.Tensor, torch.dtype, ProcessGroup]

FRAMEWORK = _framework.FRAMEWORK
API = Api(_framework.handler())

# One definition of every function for every framework (_api.Api), bound to this process's framework's handler.
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
shmem_moe_dispatch = API.shmem_moe_dispatch
shmem_moe_combine = API.shmem_moe_combine
shmem_send = API.shmem_send
shmem_recv = API.shmem_recv
fused_all_gather_matmul = API.fused_all_gather_matmul
fused_matmul_reduce_scatter = API.fused_matmul_reduce_scatter
rendezvous = API.rendezvous
debug_state = API.debug_state
is_shmem_available = API.is_shmem_available
set_signal_pad_size = API.set_signal_pad_size
get_signal_pad_size = API.get_signal_pad_size

__all__ = [
    "SymmetricMemory",
    "barrier",
    "debug_state",
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
    "shmem_moe_combine",
    "shmem_moe_dispatch",
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
