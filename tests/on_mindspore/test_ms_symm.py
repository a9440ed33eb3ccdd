"""The user API on MindSpore, on 2 and 4 real ranks (msrun, mccl on CPU), host device.

One msrun job per rank count runs every case of ms_cases.py (MindSpore's start-up costs seconds): every shared case
of tests/shared/symm_api_cases.py (torch runs the same ones in tests/st/test_symm_shared_cases.py), then the cases
only MindSpore has. Each test checks every rank's record of one case.
"""

from __future__ import annotations

import os
import sys

import pytest

import ms_job

_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared")
if _SHARED not in sys.path:
    sys.path.insert(0, _SHARED)

import symm_api_cases  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "5"}
RANKS = (2, 4)
# The 4-rank job sizes its heap with the user API's alias (SYMMETRIC_MEMORY_HEAP_SIZE) instead of the runtime's
# variable (the shared case heap_size_from_the_environment checks either).
_HEAP = {2: ("HYPER_PARALLEL_SHMEM_HEAP_SIZE", 64 << 20), 4: ("SYMMETRIC_MEMORY_HEAP_SIZE", 32 << 20)}


@pytest.fixture(scope="module", params=RANKS, ids=[f"{n}ranks" for n in RANKS])
def job(request):
    nranks = request.param
    variable, size = _HEAP[nranks]
    env = {"HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "5", variable: str(size)}
    result = ms_job.run(os.path.join(_HERE, "ms_cases.py"), nranks, timeout=400, env=env)
    return nranks, result


def records(job, name: str) -> list:
    """Every rank's result of case ``name``; fails with the rank's traceback when a rank raised."""
    nranks, result = job
    recs = result.case(name, nranks)
    for rank, rec in enumerate(recs):
        assert rec["ok"], f"rank {rank} raised in {name}: {rec['error']}\n{rec['traceback']}"
    return [rec["result"] for rec in recs]


@pytest.mark.parametrize("name", list(symm_api_cases.CASES))
def test_shared_case(job, name):
    """Every rank passed shared case ``name`` (a failing rank's record holds its AssertionError and traceback)."""
    records(job, name)


def test_empty_refuses_dtypes_without_collectives(job):
    for res in records(job, "empty_refuses_dtypes_without_collectives"):
        assert res["complex"]["type"] == "ShmemTypeError" and "TypeError" in res["complex"]["mro"], res["complex"]
        assert res["complex"]["message"].startswith("`dtype` must be one of"), res["complex"]


def test_send_needs_a_channel(job):
    for res in records(job, "send_needs_a_channel"):
        assert res["no_channel"]["type"] == "ShmemStateError", res["no_channel"]
        assert res["no_channel"]["message"].startswith("group has no channel yet (run a collective or symm.barrier on "
                                                       "it first): op=shmem_send group=hp_fresh")


def test_send_recv_are_refused_while_a_gradient_is_recorded(job):
    for res in records(job, "send_recv_refused_while_recording"):
        assert res["error"]["type"] == "ShmemStateError"
        assert res["error"]["message"].startswith("shmem_send cannot be differentiated on mindspore (a Cell's bprop")


def test_graph_mode_is_refused_with_the_reason(job):
    for res in records(job, "graph_mode_is_refused"):
        assert res["error"]["type"] == "ShmemStateError"
        assert res["error"]["message"].startswith("symmetric memory on MindSpore runs in PyNative mode only")


def test_an_absent_rank_makes_the_bootstrap_time_out(job):
    res = records(job, "absent_rank_times_out")[0]
    assert res["error"]["type"] == "ShmemTimeoutError", res["error"]
    assert "bootstrap all_gather over the MindSpore group timed out" in res["error"]["message"]
    assert "group=hp_absent timeout_sec=5" in res["error"]["message"]
    assert res["seconds"] < 30


def test_seed_example_one_runs_as_a_script():
    example = os.path.join(_HERE, "..", "..", "examples", "mindspore_producer_consumer.py")
    result = ms_job.run(os.path.abspath(example), 2, timeout=200, env=_ENV)
    assert result.returncode == 0, result.logs[-6000:]
    assert "rank 1 received 4096 halves" in result.logs and "intact=True" in result.logs, result.logs[-6000:]
