"""The torch handler's state: the runtime handle and one team per group.

The runtime is acquired over the WORLD group by the first ``symm.empty`` (or the first WORLD collective); its root
team is the WORLD's team, found under None and under the WORLD group object alike. A group gets a team
(``shmem.Team``, collective over the group) the first time it runs a collective: the team owns the group's slot of
the runtime's team pool (signals, fingerprints, counts, staging, mailbox, laid out once in C++) and runs every
collective in one call. A group this rank destroyed (``dist.destroy_process_group``) keeps its team until the next
team is made: a call on it is refused through that team, so that its peers fail the call too instead of waiting.
Then the team is released, and its slot reused.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.errors import ShmemStateError, ShmemValueError
from hyper_parallel.platform.torch import groups

_lock = threading.RLock()
_known = groups.KNOWN


def flush_for_host_read() -> None:
    """Finishes the current stream's work: Python is about to read what a peer wrote."""
    current = shmem.current_stream()
    if not current.is_default:
        current.synchronize()


@dataclass
class _State:
    handle: shmem.Handle
    heap_base: int
    heap_end: int
    root: shmem.Team
    teams: dict = field(default_factory=dict)  # None, the WORLD object, or a group -> its shmem.Team
    rank_maps: dict = field(default_factory=dict)  # group (None: WORLD) -> tuple of root ranks


_state: Optional[_State] = None


def state() -> _State:
    """The handler's state, acquiring the runtime over WORLD on first use (collective over WORLD).

    Raises:
        ShmemStateError: torch.distributed is not initialised.
    """
    global _state
    if _state is not None:
        return _state
    with _lock:
        if _state is not None:
            return _state
        groups.require_initialized()
        handle = shmem.acquire_shmem()   # the runtime reads SYMMETRIC_MEMORY_HEAP_SIZE, its variable's alias
        try:
            debug = shmem.debug_state()
            root = shmem.root_team()  # WORLD's team exists from the start: send/recv on WORLD need no collective
        except BaseException:
            handle.close()
            raise
        _state = _State(handle=handle, heap_base=debug["heap_base"], heap_end=debug["heap_base"] + debug["heap_size"],
                        root=root)
        _state.teams[None] = _state.teams[dist.group.WORLD] = root
        return _state


def active() -> Optional[_State]:
    """The state if the runtime was acquired, else None (never acquires)."""
    return _state


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
        # Only the release of the last reference shuts the runtime down, and is refused while tensors live.
        live = debug["active_allocations"] if debug["reference_count"] == 1 else []
        counts = current.root.agree("release", [len(live)])
        holders = " ".join(f"rank{r}={row[0]}" for r, row in enumerate(counts) if row[0])
        if holders:
            local = ", ".join(f"allocation_id={a['allocation_id']} bytes={a['bytes']}" for a in live)
            raise ShmemStateError(
                "symmetric memory shutdown refused: live symmetric tensors remain (free them, then call shutdown() "
                f"again): {holders} local=[{local}]"
            )
        for made in current.teams.values():
            if made is not current.root:
                made.release()
        _state = None
        current.handle.close()


def _key(group: Optional[dist.ProcessGroup]) -> Optional[dist.ProcessGroup]:
    """How a group's rank map is cached: the WORLD object and None are the same group."""
    return None if group is dist.group.WORLD else group


def group_pes(group: Optional[dist.ProcessGroup]) -> tuple:
    """The root ranks (PEs) of a group's ranks, in group-rank order; cached per group.

    Raises:
        ShmemValueError: the group does not contain this rank, or has a rank outside the root.
        ShmemStateError: the handler holds no runtime yet (one-sided calls never acquire it: only a collective
            call may, since every rank of the root must take part).
    """
    st = _state
    if st is not None:
        pes = st.rank_maps.get(group)
        if pes is not None:
            return pes
    root_ranks = shmem.debug_state()["root_ranks"] if st is not None else []
    if st is None or not root_ranks:
        raise ShmemStateError("symmetric memory is not initialised: op=group_ranks (call symm.empty() on every rank "
                              "first)")
    given, group = group, _key(group)
    if group is None:
        pes = tuple(range(len(root_ranks)))
    else:
        groups.require_live(group)
        ranks = dist.get_process_group_ranks(group)
        if dist.get_rank() not in ranks:
            raise ShmemValueError(f"`group` must contain this rank ({dist.get_rank()}), but got ranks {list(ranks)}")
        outside = [r for r in ranks if r not in root_ranks]
        if outside:
            raise ShmemValueError(
                f"`group` must lie inside the SHMEM root {list(root_ranks)}, but got ranks {list(ranks)}"
            )
        pes = tuple(root_ranks.index(r) for r in ranks)
    st.rank_maps[given] = pes
    return pes


