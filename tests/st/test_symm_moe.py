"""System tests of the user API's MoE dispatch and combine on torch, beyond the shared cases
(``tests/shared/symm_api_cases.py``: layouts, sub-groups, the too-small buffer, bad arguments, low precision,
gradients, on both frameworks): a dispatch, expert, combine step under ``torch.compile(fullgraph=True)`` (eager and
aot_eager backends, forward and backward) against eager, and round trips over random splits drawn by hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore.errors import ShmemStateError
from hyper_parallel.core.multicore.shmem import codec
from st_cases import run_case
from symm_cases import symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}
_EXPERTS, _HIDDEN, _CAPACITY, _ALIGN = 2, 4, 48, 2


def _step(x: torch.Tensor, splits: torch.Tensor, weight: torch.Tensor, group, wire=None) -> torch.Tensor:
    """Dispatch (its rows in the wire format ``wire``, or in full precision), an expert's elementwise work, combine
    back: the loss of this rank's tokens."""
    n = dist.get_world_size(group)
    table = torch.zeros((2, n * _EXPERTS), dtype=torch.int64)
    routed = symm.shmem_moe_dispatch(torch.zeros((_CAPACITY, _HIDDEN)), x, splits, table, group=group,
                                     major_align=_ALIGN, low_precision_dtype=wire)
    worked = torch.tanh(routed * weight)
    back = symm.shmem_moe_combine(torch.zeros_like(x), worked, table, torch.zeros_like(table), group=group,
                                  major_align=_ALIGN)
    return (back * back).sum() + routed.sum() / 4


def _case_compiled_step_matches_eager(backends: list) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    splits_list = [(rank + 2 * p + e) % 4 for p in range(n) for e in range(_EXPERTS)]
    rows = sum(splits_list)
    generator = torch.Generator().manual_seed(31 + rank)
    x = torch.randn((rows + 3, _HIDDEN), generator=generator)
    splits = torch.tensor(splits_list, dtype=torch.int64)
    weight = torch.randn((_CAPACITY, _HIDDEN), generator=generator)
    with symm_session():
        with torch.no_grad():
            eager = _step(x, splits, weight, None)
        leaf = x.clone().requires_grad_()
        eager_loss = _step(leaf, splits, weight, None)
        eager_loss.backward()
        for backend in backends:
            torch._dynamo.reset()
            compiled = torch.compile(_step, fullgraph=True, backend=backend)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x, splits, weight, None), eager, rtol=0, atol=0)
            leaf2 = x.clone().requires_grad_()
            loss = compiled(leaf2, splits, weight, None)
            loss.backward()
            torch.testing.assert_close(loss.detach(), eager_loss.detach(), rtol=0, atol=0)
            torch.testing.assert_close(leaf2.grad, leaf.grad, rtol=0, atol=0)
            # the rows past the routed ones were sent nowhere: no gradient but the plain one
            assert torch.equal(leaf2.grad[rows:], torch.zeros(3, _HIDDEN)), backend
        # fp8 rows: the compiled op calls the runtime's row codec as eager does, to the same bits
        torch._dynamo.reset()
        with torch.no_grad():
            eager_fp8 = _step(x, splits, weight, None, "float8_e4m3fn")
            compiled = torch.compile(_step, fullgraph=True, backend="eager")
            torch.testing.assert_close(compiled(x, splits, weight, None, "float8_e4m3fn"), eager_fp8, rtol=0, atol=0)
        assert not torch.equal(eager_fp8, eager)   # the rows did travel in fp8
        torch._dynamo.reset()


def test_compiled_moe_step_matches_eager(world_factory) -> None:
    run_case(world_factory(2, env=_ENV), _case_compiled_step_matches_eager, ["eager", "aot_eager"], timeout=300)


