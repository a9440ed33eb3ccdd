"""The runtime's debug snapshot in both vocabularies, the project's and upstream hyper-parallel's, for every handler
(no framework is imported here): the runtime face's ``shmem.debug_state()`` (torch) and MindSpore's
``symm.debug_state()`` (over the C ABI) project the runtime's raw snapshot through :func:`project`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

from hyper_parallel.core.multicore import errors

_HEX_KEYS = frozenset({"heap_base", "base", "offset", "allocation_base"})
# Upstream hyper-parallel's names, kept so that its users' code runs: the same facts as the project's keys (its byte
# counts are requested bytes, the project's are reserved bytes). A printed snapshot shows them apart.
UPSTREAM_KEYS = ("root_rank", "root_size", "device_index", "device_model", "soc_name", "allocated_count",
                 "allocated_bytes", "remaining_bytes", "max_allocated_bytes")
UPSTREAM_CONFIG_KEYS = ("heap_size_bytes", "timeout_seconds", "data_engine", "bootstrap_endpoint_base")
UPSTREAM_ALLOCATION_KEYS = ("allocation_base", "allocation_bytes")
# What a printed snapshot says beside the fields whose unit or meaning their name leaves open.
_NOTES = {
    "heap_size": "bytes of this rank's heap",
    "allocated": "bytes reserved by live and leaked allocations, with the runtime's own records",
    "max_allocated": "peak of allocated",
    "remaining": "bytes of the heap not reserved",
    "allocated_bytes": "bytes requested by live and leaked allocations",
    "remaining_bytes": "heap_size - allocated_bytes",
    "max_allocated_bytes": "= max_allocated",
}
_UNRECORDED_CALL_SITE = "<not recorded: HYPER_PARALLEL_SHMEM_LOG_LEVEL=0 records it>"


def _entry(key: str, value: object) -> str:
    if key in _HEX_KEYS and isinstance(value, int):
        return f"{key}={hex(value)}"
    if key == "call_site" and value == "":
        return f"{key}={_UNRECORDED_CALL_SITE}"
    return f"{key}={value!r}"


def _format(value: object, indent: str, upstream: tuple = ()) -> str:
    if isinstance(value, dict):
        own = ", ".join(_entry(k, v) for k, v in value.items() if k not in upstream)
        theirs = ", ".join(_entry(k, v) for k, v in value.items() if k in upstream)
        return "{" + own + (f"; upstream's names: {theirs}" if theirs else "") + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "[\n" + "".join(f"{indent}    {_format(item, indent, UPSTREAM_ALLOCATION_KEYS)},\n"
                               for item in value) + indent + "]"
    return repr(value)


class DebugState(dict):
    """A snapshot of the runtime: a dict that refuses changes and prints one field per line, addresses in hex, the
    fields upstream hyper-parallel names otherwise apart from the project's, and what a byte count counts."""

    def _read_only(self, *args, **kwargs):
        raise TypeError("`debug_state()` must not be modified, but got a write (it is a read-only snapshot)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __reduce__(self):
        # pickle, copy and deepcopy would otherwise rebuild the dict through __setitem__, which refuses; a snapshot
        # must survive dist.all_gather_object and copy.deepcopy.
        return (type(self), (dict(self),))

    def _line(self, key: str, value: object) -> str:
        if key in _HEX_KEYS and isinstance(value, int):
            shown = hex(value)
        else:
            shown = _format(value, "  ", UPSTREAM_CONFIG_KEYS if key == "config" else ())
        note = _NOTES.get(key)
        return f"  {key}: {shown}" + (f"   # {note}" if note and value is not None else "")

    def __repr__(self) -> str:
        lines = [self._line(key, value) for key, value in self.items() if key not in UPSTREAM_KEYS]
        theirs = [self._line(key, value) for key, value in self.items() if key in UPSTREAM_KEYS]
        if theirs:
            lines.append("  -- upstream hyper-parallel's names for the facts above --")
            lines.extend(theirs)
        return "DebugState(\n" + "\n".join(lines) + "\n)"

    __str__ = __repr__


class StateName(str):
    """The lifecycle state in both vocabularies: the project's name, equal to upstream hyper-parallel's as well.

    ``"initialized"`` is upstream's ``"Ready"``, ``"uninitialized"`` its ``"Uninitialized"`` and ``"failed"`` (the
    device's finalize failed; the process cannot start another lifecycle) its ``"Finalized"``. The value, its
    hash and its printout are the project's name; ``==`` and ``!=`` accept either (dict and set look-ups go by the
    project's name). :attr:`upstream` is upstream's name.
    """

    _UPSTREAM = {"uninitialized": "Uninitialized", "initialized": "Ready", "failed": "Finalized"}

    @property
    def upstream(self) -> str:
        """Upstream hyper-parallel's name of this state."""
        return self._UPSTREAM.get(str(self), str(self))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str) and not isinstance(other, StateName) and other == self.upstream:
            return True
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class Failure(str):
    """``latest_failure`` in both vocabularies: the project's ``"CODE: message"`` text (``""`` when nothing failed),
    which also answers upstream hyper-parallel's fields by key.

    ``failure["error_code"]``, ``["operation"]``, ``["phase"]``, ``["root_rank"]``, ``["cann_error_code"]`` and
    ``["message"]`` (also :meth:`get`, :meth:`keys`, :meth:`fields`) read the same text in upstream's vocabulary;
    an integer or a slice indexes the text as for any str. Every field is None when nothing failed.
    ``operation`` is the ``op=`` the message names, else None.
    """

    _KEYS = ("operation", "phase", "root_rank", "error_code", "cann_error_code", "message")
    # The project's op names that upstream names otherwise.
    _UPSTREAM_OPS = {"empty": "allocate", "acquire_shmem": "initialize"}
    # The class the runtime raises for each code of a recorded "CODE: message", which knows upstream's fields.
    _CLASSES = {c.code: c for c in (errors.ShmemValueError, errors.ShmemTypeError, errors.ShmemStateError,
                                    errors.ShmemTimeoutError, errors.ShmemOutOfMemoryError,
                                    errors.ShmemMismatchError, errors.ShmemDeviceError)}
    _OP = re.compile(r"\bop=([A-Za-z_]+)")

    def __new__(cls, text: str = "", root_rank: Optional[int] = None) -> "Failure":
        failure = super().__new__(cls, text)
        failure.root_rank = root_rank
        return failure

    def fields(self) -> dict:
        """Upstream's fields of this failure (every value None when nothing failed)."""
        if not self:
            return dict.fromkeys(self._KEYS)
        code, _, message = str(self).partition(": ")
        error = self._CLASSES.get(code, errors.ShmemError)(message)
        op = self._OP.search(message)
        operation = op.group(1).lower() if op else None
        return {
            "operation": self._UPSTREAM_OPS.get(operation, operation),
            "phase": error.phase,
            "root_rank": self.root_rank,
            "error_code": error.error_code,
            "cann_error_code": error.cann_error_code,
            "message": message,
        }

    def keys(self) -> tuple:
        """Upstream's field names."""
        return self._KEYS

    def get(self, key: str, default: object = None) -> object:
        """Upstream's field ``key``, or ``default`` for a name that is not one."""
        return self.fields().get(key, default)

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.fields()[key]
        return str.__getitem__(self, key)

    def __reduce__(self):
        return (type(self), (str(self), self.root_rank))