def team(group: Optional[dist.ProcessGroup]) -> shmem.Team:
    """The group's team, made on first use (collective over the group).

    Making one releases the teams of groups destroyed since (their slots are reused); a group that spans nodes gets
    a hierarchical team.

    Raises:
        ShmemValueError: the group spans nodes with different numbers of its ranks on them, or does not contain this
            rank.
        ShmemStateError: every team slot is taken (64 live groups besides WORLD).
        ShmemTimeoutError: a member did not arrive in time (the message names it).
    """
    st = _state or state()
    found = st.teams.get(group)
    if found is not None:
        return found
    with _lock:
        found = st.teams.get(group)
        if found is not None:
            return found
        group_pes(group)  # argument errors first
        _release_destroyed_groups(st)
        made = shmem.Team(group)  # bounded; hierarchical when the group spans nodes
        st.teams[group] = made
        return made


def _release_destroyed_groups(st: _State) -> None:
    """Releases the teams of groups that torch.distributed no longer knows (destroy_process_group)."""
    for group in [g for g, t in st.teams.items() if t is not st.root and not groups.live(g)]:
        st.teams.pop(group).release()
        st.rank_maps.pop(group, None)


def cached_team(group: Optional[dist.ProcessGroup]) -> Optional[shmem.Team]:
    """The team of a live group that already has one, else None: never raises, never makes a team (the fast path of
    the collectives: an eager call hands its tensors straight to the engine, which checks them). A destroyed group's
    team is not handed out: its calls take the checks, which refuse them through the team."""
    st = _state
    return None if st is None or not (group is None or group in _known) else st.teams.get(group)


def refusing_team(group: Optional[dist.ProcessGroup]) -> Optional[shmem.Team]:
    """The team a refusal of a call on ``group`` goes through: the group's team, even where this rank destroyed the
    group since (its peers still wait in that team); made on the group's first collective, where torch.distributed
    still knows the group; None where no team can carry it.
    """
    st = _state
    found = None if st is None else st.teams.get(group)
    if found is not None or not groups.live(group):
        return found
    try:
        return team(group)
    except (ValueError, TypeError, shmem.ShmemError):   # no team for this rank to meet its peers in
        return None


def registered_team(group: Optional[dist.ProcessGroup], op: str) -> shmem.Team:
    """The team of a group that already ran a collective (point-to-point calls cannot make one).

    Raises:
        ShmemStateError: the handler holds no runtime yet, or the group has no team yet.
    """
    group_pes(group)  # no runtime, and argument errors, first
    found = _state.teams.get(group)
    if found is None:
        raise ShmemStateError(
            f"group has no symmetric-memory channel yet: op={op} "
            f"group_ranks={list(dist.get_process_group_ranks(group))} "
            "(run symm.barrier(group) on all its ranks once before point-to-point calls)"
        )
    return found


def address(t: torch.Tensor, name: str = "tensor") -> int:
    """A tensor's address (its argument's ``name`` for the message).

    Raises:
        ShmemStateError: the tensor's allocation was freed (its storage refuses data_ptr()), in the binding's words.
    """
    try:
        return t.data_ptr()
    except RuntimeError as error:   # only an invalidated storage refuses data_ptr(); its message names the allocation
        raise ShmemStateError(f"tensor of a freed symmetric allocation: argument={name} ({error})") from None


def heap_offset(t: torch.Tensor, name: str = "tensor") -> int:
    """A tensor's offset in the symmetric heap (the same on every rank for the same allocation), or -1.

    Raises:
        ShmemStateError: the tensor's allocation was freed.
    """
    return address(t, name) - _state.heap_base if is_symmetric(t, name) else -1


def is_symmetric(t: torch.Tensor, name: str = "tensor") -> bool:
    """Whether a tensor lies in the symmetric heap (its peers' copies are addressable).

    Raises:
        ShmemStateError: the tensor's allocation was freed.
    """
    return _state is not None and in_heap(address(t, name))


def in_heap(ptr: int) -> bool:
    """Whether an address lies in the symmetric heap (False while the handler holds no runtime)."""
    st = _state
    return st is not None and st.heap_base <= ptr < st.heap_end