def _case_device_row_codec() -> None:
    """The row codec that low-precision MoE runs on the runtime's device, on the current stream
    (``codec.encode_rows_on_device``): on the host device the host codec's bytes and values, bit for bit, in every
    format; bad tensors refused by name with nothing written; no runtime, no codec on the device."""
    generator = torch.Generator().manual_seed(5 + dist.get_rank())
    with symm_session() as empty:
        empty((1,))   # the runtime starts with the API's first allocation
        for name in ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
            for dtype in (torch.float32, torch.float64, torch.bfloat16):
                if dtype == torch.bfloat16 and not name.startswith("float8"):
                    continue   # not wider than the format: the user API refuses it before the codec
                x = (torch.randn((7, 3, 45), generator=generator) * 300).to(dtype)
                want = codec.encode_rows(x, name)
                wire = torch.full_like(want, 0xAB)
                codec.encode_rows_on_device(x, wire, name)
                assert torch.equal(wire, want), (name, dtype)
                back = torch.empty_like(x)
                assert codec.decode_rows_on_device(wire, name, back) is back
                assert torch.equal(back.view(torch.uint8), codec.decode_rows(want, name, torch.empty_like(x))
                                   .view(torch.uint8)), (name, dtype)
        x = torch.ones((2, 4))
        wire = torch.zeros((2, 8), dtype=torch.uint8)
        with pytest.raises(TypeError, match=r"`dst` must have dtype torch.uint8, but got torch.int16"):
            codec.encode_rows_on_device(x, wire.view(torch.int16), "float16")
        with pytest.raises(ValueError, match=r"`dst` must have 16 bytes \(2 rows of `src` in float16\), but got 8"):
            codec.encode_rows_on_device(x, wire[:1], "float16")
        with pytest.raises(ValueError, match=r"`format` must be one of .*, but got int8"):
            codec.encode_rows_on_device(x, wire, "int8")
        with pytest.raises(ValueError, match=r"`dtype` must be a floating-point dtype wider than float16, but got "
                                             r"bfloat16"):
            codec.encode_rows_on_device(x.bfloat16(), wire, "float16")
        assert torch.equal(wire, torch.zeros((2, 8), dtype=torch.uint8))
    with pytest.raises(ShmemStateError, match=r"shmem runtime is not initialised: op=encode_rows"):
        codec.encode_rows_on_device(x, wire, "float16")


def test_device_row_codec_is_the_host_codec_on_the_host_device(world_factory) -> None:
    run_case(world_factory(2, env=_ENV), _case_device_row_codec, timeout=120)


def _case_round_trips(tables: list, align: int) -> None:
    """For each table (world x world*E splits: row = source), dispatch then combine on symmetric and ordinary
    tensors; every token comes back and lands where the numpy layout says."""
    rank, n = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        for k, table in enumerate(tables):
            table = np.array(table, np.int64).reshape(n, n * _EXPERTS)
            rows = int(table[rank].sum())
            x = torch.arange(rows * _HIDDEN, dtype=torch.float32).view(rows, _HIDDEN) + 1000 * rank
            # the numpy layout of this rank's output
            starts = np.cumsum(table, axis=1) - table   # where each source's chunks start in its input
            chunks, at = [], 0
            for e in range(_EXPERTS):
                region = at
                for s in range(n):
                    split = int(table[s, rank * _EXPERTS + e])
                    chunks.append((at, s, int(starts[s, rank * _EXPERTS + e]), split))
                    at += split
                at = region + max(-(-(at - region) // align) * align, align)
            capacity = n * n * _EXPERTS * 3 + _EXPERTS * align
            for symmetric in (False, True):
                out = empty((capacity, _HIDDEN)) if symmetric else torch.zeros((capacity, _HIDDEN))
                layout = torch.zeros((2, n * _EXPERTS), dtype=torch.int64)
                symm.shmem_moe_dispatch(out, x, torch.from_numpy(table[rank].copy()), layout, major_align=align)
                for i, (offset, s, start, split) in enumerate(chunks):
                    assert int(layout[0, i]) == split and int(layout[1, i]) == offset, (k, i, layout)
                    want = torch.arange(start * _HIDDEN, (start + split) * _HIDDEN, dtype=torch.float32)
                    assert torch.equal(out[offset:offset + split].reshape(-1), want + 1000 * s), (k, i)
                back = torch.full_like(x, -1)
                symm.shmem_moe_combine(back, out, layout, torch.zeros_like(layout))
                assert torch.equal(back, x), (k, symmetric)
                if symmetric:
                    symm.barrier()
                    empty.free(out)


# Each example is a run of the ranks: no shrinking (a failure reports its tables as drawn).
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("nranks", [2, 4])
def test_random_splits_round_trip(world_factory, nranks: int, data) -> None:
    width = nranks * nranks * _EXPERTS
    tables = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=width, max_size=width), min_size=1,
                                max_size=3))
    align = data.draw(st.sampled_from([1, 2, 4]))
    run_case(world_factory(nranks, env=_ENV), _case_round_trips, tables, align, timeout=120)
