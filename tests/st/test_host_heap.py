"""System tests of the host device's symmetric heap and waits, with 8 ranks on a small machine.

Covers the POSIX shared-memory segments (one per rank, mode 0600, an unguessable name ``hpshmem-<pid>-<32 hex>``,
unlinked once every rank has mapped it, unmapped at shutdown), the clean-up of a dead process's stale segment at
init, the clear ``ShmemOutOfMemoryError`` on every rank when /dev/shm cannot hold the heaps (nothing created, the
runtime stays uninitialised, a later acquire works), and waits that sleep in the kernel: with 8 ranks on 2 cores,
a signal wait, a barrier or a timed-out wait must cost far less CPU than wall time.

All cases run in one reused 8-rank world; none breaks a rank.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from harness import CaseOutput, World
from hyper_parallel.core.multicore import shmem
from st_cases import assert_clean, restored_env, run_case

HEAP_VAR = "HYPER_PARALLEL_SHMEM_HEAP_SIZE"
TIMEOUT_VAR = "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC"
ENV = {HEAP_VAR: "16M", TIMEOUT_VAR: "30"}
NRANKS = 8
MiB = 1 << 20
TiB = 1 << 40
SHM = "/dev/shm"
# A wait may use at most this share of one core while it waits. A sleeping waiter measures well under 1 %; seven
# spinners sharing 2 cores would each get about 2/7 (28 %), so the bound sits between with room for a loaded machine.
MAX_CPU_SHARE = 0.1
SEGMENT = re.compile(r"^/dev/shm/hpshmem-(\d+)-([0-9a-f]{32}) \(deleted\)$")


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _all_pids() -> list[int]:
    pids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return pids


def _named_segments(pids: list[int]) -> list[str]:
    """Names in /dev/shm that belong to one of ``pids``."""
    prefixes = tuple(f"hpshmem-{pid}-" for pid in pids)
    return sorted(n for n in os.listdir(SHM) if n.startswith(prefixes))


def _mapped_segments() -> list[tuple[str, str, int, str]]:
    """(address range, permissions, size, path) of every hpshmem mapping of this process."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/hpshmem-" not in line:
                continue
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.append((fields[0], fields[1], end - start, fields[5].rstrip("\n")))
    return found


