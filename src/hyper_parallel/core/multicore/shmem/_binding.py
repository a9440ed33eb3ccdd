"""Loads the C++ binding once, after torch (whose libraries it links against)."""

import torch  # noqa: F401  (loads libc10/libtorch before the extension)

from hyper_parallel import _shmem_torch as C
from hyper_parallel.core.multicore.shmem import errors as _errors

_errors._register(C)

__all__ = ["C"]
