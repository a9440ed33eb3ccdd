"""The torch calls' argument checks: the shared checks of :mod:`._checks` over torch's tensor facts
(:mod:`hyper_parallel.platform.torch.tensors`), for the checks torch's calls run themselves, and overlaps.

Every check runs before anything is written, so that a bad argument changes nothing.
"""

from __future__ import annotations

import torch

from hyper_parallel.core.symmetric_memory._checks import Checks
from hyper_parallel.platform.torch import tensors as torch_tensors

CHECKS = Checks(torch_tensors)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    a_lo, b_lo = a.data_ptr(), b.data_ptr()
    a_hi = a_lo + a.numel() * a.element_size()
    b_hi = b_lo + b.numel() * b.element_size()
    return a_lo < b_hi and b_lo < a_hi and a.numel() > 0 and b.numel() > 0
