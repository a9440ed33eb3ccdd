"""System tests of the fused ops ``fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` (real ranks).

References are independent of the code under test: the all-gather over gloo then torch's matmul, and the
products of every rank's gathered inputs summed in float64 in one process. The gathered rows must match
bit for bit; products match within the dtype's tolerance (the fused op multiplies block by block).

Covered: float32, float16 and bfloat16 on 1, 2, 3 and 4 ranks, with all_gather_matmul's pushes on its
communication stream and issued by the calling thread; row counts that are and are not multiples of
``block_size``, ``block_size=None``, a block of one row, zero rows; ``a`` as this rank's rows of ``gather_out``;
calling again with the same signal, also after filling it with junk; ``a`` reused right after the call; a
call from inside a non-default SHMEM stream; 'avg'; sub-groups of a 4-rank world; every bad argument, by
message, with a check that nothing was written.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Optional
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from hyper_parallel.platform.torch import fused as _fused
from st_cases import expect_error, run_case
from symm_cases import gathered, symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}
_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (m rows per rank, k, n, block_size): a multiple of the block, a remainder, one row per block, a block larger
# than m, the automatic block, and no rows at all.
_GATHER_SHAPES = [(8, 16, 8, 4), (7, 16, 5, 3), (5, 8, 3, 1), (3, 8, 4, 64), (37, 24, 9, None), (0, 8, 4, 2),
                  (0, 8, 4, None)]
# (m rows per rank of the result, k, n).
_SCATTER_SHAPES = [(4, 16, 8), (3, 7, 5), (1, 5, 1), (0, 8, 4), (17, 24, 3)]
_TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-2, atol=1e-2),
              torch.bfloat16: dict(rtol=2e-2, atol=5e-2)}


def _matrix(rows: int, columns: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Multiples of 1/8 in [-1, 1): exact in every dtype, products of moderate size."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(-8, 8, (rows, columns), generator=generator).to(torch.float64) / 8).to(dtype)


def _close(ours: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(ours, reference.to(ours.dtype), **_TOLERANCE[ours.dtype], msg=lambda m: f"{what}: {m}")


def _rank_of(group) -> tuple:
    return dist.get_rank(group), dist.get_world_size(group)


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _check_all_gather_matmul(empty, signal, dtype: torch.dtype, m: int, k: int, n: int, block, group=None,
                             in_place: bool = False, salt: int = 0) -> None:
    rank, size = _rank_of(group)
    a = _matrix(m, k, dtype, 100 * dist.get_rank() + salt)
    b = _matrix(k, n, dtype, 100 * dist.get_rank() + salt + 1)  # each rank its own b: its columns of a layer
    reference_rows = torch.cat(gathered(a, group))  # gloo
    gather_out = empty((size * m, k), dtype)
    gather_out.fill_(99)
    c = torch.full((size * m, n), 99, dtype=dtype)
    source = gather_out[rank * m:(rank + 1) * m] if in_place else a.clone()
    source.copy_(a)
    what = f"all_gather_matmul {dtype} m={m} k={k} n={n} block={block} in_place={in_place}"
    result = symm.fused_all_gather_matmul(source, b, c, gather_out, signal, block_size=block, group=group)
    assert result[0] is gather_out and result[1] is c, what
    assert torch.equal(gather_out, reference_rows), what
    _close(c, reference_rows.double() @ b.double(), what)
    if not in_place:  # the op is done with `a` once it returns: reusing it must not change any peer's rows
        source.fill_(-3)
        symm.barrier(group)
        assert torch.equal(gather_out, reference_rows), f"{what}: `a` reused after the call"
    symm.barrier(group)  # the next check refills gather_out: peers must be done with this one
    empty.free(gather_out)


def _check_matmul_reduce_scatter(empty, signal, dtype: torch.dtype, m: int, k: int, n: int, op: str,
                                 group=None, salt: int = 0) -> None:
    rank, size = _rank_of(group)
    x1 = _matrix(size * m, k, dtype, 100 * dist.get_rank() + salt)
    x2 = _matrix(k, n, dtype, 100 * dist.get_rank() + salt + 1)
    exact = sum(left.double() @ right.double() for left, right in zip(gathered(x1, group), gathered(x2, group)))
    if op == "avg":
        exact = exact / size
    scratch = empty(size * m * n, dtype)  # any shape with M x N elements
    what = f"matmul_reduce_scatter {dtype} m={m} k={k} n={n} {op}"
    result = symm.fused_matmul_reduce_scatter(x1, x2, scratch, signal, reduce_op=op, group=group)
    assert result.shape == (m, n) and result.dtype == dtype, what
    _close(result, exact[rank * m:(rank + 1) * m], what)
    symm.barrier(group)
    empty.free(scratch)


@contextlib.contextmanager
def _pushes(on_stream: Optional[bool]) -> Iterator[None]:
    """all_gather_matmul's pushes on its communication stream (True), by the calling thread (False), or as the
    cores decide (None; on a 2-core machine: the calling thread)."""
    with mock.patch.object(_fused, "_push_on_stream", on_stream):
        yield


def _case_matches_references(dtypes: list, on_stream: Optional[bool]) -> None:
    """Every shape and dtype, with one signal for all the calls (it is never reset by hand)."""
    with symm_session() as empty, _pushes(on_stream):
        signal = empty(dist.get_world_size() + 3, torch.int32)
        signal.fill_(12345)  # junk: the op zeroes its entries itself
        symm.barrier()
        for dtype in dtypes:
            for m, k, n, block in _GATHER_SHAPES:
                _check_all_gather_matmul(empty, signal, dtype, m, k, n, block)
            _check_all_gather_matmul(empty, signal, dtype, 6, 8, 4, 4, in_place=True)
            for m, k, n in _SCATTER_SHAPES:
                for op in ("sum", "avg"):
                    _check_matmul_reduce_scatter(empty, signal, dtype, m, k, n, op)


def _case_signal_reuse_and_junk(on_stream: Optional[bool]) -> None:
    """Back-to-back calls on one int64 signal, junk written into it between calls, and a call made inside a
    non-default SHMEM stream."""
    with symm_session() as empty, _pushes(on_stream):
        signal = empty(dist.get_world_size(), torch.int64)
        signal.fill_(-7)
        symm.barrier()
        for salt in range(3):
            _check_all_gather_matmul(empty, signal, torch.float32, 9, 8, 4, 2, salt=salt)
            _check_matmul_reduce_scatter(empty, signal, torch.float32, 5, 8, 3, "sum", salt=salt)
            signal.fill_([2 ** 40, -1, 3][salt])  # a peer's writes into it all landed before our call returned
            symm.barrier()
        stream = shmem.Stream()
        with stream:
            _check_all_gather_matmul(empty, signal, torch.float32, 4, 8, 4, 1, salt=7)
            _check_matmul_reduce_scatter(empty, signal, torch.float32, 2, 8, 3, "avg", salt=7)
        stream.destroy()


def _case_sub_groups() -> None:
    """Pairs {0, 2} and {1, 3} of a 4-rank world run the fused ops side by side, group ranks counted inside (each
    group's pushes on its own stream)."""
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    mine = pairs[rank % 2]
    with symm_session() as empty, _pushes(True):
        signal = empty(2, torch.int32)
        symm.barrier()
        for salt, dtype in enumerate([torch.float32, torch.bfloat16]):
            _check_all_gather_matmul(empty, signal, dtype, 7, 16, 5, 2, group=mine, salt=salt)
            _check_all_gather_matmul(empty, signal, dtype, 6, 8, 4, None, group=mine, in_place=True, salt=salt)
            _check_matmul_reduce_scatter(empty, signal, dtype, 5, 16, 3, "sum", group=mine, salt=salt)
            _check_matmul_reduce_scatter(empty, signal, dtype, 3, 8, 2, "avg", group=mine, salt=salt)


_REFUSED = re.compile(r" \(refused by rank 0: op=\w+ team_ranks=\[[0-9,]+\]; every member fails this call\)$")
_ADDRESS = re.compile(r"0x[0-9a-f]+")


def _expect_untouched(call, exc: type, message: str, tensors: list) -> None:
    """``call`` raises ``exc`` with exactly ``message``, and writes none of ``tensors``.

    Every rank makes the same bad call here. A check made before the group is known raises ``message`` on each rank;
    one made after it is refused through the group: every rank raises rank 0's ``message`` (its addresses are rank
    0's), with the refusal's suffix.
    """
    before = [t.clone() for t in tensors]
    got = expect_error(exc, call)
    refusal = _REFUSED.search(got)
    if refusal is not None:
        got = got[:refusal.start()]
        if dist.get_rank() != 0:
            got, message = _ADDRESS.sub("0x?", got), _ADDRESS.sub("0x?", message)
    assert got == message, f"{got!r} != {message!r}"
    for t, saved in zip(tensors, before):
        assert torch.equal(t, saved), f"written despite the error: {message}"


def _case_bad_arguments() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    m, k, n = 4, 8, 3
    with symm_session() as empty:
        a = torch.ones(m, k)
        b = torch.ones(k, n)
        c = torch.full((size * m, n), 5.0)
        gather_out = empty((size * m, k))
        gather_out.fill_(5.0)
        signal = empty(size, torch.int32)
        signal.fill_(9)
        other_gather_out = empty((size * m, k))  # the same shape, another allocation
        other_gather_out.fill_(5.0)
        symm.barrier()
        shared = torch.zeros(m * k + size * m * n)  # for `a` and `c` overlapping each other
        watched = [c, gather_out, signal, other_gather_out, shared]
        ordinary_out = torch.zeros(size * m, k)
        ordinary_signal = torch.zeros(size, dtype=torch.int32)

        def agm(**overrides):
            args = dict(a=a, b=b, c=c, gather_out=gather_out, signal=signal, block_size=None)
            args.update(overrides)
            return lambda: symm.fused_all_gather_matmul(**args)

        bad_gather = [
            (agm(a=[1.0]), TypeError, "`a` must be a torch.Tensor, but got list"),
            (agm(a=a.int()), TypeError, "`a` must have one of dtypes float32, float16, bfloat16, float64, "
                                        "but got torch.int32"),
            (agm(a=a.view(-1)), ValueError, f"`a` must be 2-D, but got shape ({m * k},)"),
            (agm(a=torch.ones(k, m).t()), ValueError, "`a` must be contiguous, but got strides (1, 4)"),
            (agm(b=b.double()), TypeError, "`b` must have the dtype of `a` (torch.float32), but got torch.float64"),
            (agm(c=c.half()), TypeError, "`c` must have the dtype of `a` (torch.float32), but got torch.float16"),
            (agm(b=torch.ones(k + 1, n)), ValueError, f"`b.shape[0]` must equal a.shape[1] ({k}), but got {k + 1}"),
            (agm(gather_out=gather_out[:-1]), ValueError,
             f"`gather_out` must have shape ({size * m}, {k}) (group size x a.shape[0], a.shape[1]), "
             f"but got ({size * m - 1}, {k})"),
            (agm(c=torch.zeros(size * m, n + 1)), ValueError,
             f"`c` must have shape ({size * m}, {n}) (group size x a.shape[0], b.shape[1]), "
             f"but got ({size * m}, {n + 1})"),
            (agm(gather_out=ordinary_out), ValueError,
             "`gather_out` must be a symmetric tensor from symm.empty, but got an ordinary tensor at "
             f"{ordinary_out.data_ptr():#x}"),
            (agm(signal=signal.float()), TypeError,
             "`signal` must have dtype torch.int32 or torch.int64, but got torch.float32"),
            (agm(signal=ordinary_signal), ValueError,
             "`signal` must be a symmetric tensor from symm.empty, but got an ordinary tensor at "
             f"{ordinary_signal.data_ptr():#x}"),
            (agm(signal=signal[:size - 1]), ValueError,
             f"`signal.numel()` must be at least the group size ({size}), but got {size - 1}"),
            (agm(block_size=0), ValueError, "`block_size` must be a positive int or None, but got 0"),
            (agm(block_size=2.0), TypeError, "`block_size` must be a positive int or None, but got float"),
            (agm(block_size=True), TypeError, "`block_size` must be a positive int or None, but got bool"),
            (agm(a=shared.view(-1)[:m * k].view(m, k), c=shared.view(-1)[m * k - 1:][:size * m * n].view(-1, n)),
             ValueError, f"`c` must not overlap `a`, but got an overlap at byte {(m * k - 1) * 4} of `a`"),
            (agm(signal=gather_out.view(torch.int32).view(-1)[:size]), ValueError,
             "`gather_out` must not overlap `signal`, but got an overlap at byte 0 of `signal`"),
        ]
        if size > 1:  # (with one rank, an `a` of the right shape inside `gather_out` is all of it: its own rows)
            bad_gather.append((agm(a=gather_out.view(-1)[1:1 + m * k].view(m, k)), ValueError,
                               "`a` must be this rank's rows of `gather_out` or not overlap it, but got an overlap "
                               "at byte 4 of `gather_out`"))
        for call, exc, message in bad_gather:
            _expect_untouched(call, exc, message, watched)

        x1 = torch.ones(size * m, k)
        x2 = torch.ones(k, n)
        scratch = empty(size * m * n)
        scratch.fill_(5.0)
        other_scratch = empty(size * m * n)
        other_scratch.fill_(5.0)
        symm.barrier()
        watched += [scratch, other_scratch]

        def mrs(**overrides):
            args = dict(x1=x1, x2=x2, symm_tensor=scratch, signal=signal, reduce_op="sum")
            args.update(overrides)
            return lambda: symm.fused_matmul_reduce_scatter(**args)

        bad_scatter = [
            (mrs(x1=None), TypeError, "`x1` must be a torch.Tensor, but got NoneType"),
            (mrs(x1=x1.long()), TypeError, "`x1` must have one of dtypes float32, float16, bfloat16, float64, "
                                           "but got torch.int64"),
            (mrs(x2=x2.view(1, k, n)), ValueError, f"`x2` must be 2-D, but got shape (1, {k}, {n})"),
            (mrs(x2=x2.bfloat16()), TypeError, "`x2` must have the dtype of `x1` (torch.float32), "
                                               "but got torch.bfloat16"),
            (mrs(symm_tensor=scratch.half()), TypeError,
             "`symm_tensor` must have the dtype of `x1` (torch.float32), but got torch.float16"),
            (mrs(reduce_op="max"), ValueError, "`reduce_op` must be one of 'sum', 'avg', but got 'max'"),
            (mrs(x2=torch.ones(k - 1, n)), ValueError, f"`x2.shape[0]` must equal x1.shape[1] ({k}), but got {k - 1}"),
            (mrs(symm_tensor=scratch[1:]), ValueError,
             f"`symm_tensor.numel()` must be x1.shape[0] x x2.shape[1] ({size * m * n}), but got {size * m * n - 1}"),
            (mrs(symm_tensor=torch.zeros(size * m, n)), ValueError,
             "`symm_tensor` must be a symmetric tensor from symm.empty, but got an ordinary tensor at "),
            (mrs(signal=signal.view(torch.float32)), TypeError,
             "`signal` must have dtype torch.int32 or torch.int64, but got torch.float32"),
        ]
        if size > 1:
            bad_scatter.append((mrs(x1=torch.ones(size * m + 1, k)), ValueError,
                                f"`x1.shape[0]` must be a multiple of the group size ({size}), but got {size * m + 1}"))
        for call, exc, message in bad_scatter:
            if message.endswith("ordinary tensor at "):  # the address of a temporary: check the rule only
                before = [t.clone() for t in watched]
                expect_error(exc, call, message)
                assert all(torch.equal(t, saved) for t, saved in zip(watched, before))
            else:
                _expect_untouched(call, exc, message, watched)

        if size > 1:
            # Ranks that disagree: every rank raises the same error after the entry sync, before any data moves.
            # (The signal is the op's scratch: its entries are zeroed on entry.)
            data = [c, gather_out, other_gather_out, scratch, other_scratch]
            offsets = ", ".join(hex(_heap_offset(gather_out if r else other_gather_out)) for r in range(size))
            _expect_untouched(agm(gather_out=other_gather_out if rank == 0 else gather_out), ValueError,
                              "`gather_out` must be the same symmetric tensor on every rank of the group, but got "
                              f"heap offsets [{offsets}] by group rank", data)
            wide = torch.ones(k, n + 1) if rank == 1 else b
            _expect_untouched(agm(b=wide, c=torch.zeros(size * m, n + 1) if rank == 1 else c), ValueError,
                              "`b.shape[1]` must be the same on every rank of the group, but got "
                              f"{[n + (r == 1) for r in range(size)]} by group rank", data)
            offsets = ", ".join(hex(_heap_offset(scratch if r else other_scratch)) for r in range(size))
            _expect_untouched(mrs(symm_tensor=other_scratch if rank == 0 else scratch), ValueError,
                              "`symm_tensor` must be the same symmetric tensor on every rank of the group, but got "
                              f"heap offsets [{offsets}] by group rank", data)
            # Nothing was left half done: the same tensors work right after.
            _check_all_gather_matmul(empty, signal, torch.float32, m, k, n, 3)
            _check_matmul_reduce_scatter(empty, signal, torch.float32, m, k, n, "sum")


def _heap_offset(t: torch.Tensor) -> int:
    return t.data_ptr() - shmem.debug_state()["heap_base"]


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("on_stream", [True, False], ids=["pushes on a stream", "pushes inline"])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_fused_ops_match_the_unfused_references(world_factory, nranks: int, on_stream: bool) -> None:
    dtypes = _DTYPES if nranks in (1, 2, 4) else [torch.float32]
    run_case(world_factory(nranks, _ENV), _case_matches_references, dtypes, on_stream, timeout=120)


@pytest.mark.parametrize("on_stream", [True, None], ids=["pushes on a stream", "as the cores decide"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_the_signal_needs_no_reset(world_factory, nranks: int, on_stream: Optional[bool]) -> None:
    run_case(world_factory(nranks, _ENV), _case_signal_reuse_and_junk, on_stream, timeout=120)


def test_sub_groups_of_four_ranks(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_sub_groups, timeout=120)


@pytest.mark.parametrize("nranks", [1, 2])
def test_bad_arguments_raise_and_write_nothing(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_bad_arguments, timeout=120)
