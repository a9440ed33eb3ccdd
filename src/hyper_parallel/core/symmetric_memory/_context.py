"""The state behind the user API: the runtime handle, the symmetric workspace, and one channel per group.

The runtime is acquired over the WORLD group by the first ``symm.empty`` (or the first WORLD collective). Right
after, every rank allocates one symmetric *workspace* (collective, like every allocation) that the collectives
stage through and signal in. It is cut into ``_SLOTS`` equal slots; a group gets one slot for its lifetime the
first time it runs a collective. Slot numbers are negotiated among the group's ranks (the largest next free
slot of any member), so groups that share a rank never share a slot, while disjoint groups may: they touch
disjoint heaps. Each slot holds:

* ``arrive[n]``: rank p of the group SETs ``arrive[p]`` on every peer to its epoch: a group barrier whose
  values only grow (signals never need resetting);
* ``sent[n]``, ``acked[n]``: the piece sequence numbers of send/recv, per peer;
* ``counts[2][n][2n + 1]``: what every rank publishes for the others to read (double-buffered): all_to_all's
  send and receive counts, and where in the heap a collective's tensors lie;
* ``staging``: bounce space for collectives whose tensors are not symmetric;
* ``mailbox``: one region per sender for send/recv, cut into ``MAILBOX_SLOTS`` pieces that travel in flight
  at once, each a 64-byte header (the message's byte count) and a payload.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.shmem._lifecycle import root_info
from hyper_parallel.core.multicore.shmem.errors import ShmemStateError, ShmemTimeoutError

_HEAP_VAR = "HYPER_PARALLEL_SHMEM_HEAP_SIZE"
_HEAP_ALIAS = "SYMMETRIC_MEMORY_HEAP_SIZE"
_SLOTS = 16
_MAX_STAGING_BYTES = 2 << 20
_MIN_STAGING_BYTES = 64 << 10
_ALIGN = 4096

# All-reduces up to this size read every peer's whole staged input (one step); larger ones reduce-scatter then
# gather.
_ONE_SHOT_BYTES = 256 << 10
# Pieces of send/recv in flight per (sender, receiver): the sender runs this far ahead of the receiver.
MAILBOX_SLOTS = 4
_CPU = torch.device("cpu")
_lock = threading.RLock()


def _round_down(value: int, unit: int) -> int:
    return value // unit * unit


def flush_for_host_read() -> None:
    """Finishes the current stream's work: Python is about to read what a peer wrote."""
    current = shmem.current_stream()
    if not current.is_default:
        current.synchronize()


