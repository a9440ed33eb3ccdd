"""The runtime through its C ABI (``libhp_shmem_c.so``, ``ccsrc/capi/hp_shmem.h``), for handlers without torch.

The torch handler links the C++ runtime directly; MindSpore's extensions use another C++ library ABI, so the
MindSpore handler reaches the same runtime through this plain-C seam. Everything here works on addresses and byte
counts: no framework is imported. Every call runs on the calling thread and completes before it returns; ctypes
releases the GIL for its duration, and the bootstrap callbacks take it back.

A failed call raises the runtime's exception class for its status code (:mod:`hyper_parallel.core.multicore.errors`)
with the runtime's message, carrying upstream's fields for the operation named.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from hyper_parallel.core.multicore import errors, runtime_logs, ucx_libraries

LIBRARY_NAME = "libhp_shmem_c.so"
ABI_VERSION = 9   # HP_SHMEM_ABI_VERSION of the header this module was written against


class _Bootstrap(ctypes.Structure):
    _fields_ = [
        ("context", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("all_gather", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)),
        ("barrier", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)),
    ]


class _ElementType(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("bytes", ctypes.c_size_t), ("reduce_dtype", ctypes.c_int)]


class _MessageExchange(ctypes.Structure):
    _fields_ = [("pe", ctypes.c_int), ("send", ctypes.c_void_p), ("send_bytes", ctypes.c_size_t),
                ("receive", ctypes.c_void_p), ("receive_capacity", ctypes.c_size_t), ("received", ctypes.c_size_t),
                ("status", ctypes.c_int)]


class _Allocation(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("address", ctypes.c_void_p), ("bytes", ctypes.c_uint64),
                ("heap_offset", ctypes.c_uint64)]


@dataclass(frozen=True)
class Allocation:
    """A symmetric allocation: its id (never reused), this rank's address, its size and its heap offset."""

    id: int
    address: int
    bytes: int
    heap_offset: int


@dataclass(frozen=True)
class ElementType:
    """An element type as the engine names it: ``name`` ("float32"), bytes per element, and the name of the
    reduction type (a name of the runtime's ``dtypes`` numbering) or None for types that only move."""

    name: str
    bytes: int
    reduce_dtype: Optional[str] = None


