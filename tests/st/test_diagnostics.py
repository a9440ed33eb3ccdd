"""System tests of the diagnostics: ``debug_state()`` and the allocation log.

Covers the read-only ``DebugState`` snapshot (writes raise TypeError, it survives pickling and copying), its
fields and their order, its repr (one field per line, addresses in hex), ``latest_failure``, heap accounting
(allocated / max_allocated / remaining across empty and free), ``reaches_peer_memory`` against the kernel's own
verdict on cross-memory attach between the ranks, and HYPER_PARALLEL_SHMEM_LOG_LEVEL=0, which logs
every allocation and free with its id, hex base, byte count and the user's call site.

Cases run in a reused 1-rank and a reused 2-rank world; the log level is set in the ranks' environment inside a
case, before its lifecycle starts, and restored afterwards.
"""

from __future__ import annotations

import copy
import ctypes
import inspect
import os
import pickle
import re
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from harness import CaseOutput
from hyper_parallel.core.multicore import shmem
from st_cases import allocation_info, assert_clean, restored_env, run_case

ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}
LOG_VAR = "HYPER_PARALLEL_SHMEM_LOG_LEVEL"
MiB = 1 << 20
FIELDS = [
    "state",
    "lifecycle",
    "reference_count",
    "root_ranks",
    "rank",
    "world_size",
    "device",
    "config",
    "heap_size",
    "allocated",
    "max_allocated",
    "remaining",
    "heap_base",
    "active_allocations",
    "leaked_allocations",
    "latest_failure",
    "calls_in_flight",
    "live_teams",
    "reaches_peer_memory",
    "nodes",
    "transports",
    # upstream hyper-parallel's keys the project's vocabulary names otherwise (test_upstream_names.py)
    "root_rank",
    "root_size",
    "device_index",
    "device_model",
    "soc_name",
    "allocated_count",
    "allocated_bytes",
    "remaining_bytes",
    "max_allocated_bytes",
]


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _line() -> int:
    """The caller's current line number."""
    return inspect.currentframe().f_back.f_lineno


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_snapshot_is_read_only() -> None:
    assert_clean()
    outside = shmem.debug_state()  # works without a runtime
    assert list(outside) == FIELDS and outside["root_ranks"] == [] and outside["reference_count"] == 0
    with shmem.acquire_shmem():
        state = shmem.debug_state()
        assert isinstance(state, shmem.DebugState) and isinstance(state, dict)
        original = dict(state)
        writes: dict[str, Callable[[], Any]] = {
            "setitem": lambda: state.__setitem__("state", "hacked"),
            "setitem new key": lambda: state.__setitem__("extra", 1),
            "delitem": lambda: state.__delitem__("state"),
            "update": lambda: state.update(state="hacked"),
            "pop": lambda: state.pop("state"),
            "popitem": lambda: state.popitem(),
            "clear": lambda: state.clear(),
            "setdefault": lambda: state.setdefault("extra", 1),
        }
        for name, write in writes.items():
            with pytest.raises(TypeError, match=r"`debug_state\(\)` must not be modified") as info:
                write()
            assert info.type is TypeError, name
        with pytest.raises(TypeError, match="must not be modified"):
            state |= {"state": "hacked"}
        assert dict(state) == original
        # A snapshot travels: pickle (dist.all_gather_object), copy and deepcopy keep its type and content.
        for name, clone in (
            ("pickle", pickle.loads(pickle.dumps(state))),
            ("copy", copy.copy(state)),
            ("deepcopy", copy.deepcopy(state)),
        ):
            assert type(clone) is shmem.DebugState and dict(clone) == original, name
            with pytest.raises(TypeError):
                clone["state"] = "hacked"
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, state)
        assert [g["rank"] for g in gathered] == list(range(dist.get_world_size()))


