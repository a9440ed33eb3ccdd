"""Loads the C++ binding once, after torch (whose libraries it links against)."""

import importlib.util

import torch  # noqa: F401  (loads libc10/libtorch before the extension)

# A build with the ascend device links libtorch_npu: torch_npu's Python side must be initialised first. Where
# torch_npu is not installed (every host-only machine) nothing is imported.
if importlib.util.find_spec("torch_npu") is not None:
    import torch_npu  # noqa: F401

# A build with UCX (the `ucx` extra: one-sided calls across nodes) links libucp: the libucx wheel loads it first, from
# the wheel or, with RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true, from the system (the binding's rpath finds the wheel's
# otherwise). Where libucx is not installed nothing is imported.
# The first libucs a process loads serves every UCX user in it: MPICH's wheel brings an older UCX of its own, so
# when mpi4py initialised MPI first the wheel's libraries cannot load, and this says so instead of a linker message.
if importlib.util.find_spec("libucx") is not None:
    try:
        importlib.import_module("libucx").load_library()
    except OSError as error:
        raise ImportError(
            "UCX's libraries cannot be loaded: another UCX is already loaded in this process (MPICH's wheel brings "
            "its own; import hyper_parallel before mpi4py initialises MPI, or uninstall libucx-cu12 to run without "
            f"one-sided calls across nodes): {error}") from error

from hyper_parallel import _shmem_torch as C
from hyper_parallel.core.multicore import errors as _errors
from hyper_parallel.core.multicore import runtime_logs as _runtime_logs

_errors.register_binding(C)
_runtime_logs.forward("torch binding", _runtime_logs.RuntimeLogSource(
    forward=C.log_forward, wait=C.log_wait, take=C.log_take, level=C.log_level))

__all__ = ["C"]
