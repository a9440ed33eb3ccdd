"""Groups as the torch operators take them: by name (``ProcessGroup.group_name``; "" is WORLD).

The operators of :mod:`~hyper_parallel.core.symmetric_memory._ops` cannot take a ProcessGroup: their schemas
hold tensors, numbers and strings, like torch's own functional collectives, which pass ``str group_name`` and
resolve it inside the op. The public functions turn ``group=`` into a name here, checking what can be checked
without the runtime, and record the group under its name; the ops look it up again with :func:`resolve`.

Everything called from the public functions reads only the group object and ``torch.distributed``'s rank and
size queries, which dynamo folds into constants: ``torch.compile(fullgraph=True)`` traces it.
"""

from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from hyper_parallel.core.multicore.errors import ShmemStateError

WORLD = ""

# Every group a public function was called with, by name. Groups live as long as the process normally does, so
# the registry holds them strongly (a destroyed group's name is never reused by torch).
_by_name: dict = {}


def name(group: Optional[dist.ProcessGroup]) -> str:
    """The name an operator takes for ``group`` ("" for WORLD), recording the group under it.

    Raises:
        ShmemStateError: torch.distributed is not initialised.
        TypeError: ``group`` is neither None nor a ProcessGroup.
        ValueError: ``group`` does not contain this rank.
    """
    if not dist.is_initialized():
        raise ShmemStateError(
            "torch.distributed is not initialised: op=symmetric_memory (call init_process_group() first)"
        )
    if group is None or group is dist.group.WORLD:
        return WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns on ranks outside the group
        raise ValueError(f"`group` must contain this rank ({dist.get_rank()}), but got a group it is not a member of")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"`group` must be a torch.distributed.ProcessGroup or None, but got {type(group).__name__}")
    group_name = group.group_name
    _by_name[group_name] = group
    return group_name


def resolve(group_name: str) -> Optional[dist.ProcessGroup]:
    """The group an operator was given by name: None for WORLD.

    A compiled graph runs before dynamo replays the registry's update (its side effects follow the graph), so a
    group met first inside a compiled function is found through torch's own name table, which its functional
    collectives resolve names with.

    Raises:
        ValueError: no group has this name.
    """
    if not group_name:
        return None
    group = _by_name.get(group_name)
    if group is None:
        try:
            group = dist.distributed_c10d._resolve_process_group(group_name)
        except (AttributeError, LookupError, RuntimeError, ValueError):
            group = None
        if group is None:
            raise ValueError(f"`group_name` must name a ProcessGroup of this process, but got {group_name!r}")
        _by_name[group_name] = group
    return group


def size(group: Optional[dist.ProcessGroup]) -> int:
    """The number of ranks in ``group`` (None: WORLD)."""
    return dist.get_world_size(group)


def rank(group: Optional[dist.ProcessGroup]) -> int:
    """This process's rank inside ``group`` (None: WORLD)."""
    return dist.get_rank(group)