_P = ctypes.c_void_p
_SIGNATURES = {
    "hp_shmem_abi_version": [],
    "hp_shmem_last_error": [],
    "hp_shmem_status_name": [ctypes.c_int],
    "hp_shmem_numberings_json": [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    "hp_shmem_read_config_json": [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    "hp_shmem_low_precision_default": [ctypes.POINTER(ctypes.c_int)],
    "hp_shmem_log_level": [],
    "hp_shmem_init": [ctypes.POINTER(_Bootstrap), ctypes.c_size_t],
    "hp_shmem_shutdown": [ctypes.POINTER(_Bootstrap)],
    "hp_shmem_state": [],
    "hp_shmem_rank": [],
    "hp_shmem_world_size": [],
    "hp_shmem_allocate": [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(_Allocation)],
    "hp_shmem_free": [ctypes.c_uint64, ctypes.c_char_p],
    "hp_shmem_peer_address": [_P, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)],
    "hp_shmem_put": [_P, _P, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int],
    "hp_shmem_get": [_P, _P, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int],
    "hp_shmem_signal": [_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int],
    "hp_shmem_put_with_signal": [_P, _P, ctypes.c_size_t, ctypes.c_size_t, _P, ctypes.c_int, ctypes.c_int64,
                                 ctypes.c_int, ctypes.c_int],
    "hp_shmem_wait_signal": [_P, ctypes.c_int, ctypes.c_int, ctypes.c_int64],
    "hp_shmem_barrier": [],
    "hp_shmem_exchange_messages": [ctypes.c_uint64, ctypes.POINTER(_MessageExchange), ctypes.c_size_t],
    "hp_shmem_team_create": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(_Bootstrap),
                             ctypes.POINTER(ctypes.c_uint64)],
    "hp_shmem_node_team_create": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                  ctypes.c_int, ctypes.POINTER(_Bootstrap), ctypes.POINTER(ctypes.c_uint64)],
    "hp_shmem_team_release": [ctypes.c_uint64],
    "hp_shmem_team_barrier": [ctypes.c_uint64, ctypes.c_int],
    "hp_shmem_all_gather": [ctypes.c_uint64, _P, ctypes.c_size_t, _P, ctypes.c_size_t, ctypes.POINTER(_ElementType),
                            ctypes.c_int],
    "hp_shmem_all_reduce": [ctypes.c_uint64, _P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                            ctypes.c_int],
    "hp_shmem_reduce_scatter": [ctypes.c_uint64, _P, ctypes.c_size_t, _P, ctypes.c_size_t, ctypes.c_int,
                                ctypes.c_int, ctypes.c_int, ctypes.c_int],
    "hp_shmem_all_to_all": [ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                            ctypes.c_int, _P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int,
                            ctypes.POINTER(_ElementType), ctypes.c_int],
    "hp_shmem_moe_exchange": [ctypes.c_uint64, ctypes.c_int, ctypes.c_int, _P, ctypes.c_int64, _P, ctypes.c_int64,
                              ctypes.c_size_t, _P, _P, ctypes.c_int64, _P, _P, ctypes.c_int],
    "hp_shmem_wire_row_bytes": [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    "hp_shmem_encode_rows": [ctypes.c_int, ctypes.c_int, _P, ctypes.c_size_t, ctypes.c_size_t, _P],
    "hp_shmem_decode_rows": [ctypes.c_int, _P, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, _P],
    "hp_shmem_send": [ctypes.c_uint64, _P, ctypes.c_size_t, ctypes.POINTER(_ElementType), ctypes.c_int],
    "hp_shmem_recv": [ctypes.c_uint64, _P, ctypes.c_size_t, ctypes.POINTER(_ElementType), ctypes.c_int],
    "hp_shmem_refuse": [ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int],
    "hp_shmem_give_up": [ctypes.c_uint64, ctypes.c_char_p],
    "hp_shmem_moe_row": [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                         ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                         ctypes.c_size_t],
    "hp_shmem_moe_plan": [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                          ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                          ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)],
    "hp_shmem_agree": [ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_int,
                       ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t],
    "hp_shmem_debug_state_json": [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    "hp_shmem_log_forward": [ctypes.c_int],
    "hp_shmem_log_wait": [ctypes.c_int],
    "hp_shmem_log_take": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t],
}
_RESTYPES = {"hp_shmem_last_error": ctypes.c_char_p, "hp_shmem_status_name": ctypes.c_char_p,
             "hp_shmem_log_forward": None}
_LOG_MESSAGE_BYTES = 4096   # a record's message, at most (longer ones are cut)
_LOG_RECORDS_PER_TAKE = 4096   # the runtime queues as many at most


def library_path() -> str:
    """Where the C ABI library of this installation lies (beside the ``hyper_parallel`` package's modules)."""
    package_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(package_dir, LIBRARY_NAME)


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The C ABI library, loaded once, its functions typed.

    Raises:
        ShmemStateError: the library is missing (an installation without it) or of another ABI version.
        ImportError: UCX's libraries, which a build with UCX links, cannot load beside another UCX of this process.
    """
    path = library_path()
    ucx_libraries.load()   # a build with UCX links libucp
    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        raise errors.ShmemStateError(f"the runtime's C ABI library cannot be loaded: path={path} reason={error}") \
            from error
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = _RESTYPES.get(name, ctypes.c_int)
    version = lib.hp_shmem_abi_version()
    if version != ABI_VERSION:
        raise errors.ShmemStateError(f"the runtime's C ABI library has another version: path={path} "
                                     f"expected={ABI_VERSION} observed={version}")
    runtime_logs.forward("C ABI", runtime_logs.RuntimeLogSource(
        forward=lambda on: lib.hp_shmem_log_forward(1 if on else 0),
        wait=lambda timeout_ms: lib.hp_shmem_log_wait(timeout_ms) == 1,   # ctypes releases the GIL for the wait
        take=functools.partial(_take_log_records, lib), level=lib.hp_shmem_log_level))
    return lib


def _take_log_records(lib: ctypes.CDLL) -> list[tuple[int, int, str]]:
    """The C ABI's queued records, oldest first, without waiting."""
    level, rank = ctypes.c_int(), ctypes.c_int()
    message = ctypes.create_string_buffer(_LOG_MESSAGE_BYTES)
    records = []
    while len(records) < _LOG_RECORDS_PER_TAKE and \
            lib.hp_shmem_log_take(ctypes.byref(level), ctypes.byref(rank), message, _LOG_MESSAGE_BYTES) == 1:
        records.append((level.value, rank.value, message.value.decode("utf-8", "replace")))
    return records


