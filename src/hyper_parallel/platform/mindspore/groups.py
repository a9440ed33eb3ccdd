"""MindSpore's communication groups as the runtime needs them: names, ranks, and a bootstrap over each.

A group is named by a string (``mindspore.communication.create_group`` or
``mindspore.mint.distributed.new_group``); None is the world group. The runtime's bootstrap (its initialisation
and each team's creation) exchanges bytes with ``all_gather_object`` and waits with ``barrier`` over the group,
never with MindSpore's point-to-point calls (broken on CPU in 2.10).
"""

from __future__ import annotations

from typing import Optional

from mindspore import communication
from mindspore.mint import distributed

from hyper_parallel.core.multicore import c_runtime
from hyper_parallel.core.multicore.errors import ShmemStateError

WORLD = communication.GlobalComm.WORLD_COMM_GROUP


def require_initialized(op: str) -> None:
    """Raises ShmemStateError unless MindSpore's communication is initialised.

    Raises:
        ShmemStateError: ``mindspore.communication.init()`` was not called.
    """
    if not distributed.is_initialized():
        raise ShmemStateError(f"mindspore communication is not initialised (call mindspore.communication.init() "
                              f"on every rank first): op={op}")


def name(group: Optional[str]) -> str:
    """The group's name (None: the world group).

    Raises:
        TypeError: not a string or None.
    """
    if group is None:
        return WORLD
    if not isinstance(group, str):
        raise TypeError(f"`group` must be a MindSpore group name (str) or None, but got {type(group).__name__}")
    return group


def ranks(group: str) -> list:
    """The world ranks of ``group``, in group-rank order."""
    if group == WORLD:
        return list(range(distributed.get_world_size()))
    return list(communication.get_process_group_ranks(group))


def world_rank() -> int:
    """This process's world rank."""
    return distributed.get_rank()


def bootstrap(group: str) -> c_runtime.Bootstrap:
    """The runtime's bootstrap over ``group`` (rank = this rank's group rank)."""
    members = ranks(group)
    me = members.index(world_rank())
    size = len(members)
    scope = None if group == WORLD else group

    def all_gather(payload: bytes) -> bytes:
        gathered = [None] * size
        distributed.all_gather_object(gathered, payload, group=scope)
        return b"".join(gathered)

    def barrier() -> None:
        distributed.barrier(group=scope)

    return c_runtime.Bootstrap(me, size, all_gather, barrier)
