"""The process-wide runtime lifecycle: ``acquire_shmem`` handles, the root identity and the bootstrap.

The first handle resolves the root (the ordered global ranks of a ProcessGroup) and initialises the runtime;
later handles only count. The last ``close()`` quiesces the device, checks on every rank that nothing is still
allocated, passes a barrier of the root group and shuts down. Nothing here runs a collective from a destructor,
a weakref callback or atexit: only an explicit ``close()`` does.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.errors import ShmemStateError, ShmemTimeoutError, attach_fields

_lock = threading.RLock()


@dataclass
class _Root:
    group: Optional[dist.ProcessGroup]  # None: a one-PE root of this process alone, without torch.distributed
    ranks: tuple  # global ranks in root order; the index is the PE
    rank: int  # this process's PE
    lifecycle: int
    references: int = 0
    nodes: tuple = (0,)  # the node of every PE (numbered by its lowest PE): the PEs whose heaps this device maps
    heap_base: int = 0  # this rank's heap address: a symmetric tensor's offset is the same on every rank
    # What reaches each PE, as debug_state()["transports"] said at init: "self", "node", the runtime's transport to
    # other nodes ("ucx"), or "none".
    transports: tuple = ("self",)

    @property
    def spans_nodes(self) -> bool:
        """Whether the root's PEs live on more than one node."""
        return len(set(self.nodes)) > 1

    def remote_transport(self, pes: Sequence[int]) -> Optional[str]:
        """The runtime's transport to other nodes where it reaches every PE of ``pes`` that lies on another node
        than this rank's (its name: "ucx"), else None."""
        node = self.nodes[self.rank]
        remote = {self.transports[pe] for pe in pes if self.nodes[pe] != node}
        return next(iter(remote)) if len(remote) == 1 and "none" not in remote else None


_root: Optional[_Root] = None