def _check(status: int, operation: str) -> None:
    if status == 0:
        return
    lib = library()
    message = lib.hp_shmem_last_error().decode("utf-8", "replace")
    name = lib.hp_shmem_status_name(status).decode()
    cls = errors.CLASSES_BY_CODE.get(name, errors.ShmemError)
    error = cls(message)
    errors.attach_fields(error, operation)
    raise error


def _call(operation: str, name: str, *args: object) -> None:
    _check(getattr(library(), name)(*args), operation)


def _read_json(operation: str, name: str) -> object:
    """A JSON document of the C ABI (``needed``/``capacity`` protocol), parsed."""
    read = getattr(library(), name)
    needed = ctypes.c_size_t(0)
    capacity = 4096
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        _check(read(buffer, capacity, ctypes.byref(needed)), operation)
        if needed.value <= capacity:
            return json.loads(buffer.value.decode("utf-8"))
        capacity = needed.value


@functools.lru_cache(maxsize=None)
def numberings() -> dict:
    """Every numbering the runtime's calls take, defined once in the runtime (``runtime/numberings.h``): name ->
    {value name -> number} for status_codes, dtypes, reduce_ops, signal_ops, compare_ops, wire_formats, call_roles,
    collectives and lifecycle_states."""
    return _read_json("numberings", "hp_shmem_numberings_json")


def _code(numbering: str, name: str) -> int:
    return numberings()[numbering][name]


def read_config() -> dict:
    """The configuration a lifecycle starting now would use, read from the environment by the runtime (the keys of
    ``debug_state()["config"]``).

    Raises:
        ShmemValueError: a variable has a bad value (the runtime's message names it).
    """
    return _read_json("read_config", "hp_shmem_read_config_json")


def low_precision_default() -> Optional[str]:
    """The default wire format of the user API's reductions (``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE``): the
    lifecycle's, read by the runtime once when it started, or the environment's while none is active; None: off.

    Raises:
        ShmemValueError: the variable names no wire format.
    """
    wire = ctypes.c_int(0)
    _call("low_precision_default", "hp_shmem_low_precision_default", ctypes.byref(wire))
    names = {number: name for name, number in numberings()["wire_formats"].items()}
    return None if wire.value == _code("wire_formats", "full") else names[wire.value]


def log_level() -> int:
    """The runtime's log level (0 debug .. 3 error), as the lifecycle set it."""
    return library().hp_shmem_log_level()


class Bootstrap:
    """A group's exchange as the runtime needs it, over two Python callables (the framework's collectives).

    Args:
        rank: this rank inside the group.
        world_size: the group's size.
        all_gather: bytes -> every rank's bytes concatenated in rank order (each rank passes as many).
        barrier: waits for every rank of the group.

    A callable that raises fails the runtime's step with its message (a ShmemTimeoutError as a timeout).
    """

    def __init__(self, rank: int, world_size: int, all_gather: Callable[[bytes], bytes],
                 barrier: Callable[[], None]) -> None:
        self._all_gather = all_gather
        self._barrier = barrier
        fields = dict(_Bootstrap._fields_)
        # The callbacks live as long as this object: the runtime calls them only during the call that was given it.
        self._gather_cb = fields["all_gather"](self._on_all_gather)
        self._barrier_cb = fields["barrier"](self._on_barrier)
        self.struct = _Bootstrap(None, rank, world_size, self._gather_cb, self._barrier_cb)

    @staticmethod
    def _fail(error: BaseException, step: str, buffer: int, capacity: int) -> int:
        # The runtime's own errors keep their message; anything else is named by its type, as a bootstrap failure
        # (errors.py labels it so, not as the device's).
        described = (str(error) if isinstance(error, errors.ShmemError)
                     else f"bootstrap {step} over the group failed: {type(error).__name__}: {error}")
        text = described.encode("utf-8", "replace")[: max(capacity - 1, 0)]
        ctypes.memmove(buffer, text + b"\0", len(text) + 1)
        return _code("status_codes", "TIMEOUT" if isinstance(error, errors.ShmemTimeoutError) else "DEVICE_ERROR")

    def _on_all_gather(self, _context: int, data: int, nbytes: int, out: int, error: int, capacity: int) -> int:
        try:
            gathered = self._all_gather(ctypes.string_at(data, nbytes))
            expected = nbytes * self.struct.world_size
            if len(gathered) != expected:
                raise errors.ShmemError(f"bootstrap all_gather returned an unexpected size: expected={expected} "
                                        f"observed={len(gathered)}")
            ctypes.memmove(out, gathered, expected)
            return 0
        except BaseException as e:  # noqa: BLE001 (nothing may unwind through C)
            return self._fail(e, "all_gather", error, capacity)

    def _on_barrier(self, _context: int, error: int, capacity: int) -> int:
        try:
            self._barrier()
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail(e, "barrier", error, capacity)


