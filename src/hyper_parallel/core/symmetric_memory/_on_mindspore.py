"""The user API on MindSpore: the shared :class:`._api.Api` over MindSpore's handler and the runtime's C ABI.

::

    import mindspore as ms
    from mindspore.communication import init
    import hyper_parallel.core.symmetric_memory as symm

    init()                                            # msrun or the MS_* environment: the mccl backend on CPU
    data = symm.empty(4096, dtype=ms.float16)        # the first call starts the runtime over the world group
    signal = symm.empty(1, dtype=ms.int32)

Tensors from ``symm.empty`` are MindSpore tensors over the symmetric heap (no copy). MindSpore cannot invalidate a
tensor, so after ``symm.free`` the tensor still reads the heap's memory: the runtime refuses it in every ``symm``
call, but reading it directly gives whatever the heap holds. Ops run on the calling thread (no streams).
"""

from __future__ import annotations

from hyper_parallel.core.symmetric_memory._api import Api
from hyper_parallel.core.symmetric_memory._over_c_abi import CAbiCalls, differentiable_backward, run_forward
from hyper_parallel.platform.mindspore.handler import Handler

_HANDLER = Handler(run_forward, differentiable_backward)
CALLS = CAbiCalls(_HANDLER)
API = Api(_HANDLER, CALLS)
