"""The user API's argument checks (symmetric_memory/checks.py): the rules that need no framework, and the checks
over torch's tensor facts.

The MindSpore suite runs the same checks over MindSpore's handler (tests/on_mindspore): only the framework's names in
the messages differ.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.core.symmetric_memory._api import SymmetricMemory
from hyper_parallel.core.symmetric_memory.checks import Checks
from hyper_parallel.platform.torch import tensors as torch_tensors

CHECKS = Checks(torch_tensors)


def test_integer_takes_ints_and_one_element_integer_tensors():
    assert CHECKS.integer(3, "size") == 3
    assert CHECKS.integer(torch.tensor([5], dtype=torch.int16), "size") == 5
    with pytest.raises(TypeError, match=r"^`size` must be an int or a one-element integer tensor, but got a tensor "
                                        r"of 2 torch.int64 elements$"):
        CHECKS.integer(torch.tensor([1, 2]), "size")
    for bad in (torch.tensor(1.0), torch.tensor(True)):
        with pytest.raises(TypeError, match=r"^`size` must be an int or a one-element integer tensor"):
            CHECKS.integer(bad, "size")
    with pytest.raises(ValueError, match=r"^`size` must be non-negative, but got -1$"):
        CHECKS.count(-1, "size")


@given(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8))
def test_window_refuses_exactly_the_slices_past_the_end(numel, offset, size):
    t = torch.zeros(numel)
    if offset + size <= numel:
        CHECKS.window(t, "src", offset, size, "src_offset")
    else:
        with pytest.raises(ValueError, match=rf"^`src_offset \+ size` must be at most src.numel\(\) \({numel}\), but "
                                             rf"got {offset} \+ {size} = {offset + size}$"):
            CHECKS.window(t, "src", offset, size, "src_offset")


def test_tensor_contract():
    with pytest.raises(TypeError, match=r"^`src` must be a torch.Tensor, but got list$"):
        CHECKS.tensor([1.0], "src")
    with pytest.raises(ValueError, match=r"^`src` must be contiguous, but got strides \(1, 2\)$"):
        CHECKS.tensor(torch.zeros(2, 2).t(), "src")
    with pytest.raises(ValueError, match=r"^`src` must be a tensor on cpu \(the SHMEM device\), but got meta$"):
        CHECKS.tensor(torch.zeros(2, device="meta"), "src")


def test_a_broken_contract_raises_the_runtimes_contract_classes():
    """ValueError and TypeError as ever, and ShmemError too: the user API gives them upstream's fields."""
    with pytest.raises(ShmemValueError, match=r"^`shape` must have non-negative dimensions"):
        checks.shape((2, -1))
    with pytest.raises(ShmemTypeError, match=r"^`src` must be a torch.Tensor, but got list$"):
        CHECKS.tensor([1.0], "src")
    with pytest.raises(ShmemValueError, match=r"^`size` must be non-negative, but got -1$"):
        CHECKS.count(-1, "size")


def test_peer_is_another_rank_of_the_group():
    assert checks.peer(2, "dst_rank", 4, 1) == 2
    with pytest.raises(ValueError, match=r"^`dst_rank` must be another rank than this one \(1\), but got 1$"):
        checks.peer(1, "dst_rank", 4, 1)
    with pytest.raises(ValueError, match=r"^`dst_rank` must be in \[0, 4\), but got 4$"):
        checks.peer(4, "dst_rank", 4, 1)


def test_reduce_op_and_low_precision_rules():
    assert CHECKS.reduce_op("avg", torch.bfloat16) == "avg"
    with pytest.raises(ValueError, match=r"^`op` must be 'sum', 'max' or 'min' for the integer dtype torch.int32"):
        CHECKS.reduce_op("avg", torch.int32)
    with pytest.raises(TypeError, match=r"^`tensor` must have one of dtypes float32, float64, float16, bfloat16, "):
        CHECKS.reduce_op("sum", torch.int16)
    rule = checks.low_precision_rule
    assert rule(torch_tensors, 2, torch.float32, "sum") is None
    assert rule(torch_tensors, 2, torch.float16, "avg") == "narrower than the tensor's dtype torch.float16 (2 bytes)"
    assert rule(torch_tensors, 1, torch.float32, "max").startswith("None for op 'max'")
    assert rule(torch_tensors, 1, torch.int64, "sum").startswith("None for the integer dtype torch.int64")


@given(st.lists(st.integers(0, 5), min_size=1, max_size=4), st.integers(0, 12))
def test_all_to_all_counts(counts, capacity):
    n = len(counts)
    sends = [torch.zeros(1) for _ in range(n)]
    receive = torch.zeros(capacity)
    for given_counts in (counts, torch.tensor(counts, dtype=torch.int32)):
        if sum(counts) <= capacity:
            _, _, got = CHECKS.all_to_all(sends, receive, given_counts, n)
            assert got == counts
        else:
            with pytest.raises(ValueError, match=r"^`sum\(receive_list\)` must be at most receive_tensor.numel\(\)"):
                CHECKS.all_to_all(sends, receive, given_counts, n)


