"""The framework-free argument rules both user-API paths share (symmetric_memory/_rules.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyper_parallel.core.symmetric_memory import _rules


def test_choice_names_every_choice():
    assert _rules.choice(1, "signal_op", _rules.SIGNAL_OPS) == "add"
    for bad in (2, True, "0", 1.0):
        with pytest.raises(ValueError, match=r"^`signal_op` must be one of 0 \(SET\), 1 \(ADD\), but got "):
            _rules.choice(bad, "signal_op", _rules.SIGNAL_OPS)


@given(st.lists(st.integers(0, 9), max_size=4))
def test_shape_accepts_sequences_of_non_negative_ints(dims):
    assert _rules.shape(dims) == tuple(dims)


def test_shape_refusals():
    assert _rules.shape(5) == (5,)
    with pytest.raises(ValueError, match=r"^`shape` must have non-negative dimensions, but got \(2, -1\)$"):
        _rules.shape((2, -1))
    for bad in ("12", 1.5, [1, 2.0], True):
        with pytest.raises(TypeError, match=r"^`shape` must be an int or a sequence of ints, but got "):
            _rules.shape(bad)


def test_integer_and_rank():
    assert _rules.integer(3, "size") == 3
    with pytest.raises(TypeError, match=r"^`size` must be an int or a one-element integer tensor, but got float$"):
        _rules.integer(3.0, "size")
    with pytest.raises(ValueError, match=r"^`target_rank` must be in \[0, 4\), but got 4$"):
        _rules.rank_in_group(4, "target_rank", 4)


def test_low_precision_names():
    assert _rules.low_precision_name(" BFloat16 ", "x") == "bfloat16"
    assert _rules.low_precision_name("mindspore.float16", "x") == "float16"
    assert _rules.low_precision_name("none", "x") is None and _rules.low_precision_name("", "x") is None
    with pytest.raises(ValueError, match=r"^`low_precision_dtype` must be one of float16, bfloat16, float8_e4m3fn, "
                                         r"float8_e5m2 or 'none', but got 'float7'$"):
        _rules.low_precision_name("float7", "low_precision_dtype")
    with pytest.raises(TypeError, match=r"^`low_precision_dtype` must be a dtype, its name or None, but got int$"):
        _rules.low_precision_name(8, "low_precision_dtype")


def test_rendezvous_mismatch_names_every_rank():
    assert _rules.rendezvous_mismatch([[256, 64], [256, 64]]) is None
    assert _rules.rendezvous_mismatch([[-1, 64], [-1, 64]]).endswith("rank0=(offset=-1, bytes=64), "
                                                                     "rank1=(offset=-1, bytes=64)")
    assert _rules.rendezvous_mismatch([[256, 64], [288, 32]]).endswith("rank0=(offset=256, bytes=64), "
                                                                       "rank1=(offset=288, bytes=32)")


def test_view_bytes():
    assert _rules.view_bytes(2, 4, 4, 24) == (8, 24)
    with pytest.raises(ValueError, match=r"^`sizes` and `storage_offset` must lie inside the tensor \(24 bytes\), "
                                         r"but got bytes \[8, 28\)$"):
        _rules.view_bytes(2, 5, 4, 24)
