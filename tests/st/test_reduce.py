"""System tests of ``shmem.reduce`` on the host device: real ranks reading each other's symmetric memory.

References are rebuilt in every rank from patterns seeded by the PE that holds them, and combined with torch in
the order of ``pes``: bit-exact for integers (wrapping like torch) and for max/min, float32/float64 sums equal to
torch's additions in that order, float16/bfloat16 sums equal to a float32 accumulation cast once. NaN counts as
equal to NaN.

Worlds (one spawn per size for the module): 2, 3 and 4 ranks for the results; the 2-rank world also runs the bad
arguments (by message) and zero-byte calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from st_cases import expect_error, run_case, session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
           torch.int64]
_OPS = ["sum", "avg", "max", "min"]


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _values(pe: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """What ``pe`` holds: random values of ``dtype`` seeded by the PE; floats carry a few NaN at PE-specific places."""
    gen = torch.Generator().manual_seed(1000 + pe)
    if dtype.is_floating_point:
        values = (torch.randn(n, generator=gen, dtype=torch.float64) * 300).to(dtype)
        values[pe :: 97] = float("nan")
        return values
    itemsize = torch.empty(0, dtype=dtype).element_size()  # random bits: the whole range, so sums wrap
    return torch.randint(0, 256, (n * itemsize,), generator=gen, dtype=torch.uint8).view(dtype)


def _combine(values: list, dtype: torch.dtype, op: str) -> torch.Tensor:
    """The reference: ``values`` combined in order, half precision accumulated in float32 and rounded once."""
    if not dtype.is_floating_point:
        if op == "sum":
            return torch.stack(values).to(torch.int64).sum(0).to(dtype)  # wraps like a sum in the dtype
        acc = values[0]
        for value in values[1:]:
            acc = torch.maximum(acc, value) if op == "max" else torch.minimum(acc, value)
        return acc
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = values[0].to(wide)
    for value in values[1:]:
        value = value.to(wide)
        acc = acc + value if op in ("sum", "avg") else torch.maximum(acc, value) if op == "max" else torch.minimum(acc, value)
    if op == "avg":
        acc = acc / len(values)
    return acc.to(dtype)


def _check(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert got.dtype == expected.dtype, what
    if got.dtype.is_floating_point:
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, expected), f"{what}: {(got != expected).nonzero()[:5].tolist()}"


def _pe_lists(rank: int, world: int) -> list:
    """Every rank, in order and reversed; this rank alone; another rank alone; a pair out of order."""
    lists = [list(range(world)), tuple(reversed(range(world))), [rank], [(rank + 1) % world]]
    if world > 2:
        lists.append([(rank + 2) % world, rank])
    return lists


# --------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------


def _case_every_dtype_op_and_pe_list(n: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        sources = {}
        for dtype in _DTYPES:
            sources[dtype] = empty(n, dtype=dtype)
            sources[dtype].copy_(_values(rank, n, dtype))
        shmem.barrier()
        for dtype, src in sources.items():
            everyone = {pe: _values(pe, n, dtype) for pe in range(world)}
            for op in _OPS:
                if op == "avg" and not dtype.is_floating_point:
                    continue
                for pes in _pe_lists(rank, world):
                    dst = torch.empty(n, dtype=dtype)
                    shmem.reduce(dst, src, pes, op=op)
                    _check(dst, _combine([everyone[pe] for pe in pes], dtype, op), f"{dtype} {op} pes={pes}")
            # A view at an offset reduces the same stretch of every PE's copy.
            dst = torch.empty(n // 2, dtype=dtype)
            shmem.reduce(dst, src[3 : 3 + n // 2], list(range(world)))
            _check(dst, _combine([everyone[pe][3 : 3 + n // 2] for pe in range(world)], dtype, "sum"), f"{dtype} view")
        # Nothing changed the sources.
        for dtype, src in sources.items():
            _check(src, _values(rank, n, dtype), f"{dtype} source")


def _case_in_place(n: int) -> None:
    """The ranks reduce into their own ``src`` one after the other; later ones read the earlier results."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        for dtype, op in [(torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.float16, "max"), (torch.int8, "sum"),
                          (torch.int64, "min")]:
            buf = empty(n, dtype=dtype)
            buf.copy_(_values(rank, n, dtype))
            copies = [_values(pe, n, dtype) for pe in range(world)]
            pes = list(reversed(range(world)))
            shmem.barrier()
            for turn in range(world):
                if turn == rank:
                    shmem.reduce(buf, buf, pes, op=op)
                copies[turn] = _combine([copies[pe] for pe in pes], dtype, op)
                shmem.barrier()  # nobody reads a copy while its owner overwrites it
            _check(buf, copies[rank], f"{dtype} {op} in place")


