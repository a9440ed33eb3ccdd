"""``debug_state()``: a read-only, process-local snapshot of the runtime for diagnosis."""

from __future__ import annotations

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import root_info

_HEX_KEYS = frozenset({"heap_base", "base", "offset"})


def _format(value: object, indent: str) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={hex(v) if k in _HEX_KEYS else repr(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "[\n" + "".join(f"{indent}    {_format(item, indent)},\n" for item in value) + indent + "]"
    return repr(value)


class DebugState(dict):
    """A snapshot of the runtime: a dict that refuses changes and prints one field per line, addresses in hex."""

    def _read_only(self, *args, **kwargs):
        raise TypeError("`debug_state()` must not be modified, but got a write (it is a read-only snapshot)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __reduce__(self):
        # pickle, copy and deepcopy would otherwise rebuild the dict through __setitem__, which refuses; a snapshot
        # must survive dist.all_gather_object and copy.deepcopy.
        return (type(self), (dict(self),))

    def __repr__(self) -> str:
        lines = []
        for key, value in self.items():
            shown = hex(value) if key in _HEX_KEYS and isinstance(value, int) else _format(value, "  ")
            lines.append(f"  {key}: {shown}")
        return "DebugState(\n" + "\n".join(lines) + "\n)"

    __str__ = __repr__


def debug_state() -> DebugState:
    """Returns a read-only snapshot of this process's runtime (local; not collective; works in any state).

    Returns:
        A :class:`DebugState` with: state, lifecycle, reference_count, root_ranks, rank, world_size, device,
        config, heap_size, allocated, max_allocated, remaining, heap_base, active_allocations,
        leaked_allocations (each with allocation_id, base, offset, bytes, ...), latest_failure and
        calls_in_flight (data-plane calls of any thread inside the runtime right now).
    """
    raw = C.debug_state()
    root = root_info()
    ordered = {
        "state": raw["state"],
        "lifecycle": raw["lifecycle"],
        "reference_count": root.references if root is not None else 0,
        "root_ranks": list(root.ranks) if root is not None else [],
        "rank": raw["rank"],
        "world_size": raw["world_size"],
        "device": raw["device"],
        "config": raw["config"],
        "heap_size": raw["heap_size"],
        "allocated": raw["allocated"],
        "max_allocated": raw["max_allocated"],
        "remaining": raw["remaining"],
        "heap_base": raw["heap_base"],
        "active_allocations": raw["active_allocations"],
        "leaked_allocations": raw["leaked_allocations"],
        "latest_failure": raw["latest_failure"],
        "calls_in_flight": raw["calls_in_flight"],
    }
    return DebugState(ordered)