def test_all_to_all_refusals():
    receive = torch.zeros(4)
    with pytest.raises(ValueError, match=r"^`send_tensor_list` must have one tensor per rank of the group \(2\), "
                                         r"but got 1$"):
        CHECKS.all_to_all([torch.zeros(1)], receive, [1, 1], 2)
    with pytest.raises(TypeError, match=r"^`send_tensor_list\[1\]` must have the dtype of `receive_tensor`"):
        CHECKS.all_to_all([torch.zeros(1), torch.zeros(1, dtype=torch.int32)], receive, [1, 1], 2)
    with pytest.raises(TypeError, match=r"^`receive_list` must be a sequence of 2 ints or a 1-D integer tensor, but "
                                        r"got a tensor of shape \(2,\) and dtype torch.float32$"):
        CHECKS.all_to_all([torch.zeros(1)] * 2, receive, torch.zeros(2), 2)
    with pytest.raises(ValueError, match=r"^`receive_list\[1\]` must be non-negative, but got -1$"):
        CHECKS.all_to_all([torch.zeros(1)] * 2, receive, [1, -1], 2)


def test_group_multiple_and_backward_modes():
    CHECKS.group_multiple(torch.zeros(6), "output_tensor", torch.zeros(2), "input_tensor", 3)
    with pytest.raises(ValueError, match=r"^`output_tensor.numel\(\)` must be 3 x input_tensor.numel\(\) \(6\), but "
                                         r"got 5$"):
        CHECKS.group_multiple(torch.zeros(5), "output_tensor", torch.zeros(2), "input_tensor", 3)
    assert CHECKS.backward_mode("allreduce") == "allreduce"
    with pytest.raises(ValueError, match=r"^`backward` must be one of 'identity', 'allreduce', but got 'x'$"):
        CHECKS.backward_mode("x")
    with pytest.raises(ValueError, match=r"^`op` must be 'sum' or 'avg' when `tensor` requires grad, but got 'max'$"):
        CHECKS.differentiable("max", "tensor")


def test_symmetric_memory_get_buffer_checks_before_it_views():
    seen = []
    handle = SymmetricMemory(CHECKS, 1, [0x1000, 0x2000], 64, lambda *view: seen.append(view) or view, lambda: None)
    assert handle.get_buffer(0, (2, 3), torch.float32, 4) == (0, 16, 40, (2, 3), torch.float32)
    with pytest.raises(TypeError, match=r"^`dtype` must be a torch.dtype, but got str$"):
        handle.get_buffer(0, 4, "float32")
    with pytest.raises(ValueError, match=r"^`rank` must be in \[0, 2\), but got 2$"):
        handle.get_buffer(2, 4, torch.float32)
    with pytest.raises(ValueError, match=r"^`sizes` and `storage_offset` must lie inside the tensor \(64 bytes\), but "
                                         r"got bytes \[60, 68\)$"):
        handle.get_buffer(0, 2, torch.float32, 15)
    assert len(seen) == 1   # refusals view nothing
    assert repr(handle) == "SymmetricMemory(rank=1, world_size=2, buffer_size=64)"


# --------------------------------------------------------------------------
# The rules that need no framework.
# --------------------------------------------------------------------------


def test_choice_names_every_choice():
    assert checks.choice(1, "signal_op", checks.SIGNAL_OPS) == "add"
    for bad in (2, True, "0", 1.0):
        with pytest.raises(ValueError, match=r"^`signal_op` must be one of 0 \(SET\), 1 \(ADD\), but got "):
            checks.choice(bad, "signal_op", checks.SIGNAL_OPS)


@given(st.lists(st.integers(0, 9), max_size=4))
def test_shape_accepts_sequences_of_non_negative_ints(dims):
    assert checks.shape(dims) == tuple(dims)


def test_shape_refusals():
    assert checks.shape(5) == (5,)
    with pytest.raises(ValueError, match=r"^`shape` must have non-negative dimensions, but got \(2, -1\)$"):
        checks.shape((2, -1))
    for bad in ("12", 1.5, [1, 2.0], True):
        with pytest.raises(TypeError, match=r"^`shape` must be an int or a sequence of ints, but got "):
            checks.shape(bad)


def test_integer_and_rank():
    assert checks.integer(3, "size") == 3
    with pytest.raises(TypeError, match=r"^`size` must be an int or a one-element integer tensor, but got float$"):
        checks.integer(3.0, "size")
    with pytest.raises(ValueError, match=r"^`target_rank` must be in \[0, 4\), but got 4$"):
        checks.rank_in_group(4, "target_rank", 4)


def test_low_precision_names():
    assert checks.low_precision_name(" BFloat16 ", "x") == "bfloat16"
    assert checks.low_precision_name("mindspore.float16", "x") == "float16"
    assert checks.low_precision_name("none", "x") is None and checks.low_precision_name("", "x") is None
    with pytest.raises(ValueError, match=r"^`low_precision_dtype` must be one of float16, bfloat16, float8_e4m3fn, "
                                         r"float8_e5m2 or 'none', but got 'float7'$"):
        checks.low_precision_name("float7", "low_precision_dtype")
    with pytest.raises(TypeError, match=r"^`low_precision_dtype` must be a dtype, its name or None, but got int$"):
        checks.low_precision_name(8, "low_precision_dtype")


