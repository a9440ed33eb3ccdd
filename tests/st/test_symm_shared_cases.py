"""The shared user-API cases (``tests/shared/symm_api_cases.py``) on torch: every case on 2 and 4 real ranks
(gloo groups), the same cases that ``tests/on_mindspore`` runs on MindSpore.

The 2-rank world sizes its heap with the runtime's variable, the 4-rank world with the user API's alias
(SYMMETRIC_MEMORY_HEAP_SIZE); every case must leave no allocation behind, and the runtime is shut down after each.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from st_cases import assert_clean, run_case

_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared")
if _SHARED not in sys.path:
    sys.path.insert(0, _SHARED)

import symm_api_cases  # noqa: E402
from symm_fw_torch import TorchFramework  # noqa: E402

# Every wait gives up after 15 s (the signal case waits that long once; 2 cores may be shared).
_TIMEOUT = {"HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "15"}
_ENV = {2: {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", **_TIMEOUT}, 4: {"SYMMETRIC_MEMORY_HEAP_SIZE": "32M", **_TIMEOUT}}


def _case(name: str) -> None:
    """Runs shared case ``name`` on this rank, from and back to an uninitialised runtime."""
    assert_clean()
    dist.barrier()
    failed = True
    try:
        symm_api_cases.run(TorchFramework(), name)
        failed = False
    finally:
        if not failed:   # after a failure the world is replaced: no collective clean-up
            dist.barrier()
            symm.shutdown()
            assert_clean()


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("name", list(symm_api_cases.CASES))
def test_shared_case(world_factory, nranks: int, name: str) -> None:
    run_case(world_factory(nranks, env=_ENV[nranks]), _case, name, timeout=120)
