"""torch's groups as the handler's calls take them: ``group=`` checked once into a key, and the operators' names.

A key is None (the WORLD) or a ``torch.distributed`` ProcessGroup that contains this rank; the calls go straight
down with it to the group's team (:mod:`.context`, where the WORLD object and None find the same team).

The operators of :mod:`.ops` cannot take a ProcessGroup: their schemas hold tensors, numbers and strings, like
torch's own functional collectives, which pass ``str group_name`` and resolve it inside the op. A call that goes
through the dispatcher (autograd, torch.compile) names its group with :func:`name`, and the operator finds it again
with :func:`resolve`. Everything called before an operator reads only the group object and ``torch.distributed``'s
queries, which dynamo folds into constants: ``torch.compile(fullgraph=True)`` traces it.
"""

from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from hyper_parallel.core.multicore.errors import (UNNAMED_CALL, ShmemStateError, ShmemTypeError, ShmemValueError,
                                                 type_name)

WORLD = ""

#: torch.distributed's table of the groups it knows (a group leaves it on destroy_process_group). The fast path asks
#: it on every eager call of a sub-group, where the public queries would cost a look-up and a raise each.
KNOWN = dist.distributed_c10d._world.pg_map

# Every group an operator was called with, by name. Groups live as long as the process normally does, so the
# registry holds them strongly (a destroyed group's name is never reused by torch).
_by_name: dict = {}


def require_initialized() -> None:
    """Raises ShmemStateError unless torch.distributed is initialised."""
    if not dist.is_initialized():
        raise ShmemStateError(
            f"torch.distributed is not initialised: {UNNAMED_CALL} (call init_process_group() first)"
        )


def live(group: Optional[dist.ProcessGroup]) -> bool:
    """Whether ``group`` (a key) is the WORLD or a group torch.distributed still knows (not destroyed)."""
    return group is None or group in KNOWN


def require_live(group: Optional[dist.ProcessGroup]) -> None:
    """Raises ShmemValueError unless torch.distributed still knows ``group`` (a key).

    Raises:
        ShmemValueError: the group was destroyed (``destroy_process_group``) or belongs to an earlier
            ``init_process_group``.
    """
    if not live(group):
        raise ShmemValueError("`group` must be a ProcessGroup torch.distributed knows, but got one it no longer knows "
                              "(destroyed by destroy_process_group on this rank, or made before the last "
                              "init_process_group)")


def key(group: Optional[dist.ProcessGroup]) -> Optional[dist.ProcessGroup]:
    """``group=`` as the calls take it: None for the WORLD, else the ProcessGroup (the WORLD object included).

    Raises:
        ShmemTypeError: ``group`` is neither None nor a ProcessGroup.
        ShmemValueError: ``group`` does not contain this rank.
    """
    if group is None:
        return None
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns on ranks outside the group
        raise ShmemValueError(f"`group` must contain this rank ({dist.get_rank()}), but got a group it is not a "
                              "member of")
    if not isinstance(group, dist.ProcessGroup):
        raise ShmemTypeError(f"`group` must be a torch.distributed.ProcessGroup or None, but got {type_name(group)}")
    return group


def name(group: Optional[dist.ProcessGroup]) -> str:
    """The name an operator takes for the key ``group`` ("" for the WORLD), recording the group under it."""
    if group is None or group is dist.group.WORLD:
        return WORLD
    group_name = group.group_name
    _by_name[group_name] = group
    return group_name


def resolve(group_name: str) -> Optional[dist.ProcessGroup]:
    """The key of the group an operator was given by name: None for the WORLD.

    A compiled graph runs before dynamo replays the registry's update (its side effects follow the graph), so a
    group met first inside a compiled function is found through torch's own name table, which its functional
    collectives resolve names with.

    Raises:
        ShmemValueError: no group has this name.
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
            raise ShmemValueError(f"`group_name` must name a ProcessGroup of this process, but got {group_name!r}")
        _by_name[group_name] = group
    return group
