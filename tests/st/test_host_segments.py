"""System tests of the host device's shared-memory segments against other jobs, a full /dev/shm and stale aliases.

* Stale-segment clean-up at init decides by the creator's lock, not by the pid in the name: a live segment whose
  pid is no process here (a job in another PID namespace sharing /dev/shm) stays, a dead creator's goes, and
  another user's segment stays whatever its state.
* The heap's pages are reserved at init: a /dev/shm too full for the heaps is a ``ShmemOutOfMemoryError`` on every
  rank with nothing left behind, and filling /dev/shm after init cannot take a heap's pages (no SIGBUS).
* Tensors that escape invalidation (``t.numpy()``, ``torch.from_dlpack(t)``): after shutdown they read zeros and
  keep what they write to their own process, through the runtime face and the user API; a new lifecycle's heap
  never lies under them. Between ``free`` and shutdown they still reach the heap: documented, not caught.

The clean-up and /dev/shm cases run in a world of its own whose /dev/shm is a small private tmpfs (its ranks share
a mount namespace): filling it takes neither the machine's memory nor other jobs' room, and no other job's
clean-up (an older version of this library judged by pid alone) removes the segments these cases plant.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness import World
from hyper_parallel.core import symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import assert_clean, run_case

ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}
NRANKS = 8
MiB = 1 << 20
SHM = "/dev/shm"
CONTROL_BYTES = 4096  # the host device's control block behind every heap
# The private /dev/shm of the full-/dev/shm world: room for the 8 heaps of 16 MiB and a little more.
SMALL_SHM_BYTES = 192 * MiB
NOBODY = 65534
CLONE_NEWNS = 0x00020000
TOO_SMALL = "shared-memory filesystem too small for "
ADVICE = f"(lower HYPER_PARALLEL_SHMEM_HEAP_SIZE or enlarge {SHM})"


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _mapped_segments() -> list[str]:
    """Lines of /proc/self/maps that map an hpshmem segment."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "/hpshmem-" in line]


def _available() -> int:
    vfs = os.statvfs(SHM)
    return vfs.f_bavail * vfs.f_frsize


