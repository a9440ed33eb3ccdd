"""System tests: ranks that do not all make the same collective call find out, on every rank, and stay usable.

The last rank of the group makes another call than the others: another collective (every ordered pair of
all_reduce, all_gather, reduce_scatter, all_to_all, barrier and the two fused ops), another element count (on the
one-step and the staged path), another dtype, another reduce op, or a low-precision default set in its environment
only. Every rank must raise ``ShmemMismatchError`` naming the differing field and both calls, every tensor the
calls could write must be unchanged, and the next matching call must return the right values, on WORLD and on a
sub-group, at 2 and 4 ranks.
"""

from __future__ import annotations

import itertools
import os
from typing import Callable, Optional

import pytest
import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import expect_error, restored_env, run_case
from symm_cases import symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}
_GARBAGE = -7.0
_N = 8  # elements per rank


class _Calls:
    """Every call of the matrix on one group, with buffers that start as garbage and are checked untouched."""

    def __init__(self, empty: Callable, group: Optional[dist.ProcessGroup]) -> None:
        self.group = group
        self.n = dist.get_world_size(group) if group is not None else dist.get_world_size()
        n = self.n
        self.buffers = {
            "tensor": torch.full((_N,), _GARBAGE),
            "gather_out": torch.full((n * _N,), _GARBAGE),
            "scatter_in": torch.full((n * _N,), _GARBAGE),
            "scatter_out": torch.full((_N,), _GARBAGE),
            "receive": torch.full((n * 2,), _GARBAGE),
            "a": torch.full((2, 4), 1.0),
            "b": torch.full((4, 3), 1.0),
            "c": torch.full((2 * n, 3), _GARBAGE),
            "x1": torch.full((2 * n, 4), 1.0),
            "x2": torch.full((4, 3), 1.0),
        }
        self.gather_symm = empty((2 * n, 4))
        self.gather_symm.fill_(_GARBAGE)
        self.signal = empty((n,), torch.int64)
        self.signal.zero_()
        self.product = empty((2 * n, 3))
        self.product.fill_(_GARBAGE)
        self.snapshot = {k: v.clone() for k, v in self.buffers.items()}
        self.snapshot["gather_symm"] = self.gather_symm.clone()

    def run(self, name: str):
        b, g, n = self.buffers, self.group, self.n
        calls = {
            "all_reduce": lambda: symm.shmem_allreduce(b["tensor"], group=g),
            "all_gather": lambda: symm.shmem_allgather(b["gather_out"], b["tensor"], group=g),
            "reduce_scatter": lambda: symm.shmem_reduce_scatter(b["scatter_out"], b["scatter_in"], group=g),
            "all_to_all": lambda: symm.shmem_alltoall([b["tensor"][:2]] * n, b["receive"], [2] * n, group=g),
            "barrier": lambda: symm.barrier(g),
            "fused_all_gather_matmul": lambda: symm.fused_all_gather_matmul(
                b["a"], b["b"], b["c"], self.gather_symm, self.signal, group=g),
            "fused_matmul_reduce_scatter": lambda: symm.fused_matmul_reduce_scatter(
                b["x1"], b["x2"], self.product, self.signal, group=g),
        }
        return calls[name]()

    def unchanged(self, what: str) -> None:
        for key, value in self.buffers.items():
            assert torch.equal(value, self.snapshot[key]), (what, key, value)
        assert torch.equal(self.gather_symm, self.snapshot["gather_symm"]), (what, "gather_out")

    def still_in_step(self, what: str) -> None:
        """A matching call works on every rank and returns the right values."""
        value = torch.full((4,), float(dist.get_rank() + 1))
        symm.shmem_allreduce(value, group=self.group)
        ranks = dist.get_process_group_ranks(self.group) if self.group is not None else range(dist.get_world_size())
        assert value.tolist() == [float(sum(r + 1 for r in ranks))] * 4, (what, value)


_COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "fused_all_gather_matmul",
                "fused_matmul_reduce_scatter"]


