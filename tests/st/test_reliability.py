"""System tests of the failure paths: a stalled bootstrap, shutdown racing other threads, refused shutdowns,
Ctrl-C inside a collective, and what timeouts of sub-groups and send/recv name.

Cases that leave a world's gloo group or barrier counters inconsistent run in a world of their own.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from harness import World
from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.shmem import _lifecycle
from st_cases import assert_clean, expect_error, run_case
from symm_cases import symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}
_SHORT_TIMEOUT_S = 2.0
_SHORT_ENV = {**_ENV, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": str(_SHORT_TIMEOUT_S)}


def _own_segments() -> list:
    """This process's shared-memory segments still named in /dev/shm (its pid is part of every name)."""
    prefix = f"hpshmem-{os.getpid()}-"
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


def _await_calls_in_flight(calls: int) -> None:
    deadline = time.monotonic() + 10
    while shmem.debug_state()["calls_in_flight"] != calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert shmem.debug_state()["calls_in_flight"] == calls, shmem.debug_state()["calls_in_flight"]


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_bootstrap_stalls_on_one_rank() -> dict:
    """Rank 1 stops for longer than the timeout inside the bootstrap's first exchange (after the monitored
    barrier); its peers give up in time, naming it, and nobody leaves a segment behind."""
    rank = dist.get_rank()
    if rank == 1:
        exchange = _lifecycle._all_gather_bytes

        def stalled(group, payload, op):
            time.sleep(2 * _SHORT_TIMEOUT_S)
            return exchange(group, payload, op)

        _lifecycle._all_gather_bytes = stalled
    started = time.monotonic()
    try:
        shmem.acquire_shmem()
    except shmem.ShmemError as error:
        return {"error": type(error).__name__, "message": str(error), "elapsed": time.monotonic() - started,
                "segments": _own_segments(), "state": shmem.debug_state()["state"]}
    raise AssertionError("acquire_shmem() must fail when a rank stalls in the bootstrap")


def _case_close_while_another_thread_waits() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    handle = shmem.acquire_shmem()
    flag = shmem.empty(1, dtype=torch.int64)
    flag.zero_()
    shmem.barrier()
    waiter_status: list = []
    waiter = None
    if rank == 0:
        def wait() -> None:
            shmem.wait_signal(flag, 1)
            waiter_status.append("ok")

        waiter = threading.Thread(target=wait)
        waiter.start()
        _await_calls_in_flight(1)
    shmem.barrier()
    # Rank 0's thread is still reading the heap: every rank refuses, none unmaps it. The calls in flight are named
    # before the live allocation: they are what a shutdown would crash.
    try:
        handle.close()
    except shmem.ShmemStateError as error:
        message = str(error)
        assert "shutdown refused: calls of other threads" in message and "in_flight: rank0=1" in message, message
        out["operation"] = error.operation  # upstream's field, as for every error of the runtime face
    out["closed_after_refusal"] = handle.closed
    if rank == 0:
        shmem.signal(flag, 1, 0)  # the runtime is open again: release the waiter
        waiter.join(timeout=10)
        out["waiter"] = waiter_status
    shmem.barrier()
    shmem.free(flag)
    handle.close()
    out["state"] = shmem.debug_state()["state"]
    return out


def _case_refused_symm_shutdown_releases_nothing() -> dict:
    rank = dist.get_rank()
    assert_clean()
    kept = symm.empty((4,), torch.float32)
    kept.fill_(rank)
    out: dict = {}
    before = shmem.debug_state()
    # Both ranks still hold the tensor: refused on both, naming both.
    out["both"] = expect_error(shmem.ShmemStateError, symm.shutdown, "symmetric memory shutdown refused",
                               "rank0=1 rank1=1")
    after = shmem.debug_state()
    out["unchanged"] = (after["state"], after["reference_count"], after["lifecycle"], after["allocated"]) == \
        (before["state"], before["reference_count"], before["lifecycle"], before["allocated"])
    # Still usable: a collective runs on the workspace the refusal kept.
    total = torch.ones(3)
    symm.shmem_allreduce(total)
    out["allreduce"] = total.tolist()
    # Rank 0 drops its last reference (a leak, not a live tensor); rank 1 still holds its copy: refused on both.
    if rank == 0:
        del kept
        kept = None
    out["one"] = expect_error(shmem.ShmemStateError, symm.shutdown, "symmetric memory shutdown refused", "rank1=1")
    if rank == 1:
        out["local"] = "allocation_id=" in out["one"]
        del kept
    symm.shutdown()  # only leaks are left: it goes through
    out["state"] = shmem.debug_state()["state"]
    return out


