"""UCX's libraries, loaded before the runtime's: a build with UCX (the `ucx` extra: one-sided calls across nodes)
links libucp, and both ways into the runtime (the torch binding and the C ABI library) load them through here.

The libucx wheel loads them from the wheel or, with ``RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true``, from the system; the
runtime's rpath alone finds the wheel only where it lies beside this package (not, for instance, in the base of a
``--system-site-packages`` environment). Where libucx is not installed nothing is imported.

The first libucs a process loads serves every UCX user in it: MPICH's wheel brings an older UCX of its own, so when
mpi4py initialised MPI first the wheel's libraries cannot load, and :func:`load` says so instead of a linker message.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util


@functools.lru_cache(maxsize=None)
def load() -> bool:
    """Loads UCX's libraries once per process, where the libucx wheel is installed.

    Returns:
        Whether the libucx wheel is installed (and its libraries are now loaded).

    Raises:
        ImportError: another UCX is already loaded in this process, and the wheel's cannot load beside it.
    """
    if importlib.util.find_spec("libucx") is None:
        return False
    try:
        importlib.import_module("libucx").load_library()
    except OSError as error:
        raise ImportError(
            "UCX's libraries cannot be loaded: another UCX is already loaded in this process (MPICH's wheel brings "
            "its own; import hyper_parallel before mpi4py initialises MPI, or uninstall libucx-cu12 to run without "
            f"one-sided calls across nodes): {error}") from error
    return True