def _case_fields_and_repr() -> dict:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    with shmem.acquire_shmem():
        t = shmem.empty(10, dtype=torch.float64)
        try:
            state = shmem.debug_state()
            assert list(state) == FIELDS, list(state)
            assert state["state"] == "initialized" and isinstance(state["lifecycle"], int) and state["lifecycle"] >= 1
            assert state["reference_count"] == 1 and state["root_ranks"] == list(range(world))
            assert state["rank"] == rank and state["world_size"] == world and state["device"] == "host"
            assert state["config"] == {
                "heap_size": 16 * MiB,
                "heap_size_source": "HYPER_PARALLEL_SHMEM_HEAP_SIZE",
                "timeout_sec": 20.0,
                "log_level": 2,
                "device": "host",
                "checks": "deferred",   # as configured; the host device checks before data moves in either mode
                "low_precision_dtype": "",   # SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE as set: unset
                "heap_size_bytes": 16 * MiB,
                "timeout_seconds": 20.0,
                "data_engine": "cpu",
                "bootstrap_endpoint_base": None,
            }
            assert state["heap_size"] == 16 * MiB
            heap_base = state["heap_base"]
            assert heap_base > 0 and heap_base % os.sysconf("SC_PAGE_SIZE") == 0
            assert state["leaked_allocations"] == [] and isinstance(state["latest_failure"], str)
            assert state["calls_in_flight"] == 0
            [alloc] = state["active_allocations"]
            assert {"allocation_id", "base", "offset", "bytes", "lifecycle"} <= set(alloc), alloc
            assert alloc["base"] == t.data_ptr() and alloc["base"] - heap_base == alloc["offset"]
            assert alloc["bytes"] == 80 and alloc["lifecycle"] == state["lifecycle"]

            text = repr(state)
            assert str(state) == text
            lines = text.splitlines()
            assert lines[0] == "DebugState(" and lines[-1] == ")", text
            # One field per line, in order, at the same indent.
            keyed = [line.strip().split(":", 1)[0] for line in lines[1:-1] if re.match(r"^  \w+: ", line)]
            assert keyed == FIELDS, text
            assert f"  heap_base: {hex(heap_base)}" in lines, text
            assert f"  state: 'initialized'" in lines and f"  rank: {rank}" in lines, text
            # Allocations show their addresses in hex, never in decimal.
            alloc_lines = [line for line in lines if f"allocation_id={alloc['allocation_id']}" in line]
            assert len(alloc_lines) == 1, text
            assert f"base={hex(alloc['base'])}" in alloc_lines[0] and f"offset={hex(alloc['offset'])}" in alloc_lines[0]
            assert str(alloc["base"]) not in text and str(heap_base) not in text, text
            return {"offset": alloc["offset"], "lifecycle": state["lifecycle"]}
        finally:
            shmem.free(t)


def _case_latest_failure() -> None:
    assert_clean()
    world = dist.get_world_size()
    with shmem.acquire_shmem():
        t = shmem.empty(4)
        try:
            with pytest.raises(ValueError) as info:
                shmem.put(t, torch.zeros(4), world + 3)
            assert str(info.value) == f"`pe` must be in [0, {world}), but got {world + 3}"
            assert str(info.value) in shmem.debug_state()["latest_failure"]
            # The next failure replaces it.
            with pytest.raises(ValueError, match="must have as many bytes"):
                shmem.get(torch.zeros(3), t, 0)
            latest = shmem.debug_state()["latest_failure"]
            assert "`src` must have as many bytes as `dst`" in latest and "`pe`" not in latest, latest
        finally:
            shmem.free(t)
    # The snapshot still tells the story after the shutdown.
    assert "must have as many bytes" in shmem.debug_state()["latest_failure"]


def _case_heap_accounting() -> list[int]:
    assert_clean()
    with shmem.acquire_shmem():
        start = shmem.debug_state()
        assert start["allocated"] == 0 and start["max_allocated"] == 0
        usable = start["remaining"]  # the heap minus the runtime's own records
        assert start["heap_size"] - 64 * 1024 < usable < start["heap_size"]

        def check(live: list[torch.Tensor], peak: int) -> int:
            state = shmem.debug_state()
            reserved = sum(a["reserved"] for a in state["active_allocations"])
            assert len(state["active_allocations"]) == len(live)
            assert state["allocated"] == reserved, repr(state)
            assert state["remaining"] == usable - state["allocated"], repr(state)
            assert state["max_allocated"] == max(peak, state["allocated"]), repr(state)
            return state["max_allocated"]

        a = shmem.empty(1000, dtype=torch.uint8)
        ra = allocation_info(a)["reserved"]
        assert 1000 <= ra < 1000 + 4096 and shmem.debug_state()["allocated"] == ra
        peak = check([a], 0)
        b = shmem.empty(300, dtype=torch.float32)
        rb = allocation_info(b)["reserved"]
        assert rb >= 1200
        peak = check([a, b], peak)
        assert peak == ra + rb
        shmem.free(a)
        assert check([b], peak) == ra + rb  # the peak stays
        c = shmem.empty(10)
        rc = allocation_info(c)["reserved"]
        check([b, c], peak)
        shmem.free(b)
        shmem.free(c)
        end = shmem.debug_state()
        assert end["allocated"] == 0 and end["remaining"] == usable and end["max_allocated"] == ra + rb
        return [ra, rb, rc]