def _hold_lock(path: str) -> subprocess.Popen:
    """Starts a process that creates ``path`` and locks it, like a segment's creator, until its stdin closes."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_cleanup_decides_by_the_lock(dead_pid: int) -> bool:
    assert_clean()
    rank = dist.get_rank()
    # A live job in another PID namespace: its segment names a pid that is no process here, and its creator, a
    # live process, holds the segment's lock.
    live = f"hpshmem-{dead_pid}-{'ef' * 16}"
    stale = f"hpshmem-{dead_pid}-{'ab' * 16}"  # its creator died: nobody holds it
    holder = None
    try:
        if rank == 0:
            holder = _hold_lock(os.path.join(SHM, live))
            with open(os.path.join(SHM, stale), "wb") as f:
                f.write(b"\0" * 4096)
        dist.barrier()  # every rank looks only after the files exist
        with shmem.acquire_shmem():
            left = set(os.listdir(SHM))
        assert live in left, "a segment whose creator holds its lock is live, whatever its pid says here"
        assert stale not in left, "a segment nobody holds, of a pid that is no process here, is stale"
        return True
    finally:
        dist.barrier()
        if holder is not None:
            holder.stdin.close()  # the holder exits
            holder.wait(timeout=30)
        if rank == 0:
            for name in (live, stale):
                _remove(os.path.join(SHM, name))


def _case_another_users_segment_is_never_removed(dead_pid: int) -> bool:
    assert_clean()
    rank = dist.get_rank()
    foreign = f"hpshmem-{dead_pid}-{'cd' * 16}"
    try:
        if rank == 0:
            with open(os.path.join(SHM, foreign), "wb") as f:
                f.write(b"\0" * 4096)
            os.chown(os.path.join(SHM, foreign), NOBODY, NOBODY)
        dist.barrier()
        with shmem.acquire_shmem():
            left = set(os.listdir(SHM))
        assert foreign in left, "another user's segment, stale or not, is never ours to remove (not even as root)"
        return True
    finally:
        dist.barrier()
        if rank == 0:
            _remove(os.path.join(SHM, foreign))


def _check_aliases_after_shutdown(aliases: dict[str, Any], address: int, nbytes: int) -> dict[str, float]:
    """After shutdown: every alias reads zeros, keeps its writes, and the next lifecycle's heap is elsewhere."""
    for name, alias in aliases.items():
        assert not torch.as_tensor(alias).any(), f"{name} reads what is no longer there"
    written = {}
    for value, (name, alias) in enumerate(aliases.items(), start=5):
        alias[-1] = value  # no fault: private zero pages took the heap's place
        written[name] = float(alias[-1])
        assert written[name] == value, (name, written[name])
    # A new lifecycle's heap never lies under the aliases, and nothing they wrote reaches it.
    with shmem.acquire_shmem():
        fresh = shmem.empty(nbytes // 4, dtype=torch.float32)
        state = shmem.debug_state()
        base, heap = state["heap_base"], state["heap_size"]
        assert address + nbytes <= base or base + heap <= address, (hex(base), heap, hex(address))
        peer = shmem.peer_tensor(fresh, (dist.get_rank() + 1) % dist.get_world_size())
        assert not fresh.any() and not peer.any(), "stale aliases wrote into a new heap"
        shmem.barrier()
        shmem.free(fresh)
    return written


def _case_shmem_aliases_survive_shutdown() -> dict[str, float]:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()
    t = shmem.empty(1024, dtype=torch.float32)
    t.fill_(rank + 1)
    shmem.barrier()
    peer = shmem.peer_tensor(t, (rank + 1) % world)
    aliases = {"numpy": t.numpy(), "dlpack": torch.from_dlpack(t), "peer numpy": peer.numpy()}
    assert aliases["peer numpy"][0] == (rank + 1) % world + 1 and aliases["dlpack"][0] == rank + 1
    address, nbytes = t.data_ptr(), t.numel() * t.element_size()
    shmem.barrier()  # every rank has read its peer's copy
    shmem.free(t)
    handle.close()
    return _check_aliases_after_shutdown(aliases, address, nbytes)


def _case_symm_aliases_survive_shutdown() -> dict[str, float]:
    assert_clean()
    rank = dist.get_rank()
    t = symm.empty(1024, dtype=torch.float32)
    t.fill_(rank + 1)
    aliases = {"numpy": t.numpy(), "dlpack": torch.from_dlpack(t)}
    address, nbytes = t.data_ptr(), t.numel() * t.element_size()
    symm.free(t)
    symm.shutdown()
    return _check_aliases_after_shutdown(aliases, address, nbytes)


def _case_alias_between_free_and_shutdown_reaches_the_heap() -> bool:
    assert_clean()
    with shmem.acquire_shmem():
        t = shmem.empty(1024, dtype=torch.float32)
        t.zero_()
        alias = t.numpy()
        address = t.data_ptr()
        shmem.free(t)
        alias[:] = 3.0  # not caught: the heap is still mapped, the write lands where `t` was
        u = shmem.empty(1024, dtype=torch.float32)
        try:
            assert u.data_ptr() == address, "the same request after a free gets the same offset"
            assert bool((u == 3.0).all()), "the documented hazard: the next allocation sees the stale alias's write"
        finally:
            shmem.free(u)
    return True


def _case_dev_shm_too_full_at_init(filler: str) -> dict[str, int]:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    heaps = world * (16 * MiB + CONTROL_BYTES)
    try:
        if rank == 0:
            # Leave room for half the heaps.
            fd = os.open(filler, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            try:
                os.posix_fallocate(fd, 0, _available() - heaps // 2)
            finally:
                os.close(fd)
        dist.barrier()
        free_before = _available()
        assert free_before < heaps, free_before
        with pytest.raises(shmem.ShmemOutOfMemoryError) as info:
            shmem.acquire_shmem()
        message = str(info.value)
        assert TOO_SMALL in message and f"path={SHM}" in message and ADVICE in message, message
        state = shmem.debug_state()
        assert state["state"] == "uninitialized" and state["reference_count"] == 0, repr(state)
        dist.barrier()  # every rank has given up before anyone looks
        leftovers = (sorted(os.listdir(SHM)), _mapped_segments(), _available())
        dist.barrier()
        assert leftovers == ([os.path.basename(filler)], [], free_before), leftovers
    finally:
        dist.barrier()
        if rank == 0:
            _remove(filler)
    dist.barrier()
    with shmem.acquire_shmem():  # with the room back, the same heaps fit
        pass
    return {"free": free_before, "heaps": heaps}


def _case_dev_shm_filled_after_init(filler: str) -> dict[str, int]:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()
    filled = -1
    try:
        heap = shmem.debug_state()["heap_size"]
        shmem.barrier()
        if rank == 0:
            # Another program (a DataLoader's shared tensors) takes everything /dev/shm has left.
            filled = 0
            chunk = b"f" * MiB
            with open(filler, "wb", buffering=0) as f:
                try:
                    while True:
                        filled += f.write(chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        dist.barrier()
        # Every page of every heap is still there: touch all of ours, then read a peer's.
        t = shmem.empty(heap - MiB, dtype=torch.uint8)  # all of the heap but what the runtime keeps
        t.fill_(rank + 1)
        shmem.barrier()
        pe = (rank + 1) % world
        got = torch.empty(MiB, dtype=torch.uint8)
        shmem.get(got, t[-MiB:], pe)
        assert bool((got == pe + 1).all()), got
        shmem.barrier()
        shmem.free(t)
    finally:
        handle.close()
        dist.barrier()
        if rank == 0:
            _remove(filler)
    return {"filled": filled, "heap": heap}


# --------------------------------------------------------------------------
# The test process: a dead pid, and a world with a private /dev/shm.
# --------------------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)  # exited and reaped: its pid names no process
    return child.pid


def _start_world_with_private_dev_shm(nranks: int, env: dict[str, str], size: int) -> World:
    """Starts a world whose ranks share a mount namespace with a ``size``-byte tmpfs on /dev/shm.

    A thread of ours enters a new mount namespace (only that thread: the test process keeps its own), mounts the
    tmpfs and spawns the ranks, which inherit the namespace; the tmpfs goes with the last rank.

    Raises:
        pytest.skip.Exception: The machine does not allow mount namespaces here (needs CAP_SYS_ADMIN).
    """
    result: dict[str, Any] = {}

    def start() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNS) != 0:
                reason = os.strerror(ctypes.get_errno())
                result["skip"] = f"a private /dev/shm needs a mount namespace (CAP_SYS_ADMIN): unshare: {reason}"
                return
            subprocess.run(["mount", "--make-rprivate", "/"], check=True, timeout=30)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", SHM], check=True, timeout=30
            )
            # Spawned by this thread: ranks forked by the fork server would not be in this thread's namespace.
            result["world"] = World(nranks, env=env, start_method="spawn")
        except BaseException as exc:  # handed to the test's thread
            result["error"] = exc

    thread = threading.Thread(target=start, name="private-dev-shm")
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), "starting the private-/dev/shm world took over 300 s"
    if "skip" in result:
        pytest.skip(result["skip"])
    if "error" in result:
        raise result["error"]
    return result["world"]


@pytest.fixture(scope="module")
def small_shm_worlds() -> Iterator[list[World]]:
    """The module's private-/dev/shm worlds, the last one current; all closed when the module is done."""
    worlds: list[World] = []
    yield worlds
    for world in worlds:
        world.close()


@pytest.fixture
def small_shm_world(small_shm_worlds: list[World]) -> World:
    """A live world of ``NRANKS`` ranks with a private /dev/shm, replaced when a failed case took it down."""
    if not small_shm_worlds or not small_shm_worlds[-1].alive:
        small_shm_worlds.append(_start_world_with_private_dev_shm(NRANKS, ENV, SMALL_SHM_BYTES))
    return small_shm_worlds[-1]


@pytest.fixture
def world8(world_factory) -> World:
    return world_factory(NRANKS, ENV)


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


def test_cleanup_keeps_a_live_segment_whose_pid_is_no_process_here(small_shm_world: World) -> None:
    assert run_case(small_shm_world, _case_cleanup_decides_by_the_lock, _dead_pid()) == [True] * NRANKS


def test_cleanup_never_removes_another_users_segment(small_shm_world: World) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"giving a test segment to another user needs root (chown); running as uid {os.geteuid()}")
    assert run_case(small_shm_world, _case_another_users_segment_is_never_removed, _dead_pid()) == [True] * NRANKS