def test_rendezvous_mismatch_names_every_rank():
    assert checks.rendezvous_mismatch([[256, 64], [256, 64]]) is None
    assert checks.rendezvous_mismatch([[-1, 64], [-1, 64]]).endswith("rank0=(offset=-1, bytes=64), "
                                                                     "rank1=(offset=-1, bytes=64)")
    assert checks.rendezvous_mismatch([[256, 64], [288, 32]]).endswith("rank0=(offset=256, bytes=64), "
                                                                       "rank1=(offset=288, bytes=32)")


def test_view_bytes():
    assert checks.view_bytes(2, 4, 4, 24) == (8, 24)
    with pytest.raises(ValueError, match=r"^`sizes` and `storage_offset` must lie inside the tensor \(24 bytes\), "
                                         r"but got bytes \[8, 28\)$"):
        checks.view_bytes(2, 5, 4, 24)


# The primitives' fast path (Checks.windows, Checks.signal, Checks.integer take the common call without the full
# checks): against the full checks alone (tensor facts whose readable_numel never answers, indices given as an int
# subclass), every call returns the same arguments or raises the same class and message.
class _FullChecksOnlyFacts:
    """torch's tensor facts, but readable_numel never answers: the checks take their full path."""

    def __getattr__(self, name):
        return getattr(torch_tensors, name)

    @staticmethod
    def readable_numel(value):
        del value
        return None


_FULL = Checks(_FullChecksOnlyFacts())


class _Index(int):
    """An int the fast path does not take (not exactly int): the full checks see it."""


_TENSORS = {
    "float4": lambda: torch.zeros(4), "float2x3": lambda: torch.zeros(2, 3), "double4": lambda: torch.zeros(4).double(),
    "int64x8": lambda: torch.zeros(8, dtype=torch.int64), "int32x1": lambda: torch.zeros(1, dtype=torch.int32),
    "scalar_int64": lambda: torch.tensor(3), "float16_empty": lambda: torch.zeros(0),
    "transposed": lambda: torch.zeros(2, 2).t(), "meta": lambda: torch.zeros(4, device="meta"),
    "list": lambda: [1.0], "none": lambda: None,
}
_INDICES = st.one_of(st.integers(-2, 9), st.sampled_from([True, 1.0, "1", None]),
                     st.sampled_from(["tensor1", "tensor2", "float_tensor"]))


def _index(value, full):
    if value == "tensor1":
        return torch.tensor([1])
    if value == "tensor2":
        return torch.tensor([1, 2])
    if value == "float_tensor":
        return torch.tensor(1.0)
    return _Index(value) if full and type(value) is int else value


def _outcome(call):
    try:
        result = call()
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    return tuple(id(r) if isinstance(r, torch.Tensor) else int(r) for r in result)


@given(st.sampled_from(sorted(_TENSORS)), st.sampled_from(sorted(_TENSORS)), _INDICES, _INDICES, _INDICES)
def test_windows_fast_path_answers_as_the_full_checks(target_kind, src_kind, target_offset, src_offset, size):
    target, src = _TENSORS[target_kind](), _TENSORS[src_kind]()

    def run(checks_, full):
        return _outcome(lambda: checks_.windows(target, _index(target_offset, full), src, _index(src_offset, full),
                                                _index(size, full)))
    assert run(CHECKS, False) == run(_FULL, True)


def test_windows_fast_path_answers_as_the_full_checks_at_every_edge():
    """Every int window of every pair of readable tensors up to one past each end (hypothesis samples the rest)."""
    kinds = ("float4", "float2x3", "double4", "float16_empty")
    edges = range(-1, 8)
    for target_kind in kinds:
        for src_kind in kinds:
            target, src = _TENSORS[target_kind](), _TENSORS[src_kind]()
            for target_offset in edges:
                for src_offset in edges:
                    for size in edges:
                        fast = _outcome(lambda: CHECKS.windows(target, target_offset, src, src_offset, size))
                        full = _outcome(lambda: _FULL.windows(target, _Index(target_offset), src, _Index(src_offset),
                                                              _Index(size)))
                        assert fast == full, (target_kind, src_kind, target_offset, src_offset, size)


@given(st.sampled_from(sorted(_TENSORS)), _INDICES)
def test_signal_fast_path_answers_as_the_full_checks(signal_kind, offset):
    signal = _TENSORS[signal_kind]()
    assert _outcome(lambda: CHECKS.signal(signal, _index(offset, False))) == \
        _outcome(lambda: _FULL.signal(signal, _index(offset, True)))


def test_readable_numel_answers_only_for_tensors_that_pass_the_tensor_checks():
    assert torch_tensors.readable_numel(torch.zeros(2, 3)) == 6
    assert torch_tensors.readable_numel(torch.zeros(0)) == 0
    for refused in (torch.zeros(2, 2).t(), torch.zeros(2, device="meta"), [1.0], None, 3,
                    torch.zeros(2, 2).to_sparse()):
        assert torch_tensors.readable_numel(refused) is None
