"""System tests of the runtime lifecycle: ``acquire_shmem`` handles, the root identity and shutdown.

Covers the Handle (``closed``, idempotent ``close()``, context manager) and its reference count; the root identity
(another group object with the same ranks shares the runtime, another membership is refused, a root smaller than
WORLD is refused); the last close (it waits for every rank, and is refused while allocations are live, leaving the
handle open for a retry); new lifecycles (a new number, a new HYPER_PARALLEL_SHMEM_HEAP_SIZE); and that nothing runs
a collective behind the user's back: dropping an unclosed handle on one rank, or a process that exits with an open
handle and live allocations.

Most cases run in one reused 4-rank world; the cases that leave a rank's runtime unusable on purpose run in a fresh
2-rank world or in plain subprocesses.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist

import hyper_parallel
from harness import World
from hyper_parallel.core.multicore import shmem
from st_cases import assert_clean, expect_error, restored_env, run_case

HEAP_VAR = "HYPER_PARALLEL_SHMEM_HEAP_SIZE"
ENV = {HEAP_VAR: "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}
MiB = 1 << 20


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _refs() -> int:
    return shmem.debug_state()["reference_count"]


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_handles_count_references() -> int:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    first = shmem.acquire_shmem()
    try:
        assert isinstance(first, shmem.Handle) and first.closed is False
        state = shmem.debug_state()
        assert state["state"] == "initialized" and state["reference_count"] == 1
        assert state["root_ranks"] == list(range(world)) and state["rank"] == rank and state["world_size"] == world
        lifecycle = state["lifecycle"]

        second = shmem.acquire_shmem()  # only counts: no new lifecycle
        assert second is not first and _refs() == 2 and shmem.debug_state()["lifecycle"] == lifecycle
        with shmem.acquire_shmem() as third:
            assert isinstance(third, shmem.Handle) and not third.closed and _refs() == 3
        assert third.closed and _refs() == 2
        second.close()
        assert second.closed and _refs() == 1 and shmem.debug_state()["state"] == "initialized"
        # close() is idempotent: a second call must not release another reference.
        second.close()
        third.close()
        assert _refs() == 1 and shmem.debug_state()["state"] == "initialized"
        t = shmem.empty(4)  # still fully usable on the remaining handle
        shmem.free(t)
    finally:
        first.close()
    state = shmem.debug_state()
    assert first.closed and state["state"] == "uninitialized", repr(state)
    assert state["reference_count"] == 0 and state["root_ranks"] == []
    first.close()  # idempotent after the shutdown too
    expect_error(shmem.ShmemStateError, lambda: shmem.empty(4), "shmem runtime is not initialised", "op=empty")
    return lifecycle


def _case_same_members_share_the_runtime() -> list[int]:
    assert_clean()
    world = dist.get_world_size()
    same = dist.new_group(list(range(world)))  # another group object, the same ranks in the same order
    lifecycles = []
    handle = shmem.acquire_shmem()
    try:
        lifecycle = shmem.debug_state()["lifecycle"]
        lifecycles.append(lifecycle)
        with shmem.acquire_shmem(same), shmem.acquire_shmem(dist.group.WORLD):
            state = shmem.debug_state()
            assert state["reference_count"] == 3 and state["lifecycle"] == lifecycle, repr(state)
        assert _refs() == 1
    finally:
        handle.close()
    assert_clean()
    # The other way round: the runtime bootstraps over the new group, and WORLD (None) then shares it.
    handle = shmem.acquire_shmem(same)
    try:
        state = shmem.debug_state()
        assert state["root_ranks"] == list(range(world)) and state["reference_count"] == 1
        lifecycles.append(state["lifecycle"])
        with shmem.acquire_shmem():
            assert _refs() == 2
            t = shmem.empty(world)
            shmem.barrier()
            shmem.free(t)
    finally:
        handle.close()
    assert_clean()
    return lifecycles


def _case_other_membership_is_refused() -> None:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1])  # collective over WORLD; ranks 2.. get a non-member placeholder
    handle = shmem.acquire_shmem()
    try:
        if rank in (0, 1):
            msg = expect_error(ValueError, lambda: shmem.acquire_shmem(pair))
            assert msg == (
                f"`root_group` must have the ranks of the active runtime's root {list(range(world))}, but got [0, 1]"
            ), msg
        else:
            # Ranks left out of new_group() hold a placeholder, not a group: say so rather than "got int".
            expect_error(ValueError, lambda: shmem.acquire_shmem(pair), f"`root_group` must contain this rank ({rank})")
        expect_error(
            TypeError, lambda: shmem.acquire_shmem("WORLD"), "`root_group` must be a torch.distributed.ProcessGroup"
        )
        # The refusal took no reference and left the runtime alone.
        state = shmem.debug_state()
        assert state["reference_count"] == 1 and state["state"] == "initialized"
        assert state["root_ranks"] == list(range(world))
    finally:
        handle.close()
    assert_clean()
    # No runtime: a root smaller than WORLD is refused in this version, and nothing is initialised.
    if rank in (0, 1):
        expect_error(ValueError, lambda: shmem.acquire_shmem(pair), "must cover the whole WORLD", "but got [0, 1]")
    else:
        expect_error(ValueError, lambda: shmem.acquire_shmem(pair), f"`root_group` must contain this rank ({rank})")
    assert_clean()
    dist.barrier()


def _case_shutdown_refused_while_allocated() -> dict:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()
    t = shmem.empty(8, dtype=torch.int64)
    try:
        info = shmem.debug_state()["active_allocations"][0]
        msg = expect_error(
            shmem.ShmemStateError,
            handle.close,
            "shutdown refused: live allocations remain",
            f"allocation_id={info['allocation_id']}",
            f"base={hex(info['base'])}",
            "bytes=64",
            *[f"rank{r}=1" for r in range(world)],
        )
        # The handle stays open and the runtime keeps working, so that the caller can free and retry.
        assert handle.closed is False
        state = shmem.debug_state()
        assert state["state"] == "initialized" and state["reference_count"] == 1
        assert [a["allocation_id"] for a in state["active_allocations"]] == [info["allocation_id"]]
        t.fill_(rank)
        shmem.barrier()
        shmem.free(t)
        handle.close()
        assert handle.closed and shmem.debug_state()["state"] == "uninitialized"
        return {"message": msg}
    finally:
        if not handle.closed:
            try:
                shmem.free(t)
            except Exception:
                pass
            handle.close()


def _case_last_close_waits_for_every_rank(late_rank: int, delay: float) -> tuple[float, float]:
    assert_clean()
    handle = shmem.acquire_shmem()
    if dist.get_rank() == late_rank:
        time.sleep(delay)
    started = time.time()
    handle.close()
    return started, time.time()


def _case_new_lifecycle_reads_the_heap_size() -> list[int]:
    assert_clean()
    ids: list[int] = []
    lifecycles: list[int] = []
    with restored_env(HEAP_VAR):
        for mib in (8, 24, 2):
            os.environ[HEAP_VAR] = f"{mib}M"
            with shmem.acquire_shmem():
                state = shmem.debug_state()
                assert state["heap_size"] == mib * MiB and state["config"]["heap_size"] == mib * MiB, repr(state)
                lifecycles.append(state["lifecycle"])
                t = shmem.empty(4)
                ids.append(shmem.debug_state()["active_allocations"][0]["allocation_id"])
                shmem.free(t)
            assert shmem.debug_state()["state"] == "uninitialized"
        # A bad value fails the acquire on every rank and starts nothing.
        os.environ[HEAP_VAR] = "0"
        expect_error(ValueError, shmem.acquire_shmem, f"`{HEAP_VAR}` must be a positive byte count, but got '0'")
        state = shmem.debug_state()
        assert state["state"] == "uninitialized" and state["lifecycle"] == lifecycles[-1], repr(state)
    # The ascend device is a valid name, but only a build against a real CANN installation carries it.
    with restored_env("HYPER_PARALLEL_SHMEM_DEVICE"):
        os.environ["HYPER_PARALLEL_SHMEM_DEVICE"] = "ascend"
        expect_error(shmem.ShmemStateError, shmem.acquire_shmem,
                     "device is not built into this module: device=ascend built=host")
        assert shmem.debug_state()["state"] == "uninitialized"
    assert lifecycles == list(range(lifecycles[0], lifecycles[0] + 3)), lifecycles
    assert ids == sorted(set(ids)), ids  # never reused across lifecycles either
    with shmem.acquire_shmem():
        assert shmem.debug_state()["heap_size"] == 16 * MiB
    return lifecycles


def _case_drop_unclosed_handle_on_one_rank() -> dict:
    """Rank 0 drops its only handle without closing it; a collective from its destructor would hang."""
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()
    lifecycle = shmem.debug_state()["lifecycle"]
    if rank == 0:
        gone = weakref.ref(handle)
        del handle
        gc.collect()
        assert gone() is None
    state = shmem.debug_state()
    assert state["state"] == "initialized" and state["lifecycle"] == lifecycle, repr(state)
    # Both runtimes still work together: no rank shut down or ran a collective on its own.
    buf = shmem.empty(world, dtype=torch.int64)
    buf[rank] = 100 + rank
    shmem.barrier()
    got = torch.empty(1, dtype=torch.int64)
    peer = (rank + 1) % world
    shmem.get(got, buf[peer : peer + 1], peer)
    assert got.item() == 100 + peer
    shmem.barrier()
    shmem.free(buf)
    return {"state": shmem.debug_state()["state"], "rank": rank}


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.fixture
def world4(world_factory) -> World:
    return world_factory(4, ENV)


def test_handles_count_references_and_close_idempotently(world4: World) -> None:
    lifecycles = run_case(world4, _case_handles_count_references)
    assert len(set(lifecycles)) == 1


def test_group_with_the_same_ranks_shares_the_runtime(world4: World) -> None:
    lifecycles = run_case(world4, _case_same_members_share_the_runtime)
    assert all(lc == lifecycles[0] for lc in lifecycles)
    assert lifecycles[0][1] == lifecycles[0][0] + 1


def test_other_membership_and_partial_roots_are_refused(world4: World) -> None:
    run_case(world4, _case_other_membership_is_refused)


def test_shutdown_with_live_allocations_is_refused_and_retryable(world4: World) -> None:
    results = run_case(world4, _case_shutdown_refused_while_allocated)
    assert all("shutdown refused" in r["message"] for r in results)


def test_last_close_waits_for_every_rank(world4: World) -> None:
    times = run_case(world4, _case_last_close_waits_for_every_rank, 3, 1.0)
    latest_start = max(start for start, _ in times)
    # No rank may finish shutting down before the last one started: the last close is collective.
    assert all(end >= latest_start for _, end in times), times


def test_new_lifecycle_applies_a_new_heap_size(world4: World) -> None:
    lifecycles = run_case(world4, _case_new_lifecycle_reads_the_heap_size)
    assert all(lc == lifecycles[0] for lc in lifecycles)


def test_dropping_an_unclosed_handle_runs_no_collective() -> None:
    # Rank 0's runtime can never be shut down afterwards (its reference is gone): a world of its own.
    with World(2, env={**ENV, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "5"}) as world:
        results = world.run(_case_drop_unclosed_handle_on_one_rank, timeout=30)
    assert [r["state"] for r in results] == ["initialized", "initialized"]


def _case_acquire_with_a_missing_rank() -> str:
    if dist.get_rank() == 1:
        return "absent"  # never calls acquire_shmem
    started = time.monotonic()
    expect_error(shmem.ShmemTimeoutError, shmem.acquire_shmem, "bootstrap timed out: op=acquire_shmem", "timeout_sec=2")
    assert time.monotonic() - started < 15, "the bootstrap must give up after HYPER_PARALLEL_SHMEM_TIMEOUT_SEC"
    return shmem.debug_state()["state"]


def _case_signal_handler_and_debug_state_during_a_collective() -> dict:
    rank = dist.get_rank()
    out: dict = {}
    with shmem.acquire_shmem():
        if rank == 1:
            time.sleep(1.0)  # rank 0 waits in empty()'s collective check meanwhile
            t = shmem.empty(64)
        else:
            # A Python signal handler that uses the runtime, fired while empty() waits for rank 1: it must run
            # after the call, never inside the wait (where it would find the runtime's lock taken).
            seen: list = []
            previous = signal.signal(signal.SIGUSR1, lambda *_: seen.append(shmem.debug_state()["state"]))
            timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
            # Diagnostics from another thread do not wait for the stuck collective either.
            def probe() -> None:
                time.sleep(0.4)
                started = time.monotonic()
                out["debug_state_state"] = shmem.debug_state()["state"]
                out["debug_state_seconds"] = time.monotonic() - started

            prober = threading.Thread(target=probe)
            try:
                timer.start()
                prober.start()
                t = shmem.empty(64)
                prober.join()
                timer.join()
            finally:
                signal.signal(signal.SIGUSR1, previous)
            out["handler_saw"] = seen
        shmem.free(t)
    return out


def test_signal_handlers_and_diagnostics_do_not_block_on_a_collective(world_factory) -> None:
    out = run_case(world_factory(2, ENV), _case_signal_handler_and_debug_state_during_a_collective, timeout=60)[0]
    assert out["handler_saw"] == ["initialized"], out
    assert out["debug_state_state"] == "initialized", out
    assert out["debug_state_seconds"] < 0.3, out  # not the 0.6 s left of rank 1's delay


def test_acquire_times_out_when_a_rank_never_comes() -> None:
    # The gloo group of this world is left with an unmatched barrier: a world of its own.
    with World(2, env={**ENV, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "2"}) as world:
        assert world.run(_case_acquire_with_a_missing_rank, timeout=30) == ["uninitialized", "absent"]


_EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    import torch.distributed as dist
    from hyper_parallel.core.multicore import shmem

    rank, world, store, linger = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    try:
        shmem.acquire_shmem()
    except shmem.ShmemStateError as exc:
        assert "torch.distributed is not initialised" in str(exc), exc
    else:
        raise AssertionError("acquire_shmem() before init_process_group() must fail")
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    handle = shmem.acquire_shmem()
    kept = shmem.empty(1024)  # a live allocation, never freed
    kept.fill_(rank)
    shmem.barrier()
    if rank == 0:
        time.sleep(linger)  # alive but calling nothing while rank 1 exits
    print(f"EXITING {time.time():.6f}", flush=True)
    # Falls off the end with `handle` open and `kept` live: atexit, weakref callbacks and destructors run now.
    """
)