def test_aliases_of_shmem_tensors_survive_shutdown(world8: World) -> None:
    results = run_case(world8, _case_shmem_aliases_survive_shutdown)
    assert results == [{"numpy": 5.0, "dlpack": 6.0, "peer numpy": 7.0}] * NRANKS


def test_aliases_of_symm_tensors_survive_shutdown(world8: World) -> None:
    results = run_case(world8, _case_symm_aliases_survive_shutdown)
    assert results == [{"numpy": 5.0, "dlpack": 6.0}] * NRANKS


def test_alias_written_between_free_and_shutdown_reaches_the_next_allocation(world8: World) -> None:
    assert run_case(world8, _case_alias_between_free_and_shutdown_reaches_the_heap) == [True] * NRANKS


def test_dev_shm_too_full_for_the_heaps_fails_at_init_on_every_rank(small_shm_world: World) -> None:
    filler = os.path.join(SHM, "filler-too-full")
    results = run_case(small_shm_world, _case_dev_shm_too_full_at_init, filler)
    assert all(r == results[0] for r in results), results


def test_dev_shm_filled_after_init_cannot_take_the_heaps_pages(small_shm_world: World) -> None:
    filler = os.path.join(SHM, "filler-after-init")
    results = run_case(small_shm_world, _case_dev_shm_filled_after_init, filler, timeout=120)
    heaps = NRANKS * (results[0]["heap"] + CONTROL_BYTES)
    # The filler got what the reserved heaps left, not their pages.
    assert 0 <= results[0]["filled"] <= SMALL_SHM_BYTES - heaps, results[0]
