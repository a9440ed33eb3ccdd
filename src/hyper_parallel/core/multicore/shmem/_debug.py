"""``debug_state()``: a read-only, process-local snapshot of the runtime for diagnosis (the projection into both
vocabularies is :mod:`hyper_parallel.core.multicore.snapshot`'s, shared with the MindSpore handler)."""

from __future__ import annotations

import torch

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import root_info
from hyper_parallel.core.multicore.snapshot import DebugState, Failure, StateName, project

__all__ = ["DebugState", "Failure", "StateName", "debug_state", "remote_transport_transfer"]


def debug_state() -> DebugState:
    """Returns a read-only snapshot of this process's runtime (local; not collective; works in any state).

    The keys and their meaning are :func:`hyper_parallel.core.multicore.snapshot.project`'s: the project's (state,
    lifecycle, reference_count, root_ranks, rank, world_size, device, config, the heap figures, active and leaked
    allocations, latest_failure, calls_in_flight, live_teams, reaches_peer_memory, nodes, transports) and upstream
    hyper-parallel's (root_rank, root_size, device_index, device_model, soc_name, config's heap_size_bytes,
    timeout_seconds, data_engine and bootstrap_endpoint_base, allocated_count, allocated_bytes, remaining_bytes,
    max_allocated_bytes, latest_failure's fields by key).

    Returns:
        A :class:`DebugState`: a read-only dict, printed one field per line with addresses in hex.
    """
    root = root_info()
    return project(C.debug_state(), root.ranks if root is not None else (), root.references if root is not None else 0)


def remote_transport_transfer(put: bool, symmetric: torch.Tensor, local: torch.Tensor, pe: int) -> None:
    """Perf diagnostics only (``hp-shmem-perf``'s floor column): the remote transport's own put or get, alone.

    Writes ``local``'s bytes into ``symmetric``'s heap offset on ``pe`` (``put``), or reads them from there into
    ``local``, through the host device's transport to other nodes (``RemoteTransport::Put``/``Get``: UCX's put or get,
    then its endpoint flush), complete when it returns. Nothing else runs: no allocation lookup, no stream, no
    chunking; what ``put``/``get`` to another node cost on top of it is theirs.

    Args:
        put: write (True) or read (False).
        symmetric: a contiguous tensor inside this rank's symmetric heap.
        local: a contiguous CPU tensor of as many bytes.
        pe: a PE of another node that the transport reaches.

    Raises:
        ValueError: the byte counts differ, ``pe`` out of range, ``symmetric`` outside this rank's heap.
        ShmemStateError: no runtime, or ``pe`` is not reached through a remote transport (the reason).
    """
    C.remote_transport_transfer(put, symmetric, local, pe)