_NO_NUMPY_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["numpy"] = None  # numpy is not a dependency of the package: every import of it fails here
    import torch
    import torch.distributed as dist
    from hyper_parallel.core.multicore import shmem
    from hyper_parallel.core.multicore.shmem import _lifecycle

    rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    try:
        torch.zeros(1).numpy()
    except RuntimeError as exc:
        assert "Numpy is not available" in str(exc), exc
    else:
        raise AssertionError("numpy must be unavailable in this process")
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    with shmem.acquire_shmem():  # the bootstrap exchanges bytes over gloo without numpy
        mine = shmem.empty(4, dtype=torch.int32)
        mine.fill_(rank)
        shmem.barrier(blocking=True)
        peer = (rank + 1) % world
        got = torch.empty(4, dtype=torch.int32)
        shmem.get(got, mine, peer)
        shmem.barrier(blocking=True)
        assert got.tolist() == [peer] * 4, got
        shmem.free(mine)

    def failing_copy(tensor):
        raise RuntimeError("Numpy is not available")

    _lifecycle._tensor_bytes = failing_copy  # the bootstrap's exchange fails on every rank
    try:
        shmem.acquire_shmem()
    except shmem.ShmemDeviceError as exc:
        assert (exc.error_code, exc.phase, exc.operation) == ("BOOTSTRAP_ERROR", "Bootstrap", "initialize"), (
            exc.error_code, exc.phase, exc.operation, str(exc))
        assert str(exc).startswith("bootstrap all_gather over the root ProcessGroup failed: RuntimeError: Numpy"), exc
        assert "error_code=BOOTSTRAP_ERROR operation=initialize phase=Bootstrap " in exc.__notes__[0], exc.__notes__
    else:
        raise AssertionError("acquire_shmem() must fail when the bootstrap's exchange fails")
    print("DONE", flush=True)
    """
)


def test_the_bootstrap_needs_no_numpy_and_its_failure_is_labelled_a_bootstrap_error(tmp_path) -> None:
    src = os.path.dirname(os.path.dirname(os.path.abspath(hyper_parallel.__file__)))
    env = {**os.environ, **ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", _NO_NUMPY_SCRIPT, str(rank), "2", store], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (out, err) in enumerate(outputs):
        assert procs[rank].returncode == 0 and "DONE" in out, f"rank {rank} exit code {procs[rank].returncode}:\n{err}"


def test_process_exits_promptly_with_an_open_handle(tmp_path) -> None:
    src = os.path.dirname(os.path.dirname(os.path.abspath(hyper_parallel.__file__)))
    # A collective at rank 1's exit would hold rank 1 until rank 0 exits too (the SHMEM timeout is longer than the
    # linger): rank 1 must end well before rank 0 does. How long an interpreter with torch takes to exit depends on
    # the machine's load, so the margins are wide and relative.
    env = {**os.environ, **ENV, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    store = str(tmp_path / "store")
    linger = 15.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _EXIT_SCRIPT, str(rank), "2", store, str(linger)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    ended: dict[int, float] = {}
    deadline = time.time() + 90
    try:
        while len(ended) < 2 and time.time() < deadline:
            for rank, proc in enumerate(procs):
                if rank not in ended and proc.poll() is not None:
                    ended[rank] = time.time()
            time.sleep(0.02)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    outputs = [proc.communicate() for proc in procs]
    for rank, (out, err) in enumerate(outputs):
        assert procs[rank].returncode == 0, f"rank {rank} exit code {procs[rank].returncode}:\n{out}\n{err}"
        exiting = float(out.split("EXITING ")[1].split()[0])
        took = ended[rank] - exiting
        assert took < linger / 2, f"rank {rank} needed {took:.1f} s to exit after its last line:\n{err}"
    # Rank 1 was gone while rank 0 still lingered: nothing waited for a peer at exit.
    assert ended[1] < ended[0] - linger / 2, ended
