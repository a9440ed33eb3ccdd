"""A user's script as a type checker reads it: `mypy --strict` must accept it and find every public function typed
(tests/unit/test_typing.py runs it; nothing here runs)."""

from __future__ import annotations

from typing import Any, assert_type

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem


def user_api(group: dist.ProcessGroup) -> None:
    buf = symm.empty((2, 1024), torch.bfloat16)
    assert_type(buf, torch.Tensor)
    signal = symm.empty(1, dtype=torch.int32)
    symm.barrier(group=group)
    symm.shmem_put(buf, 0, torch.ones(1024, dtype=torch.bfloat16), 0, 1024, target_rank=1)
    symm.shmem_get(buf, torch.tensor(0), buf, 0, 1024, 1, group=group)
    symm.shmem_signal_op(signal, 0, 1, 0, 1)
    symm.shmem_wait_for_signal(buf, signal, 0, 1, 0)
    symm.shmem_put_with_signal(buf, 0, buf, 0, 16, signal, 0, 1, 0, target_rank=1, group=group)
    assert_type(symm.shmem_allreduce(buf, op="avg", group=group, low_precision_dtype=torch.float16), torch.Tensor)
    assert_type(symm.shmem_allgather(buf, buf[0]), torch.Tensor)
    assert_type(symm.shmem_reduce_scatter(buf[0], buf, "sum", group), torch.Tensor)
    assert_type(symm.shmem_alltoall([buf[0], buf[1]], buf, [512, 512]), torch.Tensor)
    assert_type(symm.shmem_send(buf, 1), torch.Tensor | None)
    assert_type(symm.shmem_recv(buf, 0), torch.Tensor)
    gathered, product = symm.fused_all_gather_matmul(buf, buf, buf, buf, signal, group=group)
    assert_type(gathered, torch.Tensor)
    assert_type(symm.fused_matmul_reduce_scatter(buf, buf, buf, signal), torch.Tensor)
    handle = symm.rendezvous(buf, group)
    assert_type(handle.get_buffer(1, (1024,), torch.bfloat16), torch.Tensor)
    assert_type(handle.rank, int)
    assert_type(symm.is_shmem_available(), bool)
    assert_type(symm.debug_state(), dict[str, Any])
    symm.free(buf)
    symm.free(signal)
    symm.shutdown()


def runtime_face() -> None:
    with shmem.acquire_shmem() as handle:
        assert_type(handle, shmem.Handle)
        t = shmem.empty(4, dtype=torch.float32)
        assert_type(t, torch.Tensor)
        shmem.put(t, torch.zeros(4), 1)
        shmem.get(t, t, 1)
        shmem.signal(t, 1, 1, op="add")
        shmem.barrier()
        assert_type(shmem.peer_tensor(t, 1), torch.Tensor)
        team = shmem.Team(None)
        team.all_reduce(t, op="sum")
        team.all_gather(t, t)
        shmem.free(t)