def init(bootstrap: Bootstrap, heap_size: int = 0) -> None:
    """Starts a lifecycle (collective over the root: every rank of the job, rank = PE), with a heap of ``heap_size``
    bytes (0: the runtime's configuration)."""
    _call("initialize", "hp_shmem_init", ctypes.byref(bootstrap.struct), heap_size)


def shutdown(bootstrap: Bootstrap) -> None:
    """Ends the lifecycle (collective over the root; refused alike while any rank holds allocations)."""
    _call("shutdown", "hp_shmem_shutdown", ctypes.byref(bootstrap.struct))


def state() -> str:
    """'uninitialized', 'initialized' or 'failed'."""
    names = {number: name for name, number in numberings()["lifecycle_states"].items()}
    return names[library().hp_shmem_state()]


def rank() -> int:
    """This process's PE in the current lifecycle (-1 outside one)."""
    return library().hp_shmem_rank()


def allocate(nbytes: int, alignment: int, call_site: str) -> Allocation:
    """A symmetric allocation (collective over the root, checked against every rank's)."""
    out = _Allocation()
    _call("allocate", "hp_shmem_allocate", nbytes, alignment, call_site.encode(), ctypes.byref(out))
    return Allocation(out.id, out.address or 0, out.bytes, out.heap_offset)


def free(allocation_id: int, call_site: str) -> None:
    """Frees an allocation (collective over the root, checked against every rank's)."""
    _call("free", "hp_shmem_free", allocation_id, call_site.encode())


def peer_address(symmetric: int, nbytes: int, pe: int) -> int:
    """Where ``[symmetric, symmetric + nbytes)`` lies on ``pe``."""
    out = ctypes.c_void_p()
    _call("peer_tensor", "hp_shmem_peer_address", symmetric, nbytes, pe, ctypes.byref(out))
    return out.value or 0


def put(dst: int, src: int, dst_bytes: int, src_bytes: int, pe: int) -> None:
    """Writes local ``src`` into ``pe``'s copy of the symmetric ``dst``."""
    _call("put", "hp_shmem_put", dst, src, dst_bytes, src_bytes, pe)


def get(dst: int, src: int, dst_bytes: int, src_bytes: int, pe: int) -> None:
    """Reads ``pe``'s copy of the symmetric ``src`` into local ``dst``."""
    _call("get", "hp_shmem_get", dst, src, dst_bytes, src_bytes, pe)


def signal(address: int, width: int, value: int, op: str, pe: int) -> None:
    """SETs or ADDs ``value`` to the int32/int64 (``width`` 4/8) signal on ``pe``, after this rank's puts."""
    _call("signal", "hp_shmem_signal", address, width, value, _code("signal_ops", op), pe)


def put_with_signal(dst: int, src: int, nbytes: int, signal: int, width: int, value: int, op: str, pe: int) -> None:
    """Writes local ``src`` into ``pe``'s copy of the symmetric ``dst``, then SETs or ADDs ``value`` to the
    int32/int64 (``width`` 4/8) signal on ``pe``: one operation, the data visible before the signal."""
    _call("put_with_signal", "hp_shmem_put_with_signal", dst, src, nbytes, nbytes, signal, width, value,
          _code("signal_ops", op), pe)


def wait_signal(address: int, width: int, cmp: str, value: int) -> None:
    """Waits (bounded by the runtime's timeout) until the local signal compares true against ``value``."""
    _call("wait_signal", "hp_shmem_wait_signal", address, width, _code("compare_ops", cmp), value)


def barrier() -> None:
    """Every rank of this node's root arrives; earlier puts are visible everywhere after it."""
    _call("barrier", "hp_shmem_barrier")


