"""System tests of low-precision communication: ``low_precision_dtype`` of shmem_allreduce and
shmem_reduce_scatter, and ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE``.

Every low dtype (float16, bfloat16, float8_e4m3fn, float8_e5m2), 'sum' and 'avg', on 2 and 4 ranks, a
sub-group, ordinary and symmetric tensors, at 0, 1 and odd element counts, counts of several staging pieces,
and 64 MiB.

References are independent of the code under test: every rank rebuilds every rank's inputs (deterministic
random data whose magnitude changes from one 128-element block to the next, some blocks tiny enough for the
dtypes' subnormal ranges), the exact result is their sum in float64, and the bound is the formula documented
in ``_low_precision``'s docstring and the README, written out again here. Each result is checked element by
element against it, and must differ from the full-precision result (the low-precision path ran); all_reduce
results must be bit-identical on every rank of the group, and the same for ordinary and symmetric tensors.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import expect_error, restored_env, run_case
from symm_cases import gathered, symm_session

ENV_VAR = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"
LOWS = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
# 0, 1, odd, past one staging piece (the staging area is about 510 KiB with the 128 MiB heap below: a float16
# slot of 2 ranks holds 65 K elements, an fp8 slot 127 K).
COUNTS = [0, 1, 7, 4099, 300_001]
BLOCK = 128
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "128M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}

# The documented constants: unit roundoff u and underflow term tau(M) of each low dtype, and of the tensor's
# own dtype (u_t, tau_t) where it is narrower than float32.
_U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3}
_TAU = {
    torch.float16: lambda m: 2.0**-25 + 0 * m,
    torch.bfloat16: lambda m: 2.0**-134 + 0 * m,
    torch.float8_e4m3fn: lambda m: 2.0**-9 / 448 * m + 2.0**-136,
    torch.float8_e5m2: lambda m: 2.0**-16 / 57344 * m + 2.0**-143,
}
_OWN = {torch.float16: (2.0**-11, 2.0**-25), torch.bfloat16: (2.0**-8, 2.0**-134)}


# --------------------------------------------------------------------------
# References (in the ranks).
# --------------------------------------------------------------------------


def _inputs(rank: int, count: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: normal values scaled by a power of two per 128-element block (2**-6 .. 2**6, and
    one block in eight 2**-30: the subnormal ranges), exact in ``dtype``."""
    generator = torch.Generator().manual_seed(7919 * rank + 31 * count + salt)
    blocks = -(-count // BLOCK)
    exponents = torch.randint(-6, 7, (blocks,), generator=generator).to(torch.float64)
    exponents[torch.rand(blocks, generator=generator) < 0.125] = -30
    scale = torch.pow(2.0, exponents).repeat_interleave(BLOCK)[:count]
    return (torch.randn(count, generator=generator, dtype=torch.float64) * scale).to(dtype)


def _block_max(a: torch.Tensor) -> torch.Tensor:
    """Each element's largest ``a`` in its aligned 128-element block."""
    count = a.numel()
    padded = torch.zeros(-(-count // BLOCK) * BLOCK, dtype=a.dtype)
    padded[:count] = a
    return padded.view(-1, BLOCK).amax(1).repeat_interleave(BLOCK)[:count]


def _bound(low: torch.dtype, dtype: torch.dtype, op: str, n: int, a: torch.Tensor, twice: bool) -> torch.Tensor:
    """The documented bound for each element: ``a`` is sum(|x_i|) (float64); ``twice``: the value is cast down
    twice (two-shot all_reduce) rather than once (reduce_scatter, and all_reduce's one step)."""
    if op == "avg":
        a = a / n
    u = _U[low]
    u_t, tau_t = _OWN.get(dtype, (0.0, 0.0))
    coefficient = (2 * u + u * u if twice else u) + 2 * n * 2.0**-23 + 2 * u_t
    return coefficient * a + 2 * n * _TAU[low](_block_max(a)) + tau_t


def _check(result: torch.Tensor, inputs: list, low: torch.dtype, op: str, twice: bool, what: str) -> None:
    """``result`` within the documented bound of the exact reduction of ``inputs``."""
    stacked = torch.stack([t.to(torch.float64) for t in inputs])
    exact = stacked.sum(0)
    if op == "avg":
        exact /= len(inputs)
    bound = _bound(low, result.dtype, op, len(inputs), stacked.abs().sum(0), twice)
    error = (result.to(torch.float64) - exact).abs()
    bad = (error > bound).nonzero().flatten()
    assert bad.numel() == 0, (f"{what}: {bad.numel()} elements beyond the bound, first {bad[:3].tolist()}: error "
                              f"{error[bad[:3]].tolist()} bound {bound[bad[:3]].tolist()}")


def _identical(t: torch.Tensor, group: object, what: str) -> None:
    copies = gathered(t, group)
    for r, other in enumerate(copies):
        assert torch.equal(other.view(torch.uint8), copies[0].view(torch.uint8)), f"{what}: group rank {r} differs"


def _differs(low_result: torch.Tensor, full_result: torch.Tensor, what: str) -> None:
    """The low-precision result is not the full-precision one: the path was taken (random data, at least one
    element that rounds differently)."""
    assert not torch.equal(low_result, full_result), f"{what}: equal to the full-precision result"


# --------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------


def _case_bounds(lows: list, dtypes: list, counts: list, group_ranks: list | None) -> None:
    """all_reduce and reduce_scatter with every low dtype, 'sum' and 'avg', on ordinary tensors (and, on the
    whole world, symmetric ones), within the bound, bit-identical across the group."""
    world_rank = dist.get_rank()
    group = None if group_ranks is None else [dist.new_group(ranks) for ranks in group_ranks]
    if group is not None:
        group = next(g for g, ranks in zip(group, group_ranks) if world_rank in ranks)
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    with symm_session() as empty:
        for dtype in dtypes:
            for low in lows:
                if low.itemsize >= dtype.itemsize:
                    continue
                for count in counts:
                    for op in ("sum", "avg"):
                        what = f"{dtype} in {low} x{count} {op}"
                        inputs = [_inputs(r, count, dtype) for r in range(n)]
                        t = inputs[rank].clone()
                        assert symm.shmem_allreduce(t, op=op, group=group, low_precision_dtype=low) is t
                        one_step = t.nbytes <= 64 << 10  # one step below 256 KiB when it fits a slot
                        _check(t, inputs, low, op, twice=not one_step, what=f"all_reduce {what}")
                        _identical(t, group, f"all_reduce {what}")
                        full = inputs[rank].clone()
                        symm.shmem_allreduce(full, op=op, group=group)
                        if count:
                            _differs(t, full, f"all_reduce {what}")
                        if group is None:
                            sym = empty(count, dtype)
                            sym.copy_(inputs[rank])
                            symm.shmem_allreduce(sym, op=op, low_precision_dtype=low)
                            assert torch.equal(sym, t), f"symmetric all_reduce {what} differs from ordinary"
                            empty.free(sym)

                        whole = [_inputs(r, n * count, dtype, salt=1) for r in range(n)]
                        out = torch.full((count,), 3, dtype=dtype)
                        assert symm.shmem_reduce_scatter(out, whole[rank], op=op, group=group,
                                                         low_precision_dtype=low) is out
                        parts = [t[rank * count:(rank + 1) * count] for t in whole]
                        _check(out, parts, low, op, twice=False, what=f"reduce_scatter {what}")
                        full_out = torch.empty_like(out)
                        symm.shmem_reduce_scatter(full_out, whole[rank], op=op, group=group)
                        if count:
                            _differs(out, full_out, f"reduce_scatter {what}")
                        if group is None:  # in place: the output is this rank's part of a symmetric input
                            sym = empty(n * count, dtype)
                            sym.copy_(whole[rank])
                            mine = sym[rank * count:(rank + 1) * count]
                            symm.shmem_reduce_scatter(mine, sym, op=op, low_precision_dtype=low)
                            assert torch.equal(mine, out), f"in-place reduce_scatter {what} differs"
                            empty.free(sym)


def _case_large(nbytes: int, low: torch.dtype) -> None:
    """A 64 MiB all_reduce (a hundred staging pieces) and reduce_scatter."""
    rank, n = dist.get_rank(), dist.get_world_size()
    count = nbytes // 4
    with symm_session():
        inputs = [torch.randn(count, generator=torch.Generator().manual_seed(r)) for r in range(n)]
        t = inputs[rank].clone()
        symm.shmem_allreduce(t, low_precision_dtype=low)
        _check(t, inputs, low, "sum", twice=True, what="64 MiB all_reduce")
        _identical(t, None, "64 MiB all_reduce")
        part = count // n
        out = torch.empty(part)
        symm.shmem_reduce_scatter(out, inputs[rank][:part * n], low_precision_dtype=low)
        _check(out, [x[rank * part:(rank + 1) * part] for x in inputs], low, "sum", twice=False,
               what="64 MiB reduce_scatter")


def _case_environment() -> None:
    """The environment's default applies where it can and nowhere else; a call's argument overrides it; the
    variable is read once per runtime lifecycle (each session below is one)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    count = 4099
    inputs = [_inputs(r, count, torch.float32) for r in range(n)]
    x = inputs[rank]
    bf16 = [t.to(torch.bfloat16) for t in inputs]

    def reduced(t: torch.Tensor, op: str = "sum", **kwargs: object) -> torch.Tensor:
        result = t.clone()
        symm.shmem_allreduce(result, op=op, **kwargs)
        return result

    def scattered(**kwargs: object) -> torch.Tensor:
        out = torch.empty(count // n)
        symm.shmem_reduce_scatter(out, x[:count // n * n], **kwargs)
        return out

    def under(default: str | None, extra: bool = False) -> dict:
        """Every call's result in a lifecycle started under ``default`` (None: the variable unset)."""
        if default is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = default
        with symm_session():
            results = {
                "sum": reduced(x), "max": reduced(x, "max"), "scattered": scattered(),
                "ints": reduced(torch.arange(count, dtype=torch.int32) * (rank + 1)),
                "halves": reduced(x.to(torch.float16)), "bf16": reduced(bf16[rank]),
                "fp16 argument": reduced(x, low_precision_dtype="float16"),
                "none argument": reduced(x, low_precision_dtype="none"),
            }
            if extra:  # explicit arguments, the references of the defaults
                results["bf16 argument"] = reduced(x, low_precision_dtype=torch.bfloat16)
                results["bf16 scattered"] = scattered(low_precision_dtype="bfloat16")
                results["bf16 in e4m3fn"] = reduced(bf16[rank], low_precision_dtype=torch.float8_e4m3fn)
            # Changing the variable inside a lifecycle changes nothing until the next one.
            os.environ[ENV_VAR] = "float8_e5m2"
            assert torch.equal(reduced(x), results["sum"]), f"default {default!r} changed inside its lifecycle"
        return results

    with restored_env(ENV_VAR):
        unset = under(None, extra=True)
        _differs(unset["bf16 argument"], unset["sum"], "explicit bfloat16")
        default_bf16 = under("bfloat16")
        assert torch.equal(default_bf16["sum"], unset["bf16 argument"]), "the default bfloat16 differs from the argument"
        assert torch.equal(default_bf16["scattered"], unset["bf16 scattered"]), "reduce_scatter under the default"
        assert torch.equal(default_bf16["fp16 argument"], unset["fp16 argument"]), "the argument overrides the default"
        assert torch.equal(default_bf16["none argument"], unset["sum"]), "'none' turns the default off for one call"
        for name in ("max", "ints", "halves", "bf16"):  # where bfloat16 cannot apply: full precision, silently
            assert torch.equal(default_bf16[name], unset[name]), f"{name} under a bfloat16 default"

        default_e4m3 = under(" Float8_E4M3FN ")
        assert torch.equal(default_e4m3["bf16"], unset["bf16 in e4m3fn"]), "bfloat16 tensors under an e4m3fn default"
        _check(default_e4m3["bf16"], bf16, torch.float8_e4m3fn, "sum", twice=False, what="bfloat16 under e4m3fn")
        _differs(default_e4m3["bf16"], unset["bf16"], "bfloat16 under an e4m3fn default")
        for off in ("none", ""):
            results = under(off)
            assert all(torch.equal(results[name], unset[name]) for name in results), f"the default {off!r} is off"

        os.environ[ENV_VAR] = "float7"
        with symm_session():
            before = x.clone()
            expect_error(ValueError, lambda: symm.shmem_allreduce(x, low_precision_dtype=None),
                         f"`{ENV_VAR}` must be one of float16, bfloat16, float8_e4m3fn, float8_e5m2 or 'none', "
                         "but got 'float7'")
            assert torch.equal(x, before), "a bad default wrote into the tensor"
            # A call that gives its own dtype does not read the default.
            assert torch.equal(reduced(x, low_precision_dtype=torch.bfloat16), unset["bf16 argument"])


def _case_streams_and_non_finite() -> None:
    """On a non-default SHMEM stream the casts wait for it: the same bytes as on the default stream. A block with
    an inf arrives as NaN in fp8 (its scale is NaN), the other blocks as usual; float16 keeps the inf."""
    rank, n = dist.get_rank(), dist.get_world_size()
    count = 140_001  # two-shot, several pieces
    inputs = [_inputs(r, count, torch.float32, salt=5) for r in range(n)]
    with symm_session():
        symm.barrier()  # the runtime, for the stream
        for low in (torch.bfloat16, torch.float8_e5m2):
            default = inputs[rank].clone()
            symm.shmem_allreduce(default, low_precision_dtype=low)
            on_stream = inputs[rank].clone()
            scattered = torch.empty(count // n)
            stream = shmem.Stream()
            with shmem.stream(stream):
                symm.shmem_allreduce(on_stream, low_precision_dtype=low)
                symm.shmem_reduce_scatter(scattered, inputs[rank][:count // n * n], op="avg", low_precision_dtype=low)
            stream.synchronize()
            stream.destroy()
            assert torch.equal(on_stream, default), f"{low} on a stream differs from the default stream"
            parts = [t[rank * (count // n):(rank + 1) * (count // n)] for t in inputs]
            _check(scattered, parts, low, "avg", twice=False, what=f"reduce_scatter {low} on a stream")

        x = inputs[rank][:1000].clone()
        if rank == 0:
            x[300] = float("inf")  # block 2 (elements 256..383)
        fp8, half = x.clone(), x.clone()
        symm.shmem_allreduce(fp8, low_precision_dtype=torch.float8_e4m3fn)
        symm.shmem_allreduce(half, low_precision_dtype=torch.float16)
        assert fp8[256:384].isnan().all(), "the block of the inf is not NaN"
        assert not fp8[:256].isnan().any() and not fp8[384:].isnan().any(), "NaN beyond the inf's block"
        others = torch.cat([torch.arange(256), torch.arange(384, 1000)])
        _check(fp8[others], [t[:1000][others] for t in inputs], torch.float8_e4m3fn, "sum", twice=False,
               what="the finite blocks")
        assert half[300] == float("inf") and not half.isnan().any(), "float16 keeps the inf"


def _case_bad_arguments() -> None:
    """Every contract by its message, with nothing written and the ranks still in step afterwards."""
    n = dist.get_world_size()
    x = torch.full((10 * n,), 1.5)
    ints = torch.ones(10 * n, dtype=torch.int32)
    halves = torch.ones(10 * n, dtype=torch.float16)
    bf16 = torch.ones(10 * n, dtype=torch.bfloat16)
    out = torch.full((10,), 7.0)
    int_out = torch.zeros(10, dtype=torch.int32)
    names = "float16, bfloat16, float8_e4m3fn, float8_e5m2"
    cases = [
        (ValueError, lambda: symm.shmem_allreduce(ints, low_precision_dtype=torch.float16),
         "`low_precision_dtype` must be None for the integer dtype torch.int32 (low precision applies to "
         "floating-point tensors), but got float16"),
        (ValueError, lambda: symm.shmem_allreduce(x, op="max", low_precision_dtype=torch.bfloat16),
         "`low_precision_dtype` must be None for op 'max' (low precision applies to 'sum' and 'avg'), "
         "but got bfloat16"),
        (ValueError, lambda: symm.shmem_allreduce(halves, low_precision_dtype="float16"),
         "`low_precision_dtype` must be narrower than the tensor's dtype torch.float16 (2 bytes), "
         "but got float16"),
        (ValueError, lambda: symm.shmem_allreduce(bf16, low_precision_dtype=torch.float16),
         "`low_precision_dtype` must be narrower than the tensor's dtype torch.bfloat16 (2 bytes), "
         "but got float16"),
        (ValueError, lambda: symm.shmem_allreduce(x, low_precision_dtype=torch.int8),
         f"`low_precision_dtype` must be one of {names}, but got torch.int8"),
        (ValueError, lambda: symm.shmem_allreduce(x, low_precision_dtype="fp8"),
         f"`low_precision_dtype` must be one of {names} or 'none', but got 'fp8'"),
        (TypeError, lambda: symm.shmem_allreduce(x, low_precision_dtype=8),
         "`low_precision_dtype` must be a torch.dtype, its name or None, but got int"),
        (ValueError, lambda: symm.shmem_reduce_scatter(out, x, op="min", low_precision_dtype="bfloat16"),
         "`low_precision_dtype` must be None for op 'min'"),
        (ValueError, lambda: symm.shmem_reduce_scatter(int_out, ints, low_precision_dtype="float8_e5m2"),
         "`low_precision_dtype` must be None for the integer dtype torch.int32"),
        (TypeError, lambda: symm.shmem_reduce_scatter(out, x, low_precision_dtype=[torch.float16]),
         "`low_precision_dtype` must be a torch.dtype, its name or None, but got list"),
    ]
    with symm_session():
        for exc, call, message in cases:
            before = [t.clone() for t in (x, ints, halves, bf16, out)]
            expect_error(exc, call, message)
            for t, saved in zip((x, ints, halves, bf16, out), before):
                assert torch.equal(t, saved), f"{message}: a tensor was written"
        # Empty tensors: nothing to do, on every path.
        assert symm.shmem_allreduce(torch.empty(0), low_precision_dtype=torch.float8_e4m3fn).numel() == 0
        empty_out = torch.empty(0)
        assert symm.shmem_reduce_scatter(empty_out, torch.empty(0), low_precision_dtype="bfloat16") is empty_out
        # Still in step: a reduction every rank takes part in.
        symm.shmem_allreduce(x, low_precision_dtype=torch.bfloat16)
        assert torch.equal(x, torch.full((10 * n,), 1.5 * n)), "the ranks fell out of step"


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 4])
def test_every_low_dtype_within_the_documented_bound(world_factory, nranks: int) -> None:
    counts = COUNTS if nranks == 2 else COUNTS[:4] + [140_001]
    run_case(world_factory(nranks, _ENV), _case_bounds, LOWS, [torch.float32], counts, None, timeout=240)


def test_wider_and_narrower_tensors(world_factory) -> None:
    """float64 tensors with every low dtype; float16 and bfloat16 tensors with the fp8 ones (accumulated in
    float32, rounded once into the tensor)."""
    run_case(world_factory(2, _ENV), _case_bounds, LOWS, [torch.float64, torch.float16, torch.bfloat16],
             [7, 4099, 300_001], None, timeout=240)


def test_sub_groups(world_factory) -> None:
    """Two disjoint groups of two ranks at once, group-local ranks and slots."""
    run_case(world_factory(4, _ENV), _case_bounds, [torch.bfloat16, torch.float8_e4m3fn], [torch.float32],
             [1, 4099, 140_001], [[0, 2], [1, 3]], timeout=240)


def test_64_mib(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_large, 64 << 20, torch.float16, timeout=240)


def test_environment_default_and_override(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_environment)


def test_streams_and_non_finite_values(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_streams_and_non_finite)


@pytest.mark.parametrize("nranks", [2])
def test_bad_arguments_by_message(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_bad_arguments)