# After one peer timed out, how long each of the others still gets: enough to tell a late peer from a missing one.
_BOOTSTRAP_GRACE_SEC = 0.05


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of a contiguous CPU uint8 tensor, copied out without numpy (not a dependency of the package)."""
    return ctypes.string_at(tensor.data_ptr(), tensor.numel())


def _all_gather_bytes(group: dist.ProcessGroup, payload: bytes, op: str,
                      members: Optional[tuple] = None) -> Union[bytes, str]:
    """The bootstrap's all_gather: every rank's bytes, concatenated in root order, or the timeout's message.

    On gloo every rank sends its bytes to every peer and waits for each receive until the runtime's timeout, so a
    rank that stops inside the bootstrap is named and its peers give up in time (a gloo collective would wait for
    the process group's own timeout, 30 minutes by default). Other backends use their all_gather and their own
    timeouts. ``members`` (group ranks, this one among them) gathers among those ranks only, in their order.
    """
    mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    size = dist.get_world_size(group)
    if dist.get_backend(group) != "gloo" and members is None:
        gathered = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(gathered, mine, group=group)
        return b"".join(_tensor_bytes(t) for t in gathered)
    timeout_sec = C.read_config()["timeout_sec"]
    me = dist.get_rank(group)
    order = tuple(range(size)) if members is None else members
    peers = [r for r in order if r != me]
    received = {r: mine if r == me else torch.empty_like(mine) for r in order}
    missing = []
    broken = ""  # the first connection failure: its peer is gone (a dead process, a dead machine)

    def lost(peer: int, error: RuntimeError) -> None:
        nonlocal broken
        if "Timed out" not in str(error):
            broken = broken or (str(error).splitlines() or [type(error).__name__])[0]
        if peer not in missing:
            missing.append(peer)

    works = []
    for peer in peers:
        # gloo refuses to post on a connection it already saw close: that peer is gone.
        try:
            works.append((peer, dist.irecv(received[peer], src=dist.get_global_rank(group, peer), group=group)))
            works.append((peer, dist.isend(mine, dst=dist.get_global_rank(group, peer), group=group)))
        except RuntimeError as error:
            lost(peer, error)
    deadline = time.monotonic() + timeout_sec
    # A send completes once its peer has received: a peer that never does is missing too.
    for peer, work in works:
        if peer in missing:
            continue
        remaining = max(deadline - time.monotonic(), _BOOTSTRAP_GRACE_SEC)
        try:
            work.wait(timeout=timedelta(seconds=remaining))
        except RuntimeError as error:
            lost(peer, error)
    if missing:
        ranks = sorted(dist.get_global_rank(group, r) for r in missing)
        what = f"failed: op={op}" if broken else f"timed out: op={op}"
        cause = f" (gloo: {broken})" if broken else ""
        return f"bootstrap {what} step=all_gather missing_ranks={ranks} timeout_sec={timeout_sec:g}{cause}"
    return b"".join(_tensor_bytes(received[r]) for r in order)


def _barrier(group: dist.ProcessGroup, op: str) -> Optional[str]:
    """Waits until every rank of ``group`` has reached ``op``, at most the runtime's timeout.

    The process group's own timeout would otherwise apply (30 minutes by default for gloo). gloo's monitored
    barrier names the ranks that did not arrive; other backends enforce their own timeouts.

    Returns:
        None, or the timeout's message.

    Raises:
        ValueError: a HYPER_PARALLEL_SHMEM_* variable has a bad value.
    """
    timeout_sec = C.read_config()["timeout_sec"]
    if dist.get_backend(group) != "gloo":
        dist.barrier(group=group)
        return None
    try:
        dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout_sec))
    except RuntimeError as error:
        return f"bootstrap timed out: op={op} timeout_sec={timeout_sec:g} ({str(error).splitlines()[0]})"
    return None


def _bootstrap(group: dist.ProcessGroup, op: str, members: Optional[tuple] = None):
    """The runtime's bootstrap over ``group`` (or over its ranks ``members`` only): all_gather(bytes) -> bytes, and
    barrier() -> None, each returning the message of its timeout instead when a rank does not come."""
    if members is not None:
        def barrier() -> Optional[str]:
            gathered = _all_gather_bytes(group, b"\0", op, members)
            return gathered if isinstance(gathered, str) else None

        return (lambda payload: _all_gather_bytes(group, payload, op, members)), barrier
    return (lambda payload: _all_gather_bytes(group, payload, op)), (lambda: _barrier(group, op))


def _resolve_ranks(root_group: Optional[dist.ProcessGroup]) -> tuple:
    if not dist.is_available() or not dist.is_initialized():
        raise ShmemStateError(
            "torch.distributed is not initialised: op=acquire_shmem (call dist.init_process_group() first)"
        )
    group = dist.group.WORLD if root_group is None else root_group
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        # What dist.new_group() hands to the ranks it leaves out.
        raise ValueError(
            f"`root_group` must contain this rank ({dist.get_rank()}), but got a group it is not a member of"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"`root_group` must be a torch.distributed.ProcessGroup or None, but got {type(group).__name__}")
    return group, tuple(dist.get_process_group_ranks(group))


class Handle:
    """A reference to the process's SHMEM runtime; it carries no communication methods.

    Close it (or leave its ``with`` block) on every rank in the same order: the last close is collective.
    """

    def __init__(self, lifecycle: int) -> None:
        self._lifecycle = lifecycle
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has released this reference."""
        return self._closed

    def close(self) -> None:
        """Releases this reference; the last one shuts the runtime down (collective over the root group).

        Idempotent. When the shutdown is refused because allocations are still live on some rank, this handle
        stays open: free them and call ``close()`` again.

        Raises:
            ShmemStateError: live allocations remain on some rank (the message lists them).
            ShmemTimeoutError: a rank did not reach the shutdown in time.
        """
        global _root
        with _lock:
            if self._closed:
                return
            root = _root
            if root is None or root.lifecycle != self._lifecycle:
                self._closed = True  # its lifecycle already ended
                return
            if root.references > 1:
                root.references -= 1
                self._closed = True
                return
            all_gather, barrier = _local_bootstrap() if root.group is None else _bootstrap(root.group, "shutdown")
            try:
                C.shutdown(root.rank, len(root.ranks), all_gather, barrier)
            except Exception as error:
                attach_fields(error, "shutdown")
                raise
            root.references = 0
            _root = None
            self._closed = True

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Handle(lifecycle={self._lifecycle}, closed={self._closed})"


def acquire_shmem(root_group: Optional[dist.ProcessGroup] = None) -> Handle:
    """Returns a reference to the process's SHMEM runtime, initialising it on first use.

    The first handle is collective over ``root_group``: every rank finds the ranks of its node (those that can open
    its shared memory) and maps their symmetric heaps (``HYPER_PARALLEL_SHMEM_HEAP_SIZE`` bytes, read anew for every
    lifecycle). Later handles only count, also
    those of a one-PE runtime that :func:`shmem.acquire` started without torch.distributed.

    Args:
        root_group: the ProcessGroup whose ranks form the root (None: the WORLD group). Another group object
            with the same ranks in the same order shares the runtime. In this version the root must be the
            whole WORLD.

    Returns:
        A :class:`Handle`; close it on every rank (or use it as a context manager).

    Raises:
        ShmemStateError: torch.distributed is not initialised.
        TypeError: ``root_group`` is not a ProcessGroup.
        ValueError: the group does not contain this rank, does not cover the WORLD, or differs from the active
            runtime's root.
        ShmemOutOfMemoryError: /dev/shm cannot hold the symmetric heaps.
        ShmemTimeoutError: a rank of the root did not call acquire_shmem within HYPER_PARALLEL_SHMEM_TIMEOUT_SEC.
    """
    return acquire_root(root_group)


def acquire_root(root_group: Optional[dist.ProcessGroup], heap_size_bytes: Optional[int] = None) -> Handle:
    """:func:`acquire_shmem`, with the heap of a lifecycle it starts given explicitly (``heap_size_bytes``; None: the
    runtime's configuration), as upstream's ``acquire`` takes it (internal).

    Raises:
        As :func:`acquire_shmem`; ValueError for a heap size outside the runtime's limits.
    """
    global _root
    local = _join_local_root(root_group, "acquire_shmem")
    if local is not None:
        return local
    group, ranks = _resolve_ranks(root_group)
    with _lock:
        if _root is not None:
            if ranks != _root.ranks:
                raise ValueError(
                    f"`root_group` must have the ranks of the active runtime's root {list(_root.ranks)}, "
                    f"but got {list(ranks)}"
                )
            _root.references += 1
            return Handle(_root.lifecycle)
        world = dist.get_world_size()
        if ranks != tuple(range(world)):
            raise ValueError(
                f"`root_group` must cover the whole WORLD in rank order {list(range(world))}, but got {list(ranks)}"
            )
        rank = ranks.index(dist.get_rank())
        timed_out = _barrier(group, "acquire_shmem")  # before the bootstrap's unbounded collectives
        if timed_out:
            raise ShmemTimeoutError(timed_out)
        all_gather, barrier = _bootstrap(group, "acquire_shmem")
        C.init(rank, len(ranks), all_gather, barrier, heap_size_bytes or 0)
        state = C.debug_state()
        _root = _Root(group=group, ranks=ranks, rank=rank, lifecycle=C.lifecycle(), references=1,
                      nodes=tuple(state["nodes"]), heap_base=state["heap_base"],
                      transports=tuple(state["transports"]))
        return Handle(_root.lifecycle)


def root_info() -> Optional[_Root]:
    """The active root, or None (internal)."""
    return _root


def require_root(op: str) -> _Root:
    """The active root.

    Raises:
        ShmemStateError: no runtime is active.
    """
    root = _root
    if root is None:
        raise ShmemStateError(f"shmem runtime is not initialised: op={op} (call acquire_shmem() first)")
    return root


def _local_bootstrap():
    """The bootstrap of a one-PE root: nothing to exchange, nobody to wait for."""
    return (lambda payload: payload), (lambda: None)


def _join_local_root(root_group: Optional[dist.ProcessGroup], op: str) -> Optional[Handle]:
    """Counts one more reference to an active one-PE root of this process alone, if that is the active root.

    Returns:
        A :class:`Handle`, or None when no one-PE root is active (the caller then resolves a ProcessGroup root).

    Raises:
        ShmemStateError: torch.distributed was initialised since the one-PE root started, or ``root_group`` names
            a group (a one-PE root has none).
    """
    with _lock:
        root = _root
        if root is None or root.group is not None:
            return None
        if dist.is_available() and dist.is_initialized():
            raise ShmemStateError(
                f"torch.distributed was initialised during a one-PE lifecycle: op={op} lifecycle={root.lifecycle} "
                "(release the runtime's references first)"
            )
        if root_group is not None:
            raise ShmemStateError(
                f"torch.distributed is not initialised: op={op} root_group={root_group!r} (a root group needs "
                "dist.init_process_group(); without it the root is this process alone)"
            )
        root.references += 1
        return Handle(root.lifecycle)


def acquire_local(op: str, heap_size_bytes: Optional[int] = None) -> Handle:
    """A reference to a one-PE runtime of this process alone, started if none is active (upstream's one-PE root).

    Only for a process without torch.distributed: the root is this process, PE 0 of 1, and no collective runs.

    Args:
        op: the caller's name, for messages.
        heap_size_bytes: the heap of a lifecycle this call starts (None: the runtime's configuration).

    Returns:
        A :class:`Handle`.

    Raises:
        ShmemStateError: torch.distributed was initialised since a one-PE lifecycle started.
        ValueError: a HYPER_PARALLEL_SHMEM_* variable has a bad value.
        ShmemOutOfMemoryError: /dev/shm cannot hold the symmetric heap.
    """
    global _root
    with _lock:
        joined = _join_local_root(None, op)
        if joined is not None:
            return joined
        if _root is not None:
            raise ShmemStateError(
                f"torch.distributed is not initialised, but a lifecycle over a ProcessGroup is active: op={op} "
                f"lifecycle={_root.lifecycle} root_ranks={list(_root.ranks)}"
            )
        all_gather, barrier = _local_bootstrap()
        C.init(0, 1, all_gather, barrier, heap_size_bytes or 0)
        _root = _Root(group=None, ranks=(0,), rank=0, lifecycle=C.lifecycle(), references=1,
                      heap_base=C.debug_state()["heap_base"])
        return Handle(_root.lifecycle)


def device_available() -> bool:
    """Whether the configured device is built into this installation (``HYPER_PARALLEL_SHMEM_DEVICE``: ``host``
    by default, built everywhere; ``ascend`` only in a build against CANN).

    Never raises and starts nothing: a malformed ``HYPER_PARALLEL_SHMEM_*`` variable answers False (the first
    acquire raises the error naming it).

    Returns:
        True when a runtime could start here on the configured device, as far as this process can tell alone.
    """
    try:
        device = C.read_config()["device"]
    except ValueError:
        return False
    return device in C.built_devices


def low_precision_default() -> Optional[str]:
    """The default wire format of all_reduce and reduce_scatter in the user API (``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE``,
    read by the runtime with the rest of its configuration: once per lifecycle, when it starts; the environment's
    while no lifecycle is active).

    Returns:
        The wire format's name (``"bfloat16"``), or None when the default is off.

    Raises:
        ShmemValueError: the variable names no wire format (every call that takes the default raises it).
    """
    return C.low_precision_default()


def read_config() -> dict:
    """The configuration a lifecycle starting now would use, read from the environment by the runtime (the one reader
    of every ``HYPER_PARALLEL_SHMEM_*`` and ``SYMMETRIC_MEMORY_*`` variable): the keys of ``debug_state()["config"]``
    in the runtime's vocabulary (``heap_size``, ``timeout_sec``, ``log_level``, ``device``, ``checks``,
    ``low_precision_dtype``).

    Returns:
        A new dict.

    Raises:
        ShmemValueError: a variable has a bad value (the message names it).
    """
    return C.read_config()
