"""Upstream hyper-parallel's lifecycle calls: module-level ``acquire()``/``release()`` and ``host_barrier()``.

``acquire()`` takes one reference of the same count as :func:`acquire_shmem` handles (it keeps a handle of its
own), and ``release()`` gives back the latest reference ``acquire()`` took: the two styles mix in one process, and
the last reference of either kind shuts the runtime down (collective, as ``Handle.close()``).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch.distributed as dist

from hyper_parallel.core.multicore.shmem import _lifecycle
from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import (
    Handle,
    _barrier,
    _lock,
    acquire_local,
    require_root,
    root_info,
)
from hyper_parallel.core.multicore.shmem._streams import current_handle
from hyper_parallel.core.multicore.errors import (
    ShmemStateError,
    ShmemTimeoutError,
    ShmemValueError,
    attach_fields,
)

# The references acquire() took, latest last; release() closes them in reverse order.
_acquired: list = []


def _check_heap_size(heap_size_bytes: Optional[int]) -> None:
    if heap_size_bytes is None:
        return
    if isinstance(heap_size_bytes, bool) or not isinstance(heap_size_bytes, int) or heap_size_bytes <= 0:
        raise ShmemValueError(f"`heap_size_bytes` must be a positive int, but got {heap_size_bytes!r}")
    root = root_info()
    if root is not None:
        active = C.debug_state()["config"]["heap_size"]
        if active < heap_size_bytes:
            raise ShmemStateError(
                f"the active runtime's heap is smaller than requested: op=acquire heap_size={active} "
                f"heap_size_bytes={heap_size_bytes} (release every reference to start a lifecycle with a larger heap)"
            )


def _several_processes() -> Optional[str]:
    # torchrun and most launchers say how many processes the job has; a rank of a larger job that has not
    # initialised torch.distributed must not quietly get a root of its own.
    world = os.environ.get("WORLD_SIZE")
    return world if world is not None and world.strip() not in ("", "0", "1") else None


@functools.wraps(_lifecycle.acquire_shmem)
def acquire_shmem(root_group: Optional[dist.ProcessGroup] = None) -> Handle:
    # The public acquire_shmem: the lifecycle's, whose errors also carry upstream's fields (operation=initialize).
    try:
        return _lifecycle.acquire_shmem(root_group)
    except Exception as error:
        attach_fields(error, "initialize")
        raise


def acquire(root_group: Optional[dist.ProcessGroup] = None, *, heap_size_bytes: Optional[int] = None) -> None:
    """Takes one reference to the process's SHMEM runtime, starting it on first use (upstream hyper-parallel's call).

    The reference counts with :func:`acquire_shmem`'s handles; give it back with :func:`release`. With
    torch.distributed initialised the first reference is collective over ``root_group`` exactly as
    :func:`acquire_shmem`. Without it, the root is this process alone (one PE, no collective), as upstream allows:
    ``root_group`` must then be None, and a process of a larger job (``WORLD_SIZE`` above 1) is refused rather
    than given a root of its own.

    Args:
        root_group: the ProcessGroup whose ranks form the root (None: WORLD, or this process alone without
            torch.distributed).
        heap_size_bytes: the heap of a lifecycle this call starts, instead of HYPER_PARALLEL_SHMEM_HEAP_SIZE (the
            same limits apply). Joining an active lifecycle, it must not exceed the active heap.

    Raises:
        ShmemStateError: a root group without torch.distributed; torch.distributed not initialised in a job of
            several processes, or initialised since a one-PE lifecycle started; an active heap smaller than
            ``heap_size_bytes``.
        ValueError: ``heap_size_bytes`` is not a positive int, or as :func:`acquire_shmem`.
        TypeError, ShmemOutOfMemoryError, ShmemTimeoutError: as :func:`acquire_shmem`.
    """
    try:
        with _lock:
            _check_heap_size(heap_size_bytes)
            if dist.is_available() and dist.is_initialized():
                handle = _lifecycle.acquire_root(root_group, heap_size_bytes)
            else:
                world = _several_processes()
                if root_group is not None or world is not None:
                    raise ShmemStateError(
                        "torch.distributed is not initialised: op=acquire "
                        f"root_group={root_group!r} WORLD_SIZE={world} (call dist.init_process_group() first; "
                        "without it the root is this process alone, with root_group=None)"
                    )
                handle = acquire_local("acquire", heap_size_bytes)
            _acquired.append(handle)
    except Exception as error:
        attach_fields(error, "initialize")
        raise


def release() -> None:
    """Gives back the latest reference :func:`acquire` took; the last reference of the process shuts down.

    A reference that is not the last only counts down (local). The last one, of either style, is collective over
    the root as ``Handle.close()``: refused while allocations are live on some rank, and then kept, so that
    ``release()`` can be called again once they are freed.

    Raises:
        ShmemStateError: no reference taken by :func:`acquire` is left (``acquire_shmem`` handles are given back
            with ``handle.close()``), or the shutdown was refused (live allocations; the reference is kept).
        ShmemTimeoutError: a rank did not reach the shutdown in time.
    """
    try:
        with _lock:
            if not _acquired:
                root = root_info()
                raise ShmemStateError(
                    "no reference taken by shmem.acquire() is left to release: op=release "
                    f"reference_count={root.references if root is not None else 0} "
                    "(acquire_shmem() handles are given back with handle.close())"
                )
            handle: Handle = _acquired[-1]
            handle.close()  # refused: the handle stays open, and so in the list, for a retry
            _acquired.pop()
    except Exception as error:
        attach_fields(error, "shutdown")
        raise


def host_barrier() -> None:
    """Waits on the host until every rank of the root arrives, after this thread's current stream has drained.

    Unlike :func:`barrier` (enqueued on the current stream), this blocks the calling thread: it first waits for
    the work enqueued on its current stream (other streams are the caller's to synchronize), then passes a
    barrier of the root ProcessGroup, bounded by HYPER_PARALLEL_SHMEM_TIMEOUT_SEC. On a one-PE root it only
    drains the stream.

    Raises:
        ShmemStateError: no runtime is active.
        ShmemTimeoutError: a rank did not arrive in time (gloo names the missing ranks).
        ShmemError: work enqueued on the current stream failed (its own subclass).
    """
    try:
        root = require_root("host_barrier")
        C.synchronize_stream(current_handle())
        if root.group is not None and len(root.ranks) > 1:
            timed_out = _barrier(root.group, "host_barrier")
            if timed_out:
                raise ShmemTimeoutError(timed_out)
    except Exception as error:
        attach_fields(error, "host_barrier")
        raise
