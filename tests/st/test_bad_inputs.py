"""Property sweeps of the user API's argument checks with hypothesis, on real ranks.

Every call, good or bad, must either raise ValueError, TypeError or a ShmemError and leave every byte as it was,
or succeed and write exactly the addressed bytes with the right values. Nothing else: no other exception, no
write beside the range, no crash.

* one-sided calls: each rank sweeps on its own, addressing only itself (or ranks that do not exist), so that
  the ranks' sweeps never touch each other's memory;
* collectives: every rank draws the same calls (derandomized hypothesis, identical outcomes on every rank), as
  a collective needs; inputs are small integers, so every result is exact in every dtype, low precision included.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import run_case
from symm_cases import symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}
_REFUSALS = (ValueError, TypeError, shmem.ShmemError)
_SENTINEL = -7
_SETTINGS = settings(max_examples=250, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))

# Offsets and sizes: mostly small valid counts (so that many calls go through), then ints around the valid range,
# huge ones, one-element tensors, and things that are not counts at all.
_COUNTS = st.one_of(
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(-2, 10),
    st.integers(0, 8).map(lambda v: torch.tensor([v])),
    st.sampled_from([2**31, 2**63 - 1, 2**64, torch.tensor([1, 2]), torch.tensor([1.0]), torch.tensor(True), 0.5,
                     "1", None, True]),
)
_RANKS_OF_NOBODY = st.sampled_from([-1, 2**40, 1.0, "0", None, torch.tensor([0, 0])])


def _as_int(value) -> int:
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_one_sided_sweep() -> dict:
    rank = dist.get_rank()
    with symm_session() as empty:
        heap = empty((16,), torch.float32)
        heap_int = empty((16,), torch.int32)
        signals = empty((4,), torch.int64)
        local = torch.empty(16)
        source = torch.empty(16)
        buffers = {"heap": heap, "heap_int": heap_int, "signals": signals, "local": local, "source": source}

        def reset() -> dict:
            """Numbers every buffer anew and returns a copy of them all."""
            for offset, t in enumerate(buffers.values()):
                t.copy_(torch.arange(t.numel()) + 100 * offset)
            return {name: t.clone() for name, t in buffers.items()}

        def check(call, initial: dict, target: str, start, values) -> None:
            """Runs ``call``: refused, every buffer is as it was; done, ``values`` are at ``start`` of ``target``
            and every other byte is as it was."""
            try:
                call()
                outcomes["done"] += 1
            except _REFUSALS:
                values = None
                outcomes["refused"] += 1
            for name, buffer in buffers.items():
                expected = initial[name].clone()
                if name == target and values is not None:
                    expected[start:start + values.numel()] = values.to(expected.dtype)
                assert torch.equal(buffer, expected), (name, buffer, expected)

        def addressed(tensor: torch.Tensor, target_offset, first, count) -> tuple:
            """(target_offset, tensor[first:first + count]) when all three are counts, else (0, None): the call
            must refuse."""
            try:
                target_offset, first, count = _as_int(target_offset), _as_int(first), _as_int(count)
            except (TypeError, ValueError, RuntimeError):
                return 0, None
            return target_offset, tensor[first:first + count].clone()

        # (name of the buffer, the tensor handed over, where it starts in that buffer); views start inside
        # their buffers, so that a write before or after them shows.
        symmetric = st.sampled_from([("heap", heap, 0), ("heap", heap[3:11], 3), ("heap", heap, 0),
                                     ("heap", heap[3:11], 3), ("heap_int", heap_int, 0), ("heap", heap[::2], 0),
                                     ("local", local, 0)])
        ordinary_src = st.sampled_from([("local", local, 0), ("local", local[2:], 2), ("source", source, 0),
                                        ("source", source, 0), ("copy", source.double(), 0), ("heap", heap, 0),
                                        ("local", local[::2], 0)])
        ordinary_dst = st.sampled_from([("local", local, 0), ("local", local[2:], 2), ("local", local, 0),
                                        ("heap", heap, 0), ("local", local[::2], 0),
                                        ("copy", torch.empty(16, dtype=torch.float64), 0)])
        ranks = st.one_of(st.just(rank), st.just(rank), _RANKS_OF_NOBODY)
        outcomes = {"refused": 0, "done": 0}

        def transfer(call, target, target_offset, src, src_offset, size, target_rank) -> None:
            """``call`` (shmem_put or shmem_get) writes ``src[src_offset:+size]`` at ``target_offset`` of
            ``target``, or refuses."""
            initial = reset()
            (target_name, target_tensor, target_start), (_, src_tensor, _) = target, src
            offset, values = addressed(src_tensor, target_offset, src_offset, size)
            check(lambda: call(target_tensor, target_offset, src_tensor, src_offset, size, target_rank),
                  initial, target_name, target_start + offset, values)

        @_SETTINGS
        @given(target=symmetric, target_offset=_COUNTS, src=ordinary_src, src_offset=_COUNTS, size=_COUNTS,
               target_rank=ranks)
        def put(**arguments) -> None:
            transfer(symm.shmem_put, **arguments)

        @_SETTINGS
        @given(target=ordinary_dst, target_offset=_COUNTS, src=symmetric, src_offset=_COUNTS, size=_COUNTS,
               target_rank=ranks)
        def get(**arguments) -> None:
            transfer(symm.shmem_get, **arguments)

        @_SETTINGS
        @given(signal_offset=_COUNTS, value=_COUNTS, op=st.sampled_from([0, 1, 2, -1, "set", None, 1.0]),
               target_rank=ranks)
        def signal_op(signal_offset, value, op, target_rank) -> None:
            initial = reset()
            values, offset = None, 0
            try:
                offset, amount = _as_int(signal_offset), _as_int(value)
                before = int(initial["signals"][offset]) if 0 <= offset < signals.numel() else 0
                # An add wraps around like every atomic add; a value outside int64 must be refused.
                wrapped = (before + amount + 2**63) % 2**64 - 2**63
                values = torch.tensor([amount if op == 0 else wrapped]) if -2**63 <= amount < 2**63 else None
            except (TypeError, ValueError, RuntimeError, OverflowError):
                values = None
            check(lambda: symm.shmem_signal_op(signals, signal_offset, value, op, target_rank), initial, "signals",
                  offset, values)

        put()
        get()
        signal_op()
        symm.barrier()
        return outcomes


def _case_collective_sweep() -> dict:
    n = dist.get_world_size()
    with symm_session() as empty:
        pad = 3
        symmetric = empty((2 * pad + 10 * n,), torch.float32)
        outcomes = {"refused": 0, "done": 0}
        dtypes = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64,
                                  torch.complex64, torch.bool, torch.uint8])
        ops = st.sampled_from(["sum", "avg", "max", "min", "prod", "SUM", 3, None])
        low = st.sampled_from([None, None, "none", torch.float16, torch.bfloat16, "float8_e4m3fn", torch.int8, "x"])

        def pattern(numel: int, dtype: torch.dtype) -> torch.Tensor:
            return (torch.arange(numel) % 4 + 1).to(dtype)

        def framed(numel: int, dtype: torch.dtype, on_heap: bool) -> tuple:
            """(whole buffer, the view handed to the call): sentinels before and after the view."""
            if on_heap and dtype == torch.float32:
                whole = symmetric[:2 * pad + numel]
            else:
                whole = torch.empty(2 * pad + numel, dtype=dtype)
            whole.fill_(_SENTINEL if dtype != torch.bool else True)
            return whole, whole[pad:pad + numel]

        def run(call, buffers: list, expected: list) -> bool:
            """Runs a collective; checks what each framed buffer must hold. Returns whether it was refused."""
            before = [whole.clone() for whole, _ in buffers]
            try:
                call()
                refused = False
            except _REFUSALS:
                refused = True
            outcomes["refused" if refused else "done"] += 1
            for (whole, _), kept, want in zip(buffers, before, expected):
                if refused or want is None:
                    assert torch.equal(whole, kept), (whole, kept)
                else:
                    assert torch.equal(whole[:pad], kept[:pad]) and torch.equal(whole[-pad:], kept[-pad:]), whole
                    assert torch.equal(whole[pad:-pad], want), (whole[pad:-pad], want)
            return refused

        @_SETTINGS
        @given(kind=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]), dtype=dtypes,
               numel=st.integers(0, 10), op=ops, low_precision=low, on_heap=st.booleans(),
               extra=st.sampled_from([0, 0, 1, -1]))
        def collective(kind, dtype, numel, op, low_precision, on_heap, extra) -> None:
            symm.barrier()  # every rank has checked the last example before anyone reuses the heap
            if kind == "all_reduce":
                buffer = framed(numel, dtype, on_heap)
                buffer[1].copy_(pattern(numel, dtype)) if dtype != torch.bool else None
                kwargs = {} if op is None else {"op": op}
                if low_precision is not None:
                    kwargs["low_precision_dtype"] = low_precision
                x = pattern(numel, dtype)
                want = x * n if op in (None, "sum") else x
                run(lambda: symm.shmem_allreduce(buffer[1], **kwargs), [buffer], [want])
            elif kind == "all_gather":
                source = framed(numel, dtype, False)
                source[1].copy_(pattern(numel, dtype)) if dtype != torch.bool else None
                output = framed(max(numel * n + extra, 0), dtype, on_heap)
                want = pattern(numel, dtype).repeat(n)
                run(lambda: symm.shmem_allgather(output[1], source[1]), [source, output],
                    [None, want if extra == 0 else None])
            else:
                source = framed(numel * n, dtype, on_heap)
                source[1].copy_(pattern(numel * n, dtype)) if dtype != torch.bool else None
                output = framed(max(numel + extra, 0), dtype, False)
                kwargs = {} if op is None else {"op": op}
                if low_precision is not None:
                    kwargs["low_precision_dtype"] = low_precision
                part = pattern(numel * n, dtype)[dist.get_rank() * numel:(dist.get_rank() + 1) * numel]
                want = part * n if op in (None, "sum") else part
                run(lambda: symm.shmem_reduce_scatter(output[1], source[1], **kwargs), [source, output],
                    [None, want if extra == 0 else None])

        collective()
        return outcomes


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


def test_one_sided_calls_refuse_bad_arguments_cleanly_or_write_exactly_their_range(world_factory) -> None:
    for outcomes in run_case(world_factory(2, _ENV), _case_one_sided_sweep, timeout=600):
        # Three sweeps of 250 calls, and both outcomes well represented: the sweep is not all refusals.
        assert outcomes["refused"] + outcomes["done"] == 3 * 250, outcomes
        assert min(outcomes.values()) >= 75, outcomes


def test_collectives_refuse_bad_arguments_cleanly_or_write_exactly_their_result(world_factory) -> None:
    first, second = run_case(world_factory(2, _ENV), _case_collective_sweep, timeout=600)
    assert first == second, (first, second)  # every rank made the same calls with the same outcomes
    assert first["refused"] + first["done"] == 250 and min(first.values()) >= 40, first