def exchange_messages(tag: int, exchanges: Sequence[tuple[int, Optional[int], int, Optional[int], int]]
                      ) -> tuple[list[int], list[int], str]:
    """Two-sided messages with PEs of other nodes, all posted at once: for each ``(pe, send, send_bytes, receive,
    receive_capacity)`` (addresses, None: nothing that way), the bytes at ``send`` to ``pe`` under ``tag``, and
    ``pe``'s next message under ``tag`` into ``receive``. Each completes or fails within the runtime's timeout.

    Returns:
        The received bytes of each exchange, the indices of those that failed (a PE found gone, a timeout, a message
        longer than the room), and the first failure's message ("" when none failed).

    Raises:
        ShmemStateError, ShmemValueError: refused with nothing sent (a PE this device does not reach, a tag of 2^40 or
            more).
    """
    batch = (_MessageExchange * len(exchanges))()
    for entry, (pe, send, send_bytes, receive, capacity) in zip(batch, exchanges):
        entry.pe, entry.send, entry.send_bytes = pe, send, send_bytes
        entry.receive, entry.receive_capacity = receive, capacity
    lib = library()
    _check(lib.hp_shmem_exchange_messages(tag, batch, len(exchanges)), "exchange_messages")
    failed = [i for i, entry in enumerate(batch) if entry.status != 0]
    first = lib.hp_shmem_last_error().decode("utf-8", "replace") if failed else ""
    return [entry.received for entry in batch], failed, first


def team_create(pes: Sequence[int], bootstrap: Bootstrap) -> int:
    """A team of ``pes`` in group-rank order (collective over ``bootstrap``'s group); returns its id."""
    array = (ctypes.c_int * len(pes))(*pes)
    out = ctypes.c_uint64()
    _call("team_create", "hp_shmem_team_create", array, len(pes), ctypes.byref(bootstrap.struct), ctypes.byref(out))
    return out.value


def node_team_create(pes: Sequence[int], serves: Sequence[int], bootstrap: Bootstrap) -> int:
    """The node team of a team that spans nodes: this node's members ``pes`` (in group-rank order), serving the whole
    team ``serves`` (every member's PE, in its group-rank order), whose ranks the node team's messages then name
    ("team_ranks=[0,1,2,3] node_team_ranks=[0,1]"). Collective over ``bootstrap``'s group (the node's members).

    Args:
        pes: the PEs of this node's members, in the team's group-rank order.
        serves: the PEs of every member of the whole team, in its group-rank order; holds every PE of ``pes``, the
            same on every member.
        bootstrap: the exchange of this node's members (rank = index in ``pes``).

    Returns:
        The node team's id.

    Raises:
        ShmemValueError: ``pes`` not all on this node, ``serves`` missing one of them, a PE out of range or repeated.
        ShmemMismatchError: the members passed different lists.
        ShmemTimeoutError: a member did not arrive in time.
    """
    members = (ctypes.c_int * len(pes))(*pes)
    whole = (ctypes.c_int * len(serves))(*serves)
    out = ctypes.c_uint64()
    _call("team_create", "hp_shmem_node_team_create", members, len(pes), whole, len(serves),
          ctypes.byref(bootstrap.struct), ctypes.byref(out))
    return out.value


def team_release(team: int) -> None:
    """Releases a team (local; later calls on it are refused)."""
    _call("team_release", "hp_shmem_team_release", team)


def team_barrier(team: int, role: str = "forward") -> None:
    """Every member reaches it (collective over the team)."""
    _call("barrier", "hp_shmem_team_barrier", team, _code("call_roles", role))


def _element(element: ElementType) -> _ElementType:
    code = -1 if element.reduce_dtype is None else _code("dtypes", element.reduce_dtype)
    return _ElementType(element.name.encode(), element.bytes, code)


def _wire(wire: Optional[str]) -> int:
    return _code("wire_formats", "full" if wire is None else wire)


def all_gather(team: int, output: int, output_bytes: int, data: int, data_bytes: int, element: ElementType,
               role: str = "forward") -> None:
    """``output`` receives every member's ``data`` in group-rank order."""
    _call("all_gather", "hp_shmem_all_gather", team, output, output_bytes, data, data_bytes,
          ctypes.byref(_element(element)), _code("call_roles", role))


