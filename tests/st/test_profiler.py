"""Every collective, one-sided call and fused op of the library is a named range in a ``torch.profiler`` trace, as
gloo's collectives are: eagerly (the fast path, which skips torch's dispatcher, included), under
``torch.compile(fullgraph=True)``, and on the runtime face. Two real gloo ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import run_case
from symm_cases import symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "32M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}
_PREFIX = "hyper_parallel_shmem::"


def _ranges(prof: profile) -> set:
    return {event.name[len(_PREFIX):] for event in prof.events() if event.name.startswith(_PREFIX)}


def _case_user_api_eager() -> set:
    rank, n = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % n
    with symm_session() as empty:
        buf = empty((n, 64))
        signal = empty(n, torch.int32)
        signal.zero_()
        symm.barrier()
        plain = torch.ones(8)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            symm.shmem_allreduce(plain)                       # the fast path: a plain tensor, a team that exists
            symm.shmem_allgather(buf, torch.ones(64))
            symm.shmem_reduce_scatter(torch.empty(64), buf)
            symm.shmem_alltoall([buf[r] for r in range(n)], torch.empty(n * 64), [64] * n)
            symm.barrier()
            symm.shmem_put(buf, 0, torch.ones(64), 0, 64, peer)
            symm.shmem_get(torch.empty(64), 0, buf, 0, 64, peer)
            symm.shmem_put_with_signal(buf, 0, torch.ones(64), 0, 64, signal, rank, 1, 0, peer)
            symm.shmem_wait_for_signal(buf, signal, (rank - 1) % n, 1, 0)
            symm.shmem_signal_op(signal, 0, 0, 0, rank)
            if rank == 0:
                symm.shmem_send(torch.ones(4), 1)
            elif rank == 1:
                symm.shmem_recv(torch.empty(4), 0)
            a, b = torch.randn(4, 8), torch.randn(8, 6)
            gather_out = empty((4 * n, 8))
            symm.fused_all_gather_matmul(a, b, torch.empty(4 * n, 6), gather_out, signal)
            symm_tensor = empty((4 * n, 6))
            symm.fused_matmul_reduce_scatter(torch.randn(4 * n, 8), b, symm_tensor, signal)
            symm.barrier()
        return _ranges(prof)


def _case_compiled() -> set:
    with symm_session():
        def step(x: torch.Tensor) -> torch.Tensor:
            return symm.shmem_allreduce(x * 2) + 1

        compiled = torch.compile(step, fullgraph=True, backend="eager")
        compiled(torch.ones(8))   # traced outside the trace
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            compiled(torch.ones(8))
        torch._dynamo.reset()
        return _ranges(prof)


def _case_runtime_face() -> set:
    rank, n = dist.get_rank(), dist.get_world_size()
    with shmem.acquire_shmem():
        t = shmem.empty(16)
        sig = shmem.empty(1, dtype=torch.int64)
        sig.zero_()
        shmem.barrier()
        team = shmem.root_team()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            team.all_reduce(t)
            shmem.put(t, torch.ones(16), (rank + 1) % n)
            shmem.signal(sig, 1, (rank + 1) % n, op="add")
            shmem.wait_signal(sig, 1, cmp="ge")
            shmem.barrier()
        shmem.free(t)
        shmem.free(sig)
    return _ranges(prof)


def test_every_call_of_the_user_api_is_a_range_eagerly(world_factory) -> None:
    sender, receiver = run_case(world_factory(2, _ENV), _case_user_api_eager, timeout=120)
    for seen in (sender, receiver):
        # put_with_signal is one runtime operation, a range of its own.
        for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "put", "get",
                     "put_with_signal", "wait_signal", "signal", "fused_all_gather_matmul",
                     "fused_matmul_reduce_scatter"):
            assert name in seen, (name, sorted(seen))
    assert "send" in sender and "recv" in receiver, (sorted(sender), sorted(receiver))


def test_a_compiled_call_is_a_range(world_factory) -> None:
    for seen in run_case(world_factory(2, _ENV), _case_compiled, timeout=180):
        assert "all_reduce" in seen or "all_reduce_" in seen, sorted(seen)


def test_the_runtime_faces_calls_are_ranges(world_factory) -> None:
    for seen in run_case(world_factory(2, _ENV), _case_runtime_face, timeout=120):
        assert {"all_reduce", "put", "signal", "wait_signal", "barrier"} <= seen, sorted(seen)
