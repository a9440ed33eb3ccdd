"""MindSpore's adapter for the shared user-API cases (``tests/shared/symm_api_cases.py``), used in the msrun ranks.

References go through MindSpore's own collectives (mccl, ``mindspore.mint.distributed``), independent of the
library; gradients through ``mindspore.grad`` (the library's ops differentiate through a Cell's bprop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

import mindspore as ms
from mindspore import communication, ops
from mindspore.mint import distributed as md

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.platform.mindspore import tensors as ms_tensors


class MindSporeFramework:
    """The ``fw`` of the shared cases on MindSpore (see ``symm_api_cases.Framework``)."""

    name = "mindspore"
    symm = symm
    tensor_type = "mindspore.Tensor"
    group_type = "a MindSpore group name (str)"

    def __init__(self) -> None:
        self.rank = md.get_rank()
        self.world = md.get_world_size()
        self._groups: dict = {}

    def dtype(self, name: str) -> Any:
        return getattr(ms, name)

    def dtype_text(self, name: str) -> str:
        return str(self.dtype(name))

    def qualified_dtype(self, name: str) -> str:
        return f"mindspore.{name}"

    def tensor(self, a: np.ndarray, dtype: Optional[str] = None) -> ms.Tensor:
        a = np.array(a)   # a copy, independent of the caller's array
        if dtype == "bfloat16":   # numpy has no bfloat16: through float32
            return ms.Tensor(a.astype(np.float32)).astype(ms.bfloat16)
        return ms.Tensor(a.astype(dtype) if dtype is not None else a)

    def numpy(self, t: ms.Tensor) -> np.ndarray:
        return (t.astype(ms.float32) if t.dtype == ms.bfloat16 else t).asnumpy()

    def sub_group(self, groups: Sequence[Sequence[int]]) -> str:
        mine = next(list(ranks) for ranks in groups if self.rank in ranks)
        name = "hp_shared_" + "_".join(map(str, mine))
        if name not in self._groups:   # MindSpore: only a group's members create it, once
            communication.create_group(name, mine)
            self._groups[name] = mine
        return name

    def all_gather(self, a: np.ndarray) -> list:
        a = np.ascontiguousarray(a)
        got = [None] * self.world
        md.all_gather_object(got, a.tobytes())
        return [np.frombuffer(b, a.dtype).reshape(a.shape) for b in got]

    def all_reduce(self, a: np.ndarray) -> np.ndarray:
        t = ms.Tensor(np.array(a))
        md.all_reduce(t)   # in place (mint.distributed)
        return t.asnumpy()

    def barrier(self) -> None:
        md.barrier()

    def debug_state(self) -> dict:
        return symm.debug_state()

    def grad(self, fn: Callable[..., Any], inputs: Sequence[ms.Tensor]) -> list:
        grads = ms.grad(fn, grad_position=tuple(range(len(inputs))))(*inputs)
        grads = grads if isinstance(grads, (tuple, list)) else (grads,)
        return [self.numpy(g) for g in grads]

    def zeros_like_output(self, shape: Sequence[int], dtype: str = "float32") -> ms.Tensor:
        return ops.zeros(tuple(shape), self.dtype(dtype))

    def synchronize(self) -> None:
        ms_tensors.synchronize()   # copy_ is queued: it must have run before a barrier publishes it