def all_reduce(team: int, tensor: int, data: Optional[int], nbytes: int, dtype: str, op: str,
               wire: Optional[str] = None, role: str = "forward") -> None:
    """Reduces ``tensor`` in place (``data`` None) or ``data`` into ``tensor`` across the team."""
    _call("all_reduce", "hp_shmem_all_reduce", team, tensor, data, nbytes, _code("dtypes", dtype), _code("reduce_ops", op),
          _wire(wire), _code("call_roles", role))


def reduce_scatter(team: int, output: int, output_bytes: int, data: int, data_bytes: int, dtype: str, op: str,
                   wire: Optional[str] = None, role: str = "forward") -> None:
    """``output`` receives part ``me`` of ``data`` reduced across the team."""
    _call("reduce_scatter", "hp_shmem_reduce_scatter", team, output, output_bytes, data, data_bytes,
          _code("dtypes", dtype), _code("reduce_ops", op), _wire(wire), _code("call_roles", role))


def all_to_all(team: int, sends: Sequence[tuple[int, int]], receive: int, receive_bytes: int,
               receive_counts: Sequence[int], element: ElementType, role: str = "forward") -> None:
    """``sends[j]`` (address, bytes) goes to group rank j; ``receive`` gets rank i's part after counts[<i]."""
    n = len(sends)
    addresses = (ctypes.c_void_p * n)(*(a for a, _ in sends))
    sizes = (ctypes.c_size_t * n)(*(b for _, b in sends))
    counts = (ctypes.c_uint64 * len(receive_counts))(*receive_counts)
    _call("all_to_all", "hp_shmem_all_to_all", team, addresses, sizes, n, receive, receive_bytes, counts,
          len(receive_counts), ctypes.byref(_element(element)), _code("call_roles", role))


def moe_exchange(team: int, direction: str, experts: int, data: int, data_rows: int, output: int, output_rows: int,
                 row_bytes: int, in_splits: int, in_offsets: Optional[int], major_align: int, out_splits: int,
                 out_offsets: int, role: str = "forward") -> None:
    """MoE dispatch or combine (``direction``) of rows of ``row_bytes`` over the team (the split tables: addresses of
    group size x ``experts`` int64; ``in_offsets`` None: packed). Every member checks every member's call before
    anything is written."""
    code = {"dispatch": 0, "combine": 1}[direction]
    _call("moe_" + direction, "hp_shmem_moe_exchange", team, code, experts, data, data_rows, output, output_rows,
          row_bytes, in_splits, in_offsets, major_align, out_splits, out_offsets, _code("call_roles", role))


def wire_row_bytes(wire: str, row_elems: int) -> int:
    """Bytes of one MoE wire row of ``row_elems`` values in the wire format ``wire`` (the runtime's row codec:
    ``2 * row_elems`` for float16 and bfloat16, ``4 + row_elems`` for the fp8 formats: the row's scale, then its
    codes)."""
    size = ctypes.c_size_t(0)
    _call("wire_row_bytes", "hp_shmem_wire_row_bytes", _wire(wire), row_elems, ctypes.byref(size))
    return size.value


def encode_rows(wire: str, dtype: str, data: int, rows: int, row_elems: int, out: int) -> None:
    """Encodes ``rows`` x ``row_elems`` values of ``dtype`` (a floating dtype's name) at ``data`` into the MoE wire
    rows at ``out`` (:func:`wire_row_bytes` each), on the calling thread: the runtime's row codec, the one torch's
    handler calls too."""
    _call("encode_rows", "hp_shmem_encode_rows", _wire(wire), _code("dtypes", dtype), data, rows, row_elems, out)


def decode_rows(wire: str, data: int, rows: int, row_elems: int, dtype: str, out: int) -> None:
    """Decodes ``rows`` MoE wire rows at ``data`` into ``rows`` x ``row_elems`` values of ``dtype`` at ``out``."""
    _call("decode_rows", "hp_shmem_decode_rows", _wire(wire), data, rows, row_elems, _code("dtypes", dtype), out)


# A member's published row of an MoE exchange: this many values, then 2 x members x experts (hp_shmem.h).
MOE_ROW_HEADER = 6


