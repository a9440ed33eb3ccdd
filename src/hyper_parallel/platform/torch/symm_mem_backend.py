"""The host device as torch's own symmetric-memory backend for CPU tensors.

Importing this module (the torch handler, :mod:`hyper_parallel.platform.torch`, does, and so does ``import
hyper_parallel.core.symmetric_memory`` on torch) makes ``torch.distributed._symmetric_memory`` work on CPU tensors
over the runtime and heap of ``shmem.empty`` and ``symm.empty``::

    import torch.distributed._symmetric_memory as symm_mem
    import hyper_parallel.platform.torch  # noqa: F401  (the torch handler: registers the backend)

    t = symm_mem.empty(1024, device="cpu")         # collective over WORLD (the runtime's allocations are)
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)  # collective over the group
    hdl.barrier()
    torch.ops.symm_mem.one_shot_all_reduce(t, "sum", dist.group.WORLD.group_name)

The native part (``ccsrc/bindings/torch/symm_mem_*``) registers the allocator for ``DeviceType::CPU`` and under
:data:`NAME` for ``symm_mem.set_backend``, and the CPU kernels of the ``symm_mem`` operators. This module gives it
what only Python has: the runtime reference of the backend (acquired over WORLD by the first ``symm_mem.empty``) and
the teams of the groups handles are made over (``shmem.Team``, one per group, made on first use). torch's Python
fused operators get their CPU implementations from :mod:`.symm_mem_fused`.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory  # noqa: F401  (declares torch's Python-level symm_mem operators)
from torch._C._distributed_c10d import _SymmetricMemory
from torch.distributed import distributed_c10d as c10d

from hyper_parallel.core.multicore import shmem  # first: it loads the binding after torch, as the binding needs
from hyper_parallel import _shmem_torch as C

#: The name ``torch.distributed._symmetric_memory.set_backend`` takes for this backend.
NAME: str = C.symm_mem_backend_name

_lock = threading.RLock()
_handle = None  # the backend's runtime reference (shmem.Handle)
# group name -> (lifecycle, ProcessGroup, shmem.Team) of the teams this backend made.
_teams: dict = {}


def _ensure_runtime() -> None:
    """Acquires the backend's reference to the runtime over WORLD on first use (collective over WORLD then)."""
    global _handle
    from hyper_parallel.core.multicore.errors import ShmemStateError

    with _lock:
        if _handle is not None and not _handle.closed and C.state() == "initialized":
            return
        if not dist.is_initialized():
            raise ShmemStateError(
                "torch.distributed is not initialised: op=symm_mem.empty (call init_process_group() first)"
            )
        _handle = shmem.acquire_shmem()


def _team_for_group(group_name: Optional[str]) -> tuple:
    """The team of a group (None: the root) as the native side takes it: (team id, PEs, this rank's group rank).

    Made on first use, collectively over the group; a name torch gave again to a new group gets a new team, and the
    teams of destroyed groups are released.

    Raises:
        ShmemStateError: no runtime is active.
        ValueError: the group has ranks outside the root, or spans nodes.
    """
    from hyper_parallel.core.multicore.errors import ShmemStateError

    with _lock:
        if C.state() != "initialized":
            raise ShmemStateError(
                "symmetric memory is not initialised: op=rendezvous (allocate with symm_mem.empty on every rank first)"
            )
        lifecycle = C.lifecycle()
        root = shmem.root_team()
        if group_name is None:
            team = root
        else:
            group = c10d._resolve_process_group(group_name)
            _release_stale(lifecycle)
            entry = _teams.get(group_name)
            if entry is not None and entry[1] is group:
                team = entry[2]
            elif tuple(dist.get_process_group_ranks(group)) == tuple(dist.get_process_group_ranks(dist.group.WORLD)) \
                    and len(root.pes) == dist.get_world_size(group) and dist.get_world_size() == len(root.pes):
                team = root
            else:
                if entry is not None:
                    entry[2].release()
                team = shmem.Team(group)
                _teams[group_name] = (lifecycle, group, team)
        if team.spans_nodes:
            raise ValueError(
                f"`group` must lie on one node for torch's symmetric memory on the host device, but got PEs "
                f"{list(team.pes)} on nodes {list(team.nodes)}"
            )
        return team.id, tuple(team.pes), team.rank


def _release_stale(lifecycle: int) -> None:
    """Forgets the teams of ended lifecycles and releases those of destroyed groups (local, never waits)."""
    for name in list(_teams):
        team_lifecycle, group, team = _teams[name]
        if team_lifecycle != lifecycle:
            del _teams[name]
            continue
        try:
            dist.get_process_group_ranks(group)
        except (ValueError, RuntimeError, KeyError):
            team.release()
            del _teams[name]


def shutdown() -> None:
    """Gives back the backend's runtime reference (collective over the root when the runtime is active).

    Frees on every rank what torch's API let go of on every rank, releases the backend's teams and closes its
    reference; the runtime shuts down when that was the last one. Allocations of torch's API still alive (their
    tensors or handles) keep the runtime up: the shutdown is refused on every rank, as ``shmem`` refuses it.

    Raises:
        ShmemStateError: symmetric tensors are still live on some rank (the message lists them).
        ShmemTimeoutError: a rank did not reach the shutdown in time.
    """
    global _handle
    with _lock:
        if _handle is None or _handle.closed:
            _handle = None
            return
        if C.state() == "initialized":
            C.symm_mem_flush()
            C.symm_mem_forget()
        for _, _, team in _teams.values():
            team.release()
        _teams.clear()
        _handle.close()
        _handle = None


def state() -> dict:
    """What the backend holds on this rank: ``live_allocations`` (of torch's API), ``foreign_allocations`` (of
    ``shmem.empty``/``symm.empty`` rendezvoused), ``cached_handles``, ``pending_frees`` (let go of on this rank, freed
    at the next collective allocation once every rank has), and ``holds_runtime``."""
    result = dict(C.symm_mem_state())
    result["holds_runtime"] = _handle is not None and not _handle.closed
    return result


def _check_signal_pad_rank() -> None:
    """Makes ``get_signal_pad`` of the backend's handles check its rank where torch does not (torch 2.13 indexes the
    signal pads with it unchecked: a rank out of range gives a tensor over a wild pointer). Later torch checks it
    itself (``check_rank``: "rank must be in [0, world_size)"), with the same message as here."""
    torch_get_signal_pad = _SymmetricMemory.get_signal_pad

    def get_signal_pad(self, rank, sizes=[], dtype=None, storage_offset=0):  # noqa: B006  (torch's defaults)
        if self.device.type == "cpu" and isinstance(rank, int) and not 0 <= rank < self.world_size:
            raise RuntimeError(f"get_signal_pad: rank must be in [0, {self.world_size}) (got {rank})")
        return torch_get_signal_pad(self, rank, sizes, dtype, storage_offset)

    get_signal_pad.__doc__ = torch_get_signal_pad.__doc__
    _SymmetricMemory.get_signal_pad = get_signal_pad


if not C.symm_mem_torch_checks_pad_rank:
    _check_signal_pad_rank()
C.symm_mem_set_hooks(_ensure_runtime, _team_for_group)
C.symm_mem_register_ops()

from hyper_parallel.platform.torch import symm_mem_fused  # noqa: E402,F401  (CPU kernels of torch's fused ops)

__all__ = ["NAME", "shutdown", "state"]