def _cpu_share(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Runs ``fn``; returns (process CPU seconds, wall seconds, result or the exception it raised)."""
    cpu, wall = time.process_time(), time.monotonic()
    try:
        result: Any = fn()
    except Exception as exc:  # the caller checks what was raised
        result = exc
    return time.process_time() - cpu, time.monotonic() - wall, result


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_segments_are_private_and_unlinked() -> list[str]:
    assert_clean()
    pids = _all_pids()
    secrets = []
    for _ in range(2):  # two lifecycles: fresh random names each time
        handle = shmem.acquire_shmem()
        try:
            shmem.barrier()  # every rank is past its init
            # Nothing of ours is left in /dev/shm once acquire returned on every rank.
            assert _named_segments(pids) == [], _named_segments(pids)
            heap_size = shmem.debug_state()["heap_size"]
            mapped = _mapped_segments()
            assert len(mapped) == NRANKS, mapped
            owners = []
            for rng, perms, size, path in mapped:
                match = SEGMENT.match(path)
                assert match, f"mapping {path!r} is not an unlinked hpshmem-<pid>-<32 hex> segment"
                owners.append(int(match.group(1)))
                secrets.append(match.group(2))
                assert perms == "rw-s" and size >= heap_size, (perms, size)
                mode = os.stat(f"/proc/self/map_files/{rng}").st_mode & 0o777
                assert mode == 0o600, f"{path}: mode {oct(mode)}"
            assert sorted(owners) == sorted(pids), (owners, pids)  # one segment per rank, each rank's own
        finally:
            handle.close()
        assert _mapped_segments() == [], "the segments must be unmapped at shutdown"
    assert len(set(secrets)) == 2 * NRANKS, secrets  # 16 distinct random names over two lifecycles
    return secrets


def _case_stale_segment_is_removed(dead_pid: int) -> dict:
    assert_clean()
    rank = dist.get_rank()
    stale = f"hpshmem-{dead_pid}-{'ab' * 16}"
    alive = f"hpshmem-{os.getppid()}-{'cd' * 16}"  # the test runner: alive, so not ours to remove
    odd = "hpshmem-notapid-0123"
    made = [stale, alive, odd]
    try:
        if rank == 0:
            for name in made:
                with open(os.path.join(SHM, name), "wb") as f:
                    f.write(b"\0" * 4096)
        dist.barrier()  # every rank looks only after the files exist
        with shmem.acquire_shmem():
            left = set(os.listdir(SHM))
            assert stale not in left, "a dead process's segment must be removed at init"
            assert alive in left and odd in left, "segments of live processes and foreign names must stay"
        dist.barrier()
        return {"stale": stale}
    finally:
        dist.barrier()
        if rank == 0:
            for name in made:
                try:
                    os.unlink(os.path.join(SHM, name))
                except FileNotFoundError:
                    pass


def _case_heap_larger_than_dev_shm() -> list[int]:
    assert_clean()
    pids = _all_pids()
    world = dist.get_world_size()
    vfs = os.statvfs(SHM)
    available = vfs.f_bavail * vfs.f_frsize
    # Each rank's heap fits alone but not all of them together; then one heap alone does not fit.
    sizes = [(available // world // MiB + 64) * MiB, (available // MiB + 1024) * MiB]
    # A heap size above the free space must exist within the configuration's limit (1 TiB) for this test.
    assert sizes[-1] <= TiB, f"{SHM} has {available} bytes free: no allowed heap size (max 1 TiB) exceeds that"
    lifecycle = shmem.debug_state()["lifecycle"]
    with restored_env(HEAP_VAR):
        for heap in sizes:
            os.environ[HEAP_VAR] = f"{heap // MiB}M"
            try:
                handle = shmem.acquire_shmem()
            except shmem.ShmemOutOfMemoryError as exc:
                message = str(exc)
            else:
                handle.close()
                raise AssertionError(f"a {heap}-byte heap per rank was accepted with {available} bytes in {SHM}")
            assert f"path={SHM}" in message, message
            required = int(re.search(r"required=(\d+)", message).group(1))
            seen = int(re.search(r"available=(\d+)", message).group(1))
            assert required >= heap * world and seen < required, message
            assert abs(seen - available) < available // 2 + 256 * MiB, message  # it is /dev/shm's free space
            state = shmem.debug_state()
            assert state["state"] == "uninitialized" and state["reference_count"] == 0, repr(state)
            assert state["lifecycle"] == lifecycle and "required=" in state["latest_failure"], repr(state)
            # Nothing was created or mapped (looked at between barriers: the next acquire creates segments again).
            dist.barrier()
            leftovers = (_named_segments(pids), _mapped_segments())
            dist.barrier()
            assert leftovers == ([], []), leftovers
    with shmem.acquire_shmem():
        state = shmem.debug_state()
        assert state["heap_size"] == 16 * MiB and state["lifecycle"] == lifecycle + 1
    return sizes


def _case_waits_sleep_in_the_kernel(delay: float) -> dict:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()
    sig = shmem.empty(1, dtype=torch.int32)
    try:
        sig.zero_()
        shmem.barrier()
        # 1. Seven ranks wait for a signal that rank 0 raises after `delay` seconds.
        if rank == 0:
            time.sleep(delay)
            for pe in range(1, world):
                shmem.signal(sig, 1, pe)
            signal_wait = None
        else:
            signal_wait = _cpu_share(lambda: shmem.wait_signal(sig, 1, cmp="ge"))
        # 2. Seven ranks wait in a barrier for rank 0.
        if rank == 0:
            time.sleep(delay)
            shmem.barrier()
            barrier_wait = None
        else:
            barrier_wait = _cpu_share(shmem.barrier)
        shmem.barrier()
        return {"signal": signal_wait, "barrier": barrier_wait}
    finally:
        shmem.free(sig)
        handle.close()


def _case_wait_times_out_asleep(timeout: str) -> tuple[float, float, str]:
    assert_clean()
    with restored_env(TIMEOUT_VAR):
        os.environ[TIMEOUT_VAR] = timeout
        with shmem.acquire_shmem():
            sig = shmem.empty(1, dtype=torch.int64)
            try:
                sig.zero_()
                shmem.barrier()
                # Every rank waits for a signal nobody raises: 8 sleepers on 2 cores, each giving up on its own.
                cpu, wall, result = _cpu_share(lambda: shmem.wait_signal(sig, 1, cmp="ge"))
                assert isinstance(result, shmem.ShmemTimeoutError), repr(result)
                shmem.barrier()
            finally:
                shmem.free(sig)
    return cpu, wall, str(result)


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.fixture
def world8(world_factory) -> World:
    return world_factory(NRANKS, ENV)


def test_segments_are_private_unguessable_and_unlinked(world8: World) -> None:
    secrets = run_case(world8, _case_segments_are_private_and_unlinked)
    for per_rank in secrets:
        # Every rank mapped the same 8 segments in each lifecycle (the next lifecycle used new names).
        assert sorted(per_rank[:NRANKS]) == sorted(secrets[0][:NRANKS])
        assert sorted(per_rank[NRANKS:]) == sorted(secrets[0][NRANKS:])


def test_stale_segment_of_a_dead_process_is_removed_at_init(world8: World) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)  # exited and reaped: its pid names no process
    outputs: list[CaseOutput] = run_case(world8, _case_stale_segment_is_removed, child.pid, capture_stderr=True)
    stale = outputs[0].value["stale"]
    logged = [
        rank
        for rank, out in enumerate(outputs)
        if f"removed a stale shared-memory segment of a dead process: name=/{stale} pid={child.pid}" in out.stderr
    ]
    assert len(logged) == 1, [out.stderr for out in outputs]  # the rank that removed it says so, once


def test_heap_too_large_for_dev_shm_fails_cleanly_on_every_rank(world8: World) -> None:
    run_case(world8, _case_heap_larger_than_dev_shm)


def test_waits_sleep_instead_of_spinning(world8: World) -> None:
    delay = 2.5
    results = run_case(world8, _case_waits_sleep_in_the_kernel, delay, timeout=90)
    for rank, r in enumerate(results[1:], start=1):
        for what in ("signal", "barrier"):
            cpu, wall, error = r[what]
            assert error is None, f"rank {rank} {what}: {error!r}"
            assert wall >= delay * 0.6, f"rank {rank} {what} did not wait: {wall:.2f} s"
            assert cpu < MAX_CPU_SHARE * wall, f"rank {rank} {what} wait burnt {cpu:.2f} s CPU in {wall:.2f} s"


def test_timed_out_wait_sleeps_and_names_the_values(world8: World) -> None:
    results = run_case(world8, _case_wait_times_out_asleep, "2", timeout=90)
    for rank, (cpu, wall, message) in enumerate(results):
        for needle in ("signal wait timed out", "cmp=ge", "expected=1", "observed=0", "timeout_sec=2"):
            assert needle in message, (rank, needle, message)
        assert 1.9 <= wall < 8.0, f"rank {rank} gave up after {wall:.2f} s"
        assert cpu < MAX_CPU_SHARE * wall, f"rank {rank} burnt {cpu:.2f} s CPU in a {wall:.2f} s wait"