def data_engine(device: str) -> str:
    """Upstream's ``data_engine`` of a device: the engine that moves the bytes of put and get.

    Upstream's runtime configures CANN SHMEM's data-operation engine and accepts only ``"mte"`` (the NPU's memory
    transfer engine, CANN SHMEM's default; its SDMA, RoCE and UDMA engines are not used). The ascend device runs on
    the same default, so it reports ``"mte"``; the host device moves bytes with the CPU (memcpy into the peer's
    mapping, cross-memory attach), so it reports ``"cpu"``.

    Args:
        device: the runtime's device name (``config["device"]``).

    Returns:
        ``"mte"`` or ``"cpu"``.
    """
    return "mte" if device == "ascend" else "cpu"


def project(raw: dict, root_ranks: Sequence[int], reference_count: int) -> DebugState:
    """The runtime's raw snapshot of this process as ``debug_state()`` returns it (read-only).

    One snapshot answers two vocabularies, every value read from the same runtime snapshot:

    * the project's: state, lifecycle, reference_count, root_ranks, rank, world_size, device, config
      (heap_size, timeout_sec, log_level, device), heap_size, allocated, max_allocated, remaining (in reserved
      bytes, the runtime's own records counted), heap_base, active_allocations and leaked_allocations (each with
      allocation_id, base, offset, bytes, reserved, lifecycle, call_site), latest_failure, calls_in_flight
      (data-plane calls of any thread inside the runtime right now), live_teams (the runtime teams of this rank)
      and reaches_peer_memory (whether the device reads peers' ordinary tensors straight out of their processes:
      on the host device, where the kernel allows cross-memory attach between every pair of ranks) and nodes (the
      node of every root rank, numbered by the node's lowest rank: the ranks whose heaps this device maps; one
      node per machine on the host device, found by which ranks can open each other's shared memory) and transports
      (what carries this rank's one-sided calls to every root rank: "self", "node" for the mapped memory of its
      node, the device's transport to other nodes, e.g. "ucx", "lost" for a rank of another node whose process
      or node has gone since, or "none" where one-sided calls do not reach);
    * upstream hyper-parallel's: state (:class:`StateName` compares equal to ``"Ready"``, ``"Uninitialized"``,
      ``"Finalized"`` too), reference_count (acquire_shmem handles and shmem.acquire() references alike),
      root_rank, root_size, device_index, device_model, soc_name (None on the host device: there is no NPU),
      config (also heap_size_bytes, timeout_seconds, data_engine (:func:`data_engine`), bootstrap_endpoint_base:
      None, the bootstrap runs over the framework's process group), allocated_count and allocated_bytes (every
      allocation not yet freed, leaked ones included, in requested bytes), remaining_bytes
      (``heap_size_bytes - allocated_bytes``, a logical budget), max_allocated_bytes (the project's reserved-byte peak, at least upstream's requested-byte one),
      each active allocation's allocation_base and allocation_bytes, and latest_failure's fields by key
      (:class:`Failure`).

    Without an active lifecycle (before the first acquire, after the last release) state is ``"uninitialized"``
    and the lifecycle's fields are None: config, active_allocations and every upstream-only field, as upstream
    has them; rank is -1, world_size and the heap figures 0, root_ranks and leaked_allocations empty.

    Args:
        raw: the runtime's snapshot (the binding's ``debug_state()``, or the C ABI's as a dict).
        root_ranks: the world ranks of the root's PEs (empty without a lifecycle).
        reference_count: the references taken on the runtime in this process.

    Returns:
        A :class:`DebugState`: a read-only dict, printed one field per line with addresses in hex.
    """
    live = raw["state"] != "uninitialized"
    config = raw["config"]
    allocations = [
        {**info, "allocation_base": info["base"], "allocation_bytes": info["bytes"]}
        for info in raw["active_allocations"]
    ]
    allocated_bytes = sum(info["bytes"] for info in raw["active_allocations"] + raw["leaked_allocations"])
    ordered = {
        "state": StateName(raw["state"]),
        "lifecycle": raw["lifecycle"],
        "reference_count": reference_count,
        "root_ranks": list(root_ranks),
        "rank": raw["rank"],
        "world_size": raw["world_size"],
        "device": raw["device"],
        "config": {
            **config,
            "heap_size_bytes": config["heap_size"],
            "timeout_seconds": config["timeout_sec"],
            "data_engine": data_engine(config["device"]),
            "bootstrap_endpoint_base": None,
        } if live else None,
        "heap_size": raw["heap_size"],
        "allocated": raw["allocated"],
        "max_allocated": raw["max_allocated"],
        "remaining": raw["remaining"],
        "heap_base": raw["heap_base"],
        "active_allocations": allocations if live else None,
        "leaked_allocations": raw["leaked_allocations"],
        "latest_failure": Failure(raw["latest_failure"], raw["rank"] if live else None),
        "calls_in_flight": raw["calls_in_flight"],
        "live_teams": raw["live_teams"],
        "reaches_peer_memory": raw["reaches_peer_memory"],
        "nodes": list(raw["nodes"]),
        "transports": list(raw["transports"]),
        # Upstream hyper-parallel's keys that the project's vocabulary has under other names.
        "root_rank": raw["rank"] if live else None,
        "root_size": raw["world_size"] if live else None,
        "device_index": None,
        "device_model": None,
        "soc_name": None,
        "allocated_count": len(raw["active_allocations"]) + len(raw["leaked_allocations"]) if live else None,
        "allocated_bytes": allocated_bytes if live else None,
        "remaining_bytes": config["heap_size"] - allocated_bytes if live else None,
        "max_allocated_bytes": raw["max_allocated"] if live else None,
    }
    return DebugState(ordered)
