"""Unit tests of the runtime face's argument checks and of ``DebugState``, without a runtime.

No process group and no SHMEM lifecycle is started here: arguments are checked before the runtime is looked for. Messages are checked in full,
since they are the contract ("`x` must be y, but got z").
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from hyper_parallel.core.multicore import shmem, snapshot
from hyper_parallel.core.multicore.shmem import DebugState, ShmemStateError
from hyper_parallel.core.multicore.errors import type_name
from hyper_parallel.core.multicore.shmem._checks import check_choice

# --------------------------------------------------------------------------
# _checks.py
# --------------------------------------------------------------------------


def test_type_name_is_the_short_class_name() -> None:
    assert type_name(3) == "int"
    assert type_name(None) == "NoneType"
    assert type_name(torch.zeros(1)) == "Tensor"


# The data-plane entries check their arguments (in the binding) before they look for a runtime: with good
# arguments and no runtime they fail with the state error, with bad ones with the contract error.
_NO_RUNTIME = r"^shmem runtime is not initialised: op="


def _entries(tensor_arg_name):
    """Each data-plane entry as a call that passes `bad` as the tensor argument named `tensor_arg_name`."""
    good = torch.zeros(4)
    signal = torch.zeros(1, dtype=torch.int32)
    return {
        "dst": lambda bad: shmem.put(bad, good, 0),
        "src": lambda bad: shmem.get(good, bad, 0),
        "output": lambda bad: shmem.all_gather(bad, good),
        "input": lambda bad: shmem.all_gather(signal, bad),
        "signal_tensor": lambda bad: shmem.signal(bad, 1, 0),
        "tensor": lambda bad: shmem.free(bad),
    }[tensor_arg_name]


def test_good_arguments_reach_the_runtime_check() -> None:
    signal = torch.zeros(1, dtype=torch.int32)
    for call in (
        lambda: shmem.put(torch.zeros(3), torch.zeros(3), 0),
        lambda: shmem.get(torch.zeros(0), torch.zeros(0), 5),
        lambda: shmem.signal(signal, 5, 1, op="add"),
        lambda: shmem.signal(torch.zeros(4, dtype=torch.int64)[2:3], -5, 0),  # a one-element view
        lambda: shmem.wait_signal(signal, 0, cmp="ge"),
        lambda: shmem.all_gather(torch.zeros(4), torch.zeros(2)),
        lambda: shmem.barrier(),
    ):
        with pytest.raises(ShmemStateError, match=_NO_RUNTIME):
            call()


@pytest.mark.parametrize("name", ["dst", "src", "output", "input", "signal_tensor", "tensor"])
@pytest.mark.parametrize("value,got", [([1.0], "list"), (None, "NoneType"), (3, "int"), (torch.Size([2]), "Size")])
def test_tensor_arguments_reject_other_types(name, value, got) -> None:
    with pytest.raises(TypeError) as info:
        _entries(name)(value)
    assert str(info.value) == f"`{name}` must be a torch.Tensor, but got {got}"


@pytest.mark.parametrize("name", ["dst", "src", "output", "input", "signal_tensor", "tensor"])
def test_tensor_arguments_reject_other_devices(name) -> None:
    with pytest.raises(ValueError) as info:
        _entries(name)(torch.zeros(1, dtype=torch.int32, device="meta"))
    assert str(info.value) == f"`{name}` must be a cpu tensor (the host device), but got a tensor on meta"


@pytest.mark.parametrize(
    "tensor,shape,strides",
    [
        (torch.zeros(8)[::2], [4], [2]),
        (torch.zeros(3, 4).t(), [4, 3], [1, 4]),
        (torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last), [2, 3, 4, 5], [60, 1, 15, 3]),
    ],
)
@pytest.mark.parametrize("name", ["dst", "src", "output", "input", "tensor"])
def test_tensor_arguments_reject_non_contiguous_layouts(name, tensor, shape, strides) -> None:
    with pytest.raises(ValueError) as info:
        _entries(name)(tensor)
    assert str(info.value) == f"`{name}` must be contiguous, but got a tensor of shape {shape} and strides {strides}"


@pytest.mark.parametrize("name", ["dst", "src", "output", "input", "tensor"])
def test_lazy_conjugate_and_negative_views_are_rejected(name) -> None:
    # Their bytes are not their values: a raw copy would deliver the unconjugated (or un-negated) numbers.
    x = torch.randn(4, dtype=torch.complex64)
    for view, kind in ((x.conj(), "conjugate"), (x._neg_view(), "negative")):
        with pytest.raises(ValueError) as info:
            _entries(name)(view)
        assert str(info.value) == (
            f"`{name}` must have its lazy conjugation or negation resolved (call .resolve_conj() or .resolve_neg()), "
            f"but got a {kind} view"
        )


@pytest.mark.parametrize(
    "value,got",
    [(True, "bool"), (False, "bool"), (1.0, "float"), ("1", "str"), (None, "NoneType"), (torch.tensor(1), "Tensor")],
)
def test_pe_must_be_an_int(value, got) -> None:
    signal = torch.zeros(1, dtype=torch.int32)
    for call in (
        lambda: shmem.put(torch.zeros(1), torch.zeros(1), value),
        lambda: shmem.get(torch.zeros(1), torch.zeros(1), value),
        lambda: shmem.signal(signal, 1, value),
    ):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == f"`pe` must be an int, but got {got}"


def test_check_choice_maps_and_lists_the_options() -> None:
    choices = {"set": 0, "add": 1}
    assert check_choice("op", "set", choices) == 0
    assert check_choice("op", "add", choices) == 1
    for value, shown in (("mul", "'mul'"), ("SET", "'SET'"), (0, "0"), (None, "None"), (["set"], "['set']")):
        with pytest.raises(ValueError) as info:  # also for an unhashable value: no TypeError leaks out
            check_choice("op", value, choices)
        assert str(info.value) == f"`op` must be one of 'set', 'add', but got {shown}"


def test_signal_op_and_cmp_are_checked() -> None:
    signal = torch.zeros(1, dtype=torch.int32)
    # str() is the whole message: pytest's match= also searches the upstream note (see unit/test_upstream_vocabulary.py).
    with pytest.raises(ValueError) as info:
        shmem.signal(signal, 1, 0, op="mul")
    assert str(info.value) == "`op` must be one of 'set', 'add', but got 'mul'"
    with pytest.raises(ValueError) as info:
        shmem.wait_signal(signal, 1, cmp="==")
    assert str(info.value) == "`cmp` must be one of 'eq', 'ne', 'gt', 'ge', 'lt', 'le', but got '=='"


@pytest.mark.parametrize(
    "dtype,low,high",
    [(torch.int32, -(2**31), 2**31 - 1), (torch.int64, -(2**63), 2**63 - 1)],
)
def test_signal_value_range_is_the_dtype_range(dtype, low, high) -> None:
    signal = torch.zeros(1, dtype=dtype)
    for value in (low, high):  # in range: on to the runtime
        with pytest.raises(ShmemStateError, match=_NO_RUNTIME):
            shmem.wait_signal(signal, value)
    for value in (low - 1, high + 1, 2**70):
        for call in (lambda: shmem.signal(signal, value, 0), lambda: shmem.wait_signal(signal, value)):
            with pytest.raises(ValueError) as info:
                call()
            assert str(info.value) == f"`value` must fit in {dtype} [{low}, {high}], but got {value}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint32, torch.bool, torch.uint8])
def test_signal_rejects_other_dtypes(dtype) -> None:
    for call in (lambda s: shmem.signal(s, 1, 0), lambda s: shmem.wait_signal(s, 1)):
        with pytest.raises(TypeError) as info:
            call(torch.zeros(1, dtype=dtype))
        assert str(info.value) == f"`signal_tensor` must be an int32 or int64 tensor, but got {dtype}"


@pytest.mark.parametrize("numel", [0, 2])
def test_signal_rejects_other_sizes(numel) -> None:
    with pytest.raises(ValueError) as info:
        shmem.wait_signal(torch.zeros(numel, dtype=torch.int32), 1)
    assert str(info.value) == f"`signal_tensor` must have exactly one element, but got {numel}"


def test_signal_checks_the_tensor_first_then_dtype_size_and_value() -> None:
    with pytest.raises(TypeError) as info:
        shmem.signal(3, 1, 0)
    assert str(info.value) == "`signal_tensor` must be a torch.Tensor, but got int"
    with pytest.raises(TypeError, match=r"int32 or int64 tensor, but got torch.float32$"):
        shmem.signal(torch.zeros(2), 1.5, 0)  # the dtype before the size and the value
    with pytest.raises(ValueError, match=r"exactly one element, but got 2$"):
        shmem.signal(torch.zeros(2, dtype=torch.int32), 1.5, 0)  # the size before the value
    for value, got in ((1.5, "float"), (True, "bool"), ("1", "str")):
        with pytest.raises(TypeError) as info:
            shmem.signal(torch.zeros(1, dtype=torch.int32), value, 0)
        assert str(info.value) == f"`value` must be an int, but got {got}"


# --------------------------------------------------------------------------
# DebugState
# --------------------------------------------------------------------------

_SNAPSHOT = {
    "state": "initialized",
    "lifecycle": 3,
    "root_ranks": [0, 1],
    "config": {"heap_size": 1024, "device": "host"},
    "heap_base": 0x7F0000000000,
    "active_allocations": [
        {"allocation_id": 5, "base": 0x7F0000000100, "offset": 0x100, "bytes": 64},
        {"allocation_id": 9, "base": 0x7F0000000200, "offset": 0x200, "bytes": 0},
    ],
    "leaked_allocations": [],
    "latest_failure": "",
}

_SNAPSHOT_REPR = """DebugState(
  state: 'initialized'
  lifecycle: 3
  root_ranks: [0, 1]
  config: {heap_size=1024, device='host'}
  heap_base: 0x7f0000000000
  active_allocations: [
      {allocation_id=5, base=0x7f0000000100, offset=0x100, bytes=64},
      {allocation_id=9, base=0x7f0000000200, offset=0x200, bytes=0},
  ]
  leaked_allocations: []
  latest_failure: ''
)"""


def test_debug_state_prints_one_field_per_line_with_hex_addresses() -> None:
    state = DebugState(_SNAPSHOT)
    assert repr(state) == _SNAPSHOT_REPR
    assert str(state) == _SNAPSHOT_REPR
    small = DebugState({"heap_base": 0, "offset": 4096})
    assert repr(small) == "DebugState(\n  heap_base: 0x0\n  offset: 0x1000\n)"


def test_a_printed_snapshot_tells_upstreams_names_and_the_byte_counts_apart() -> None:
    raw = {"state": "initialized", "lifecycle": 1, "rank": 0, "world_size": 2, "device": "host",
           "config": {"heap_size": 1 << 20, "timeout_sec": 5.0, "log_level": 2, "device": "host"},
           "heap_size": 1 << 20, "allocated": 16448, "max_allocated": 16448, "remaining": (1 << 20) - 16448,
           "heap_base": 0x7F0000000000,
           "active_allocations": [{"allocation_id": 1, "base": 0x7F0000000100, "offset": 0x100, "bytes": 16388,
                                   "reserved": 16448, "lifecycle": 1, "call_site": ""}],
           "leaked_allocations": [], "latest_failure": "", "calls_in_flight": 0, "live_teams": 1,
           "reaches_peer_memory": True, "nodes": [0, 0],
           "transports": ["self", "node"]}
    printed = repr(snapshot.project(raw, [0, 1], 1)).splitlines()
    marker = printed.index("  -- upstream hyper-parallel's names for the facts above --")
    ours, theirs = printed[:marker], printed[marker + 1:-1]
    assert [line.split(":")[0].strip() for line in theirs] == list(snapshot.UPSTREAM_KEYS)
    assert "  allocated: 16448   # bytes reserved by live and leaked allocations, with the runtime's own records" in ours
    assert "  allocated_bytes: 16388   # bytes requested by live and leaked allocations" in theirs
    config = next(line for line in ours if line.startswith("  config: "))
    assert config.endswith("; upstream's names: heap_size_bytes=1048576, timeout_seconds=5.0, data_engine='cpu', "
                           "bootstrap_endpoint_base=None}"), config
    allocation = next(line for line in ours if "allocation_id=1" in line)
    assert "call_site=<not recorded: HYPER_PARALLEL_SHMEM_LOG_LEVEL=0 records it>; upstream's names: " \
           "allocation_base=0x7f0000000100, allocation_bytes=16388}" in allocation, allocation


def test_debug_state_is_a_dict_in_field_order() -> None:
    state = DebugState(_SNAPSHOT)
    assert isinstance(state, dict)
    assert state == _SNAPSHOT
    assert list(state) == list(_SNAPSHOT)
    assert state["heap_base"] == 0x7F0000000000  # values stay ints: only the printout is hex


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.__setitem__("state", "failed"),
        lambda s: s.__delitem__("state"),
        lambda s: s.clear(),
        lambda s: s.pop("state"),
        lambda s: s.popitem(),
        lambda s: s.setdefault("new", 1),
        lambda s: s.update(state="failed"),
        lambda s: s.__ior__({"state": "failed"}),
    ],
    ids=["setitem", "delitem", "clear", "pop", "popitem", "setdefault", "update", "ior"],
)
def test_debug_state_refuses_writes(write) -> None:
    state = DebugState(_SNAPSHOT)
    with pytest.raises(TypeError) as info:
        write(state)
    assert str(info.value) == "`debug_state()` must not be modified, but got a write (it is a read-only snapshot)"
    assert state == _SNAPSHOT


def test_debug_state_survives_pickle_and_copy() -> None:
    # A snapshot is something to send elsewhere: dist.all_gather_object, a multiprocessing queue, a log record.
    state = DebugState(_SNAPSHOT)
    for clone in (pickle.loads(pickle.dumps(state)), copy.copy(state), copy.deepcopy(state)):
        assert type(clone) is DebugState
        assert clone == _SNAPSHOT and repr(clone) == _SNAPSHOT_REPR
        with pytest.raises(TypeError):
            clone["state"] = "failed"  # still read-only
