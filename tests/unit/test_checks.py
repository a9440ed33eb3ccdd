"""Unit tests of the runtime face's argument checks (``_checks.py``) and of ``DebugState``, without a runtime.

Both are pure Python: no process group and no SHMEM lifecycle is started here. Messages are checked in full,
since they are the contract ("`x` must be y, but got z").
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from hyper_parallel.core.multicore.shmem import DebugState
from hyper_parallel.core.multicore.shmem._checks import check_choice, check_int, check_signal, check_tensor, type_name

# --------------------------------------------------------------------------
# _checks.py
# --------------------------------------------------------------------------


def test_type_name_is_the_short_class_name() -> None:
    assert type_name(3) == "int"
    assert type_name(None) == "NoneType"
    assert type_name(torch.zeros(1)) == "Tensor"


def test_check_tensor_returns_a_contiguous_cpu_tensor_unchanged() -> None:
    for tensor in (torch.zeros(3), torch.zeros(0), torch.zeros(2, 3)[1], torch.zeros(4, 1).t()):
        assert check_tensor("dst", tensor) is tensor


@pytest.mark.parametrize("value,got", [([1.0], "list"), (None, "NoneType"), (3, "int"), (torch.Size([2]), "Size")])
def test_check_tensor_rejects_other_types(value, got) -> None:
    with pytest.raises(TypeError) as info:
        check_tensor("src", value)
    assert str(info.value) == f"`src` must be a torch.Tensor, but got {got}"


def test_check_tensor_rejects_other_devices() -> None:
    with pytest.raises(ValueError) as info:
        check_tensor("output", torch.zeros(2, device="meta"))
    assert str(info.value) == "`output` must be a cpu tensor (the host device), but got a tensor on meta"


@pytest.mark.parametrize(
    "tensor,shape,strides",
    [
        (torch.zeros(8)[::2], [4], [2]),
        (torch.zeros(3, 4).t(), [4, 3], [1, 4]),
        (torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last), [2, 3, 4, 5], [60, 1, 15, 3]),
    ],
)
def test_check_tensor_rejects_non_contiguous_layouts(tensor, shape, strides) -> None:
    with pytest.raises(ValueError) as info:
        check_tensor("dst", tensor)
    assert str(info.value) == f"`dst` must be contiguous, but got a tensor of shape {shape} and strides {strides}"


@pytest.mark.parametrize("value", [0, -1, 7, 2**62])
def test_check_int_returns_ints(value) -> None:
    assert check_int("pe", value) == value


@pytest.mark.parametrize(
    "value,got",
    [(True, "bool"), (False, "bool"), (1.0, "float"), ("1", "str"), (None, "NoneType"), (torch.tensor(1), "Tensor")],
)
def test_check_int_rejects_bools_and_non_ints(value, got) -> None:
    with pytest.raises(TypeError) as info:
        check_int("pe", value)
    assert str(info.value) == f"`pe` must be an int, but got {got}"


def test_check_choice_maps_and_lists_the_options() -> None:
    choices = {"set": 0, "add": 1}
    assert check_choice("op", "set", choices) == 0
    assert check_choice("op", "add", choices) == 1
    for value, shown in (("mul", "'mul'"), ("SET", "'SET'"), (0, "0"), (None, "None"), (["set"], "['set']")):
        with pytest.raises(ValueError) as info:  # also for an unhashable value: no TypeError leaks out
            check_choice("op", value, choices)
        assert str(info.value) == f"`op` must be one of 'set', 'add', but got {shown}"


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_check_signal_accepts_one_int32_or_int64_element(dtype) -> None:
    assert check_signal("signal_tensor", torch.zeros(1, dtype=dtype), 5) == 5
    assert check_signal("signal_tensor", torch.zeros(1, 1, dtype=dtype), -5) == -5  # one element, any shape
    assert check_signal("signal_tensor", torch.zeros(4, dtype=dtype)[2:3], 0) == 0  # a view of one element


@pytest.mark.parametrize(
    "dtype,low,high",
    [(torch.int32, -(2**31), 2**31 - 1), (torch.int64, -(2**63), 2**63 - 1)],
)
def test_check_signal_value_range_is_the_dtype_range(dtype, low, high) -> None:
    signal = torch.zeros(1, dtype=dtype)
    assert check_signal("signal_tensor", signal, low) == low
    assert check_signal("signal_tensor", signal, high) == high
    for value in (low - 1, high + 1):
        with pytest.raises(ValueError) as info:
            check_signal("signal_tensor", signal, value)
        assert str(info.value) == f"`value` must fit in {dtype} [{low}, {high}], but got {value}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint32, torch.bool, torch.uint8])
def test_check_signal_rejects_other_dtypes(dtype) -> None:
    with pytest.raises(TypeError) as info:
        check_signal("signal_tensor", torch.zeros(1, dtype=dtype), 1)
    assert str(info.value) == f"`signal_tensor` must be an int32 or int64 tensor, but got {dtype}"


@pytest.mark.parametrize("numel", [0, 2])
def test_check_signal_rejects_other_sizes(numel) -> None:
    with pytest.raises(ValueError) as info:
        check_signal("sig", torch.zeros(numel, dtype=torch.int32), 1)
    assert str(info.value) == f"`sig` must have exactly one element, but got {numel}"


def test_check_signal_checks_the_tensor_first_then_dtype_size_and_value() -> None:
    with pytest.raises(TypeError, match=r"^`sig` must be a torch.Tensor, but got int$"):
        check_signal("sig", 3, 1)
    with pytest.raises(ValueError, match=r"^`sig` must be a cpu tensor"):
        check_signal("sig", torch.zeros(1, dtype=torch.int32, device="meta"), 1)
    with pytest.raises(TypeError, match=r"int32 or int64 tensor, but got torch.float32$"):
        check_signal("sig", torch.zeros(2), 1.5)  # the dtype before the size and the value
    with pytest.raises(ValueError, match=r"exactly one element, but got 2$"):
        check_signal("sig", torch.zeros(2, dtype=torch.int32), 1.5)  # the size before the value
    for value, got in ((1.5, "float"), (True, "bool"), ("1", "str")):
        with pytest.raises(TypeError) as info:
            check_signal("sig", torch.zeros(1, dtype=torch.int32), value)
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