def moe_row(direction: str, experts: int, members: int, in_splits: Sequence[int], in_offsets: Optional[Sequence[int]],
            input_rows: int, output_rows: int) -> list:
    """What this rank publishes of its MoE exchange (``direction`` "dispatch" or "combine"; the split tables as
    lists of members x ``experts`` values), as the engine's exchange publishes it: local."""
    n = members * experts
    splits = (ctypes.c_int64 * n)(*in_splits)
    offsets = None if in_offsets is None else (ctypes.c_int64 * n)(*in_offsets)
    row = (ctypes.c_int64 * (MOE_ROW_HEADER + 2 * n))()
    _call("moe_" + direction, "hp_shmem_moe_row", 0 if direction == "dispatch" else 1, experts, members, splits,
          offsets, input_rows, output_rows, row, len(row))
    return list(row)


def moe_plan(direction: str, experts: int, major_align: int, rows: Sequence[Sequence[int]], me: int) -> tuple:
    """Member ``me``'s layout of an MoE exchange from every member's published row: ``(splits, offsets, from)``
    (lists of members x experts values), as the engine's exchange lays it out: local.

    Raises:
        ShmemValueError: a member's bad split table, or a receiver's output too small, with the message every member
            raises.
    """
    members, length = len(rows), len(rows[0])
    flat = (ctypes.c_int64 * (members * length))(*(value for row in rows for value in row))
    n = members * experts
    splits, offsets, starts = (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
    _call("moe_" + direction, "hp_shmem_moe_plan", 0 if direction == "dispatch" else 1, experts, major_align,
          members, flat, length, me, splits, offsets, starts)
    return list(splits), list(offsets), list(starts)


def send(team: int, data: int, nbytes: int, element: ElementType, peer: int) -> None:
    """Sends ``nbytes`` at ``data`` (of ``element``s) to group rank ``peer`` (its :func:`recv` takes them)."""
    _call("send", "hp_shmem_send", team, data, nbytes, ctypes.byref(_element(element)), peer)


def recv(team: int, data: int, nbytes: int, element: ElementType, peer: int) -> None:
    """Receives the next message of group rank ``peer`` into ``data``; one of another dtype or size is refused on
    both sides."""
    _call("recv", "hp_shmem_recv", team, data, nbytes, ctypes.byref(_element(element)), peer)


def refuse(team: int, collective: str, error: BaseException, role: str = "forward") -> None:
    """Refuses the call ``collective`` on every member for ``error``, a check of this rank's that failed.

    Raises:
        The runtime's exception for ``error``'s status (ValueError and TypeError subclasses for broken contracts,
        ShmemStateError otherwise), with the message every member reports: ``error``'s, naming this rank.
    """
    _call(collective, "hp_shmem_refuse", team, _code("collectives", collective),
          _code("status_codes", errors.project_code(error)), str(error).encode(), _code("call_roles", role))


def agree(team: int, members: int, collective: str, dtype: str, element_bytes: int, count: int,
          reduce_op: Optional[str], wire: Optional[str], peer: int, values: Sequence[int],
          role: str = "forward") -> list:
    """A fingerprinted sync of the team on one call that publishes ``values`` (collective over the team's
    ``members``; each publishes as many): members whose calls differ all raise ShmemMismatchError, naming both.

    Args:
        reduce_op: the call's reduce op, None for none; wire: its wire format, None for the tensor's own dtype;
            peer: a group rank, -1 for none.

    Returns:
        Every member's values, in group-rank order.
    """
    n = len(values)
    mine = (ctypes.c_int64 * n)(*values)
    rows = (ctypes.c_int64 * (n * members))()
    lengths = (ctypes.c_size_t * members)()
    _call(collective, "hp_shmem_agree", team, _code("collectives", collective), dtype.encode(), element_bytes, count,
          0 if reduce_op is None else _code("reduce_ops", reduce_op) + 1, _wire(wire), peer, mine, n,
          _code("call_roles", role), rows, n * members, lengths, members)
    result, at = [], 0
    for length in lengths:
        result.append(list(rows[at:at + length]))
        at += length
    return result


def give_up(team: int, message: str) -> None:
    """Gives up the team's next sync for a failure of this rank's own: members waiting there fail with ``message``."""
    _call("give_up", "hp_shmem_give_up", team, message.encode())


def debug_state() -> dict:
    """The runtime's snapshot as a dict (the keys of the torch runtime face's ``debug_state``)."""
    return _read_json("debug_state", "hp_shmem_debug_state_json")
