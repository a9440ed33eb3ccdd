"""The MindSpore handler (:class:`hyper_parallel.core.symmetric_memory.protocol.Handler`): what the user API runs on
when the process uses MindSpore.

Its parts: MindSpore's tensor facts and tensors over heap memory (:mod:`.tensors`), its calls over the runtime's C
ABI (:mod:`.calls`) with their groups and bootstrap (:mod:`.groups`) and autograd through ``nn.Cell`` bprop
(:mod:`.autograd`). It has no eager calls before the checks (a call through the C ABI costs more than the checks)
and no operators to register. It imports MindSpore and numpy, never torch, and of the runtime only its C ABI
(:mod:`hyper_parallel.core.multicore.c_runtime`) and its exceptions.
"""

from __future__ import annotations

from hyper_parallel.platform.mindspore import tensors
from hyper_parallel.platform.mindspore.calls import CAbiCalls


class MindSporeHandler:
    """MindSpore's side of the user API."""

    name = "mindspore"
    facts = tensors
    fast = None

    def __init__(self) -> None:
        self.calls = CAbiCalls()

    @staticmethod
    def register_operators() -> None:
        """Nothing to register: MindSpore runs the calls as Python calls (PyNative mode)."""


HANDLER = MindSporeHandler()
