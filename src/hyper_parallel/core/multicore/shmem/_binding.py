"""Loads the C++ binding once, after torch (whose libraries it links against)."""

import importlib.util

import torch  # noqa: F401  (loads libc10/libtorch before the extension)

# A build with the ascend device links libtorch_npu: torch_npu's Python side must be initialised first. Where
# torch_npu is not installed (every host-only machine) nothing is imported.
if importlib.util.find_spec("torch_npu") is not None:
    import torch_npu  # noqa: F401

# A build with UCX links libucp: its libraries first (ucx_libraries: where libucx is not installed, nothing).
from hyper_parallel.core.multicore import ucx_libraries as _ucx_libraries  # noqa: E402

_ucx_libraries.load()

from hyper_parallel import _shmem_torch as C
from hyper_parallel.core.multicore import errors as _errors
from hyper_parallel.core.multicore import runtime_logs as _runtime_logs

_errors.register_binding(C)
_runtime_logs.forward("torch binding", _runtime_logs.RuntimeLogSource(
    forward=C.log_forward, wait=C.log_wait, take=C.log_take, level=C.log_level))

__all__ = ["C"]
