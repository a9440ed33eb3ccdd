"""The torch handler (:class:`hyper_parallel.core.symmetric_memory.protocol.Handler`): what the user API runs on
when the process uses torch.

Its parts: torch's tensor facts (:mod:`.tensors`), its calls (:mod:`.calls`) with their groups (:mod:`.groups`),
state (:mod:`.context`), low precision (:mod:`.low_precision`) and autograd (:mod:`.autograd`), the eager collectives
taken before the checks (:class:`.collectives.Fast`), and the ``hyper_parallel_shmem`` operators (:mod:`.ops`),
registered when the user API binds the handler. Below it: the runtime face :mod:`hyper_parallel.core.multicore.shmem`
and the C++ binding ``hyper_parallel._shmem_torch`` (``ccsrc/bindings/torch``).
"""

from __future__ import annotations

from hyper_parallel.platform.torch import collectives, ops, tensors
from hyper_parallel.platform.torch.calls import TorchCalls


class TorchHandler:
    """torch's side of the user API."""

    name = "torch"
    facts = tensors
    calls = TorchCalls
    fast = collectives.Fast

    register_operators = staticmethod(ops.register)


HANDLER = TorchHandler()