def _case_allocation_log(level: str | None) -> dict:
    assert_clean()
    with restored_env(LOG_VAR):
        if level is None:
            os.environ.pop(LOG_VAR, None)
        else:
            os.environ[LOG_VAR] = level
        with shmem.acquire_shmem():
            empty_line = _line() + 1
            t = shmem.empty(32, dtype=torch.float64)
            info = allocation_info(t)
            free_line = _line() + 1
            shmem.free(t)
    return {
        "allocation_id": info["allocation_id"],
        "base": info["base"],
        "call_site": info["call_site"],
        "empty_line": empty_line,
        "free_line": free_line,
        "file": __file__,
    }


def _kernel_lets_every_rank_read_every_peer() -> bool:
    """Probes cross-memory attach between the ranks on its own: each reads a word every peer published."""
    libc = ctypes.CDLL(None, use_errno=True)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]

    word = ctypes.c_uint64(0x5EED0000 + dist.get_rank())
    published: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(published, (os.getpid(), ctypes.addressof(word)))
    readable = True
    for rank, (pid, address) in enumerate(published):
        copied = ctypes.c_uint64(0)
        local = IoVec(ctypes.addressof(copied), 8)
        remote = IoVec(address, 8)
        read = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        readable = readable and read == 8 and copied.value == 0x5EED0000 + rank
    verdicts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, readable)
    dist.barrier()  # every peer has read this rank's word before it goes
    return all(verdicts)


def _case_reaches_peer_memory_as_the_kernel_allows() -> None:
    assert_clean()
    expected = _kernel_lets_every_rank_read_every_peer()
    with shmem.acquire_shmem():
        assert shmem.debug_state()["reaches_peer_memory"] is expected, expected
    assert shmem.debug_state()["reaches_peer_memory"] is False  # no runtime, no device


def _case_ranks_of_one_machine_are_one_node() -> None:
    assert_clean()
    with shmem.acquire_shmem():
        assert shmem.debug_state()["nodes"] == [0] * dist.get_world_size()
        assert not shmem.root_team().spans_nodes
    assert shmem.debug_state()["nodes"] == []  # no runtime


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [1, 2])
def test_debug_state_is_a_read_only_snapshot(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, ENV), _case_snapshot_is_read_only)


@pytest.mark.parametrize("nranks", [1, 2])
def test_debug_state_fields_and_repr(world_factory, nranks: int) -> None:
    results = run_case(world_factory(nranks, ENV), _case_fields_and_repr)
    assert all(r == results[0] for r in results)  # same offset and lifecycle on every rank


@pytest.mark.parametrize("nranks", [1, 2])
def test_debug_state_says_whether_ordinary_tensors_are_read_in_place(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, ENV), _case_reaches_peer_memory_as_the_kernel_allows)


def test_latest_failure_records_the_last_error(world_factory) -> None:
    run_case(world_factory(2, ENV), _case_latest_failure)


def test_heap_accounting_follows_empty_and_free(world_factory) -> None:
    reserved = run_case(world_factory(2, ENV), _case_heap_accounting)
    assert reserved[0] == reserved[1]


def test_log_level_0_logs_every_allocation_and_free_with_the_call_site(world_factory) -> None:
    outputs: list[CaseOutput] = run_case(world_factory(2, ENV), _case_allocation_log, "0", capture_stderr=True)
    for rank, out in enumerate(outputs):
        v = out.value
        site_empty = f"call_site={v['file']}:{v['empty_line']} in _case_allocation_log"
        site_free = f"call_site={v['file']}:{v['free_line']} in _case_allocation_log"
        empties = [line for line in out.stderr.splitlines() if "op=Empty" in line]
        frees = [line for line in out.stderr.splitlines() if "op=Free" in line]
        assert len(empties) == 1 and len(frees) == 1, out.stderr
        for line, site in ((empties[0], site_empty), (frees[0], site_free)):
            assert f"[hyper_parallel.shmem DEBUG rank={rank}]" in line, line
            for needle in (f"allocation_id={v['allocation_id']} ", f"base={hex(v['base'])} ", "bytes=256 ", site):
                assert needle in line, (needle, line)
            # Internal frames are removed: the site is the user's line, never the package's.
            assert "hyper_parallel/core" not in line, line
        # debug_state keeps the same call site.
        assert v["call_site"] == site_empty.split("=", 1)[1]


def test_default_log_level_logs_no_allocations(world_factory) -> None:
    outputs: list[CaseOutput] = run_case(world_factory(2, ENV), _case_allocation_log, None, capture_stderr=True)
    for out in outputs:
        assert "op=Empty" not in out.stderr and "op=Free" not in out.stderr, out.stderr


@pytest.mark.parametrize("nranks", [1, 3])
def test_debug_state_puts_the_ranks_of_one_machine_on_one_node(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, ENV), _case_ranks_of_one_machine_are_one_node)
