"""System tests of the user API's collectives against torch.distributed (gloo) on the same inputs.

Every collective runs on both paths (ordinary tensors staged through the workspace, and symmetric tensors on
the copy-free path) for float32, float16, bfloat16, int32 and int64, at 0, 1 and odd element counts, a count
that needs several staging pieces, and 64 MiB, on 1, 2, 3, 4 and 8 ranks.

References: gloo's result on the same inputs (bit-exact for integers and for max/min), and for float sums the
exact sum of the gathered inputs computed in float64 in one process: the inputs are multiples of 1/8 small
enough that the float32 accumulator is exact, so a result rounded once (fp16/bf16 accumulate in float32) equals
the float64 sum rounded to the dtype, bit for bit. Every rank's all-reduce result is compared with every other
rank's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from st_cases import run_case
from symm_cases import DTYPES, gathered, rank_input, symm_session

_RANKS = [1, 2, 3, 4, 8]
# 0, 1 and odd counts, then one that crosses the one-shot limit and several staging pieces (the staging area
# is 1 MiB per group with the 256 MiB heap below).
_COUNTS = [0, 1, 7, 4099, 700_001]
_LARGE_BYTES = 64 << 20
_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _env(nranks: int) -> dict:
    heap = "320M" if nranks <= 4 else "96M"
    return {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": heap, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}


# --------------------------------------------------------------------------
# Reference checks (run in the ranks).
# --------------------------------------------------------------------------


def _check_reduced(ours: torch.Tensor, inputs: list, op: str, what: str, gloo: bool = True) -> None:
    """``ours`` against the float64 reduction of the gathered inputs and (``gloo``) gloo's all_reduce of them."""
    stacked = torch.stack([t.to(torch.float64) for t in inputs])
    if op in ("sum", "avg"):
        exact = stacked.sum(0)
        if op == "avg":
            exact /= len(inputs)
    else:
        exact = stacked.amax(0) if op == "max" else stacked.amin(0)
    if ours.dtype.is_floating_point and op == "avg":
        torch.testing.assert_close(ours, exact.to(ours.dtype), msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(ours, exact.to(ours.dtype)), f"{what}: {(ours != exact.to(ours.dtype)).nonzero()[:5]}"
    if gloo and op != "avg":
        reference = inputs[dist.get_rank()].clone()
        dist.all_reduce(reference, op=_TORCH_OPS[op])
        if ours.dtype.is_floating_point and op == "sum":
            torch.testing.assert_close(ours, reference, msg=lambda m: f"{what} vs gloo: {m}")
        else:
            assert torch.equal(ours, reference), f"{what} vs gloo"


def _reductions(dtypes: list, counts: list, ops: list) -> Iterator[tuple]:
    """Every (dtype, count, op) to try: 'avg' only on floating-point dtypes."""
    for dtype in dtypes:
        for count in counts:
            for op in ops:
                if op != "avg" or dtype.is_floating_point:
                    yield dtype, count, op


def _same_everywhere(t: torch.Tensor, what: str) -> None:
    copies = gathered(t)
    for r, other in enumerate(copies):
        assert torch.equal(other.view(torch.uint8), copies[0].view(torch.uint8)), f"{what}: rank {r} differs"


# --------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------


def _case_allreduce(counts: list, dtypes: list, ops: list) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        for dtype, count, op in _reductions(dtypes, counts, ops):
            inputs = [rank_input(r, count, dtype) for r in range(world)]
            ordinary = inputs[rank].clone()
            assert symm.shmem_allreduce(ordinary, op=op) is ordinary
            _check_reduced(ordinary, inputs, op, f"ordinary {dtype} x{count} {op}")
            _same_everywhere(ordinary, f"ordinary {dtype} x{count} {op}")
            symmetric = empty(count, dtype)
            symmetric.copy_(inputs[rank])
            symm.shmem_allreduce(symmetric, op=op)
            assert torch.equal(symmetric, ordinary), f"symmetric {dtype} x{count} {op} differs from ordinary"
            empty.free(symmetric)


def _case_allgather(counts: list, dtypes: list) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        for dtype in dtypes:
            for count in counts:
                mine = rank_input(rank, count, dtype)
                reference = torch.cat(gathered(mine))
                out = torch.full((world * count,), 7, dtype=dtype)
                assert symm.shmem_allgather(out, mine) is out
                assert torch.equal(out, reference), f"ordinary {dtype} x{count}"
                sym_out = empty(world * count, dtype)
                symm.shmem_allgather(sym_out, mine)
                assert torch.equal(sym_out, reference), f"push {dtype} x{count}"
                sym_in = empty(count, dtype)
                sym_in.copy_(mine)
                out.fill_(7)
                symm.shmem_allgather(out, sym_in)
                assert torch.equal(out, reference), f"pull {dtype} x{count}"
                sym_out.fill_(7)
                sym_out[rank * count:(rank + 1) * count].copy_(mine)
                symm.shmem_allgather(sym_out, sym_out[rank * count:(rank + 1) * count])
                assert torch.equal(sym_out, reference), f"in place {dtype} x{count}"
                empty.free(sym_out)
                empty.free(sym_in)


def _case_reduce_scatter(counts: list, dtypes: list, ops: list) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        for dtype, count, op in _reductions(dtypes, counts, ops):
            inputs = [rank_input(r, world * count, dtype) for r in range(world)]
            parts = [t[rank * count:(rank + 1) * count] for t in inputs]
            out = torch.full((count,), 3, dtype=dtype)
            assert symm.shmem_reduce_scatter(out, inputs[rank], op=op) is out
            _check_reduced(out, parts, op, f"ordinary {dtype} x{count} {op}", gloo=False)
            if op != "avg":
                gloo_out = torch.empty_like(out)
                dist.reduce_scatter_tensor(gloo_out, inputs[rank].clone(), op=_TORCH_OPS[op])
                torch.testing.assert_close(out, gloo_out, rtol=0 if op != "sum" else None,
                                           atol=0 if op != "sum" else None)
            sym_in = empty(world * count, dtype)
            sym_in.copy_(inputs[rank])
            out2 = torch.full((count,), 3, dtype=dtype)
            symm.shmem_reduce_scatter(out2, sym_in, op=op)
            assert torch.equal(out2, out), f"symmetric {dtype} x{count} {op}"
            empty.free(sym_in)


def _case_alltoall(counts: list, dtypes: list) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()

    def split(i: int, j: int, base: int) -> int:  # elements rank i sends to rank j: uneven, some empty
        return 0 if base == 0 else base + (i * 3 + j * 5) % 7 - 3 if base > 3 else (i + j) % (base + 1)

    with symm_session() as empty:
        for dtype in dtypes:
            for base in counts:
                sends = [rank_input(rank, split(rank, j, base), dtype, salt=j) for j in range(world)]
                receive_list = [split(i, rank, base) for i in range(world)]
                expected = torch.cat([rank_input(i, split(i, rank, base), dtype, salt=rank) for i in range(world)])
                # gloo on the same inputs
                gloo_out = torch.empty(sum(receive_list), dtype=dtype)
                dist.all_to_all_single(gloo_out, torch.cat(sends), receive_list, [s.numel() for s in sends])
                assert torch.equal(gloo_out, expected)
                capacity = world * (base + 4) + 5  # the same on every rank: symmetric allocations must agree
                out = torch.full((capacity,), 9, dtype=dtype)
                assert symm.shmem_alltoall(sends, out, receive_list) is out
                assert torch.equal(out[:expected.numel()], expected), f"ordinary {dtype} base {base}"
                assert (out[expected.numel():] == 9).all(), "wrote past the received parts"
                sym_out = empty(capacity, dtype)
                sym_out.fill_(9)
                symm.shmem_alltoall(sends, sym_out, torch.tensor(receive_list))
                assert torch.equal(sym_out[:expected.numel()], expected), f"push {dtype} base {base}"
                empty.free(sym_out)


def _case_alltoall_in_place(counts: list, dtypes: list) -> None:
    """The send blocks are the blocks of the receive tensor: everywhere (pairwise swaps when it is symmetric), or
    on rank 0 only (staged then, since peers may not write into blocks rank 0 has yet to send)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        for dtype in dtypes:
            for per in counts:
                data = rank_input(rank, world * per, dtype)
                reference = torch.empty_like(data)
                dist.all_to_all_single(reference, data)
                for layout in ("symmetric", "ordinary", "rank 0 only"):
                    buffer = empty(world * per, dtype) if layout != "ordinary" else torch.empty(world * per, dtype=dtype)
                    other = empty(world * per, dtype)
                    buffer.copy_(data)
                    in_place = layout != "rank 0 only" or rank == 0
                    sends = list(buffer.split(per)) if in_place else [t.clone() for t in data.split(per)]
                    target = buffer if in_place else other
                    symm.shmem_alltoall(sends, target, [per] * world)
                    assert torch.equal(target, reference), f"{layout} {dtype} x{per}"
                    empty.free(other)
                    if layout != "ordinary":
                        empty.free(buffer)


def _case_different_symmetric_tensors(count: int) -> None:
    """Ranks pass different symmetric tensors (other heap offsets): peers must not address them; still right."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        first, second = empty(world * count, torch.float32), empty(world * count, torch.float32)
        mine = first if rank % 2 == 0 else second
        inputs = [rank_input(r, world * count, torch.float32) for r in range(world)]
        mine.copy_(inputs[rank])
        symm.shmem_allreduce(mine)
        _check_reduced(mine, inputs, "sum", "all_reduce")
        mine.copy_(inputs[rank])
        out = torch.empty(count)
        symm.shmem_reduce_scatter(out, mine)
        _check_reduced(out, [t[rank * count:(rank + 1) * count] for t in inputs], "sum", "reduce_scatter", gloo=False)
        symm.shmem_allgather(mine, out)
        assert torch.equal(mine, torch.cat(gathered(out))), "all_gather"


def _case_send_recv(counts: list, dtypes: list) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    with symm_session():
        symm.barrier()
        for dtype in dtypes:
            for count in counts:
                # Even ranks send first, odd ranks receive first: large messages (which wait for the receiver to
                # drain each piece) never wait in a cycle, for odd rings too (rank 0 sends before it receives).
                mine = rank_input(rank, count, dtype)
                got = torch.empty(count, dtype=dtype)
                if rank % 2 == 0:
                    symm.shmem_send(mine, right)
                    symm.shmem_recv(got, left)
                else:
                    symm.shmem_recv(got, left)
                    symm.shmem_send(mine, right)
                assert torch.equal(got, rank_input(left, count, dtype)), f"{dtype} x{count} from {left}"


def _case_large(nbytes: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    count = nbytes // 4
    with symm_session() as empty:
        inputs = [rank_input(r, count, torch.float32) for r in range(world)]
        t = inputs[rank].clone()
        symm.shmem_allreduce(t)
        _check_reduced(t, inputs, "sum", "64 MiB ordinary")
        sym = empty(count, torch.float32)
        sym.copy_(inputs[rank])
        symm.shmem_allreduce(sym)
        assert torch.equal(sym, t), "64 MiB symmetric differs from ordinary"
        part = count // world
        out = torch.empty(part)
        symm.shmem_reduce_scatter(out, inputs[rank][:part * world])
        assert torch.equal(out, t[rank * part:(rank + 1) * part]), "64 MiB reduce_scatter"
        gathered_out = empty(part * world, torch.float32)
        symm.shmem_allgather(gathered_out, out)
        assert torch.equal(gathered_out, t[:part * world]), "64 MiB all_gather"
        sends = list(inputs[rank][:part * world].chunk(world))
        received = torch.empty(part * world)
        symm.shmem_alltoall(sends, received, [part] * world)
        reference = torch.empty(part * world)
        dist.all_to_all_single(reference, inputs[rank][:part * world])
        assert torch.equal(received, reference), "64 MiB all_to_all"


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", [_case_allreduce, _case_reduce_scatter], ids=["allreduce", "reduce_scatter"])
@pytest.mark.parametrize("nranks", _RANKS)
def test_reductions_match_gloo(world_factory, nranks: int, case) -> None:
    counts = _COUNTS if nranks <= 4 else _COUNTS[:4]  # 8 ranks: the large count's pieces are covered at 4
    run_case(world_factory(nranks, _env(nranks)), case, counts, DTYPES, ["sum", "avg", "max", "min"], timeout=240)


@pytest.mark.parametrize("nranks", _RANKS)
def test_allgather_matches_gloo(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_allgather, _COUNTS, DTYPES, timeout=180)


@pytest.mark.parametrize("nranks", _RANKS)
def test_alltoall_matches_gloo(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_alltoall, [0, 1, 7, 4099, 300_001], DTYPES, timeout=180)


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_alltoall_in_place_matches_gloo(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_alltoall_in_place, [1, 4099, 300_001],
             [torch.float32, torch.bfloat16, torch.int64], timeout=180)


@pytest.mark.parametrize("nranks", [2, 3])
def test_different_symmetric_tensors_on_different_ranks(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_different_symmetric_tensors, 200_003)


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_send_recv_ring(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_send_recv, [0, 1, 7, 700_001], DTYPES, timeout=180)


@pytest.mark.parametrize("nranks", [2, 4])
def test_64_mib(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_large, _LARGE_BYTES, timeout=300)