class GroupChannel:
    """One group's ranks, its slot of the workspace, and the epochs of its protocols.

    All methods enqueue on the current SHMEM stream; only :meth:`publish`, whose rows Python reads, waits for
    the stream to finish.
    """

    def __init__(self, pes: tuple, me: int, slot: "torch.Tensor", world: int, staging_bytes: int,
                 whole_root: bool) -> None:
        self.pes = pes  # root rank (PE) of each group rank
        self.whole_root = whole_root
        self.size = len(pes)
        self.me = me  # this process's rank inside the group
        self.my_pe = pes[me]
        # Peers in rotated order (me+1, me+2, ...): no two ranks start by writing to the same peer.
        self.peers = tuple((me + r) % self.size for r in range(1, self.size))
        signals = slot[: 3 * world * 8].view(torch.int64)
        self.arrive = [signals[p:p + 1] for p in range(world)]
        self.sent = [signals[world + p:world + p + 1] for p in range(world)]
        self.acked = [signals[2 * world + p:2 * world + p + 1] for p in range(world)]
        counts_offset = 3 * world * 8
        counts_bytes = 2 * world * (2 * world + 1) * 8
        counts = slot[counts_offset:counts_offset + counts_bytes].view(torch.int64).view(2, world, 2 * world + 1)
        n = self.size
        # all_to_all's views, made once (slicing costs a microsecond each on the small-message path): per parity,
        # this rank's row of counts, the group's table, and one eager region of the staging half per sender.
        self.counts_row = [counts[parity, me, :2 * n + 1] for parity in (0, 1)]
        self.counts_table = [counts[parity, :n, :2 * n + 1] for parity in (0, 1)]
        staging_offset = _round_down(counts_offset + counts_bytes + _ALIGN - 1, _ALIGN)
        self.staging = slot[staging_offset:staging_offset + staging_bytes]
        self.mailbox = slot[staging_offset + staging_bytes:staging_offset + 2 * staging_bytes]
        region = _round_down(staging_bytes // self.size, 64)
        self.mailbox_slot_bytes = _round_down(region // MAILBOX_SLOTS, 64)
        self.mailbox_payload_bytes = self.mailbox_slot_bytes - 64
        self._mailbox_slots = []  # (header, payload) views, made once like the other small-message views
        for index in range(self.size * MAILBOX_SLOTS):
            slot = self.mailbox[index * self.mailbox_slot_bytes:(index + 1) * self.mailbox_slot_bytes]
            self._mailbox_slots.append((slot[:8].view(torch.int64), slot[64:]))
        self.one_shot_bytes = min(_ONE_SHOT_BYTES, staging_bytes // 2)
        half = self.staging.numel() // 2
        self.eager_region_bytes = _round_down(half // n, 64)
        self.eager_regions = [
            [self.staging[parity * half + i * self.eager_region_bytes:][:self.eager_region_bytes] for i in range(n)]
            for parity in (0, 1)
        ]
        self._one_shot_stages: dict = {}
        self.op = "barrier"  # the operation under way, for error messages (set by channel())
        self.epoch = 0
        self.parity = 0  # which half of the staging (and of `counts`) the next double-buffered op uses
        self.sent_messages = [0] * self.size
        self.received_messages = [0] * self.size

    def sync(self) -> None:
        """A group barrier: everything enqueued before it is visible to every member.

        The WORLD uses the device's counting barrier (one cache line, cheaper than n - 1 signals and waits when
        ranks outnumber cores); other groups signal epochs through their slot.
        """
        if self.whole_root:
            try:
                shmem.barrier()
            except ShmemTimeoutError as error:
                raise ShmemTimeoutError(f"group sync timed out: op={self.op} group_ranks={list(self.pes)} ({error})") \
                    from None
            return
        self.epoch += 1
        epoch, me, pes = self.epoch, self.me, self.pes
        for p in self.peers:
            shmem.signal(self.arrive[me], epoch, pes[p])
        for p in self.peers:
            try:
                shmem.wait_signal(self.arrive[p], epoch, cmp="ge")
            except ShmemTimeoutError as error:
                flush_for_host_read()
                missing = [pes[q] for q in self.peers if int(self.arrive[q].item()) < epoch]
                raise ShmemTimeoutError(
                    f"group sync timed out: op={self.op} group_ranks={list(pes)} epoch={epoch} "
                    f"missing_ranks={missing} ({error})"
                ) from None

    def wait_for_peer(self, signal: torch.Tensor, value: int, peer: int) -> None:
        """Waits until ``signal >= value``, where group rank ``peer`` raises it; a timeout names the operation,
        the group and the peer."""
        try:
            shmem.wait_signal(signal, value, cmp="ge")
        except ShmemTimeoutError as error:
            raise ShmemTimeoutError(
                f"{self.op} timed out waiting for a peer: group_ranks={list(self.pes)} "
                f"missing_ranks=[{self.pes[peer]}] ({error})"
            ) from None

    def publish(self, parity: int, values: list) -> list:
        """Every member's ``values`` (ints, at most 2n + 1), after a sync: row i is group rank i's.

        The rows live in the ``counts`` area of ``parity`` (from :meth:`flip`, so that a slow peer still reading
        the previous op's rows is not overwritten); the call includes a sync of the group.
        """
        row = torch.tensor(values, dtype=torch.int64, device=self.counts_row[parity].device)
        mine = self.counts_row[parity][:len(values)]
        for p in self.peers + (self.me,):
            shmem.put(mine, row, self.pes[p])
        self.sync()
        flush_for_host_read()
        return self.counts_table[parity][:, :len(values)].tolist()

    def flip(self) -> int:
        """The parity for a double-buffered op, switching it for the next."""
        parity = self.parity
        self.parity ^= 1
        return parity

    def mailbox_slot(self, sender: int, seq: int) -> tuple:
        """(header, payload) of the mailbox slot for piece ``seq`` from group rank ``sender``: an int64 byte count
        and the bytes."""
        return self._mailbox_slots[sender * MAILBOX_SLOTS + seq % MAILBOX_SLOTS]

    def one_shot_stage(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The staging half for the next one-step op (switching halves), as ``numel`` elements of ``dtype``.

        Views are cached: on the small-message path, slicing would cost more than the transfer.
        """
        parity = self.flip()
        key = (parity, dtype, numel)
        view = self._one_shot_stages.get(key)
        if view is None:
            if len(self._one_shot_stages) >= 256:
                self._one_shot_stages.clear()
            view = self.staging_view(dtype, parity * (self.staging.numel() // 2), numel)
            self._one_shot_stages[key] = view
        return view

    def staging_view(self, dtype: torch.dtype, byte_offset: int, numel: int) -> torch.Tensor:
        """``numel`` elements of ``dtype`` in the staging area, starting ``byte_offset`` bytes in."""
        nbytes = numel * dtype.itemsize
        return self.staging[byte_offset:byte_offset + nbytes].view(dtype)


@dataclass
class _State:
    handle: shmem.Handle
    workspace: torch.Tensor
    slot_bytes: int
    staging_bytes: int
    heap_base: int
    heap_end: int
    channels: dict = field(default_factory=dict)  # group (or None: WORLD) -> GroupChannel
    next_free_slot: int = 0
    rank_maps: dict = field(default_factory=dict)  # group -> tuple of root ranks


_state: Optional[_State] = None


def _heap_size_env() -> dict:
    """The environment acquire_shmem should see: SYMMETRIC_MEMORY_HEAP_SIZE as an alias of the runtime's variable."""
    alias = os.environ.get(_HEAP_ALIAS)
    if alias is None:
        return {}
    primary = os.environ.get(_HEAP_VAR)
    if primary is not None and primary != alias:
        raise ValueError(
            f"`{_HEAP_ALIAS}` must equal `{_HEAP_VAR}` when both are set, but got {alias!r} and {primary!r}"
        )
    return {_HEAP_VAR: alias}


def _workspace_layout(heap_size: int, world: int) -> tuple:
    """(slot_bytes, staging_bytes) for a heap: an eighth of the heap at most, split over the slots."""
    signal_bytes = _round_down(3 * world * 8 + 2 * world * (2 * world + 1) * 8 + _ALIGN - 1, _ALIGN)
    budget = heap_size // 8
    staging = _round_down((budget // _SLOTS - signal_bytes) // 2, _ALIGN)
    staging = max(_MIN_STAGING_BYTES, min(_MAX_STAGING_BYTES, staging))
    return signal_bytes + 2 * staging, staging


def state() -> _State:
    """The user API's state, acquiring the runtime over WORLD on first use (collective over WORLD).

    Raises:
        ShmemStateError: torch.distributed is not initialised.
    """
    global _state
    if _state is not None:
        return _state
    with _lock:
        if _state is not None:
            return _state
        if not dist.is_initialized():
            raise ShmemStateError(
                "torch.distributed is not initialised: op=symmetric_memory (call init_process_group() first)"
            )
        overrides = _heap_size_env()
        saved = {k: os.environ.get(k) for k in overrides}
        os.environ.update(overrides)
        try:
            handle = shmem.acquire_shmem()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        try:
            debug = shmem.debug_state()
            world = dist.get_world_size()
            slot_bytes, staging_bytes = _workspace_layout(debug["heap_size"], world)
            workspace = shmem.empty(_SLOTS * slot_bytes, dtype=torch.uint8, alignment=_ALIGN)
        except BaseException:
            handle.close()
            raise
        workspace.zero_()  # the heap may hand out memory an earlier allocation left signals in
        shmem.barrier()
        _state = _State(
            handle=handle,
            workspace=workspace,
            slot_bytes=slot_bytes,
            staging_bytes=staging_bytes,
            heap_base=debug["heap_base"],
            heap_end=debug["heap_base"] + debug["heap_size"],
        )
        channel(None)  # WORLD's channel exists from the start, so that send/recv on WORLD need no collective first
        return _state


def active() -> Optional[_State]:
    """The state if the runtime was acquired, else None (never acquires)."""
    return _state


def tensor_device() -> torch.device:
    """Where the SHMEM device's tensors live: that of the heap once acquired, else the host device's CPU."""
    st = _state
    return st.workspace.device if st is not None else _CPU


def shutdown() -> None:
    """Frees the workspace and releases this API's runtime reference (collective over WORLD).

    The ranks first agree that the release can go through: where the API holds the last reference to the runtime,
    every symmetric tensor must have been freed on every rank. Otherwise nothing is released on any rank, and
    ``shutdown()`` may be called again once the tensors are freed.

    Raises:
        ShmemStateError: symmetric tensors are still live on some rank (the message lists them); nothing was
            released.
        ShmemTimeoutError: a rank did not reach the shutdown in time.
    """
    global _state
    with _lock:
        if _state is None:
            return
        current = _state
        debug = shmem.debug_state()
        workspace_base = current.workspace.data_ptr()
        # Only the release of the last reference shuts the runtime down, and is refused while tensors live.
        live = [a for a in debug["active_allocations"] if a["base"] != workspace_base] \
            if debug["reference_count"] == 1 else []
        world = current.channels[None]
        counts = world.publish(world.flip(), [len(live)])
        holders = " ".join(f"rank{r}={row[0]}" for r, row in enumerate(counts) if row[0])
        if holders:
            local = ", ".join(f"allocation_id={a['allocation_id']} bytes={a['bytes']}" for a in live)
            raise ShmemStateError(
                "symmetric memory shutdown refused: live symmetric tensors remain (free them, then call shutdown() "
                f"again): {holders} local=[{local}]"
            )
        shmem.free(current.workspace)
        _state = None
        current.handle.close()


def _key(group: Optional[dist.ProcessGroup]) -> Optional[dist.ProcessGroup]:
    """How a group is cached: the WORLD object and None are the same group."""
    return None if group is dist.group.WORLD else group


def group_pes(group: Optional[dist.ProcessGroup]) -> tuple:
    """The root ranks (PEs) of a group's ranks, in group-rank order; cached per group.

    Raises:
        TypeError: ``group`` is not a ProcessGroup.
        ValueError: the group does not contain this rank, or has a rank outside the root.
        ShmemStateError: the API holds no runtime yet (one-sided calls never acquire it: only a collective
            call may, since every rank of the root must take part).
    """
    st = _state
    root = root_info()
    if st is None or root is None:
        raise ShmemStateError("symmetric memory is not initialised: op=group_ranks (call symm.empty() on every rank "
                              "first)")
    group = _key(group)
    pes = st.rank_maps.get(group)
    if pes is not None:
        return pes
    if group is None:
        pes = tuple(range(len(root.ranks)))
    else:
        if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns on ranks outside the group
            raise ValueError(
                f"`group` must contain this rank ({dist.get_rank()}), but got a group it is not a member of"
            )
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"`group` must be a torch.distributed.ProcessGroup or None, but got {type(group).__name__}")
        ranks = dist.get_process_group_ranks(group)
        if dist.get_rank() not in ranks:
            raise ValueError(f"`group` must contain this rank ({dist.get_rank()}), but got ranks {list(ranks)}")
        outside = [r for r in ranks if r not in root.ranks]
        if outside:
            raise ValueError(
                f"`group` must lie inside the SHMEM root {list(root.ranks)}, but got ranks {list(ranks)}"
            )
        pes = tuple(root.ranks.index(r) for r in ranks)
    st.rank_maps[group] = pes
    return pes


def channel(group: Optional[dist.ProcessGroup], op: str = "barrier") -> GroupChannel:
    """The group's channel for the collective ``op``, registering the group on first use (collective over the
    group).

    Registration agrees on a workspace slot and checks that the group lives on one machine. ``op`` names the
    collective in the channel's timeout messages.

    Raises:
        ValueError: the group spans machines, or does not contain this rank.
        ShmemStateError: every slot of the workspace is taken.
    """
    st = state()
    group = _key(group)
    ch = st.channels.get(group)
    if ch is not None:
        ch.op = op
        return ch
    with _lock:
        pes = group_pes(group)
        world = dist.get_world_size()
        me = pes.index(root_info().rank)
        torch_group = group if group is not None else dist.group.WORLD
        proposals: list = [None] * len(pes)
        dist.all_gather_object(proposals, (st.next_free_slot, socket.gethostname()), group=torch_group)
        hosts = sorted({host for _, host in proposals})
        if len(hosts) > 1:
            raise ValueError(
                f"`group` must lie on one machine (symmetric memory is node-local), but got hosts {hosts}"
            )
        slot = max(next_free for next_free, _ in proposals)
        if slot >= _SLOTS:
            raise ShmemStateError(
                f"every workspace slot is taken by another group: slots={_SLOTS} group_ranks={list(pes)}"
            )
        st.next_free_slot = slot + 1
        memory = st.workspace[slot * st.slot_bytes:(slot + 1) * st.slot_bytes]
        ch = GroupChannel(pes, me, memory, world, st.staging_bytes, whole_root=group is None)
        ch.op = op
        st.channels[group] = ch
        return ch


def registered_channel(group: Optional[dist.ProcessGroup], op: str) -> GroupChannel:
    """The channel of a group that already ran a collective (point-to-point calls cannot register one).

    Raises:
        ShmemStateError: the API holds no runtime yet, or the group has no channel yet.
    """
    group_pes(group)  # no runtime, and argument errors, first
    ch = _state.channels.get(_key(group))
    if ch is None:
        raise ShmemStateError(
            f"group has no symmetric-memory channel yet: op={op} "
            f"group_ranks={list(dist.get_process_group_ranks(group))} "
            "(run symm.barrier(group) on all its ranks once before point-to-point calls)"
        )
    ch.op = op
    return ch


def heap_offset(t: torch.Tensor) -> int:
    """A tensor's offset in the symmetric heap (the same on every rank for the same allocation), or -1."""
    return t.data_ptr() - _state.heap_base if is_symmetric(t) else -1


def is_symmetric(t: torch.Tensor) -> bool:
    """Whether a tensor lies in the symmetric heap (its peers' copies are addressable)."""
    st = _state
    if st is None:
        return False
    ptr = t.data_ptr()
    return st.heap_base <= ptr < st.heap_end
