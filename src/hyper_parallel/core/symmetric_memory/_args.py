"""The torch path's argument checks: the shared checks of :mod:`._checks` over torch's tensor facts
(:mod:`hyper_parallel.platform.torch.tensors`), and what only torch does with them (windows as views, overlaps).

Every check runs before anything is written, so that a bad argument changes nothing.
"""

from __future__ import annotations

from typing import Union

import torch

from hyper_parallel.core.symmetric_memory._checks import Checks
from hyper_parallel.platform.torch import tensors as torch_tensors

Count = Union[int, torch.Tensor]

CHECKS = Checks(torch_tensors)
integer = CHECKS.integer
count = CHECKS.count
rank_in_group = CHECKS.rank_in_group
tensor = CHECKS.tensor
same_dtype = CHECKS.same_dtype
reduce_op = CHECKS.reduce_op


def window(value: torch.Tensor, name: str, offset: int, size: int, offset_name: str) -> torch.Tensor:
    """The flat slice ``value[offset : offset + size]`` of a contiguous tensor.

    Raises:
        ValueError: the slice runs past the tensor's end.
    """
    CHECKS.window(value, name, offset, size, offset_name)
    return value.view(-1)[offset:offset + size]


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    a_lo, b_lo = a.data_ptr(), b.data_ptr()
    a_hi = a_lo + a.numel() * a.element_size()
    b_hi = b_lo + b.numel() * b.element_size()
    return a_lo < b_hi and b_lo < a_hi and a.numel() > 0 and b.numel() > 0
