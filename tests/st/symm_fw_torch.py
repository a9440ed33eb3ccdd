"""torch's adapter for the shared user-API cases (``tests/shared/symm_api_cases.py``), used in the gloo ranks.

References go through gloo (``torch.distributed``), independent of the library; gradients through autograd.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem


class TorchFramework:
    """The ``fw`` of the shared cases on torch (see ``symm_api_cases.Framework``)."""

    name = "torch"
    symm = symm
    tensor_type = "torch.Tensor"
    group_type = "a torch.distributed.ProcessGroup"

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def dtype(self, name: str) -> torch.dtype:
        return getattr(torch, name)

    def dtype_text(self, name: str) -> str:
        return str(self.dtype(name))

    def qualified_dtype(self, name: str) -> str:
        return f"torch.{name}"

    def tensor(self, a: np.ndarray, dtype: Optional[str] = None) -> torch.Tensor:
        t = torch.from_numpy(np.array(a))   # a copy: writable, contiguous, independent of ``a``
        return t.to(self.dtype(dtype)) if dtype is not None else t

    def numpy(self, t: torch.Tensor) -> np.ndarray:
        t = t.detach()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    def sub_group(self, groups: Sequence[Sequence[int]]) -> dist.ProcessGroup:
        made = [dist.new_group(list(ranks)) for ranks in groups]   # every rank creates every group, in one order
        return next(g for g, ranks in zip(made, groups) if self.rank in ranks)

    def all_gather(self, a: np.ndarray) -> list:
        out = [torch.empty(a.shape, dtype=torch.from_numpy(a).dtype) for _ in range(self.world)]
        dist.all_gather(out, torch.from_numpy(np.ascontiguousarray(a)))
        return [t.numpy() for t in out]

    def all_reduce(self, a: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.array(a))
        dist.all_reduce(t)
        return t.numpy()

    def barrier(self) -> None:
        dist.barrier()

    def debug_state(self) -> dict:
        return shmem.debug_state()

    def grad(self, fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> list:
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        fn(*leaves).backward()
        return [self.numpy(t.grad) for t in leaves]

    def zeros_like_output(self, shape: Sequence[int], dtype: str = "float32") -> torch.Tensor:
        return torch.zeros(tuple(shape), dtype=self.dtype(dtype))

    def synchronize(self) -> None:
        """torch's copy_ on the cpu has run when it returns."""