def _case_on_a_stream(n: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        src = empty(n, dtype=torch.float32)
        src.copy_(_values(rank, n, torch.float32))
        shmem.barrier()
        s = shmem.Stream()
        dst = torch.empty(n, dtype=torch.float32)
        with s:
            shmem.reduce(dst, src, list(range(world)), op="max")
        s.synchronize()
        s.destroy()
        _check(dst, _combine([_values(pe, n, torch.float32) for pe in range(world)], torch.float32, "max"), "stream")


def _case_bad_arguments_write_nothing() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        src = empty(16, dtype=torch.float32)
        ints = empty(16, dtype=torch.int32)
        gone = shmem.empty(16, dtype=torch.float32)  # not the session's: freed here
        src.fill_(3.0)
        ints.fill_(4)
        shmem.free(gone)
        dst = torch.full((16,), 5.0)
        in_range = f"must be in [0, {world}), but got"
        checks = [
            (lambda: shmem.reduce(dst, src, [0], op="prod"), ValueError,
             "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'"),
            (lambda: shmem.reduce(torch.zeros(4, dtype=torch.complex64), torch.zeros(4, dtype=torch.complex64), [0]),
             TypeError, "`src` must have one of dtypes float32, float64, float16, bfloat16, int8, uint8, int32, int64, "
             "but got torch.complex64"),
            (lambda: shmem.reduce(dst.half(), src, [0]), TypeError,
             "`dst` must have the dtype of `src` (torch.float32), but got torch.float16"),
            (lambda: shmem.reduce(dst, src, 0), TypeError, "`pes` must be a list or tuple of ints, but got int"),
            (lambda: shmem.reduce(dst, src, range(world)), TypeError,
             "`pes` must be a list or tuple of ints, but got range"),
            (lambda: shmem.reduce(dst, src, [0, 1.0]), TypeError, "`pes[1]` must be an int, but got float"),
            (lambda: shmem.reduce(dst, src, [True]), TypeError, "`pes[0]` must be an int, but got bool"),
            (lambda: shmem.reduce(dst, src, []), ValueError, "`pes` must name at least one pe, but got none"),
            (lambda: shmem.reduce(dst, src, (0, world)), ValueError, f"`pes[1]` {in_range} {world}"),
            (lambda: shmem.reduce(dst, src, [-1]), ValueError, f"`pes[0]` {in_range} -1"),
            (lambda: shmem.reduce(dst, src, [1, 0, 1]), ValueError,
             "`pes` must be distinct, but got 1 at positions 0 and 2"),
            (lambda: shmem.reduce(dst.int(), ints, [0], op="avg"), ValueError,
             "`op` must be sum, max or min for int32, but got avg"),
            (lambda: shmem.reduce(dst[:8], src, [0]), ValueError,
             "`src` must have as many bytes as `dst` (32), but got 64"),
            (lambda: shmem.reduce(dst, torch.ones(16), [0]), ValueError,
             "`src` must be a symmetric tensor allocated by shmem.empty"),
            (lambda: shmem.reduce(src[1:9], src[:8], [0]), ValueError,
             "`dst` must be `src` itself or not overlap it, but got bytes ["),
            (lambda: shmem.reduce(dst.view(4, 4).t(), src.view(4, 4), [0]), ValueError, "`dst` must be contiguous"),
            (lambda: shmem.reduce([5.0] * 16, src, [0]), TypeError, "`dst` must be a torch.Tensor, but got list"),
            (lambda: shmem.reduce(dst, gone, [0]), shmem.ShmemStateError, "tensor of a freed symmetric allocation"),
            # Zero elements: still validated.
            (lambda: shmem.reduce(dst[:0], src[3:3], [world]), ValueError, f"`pes[0]` {in_range} {world}"),
        ]
        for index, (call, exc_type, *fragments) in enumerate(checks):
            try:
                expect_error(exc_type, call, *fragments)
            except BaseException as exc:
                raise AssertionError(f"check {index} ({fragments[0]!r}): {exc}") from exc
            assert torch.equal(dst, torch.full((16,), 5.0)), f"check {index} wrote into dst"
        # Zero elements: a no-op.
        shmem.reduce(dst[:0], src[3:3], list(range(world)), op="avg")
        shmem.reduce(torch.empty(0, dtype=torch.int32), ints[16:], [rank])
        shmem.barrier()
        assert torch.equal(dst, torch.full((16,), 5.0))
        assert torch.equal(src, torch.full((16,), 3.0)) and torch.equal(ints, torch.full((16,), 4, dtype=torch.int32))


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_every_dtype_op_and_pe_list(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_every_dtype_op_and_pe_list, 2053, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_in_place(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_in_place, 1500)


def test_on_a_non_default_stream(world_factory) -> None:
    run_case(world_factory(3, _ENV), _case_on_a_stream, 5000)


def test_bad_arguments_raise_and_write_nothing(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_bad_arguments_write_nothing)