def _group_for(kind: str) -> Optional[dist.ProcessGroup]:
    if kind == "world":
        return None
    world = dist.get_world_size()
    # Every rank makes both halves' groups (new_group is collective over WORLD); a rank uses its own half.
    halves = [dist.new_group(list(range(0, world // 2))), dist.new_group(list(range(world // 2, world)))]
    return halves[0] if dist.get_rank() < world // 2 else halves[1]


def _case_collective_pairs(kind: str) -> None:
    with symm_session() as empty:
        group = _group_for(kind)
        calls = _Calls(empty, group)
        me = dist.get_rank(group) if group is not None else dist.get_rank()
        odd = me == calls.n - 1
        for first, second in itertools.permutations(_COLLECTIVES, 2):
            what = f"{first} vs {second}"
            expect_error(shmem.ShmemMismatchError, lambda: calls.run(second if odd else first),
                         "ranks disagree on a collective (collective)", f"calls collective={first} ",
                         f"calls collective={second} ")
            calls.unchanged(what)
            calls.still_in_step(what)


def _case_arguments(kind: str) -> None:
    with symm_session():
        group = _group_for(kind)
        n = dist.get_world_size(group) if group is not None else dist.get_world_size()
        me = dist.get_rank(group) if group is not None else dist.get_rank()
        odd = me == n - 1
        cases = [
            # (what, field, the others' call, the last rank's call, the tensors to check)
            ("all_reduce count", "count", lambda t: symm.shmem_allreduce(t[:8], group=group),
             lambda t: symm.shmem_allreduce(t[:16], group=group)),
            ("all_reduce one step vs staged", "count", lambda t: symm.shmem_allreduce(t[:8], group=group),
             lambda t: symm.shmem_allreduce(t, group=group)),
            ("all_reduce dtype", "dtype", lambda t: symm.shmem_allreduce(t[:8], group=group),
             lambda t: symm.shmem_allreduce(t[:8].view(torch.int32), group=group)),
            ("all_reduce float64", "dtype", lambda t: symm.shmem_allreduce(t[:16].view(torch.float64), group=group),
             lambda t: symm.shmem_allreduce(t[:16].view(torch.int64), group=group)),
            ("all_reduce op", "op", lambda t: symm.shmem_allreduce(t[:8], op="sum", group=group),
             lambda t: symm.shmem_allreduce(t[:8], op="max", group=group)),
            ("reduce_scatter op", "op",
             lambda t: symm.shmem_reduce_scatter(t[:2], t[2:2 + 2 * n], op="sum", group=group),
             lambda t: symm.shmem_reduce_scatter(t[:2], t[2:2 + 2 * n], op="min", group=group)),
            ("all_gather count", "count", lambda t: symm.shmem_allgather(t[:n], t[n:n + 1], group=group),
             lambda t: symm.shmem_allgather(t[:2 * n], t[2 * n:2 * n + 2], group=group)),
            ("all_gather dtype", "dtype", lambda t: symm.shmem_allgather(t[:n], t[n:n + 1], group=group),
             lambda t: symm.shmem_allgather(t[:n].view(torch.int32), t[n:n + 1].view(torch.int32), group=group)),
            ("low precision", "wire",
             lambda t: symm.shmem_allreduce(t[:256], group=group, low_precision_dtype="none"),
             lambda t: symm.shmem_allreduce(t[:256], group=group, low_precision_dtype=torch.bfloat16)),
        ]
        for what, field, common, other in cases:
            data = torch.full((100_000,), _GARBAGE)
            expect_error(shmem.ShmemMismatchError, lambda: (other if odd else common)(data),
                         f"ranks disagree on a collective ({field})")
            assert torch.equal(data, torch.full_like(data, _GARBAGE)), what
            value = torch.full((4,), 1.0)
            symm.shmem_allreduce(value, group=group)
            assert value.tolist() == [float(n)] * 4, (what, value)


def _case_low_precision_default_on_one_rank() -> None:
    """SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE set on the last rank only: its all_reduce travels in bfloat16, the
    others' in full precision; every rank finds out, and an explicit choice on every rank works."""
    world = dist.get_world_size()
    with restored_env("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"):
        if dist.get_rank() == world - 1:
            os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"] = "bfloat16"
        else:
            os.environ.pop("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", None)
        with symm_session():
            grads = torch.full((1024,), 0.5)
            expect_error(shmem.ShmemMismatchError, lambda: symm.shmem_allreduce(grads),
                         "ranks disagree on a collective (wire)", "wire=full", "wire=bfloat16")
            assert torch.equal(grads, torch.full_like(grads, 0.5))
            symm.shmem_allreduce(grads, low_precision_dtype="none")
            assert torch.equal(grads, torch.full_like(grads, 0.5 * world))


# (ranks, group): a sub-group is half of the world, so it needs 4 ranks to hold two.
_LAYOUTS = [(2, "world"), (4, "world"), (4, "sub-group")]


@pytest.mark.parametrize("nranks,kind", _LAYOUTS, ids=[f"{n}-{k}" for n, k in _LAYOUTS])
def test_every_pair_of_collectives_is_caught_on_every_rank(world_factory, nranks: int, kind: str) -> None:
    run_case(world_factory(nranks, _ENV), _case_collective_pairs, kind, timeout=240)


@pytest.mark.parametrize("nranks,kind", _LAYOUTS, ids=[f"{n}-{k}" for n, k in _LAYOUTS])
def test_counts_dtypes_ops_and_wire_formats_are_caught(world_factory, nranks: int, kind: str) -> None:
    run_case(world_factory(nranks, _ENV), _case_arguments, kind, timeout=240)


@pytest.mark.parametrize("nranks", [2, 4])
def test_a_low_precision_default_on_one_rank_is_caught(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_low_precision_default_on_one_rank, timeout=120)