def _case_ctrl_c_inside_a_collective_check() -> dict:
    """Rank 0 waits in empty()'s collective check for rank 1, which never comes; Ctrl-C ends the wait at once."""
    rank = dist.get_rank()
    shmem.acquire_shmem()
    if rank == 1:
        return {"rank": 1}
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    out: dict = {}
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    try:
        timer.start()
        shmem.empty(64)
    except KeyboardInterrupt:
        out["interrupted"] = True
    except shmem.ShmemError as error:
        out["error"] = f"{type(error).__name__}: {error}"
    finally:
        out["elapsed"] = time.monotonic() - started
        timer.join()
        signal.signal(signal.SIGINT, previous)
    out["active"] = len(shmem.debug_state()["active_allocations"])
    return out


def _case_sub_group_timeout_names_the_group_the_op_and_the_rank() -> dict:
    rank = dist.get_rank()
    pair = dist.new_group([1, 2])
    never = dist.new_group([1, 2])  # rank 2 never runs a collective on it
    out: dict = {}
    with symm_session():
        symm.barrier()  # acquires the runtime, over WORLD
        if rank in (1, 2):
            symm.barrier(pair)  # registers the pair's channel
            if rank == 1:
                out["allreduce"] = expect_error(shmem.ShmemTimeoutError, lambda: symm.shmem_allreduce(torch.ones(4),
                                                                                                    group=pair),
                                                "all_reduce timed out at its first sync: team_ranks=[1,2]",
                                                "missing_ranks=[2]", "sync timed out: arrived=1 of 2",
                                                "it fails on every member")
                out["recv"] = expect_error(shmem.ShmemTimeoutError,
                                           lambda: symm.shmem_recv(torch.empty(4), 1, group=pair),
                                           "recv timed out waiting for a peer", "team_ranks=[1,2]",
                                           "missing_ranks=[2]")
                out["world_recv"] = expect_error(shmem.ShmemTimeoutError, lambda: symm.shmem_recv(torch.empty(4), 0),
                                                 "recv timed out waiting for a peer", "team_ranks=[0,1,2]",
                                                 "missing_ranks=[0]")
                # Making a group's team is bounded too, and names the member that did not come.
                started = time.monotonic()
                out["team_create"] = expect_error(shmem.ShmemTimeoutError, lambda: symm.barrier(never),
                                                  "bootstrap timed out: op=team_create", "missing_ranks=[2]")
                assert time.monotonic() - started < 4 * _SHORT_TIMEOUT_S + 5, out
        dist.barrier()  # rank 1 timed out three times meanwhile; the WORLD's channel is still in step
    return out


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


def test_a_rank_stalled_in_the_bootstrap_is_named_and_nothing_is_left() -> None:
    with World(2, env=_SHORT_ENV) as world:
        results = world.run(_case_bootstrap_stalls_on_one_rank, timeout=60)
    early, late = results
    assert early["error"] == "ShmemTimeoutError", early
    assert "bootstrap timed out: op=acquire_shmem step=all_gather missing_ranks=[1]" in early["message"], early
    assert early["elapsed"] < _SHORT_TIMEOUT_S + 5, early  # not gloo's 30 minutes
    # The late rank comes back to peers that left: it fails too, in its own bounded wait.
    assert late["error"] in ("ShmemTimeoutError", "ShmemDeviceError"), late
    assert late["elapsed"] < 4 * _SHORT_TIMEOUT_S + 10, late
    for out in results:
        assert out["segments"] == [] and out["state"] == "uninitialized", out


def test_close_is_refused_on_every_rank_while_another_thread_waits(world_factory) -> None:
    results = run_case(world_factory(2, _ENV), _case_close_while_another_thread_waits, timeout=60)
    for out in results:
        assert out["operation"] == "shutdown" and out["closed_after_refusal"] is False, out
        assert out["state"] == "uninitialized", out
    assert results[0]["waiter"] == ["ok"]


def test_a_refused_symm_shutdown_releases_nothing(world_factory) -> None:
    results = run_case(world_factory(2, _ENV), _case_refused_symm_shutdown_releases_nothing, timeout=60)
    assert results[1]["local"], results[1]
    for out in results:
        assert out["unchanged"], out
        assert out["allreduce"] == [2.0, 2.0, 2.0], out
        assert out["state"] == "uninitialized", out


def test_ctrl_c_ends_a_collective_check_at_once() -> None:
    # Rank 0 left a collective check that rank 1 never entered: a world of its own.
    with World(2, env=_ENV) as world:
        out, _ = world.run(_case_ctrl_c_inside_a_collective_check, timeout=60)
    assert out.get("interrupted"), out
    assert out["elapsed"] < 10, out  # not the 20 s timeout
    assert out["active"] == 0, out  # the allocation was undone


def test_timeouts_of_sub_groups_and_send_recv_name_the_group_the_op_and_the_rank() -> None:
    # The pair's epochs differ between its ranks afterwards: a world of its own.
    with World(3, env=_SHORT_ENV) as world:
        results = world.run(_case_sub_group_timeout_names_the_group_the_op_and_the_rank, timeout=90)
    assert results[0] == {} and results[2] == {}, results
    assert set(results[1]) == {"allreduce", "recv", "world_recv", "team_create"}, results[1]
