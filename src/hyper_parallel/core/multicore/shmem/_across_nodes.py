"""The root's collectives across nodes: allocation, free and barrier when the root spans machines.

The runtime checks every symmetric allocation and free against the ranks of its node (each node maps its own
ranks' heaps only), and its barrier counts them. When the root spans nodes, this module extends each to the whole
job, bounded by ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``: allocation and free over the root ProcessGroup (a symmetric
tensor lies at the same heap offset on every rank of the job, and a rank whose call differs makes every rank raise,
with nothing changed); the barrier over the runtime's transport to other nodes where it has one (one message each way
with every PE of the other nodes), else over the root ProcessGroup.
"""

from __future__ import annotations

import struct
from typing import Callable, Optional

import torch

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import _all_gather_bytes, _Root
from hyper_parallel.core.multicore.errors import (
    AGREED,
    ShmemMismatchError,
    ShmemTimeoutError,
    failure_class,
    failure_kind,
)

# One rank's part of a check: what happened locally (AGREED or the failure's kind, errors.failure_kind), then three
# op-specific numbers.
_RECORD = struct.Struct("<qqqq")


def _exchange(root: _Root, op: str, status: int, a: int, b: int, c: int) -> list:
    """Every root rank's record (status, a, b, c), in PE order.

    Raises:
        ShmemTimeoutError: a rank did not come in time (the message names it).
    """
    gathered = _all_gather_bytes(root.group, _RECORD.pack(status, a, b, c), op)
    if isinstance(gathered, str):
        raise ShmemTimeoutError(gathered)
    return [_RECORD.unpack_from(gathered, r * _RECORD.size) for r in range(len(root.ranks))]


def _raise_for_other_failure(records: list, me: int, op: str) -> None:
    for rank, (status, *_rest) in enumerate(records):
        if status != AGREED and rank != me:
            raise failure_class(status)(f"symmetric {op} failed on another node's rank: rank={rank} "
                                           f"root_rank={me} (that rank raised the cause)")


def empty(root: _Root, allocate: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Runs ``allocate`` (the runtime's allocation, checked on this node) and checks it against every rank of the job.

    Returns:
        The symmetric tensor.

    Raises:
        The local failure of ``allocate`` itself; otherwise, when another rank failed or allocated elsewhere, the
        error naming it, after this rank's allocation is freed again (on every rank of its node alike).
    """
    try:
        tensor = allocate()
    except Exception as error:
        _exchange(root, "allocate", failure_kind(error), 0, 0, 0)
        raise
    offset = tensor.data_ptr() - root.heap_base
    nbytes = tensor.numel() * tensor.element_size()
    records = _exchange(root, "allocate", AGREED, offset, nbytes, 0)
    try:
        _raise_for_other_failure(records, root.rank, "allocation")
        for rank, (_status, their_offset, their_bytes, _unused) in enumerate(records):
            if (their_offset, their_bytes) != (offset, nbytes):
                raise ShmemMismatchError(
                    f"ranks disagree on a symmetric allocation across nodes: rank={root.rank} bytes={nbytes} "
                    f"offset={offset:#x}, rank={rank} bytes={their_bytes} offset={their_offset:#x}"
                )
    except Exception:
        C.free(tensor, "")  # every rank of this node saw the same records: they all free it again
        raise
    return tensor


def free(root: _Root, tensor: torch.Tensor, release: Callable[[], None]) -> None:
    """Checks a free against every rank of the job, then runs ``release`` (the runtime's free, checked on this node).

    Raises:
        ShmemMismatchError: another rank frees another allocation (nothing is freed anywhere).
        ShmemTimeoutError: a rank did not come in time.
    """
    offset = tensor.data_ptr() - root.heap_base if isinstance(tensor, torch.Tensor) else -1
    nbytes = tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else -1
    records = _exchange(root, "free", AGREED, offset, nbytes, 0)
    for rank, (_status, their_offset, their_bytes, _unused) in enumerate(records):
        if (their_offset, their_bytes) != (offset, nbytes):
            raise ShmemMismatchError(
                f"ranks disagree on a symmetric free across nodes: rank={root.rank} bytes={nbytes} offset={offset:#x}, "
                f"rank={rank} bytes={their_bytes} offset={their_offset:#x}"
            )
    release()


def barrier(root: _Root, node_barrier: Callable[[], None]) -> Optional[str]:
    """A barrier of the whole job: this node's, then a step that meets every other node's ranks, then this node's
    again.

    Returns:
        None, or the message of the cross-node step's failure (naming the ranks that did not come).
    """
    node_barrier()
    transport = root.remote_transport(range(len(root.ranks)))
    if transport is not None:
        failed = _meet_other_nodes(root, transport)
        if failed:
            return failed
    else:
        gathered = _all_gather_bytes(root.group, b"\0", "barrier")
        if isinstance(gathered, str):
            return gathered
    node_barrier()
    return None


# The root barrier's messages on the runtime's transport: a tag below those of the teams that span nodes (which pick
# theirs from 2^30 up, _hierarchy).
_BARRIER_TAG = 1


def _meet_other_nodes(root: _Root, transport: str) -> Optional[str]:
    """One message each way with every PE of the other nodes, over the runtime's transport, all posted at once.

    Returns:
        None once every one answered; otherwise the failure, naming the ranks that did not. A PE whose node is gone
        fails at once, and the others are still met within the timeout.
    """
    node = root.nodes[root.rank]
    others = [pe for pe, pe_node in enumerate(root.nodes) if pe_node != node]
    mine = torch.zeros(1, dtype=torch.uint8)
    rooms = torch.empty(len(others), dtype=torch.uint8)
    try:
        outcomes = C.exchange_messages(_BARRIER_TAG, [(pe, mine, rooms[i:i + 1]) for i, pe in enumerate(others)])
    except RuntimeError as error:  # refused before anything was sent
        outcomes = [(0, str(error))] * len(others)
    failed = [(root.ranks[pe], failure) for pe, (_, failure) in zip(others, outcomes) if failure]
    if not failed:
        return None
    first = (failed[0][1].splitlines() or [""])[0]
    return (f"barrier across nodes failed: op=barrier missing_ranks={sorted(rank for rank, _ in failed)} "
            f"timeout_sec={C.read_config()['timeout_sec']:g} ({transport}: {first})")
