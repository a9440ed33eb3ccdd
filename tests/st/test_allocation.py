"""System tests of symmetric allocation and the guard chain, on the host device with real ranks.

Covers ``shmem.empty`` (torch-style sizes, dtype default, alignment, argument errors), ``shmem.free`` (views,
double frees, foreign tensors, tensors of an earlier lifecycle), ranks that disagree on an allocation or a free
(``ShmemMismatchError`` on every rank, nothing corrupted), allocation ids that are never reused, the guard that makes
a freed tensor and all its views raise a clear error naming the allocation, and leaked allocations.

The ``_case_*`` functions run inside the ranks of a 2-rank world (and a 1-rank one); each starts and ends a
lifecycle of its own and cleans up in ``finally`` so that one failure does not cascade into the next case.
"""

from __future__ import annotations

import gc
import io
import os
import re
import stat
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from harness import CaseOutput, World
from hyper_parallel.core.multicore import runtime_logs, shmem
from st_cases import allocation_info, assert_clean, expect_error, run_case

ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}
FREED = "symmetric allocation was freed"


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _active_ids() -> list[int]:
    return [a["allocation_id"] for a in shmem.debug_state()["active_allocations"]]


def _leaked_ids() -> list[int]:
    return [a["allocation_id"] for a in shmem.debug_state()["leaked_allocations"]]


def _free_quietly(tensors: list[torch.Tensor]) -> None:
    """Best-effort cleanup after a failed case: frees what is still live, ignores what is not."""
    for t in tensors:
        try:
            shmem.free(t)
        except Exception:
            pass


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_empty_shapes_and_dtypes() -> list[int]:
    assert_clean()
    rank = dist.get_rank()
    made: list[torch.Tensor] = []
    handle = shmem.acquire_shmem()
    try:
        # torch-style sizes: varargs, a tuple, a list, a torch.Size.
        forms = [((2, 3), (2, 3)), (((2, 3),), (2, 3)), (([4],), (4,)), ((torch.Size([2, 2, 2]),), (2, 2, 2))]
        for size, shape in forms:
            t = shmem.empty(*size)
            made.append(t)
            assert tuple(t.shape) == shape and t.is_contiguous() and t.device.type == "cpu"
            assert t.dtype == torch.get_default_dtype() == torch.float32
            assert allocation_info(t)["bytes"] == t.numel() * 4
        t = shmem.empty(5, dtype=torch.int16)
        made.append(t)
        assert t.dtype == torch.int16 and allocation_info(t)["bytes"] == 10
        # The default dtype is read at the call, not at import.
        saved = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            t = shmem.empty(3)
        finally:
            torch.set_default_dtype(saved)
        made.append(t)
        assert t.dtype == torch.float64 and allocation_info(t)["bytes"] == 24
        zero = shmem.empty(0, dtype=torch.int32)
        made.append(zero)
        assert tuple(zero.shape) == (0,) and zero.numel() == 0
        # The memory is usable as an ordinary tensor.
        a = made[0]
        a.copy_(torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank)
        assert a.sum().item() == 15 + 60 * rank
        return [allocation_info(t)["offset"] for t in made if t.numel()]
    finally:
        for t in made:
            shmem.free(t)
        handle.close()


def _case_bad_arguments() -> None:
    assert_clean()
    with shmem.acquire_shmem():
        before = shmem.debug_state()
        # Contract errors are raised before any collective, on every rank alike.
        expect_error(TypeError, lambda: shmem.empty(2.0), "`size` must be ints or one sequence of ints, but got (2.0,)")
        expect_error(TypeError, lambda: shmem.empty((2, "3")), "`size` must be ints or one sequence of ints", "'3'")
        expect_error(TypeError, lambda: shmem.empty(True), "`size` must be ints", "True")
        expect_error(TypeError, lambda: shmem.empty(None), "`size` must be ints", "None")
        expect_error(TypeError, lambda: shmem.empty(2, 3.5), "`size` must be ints", "3.5")
        expect_error(ValueError, lambda: shmem.empty(2, -1), "`size` must contain non-negative dimensions, but got [2, -1]")
        expect_error(TypeError, lambda: shmem.empty(4, dtype="float32"), "`dtype` must be a torch.dtype, but got str")
        expect_error(TypeError, lambda: shmem.empty(4, dtype=float), "`dtype` must be a torch.dtype, but got type")
        for bad in (3, 0, -64, 96, 1.5, True, "64"):
            expected = f"`alignment` must be a power of two, but got {bad!r}"
            expect_error(ValueError, lambda: shmem.empty(4, alignment=bad), expected)
        # A shape whose byte count overflows int64 is a contract error, not a wrapped-around tiny allocation.
        for dims in [(2**31, 2**31, 4), (2**62, 4), (2**32, 2**32), (2**63,)]:
            expect_error(ValueError, lambda: shmem.empty(*dims), "`size` must describe at most", str(list(dims)))
        after = shmem.debug_state()
        assert after["active_allocations"] == [] and after["leaked_allocations"] == [], repr(after)
        assert after["allocated"] == before["allocated"] == 0
        # Nobody was left waiting in a collective: a real allocation still pairs up.
        t = shmem.empty(4)
        shmem.free(t)


def _case_alignment() -> list[list[int]]:
    assert_clean()
    made: list[torch.Tensor] = []
    handle = shmem.acquire_shmem()
    try:
        offsets = []
        for alignment in (1, 256, 4096):
            made.append(shmem.empty(3, dtype=torch.uint8))  # knocks the next free offset off any alignment
            t = shmem.empty(10, dtype=torch.uint8, alignment=alignment)
            made.append(t)
            info = allocation_info(t)
            assert t.data_ptr() % alignment == 0 and info["offset"] % alignment == 0, (alignment, hex(t.data_ptr()))
            offsets.append(info["offset"])
        # Beyond the page size up to 2 MiB the address is aligned too (heaps are mapped at 2 MiB boundaries);
        # aligning only the offset inside a page-aligned heap would hand out a misaligned tensor.
        for alignment in (1 << 16, 1 << 21):
            made.append(shmem.empty(3, dtype=torch.uint8))
            t = shmem.empty(10, dtype=torch.uint8, alignment=alignment)
            made.append(t)
            assert t.data_ptr() % alignment == 0, f"alignment={alignment} gave base {hex(t.data_ptr())}"
            offsets.append(allocation_info(t)["offset"])
        # Above that it is refused, on every rank, before any collective.
        expect_error(ValueError, lambda: shmem.empty(10, alignment=1 << 22),
                     "`alignment` must be at most 2097152 (2 MiB), but got 4194304")
        return offsets
    finally:
        for t in made:
            shmem.free(t)
        handle.close()


def _case_free_rejects() -> None:
    assert_clean()
    handle = shmem.acquire_shmem()
    t = shmem.empty(4, 4)
    try:
        aid = allocation_info(t)["allocation_id"]
        # Views of every kind (including ones that start at the allocation's base) are refused by name.
        for view in (t[1], t.view(16), t[:], t.detach(), t[2:]):
            expect_error(ValueError, lambda: shmem.free(view), "not a view", f"allocation_id={aid}")
        expect_error(ValueError, lambda: shmem.free(torch.zeros(4)), "`tensor` must be a tensor returned by shmem.empty")
        expect_error(TypeError, lambda: shmem.free("t"), "`tensor` must be a torch.Tensor, but got str")
        expect_error(TypeError, lambda: shmem.free(None), "`tensor` must be a torch.Tensor, but got NoneType")
        # The refusals changed nothing: the allocation is still active and usable.
        assert _active_ids() == [aid]
        t.fill_(2.0)
        assert t.sum().item() == 32.0
        row = t[0]
        shmem.free(t)
        assert _active_ids() == []
        # A second free names the allocation; so does freeing a view of the freed tensor.
        expect_error(shmem.ShmemStateError, lambda: shmem.free(t), FREED, f"allocation_id={aid}")
        expect_error(shmem.ShmemStateError, lambda: shmem.free(row), FREED, f"allocation_id={aid}")
        # A zero-byte allocation frees (and double-frees) like any other.
        z = shmem.empty(0)
        zid = [a["allocation_id"] for a in shmem.debug_state()["active_allocations"]][0]
        shmem.free(z)
        expect_error(shmem.ShmemStateError, lambda: shmem.free(z), FREED, f"allocation_id={zid}")
        assert shmem.debug_state()["allocated"] == 0
    finally:
        _free_quietly([t])
        handle.close()


def _case_free_from_earlier_lifecycle() -> None:
    assert_clean()
    with shmem.acquire_shmem():
        t = shmem.empty(8)
        aid, lifecycle = allocation_info(t)["allocation_id"], shmem.debug_state()["lifecycle"]
        shmem.free(t)
    # Without a runtime, free still names the allocation and its lifecycle.
    expect_error(shmem.ShmemStateError, lambda: shmem.free(t), f"allocation_id={aid}", f"lifecycle={lifecycle}")
    with shmem.acquire_shmem():
        assert shmem.debug_state()["lifecycle"] == lifecycle + 1
        fresh = shmem.empty(8)  # may well land at the same address as t did
        try:
            expect_error(shmem.ShmemStateError, lambda: shmem.free(t), f"allocation_id={aid}", f"lifecycle={lifecycle}")
            expect_error(shmem.ShmemStateError, lambda: shmem.put(t, torch.zeros(8), 0), f"allocation_id={aid}")
            assert len(_active_ids()) == 1
        finally:
            shmem.free(fresh)


def _case_mismatched_sizes_and_orders() -> list[int]:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    made: list[torch.Tensor] = []
    handle = shmem.acquire_shmem()
    try:
        before = shmem.debug_state()

        # Different sizes: every rank fails and sees both sides' byte counts.
        mine, theirs = (64, 128) if rank == 0 else (128, 64)
        msg = expect_error(
            shmem.ShmemMismatchError,
            lambda: shmem.empty(mine // 4),
            "ranks disagree on a symmetric allocation",
            f"rank={rank} op=Empty",
            f"bytes={mine}",
            f"bytes={theirs}",
        )
        assert "rank=0" in msg and "rank=1" in msg
        assert "ranks disagree on a symmetric allocation" in shmem.debug_state()["latest_failure"]

        # Different orders: both calls fail on every rank.
        first, second = (8, 24) if rank == 0 else (24, 8)
        expect_error(shmem.ShmemMismatchError, lambda: shmem.empty(first), "bytes=32", "bytes=96")
        expect_error(shmem.ShmemMismatchError, lambda: shmem.empty(second), "bytes=32", "bytes=96")

        # Different alignments.
        expect_error(
            shmem.ShmemMismatchError,
            lambda: shmem.empty(4, alignment=128 if rank == 0 else 256),
            "alignment=128",
            "alignment=256",
        )

        # Nothing was corrupted: the accounting is back where it was and the heap pairs up again.
        after = shmem.debug_state()
        assert after["active_allocations"] == [] and after["leaked_allocations"] == [], repr(after)
        assert after["allocated"] == before["allocated"] and after["remaining"] == before["remaining"]
        t = shmem.empty(16)
        made.append(t)
        t.fill_(float(rank))
        shmem.barrier()
        got = torch.empty(16)
        shmem.get(got, t, peer)
        assert got.eq(float(peer)).all()

        # A free that disagrees fails everywhere and frees nothing.
        a = shmem.empty(4)
        b = shmem.empty(8)
        made += [a, b]
        ids = _active_ids()
        expect_error(
            shmem.ShmemMismatchError,
            lambda: shmem.free(a if rank == 0 else b),
            "ranks disagree on a symmetric free",
            "bytes=16",
            "bytes=32",
        )
        assert _active_ids() == ids
        a.fill_(1.0)  # still valid memory
        b.fill_(2.0)
        shmem.barrier()
        return [allocation_info(x)["offset"] for x in made]
    finally:
        for t in made:
            shmem.free(t)
        handle.close()


def _case_ids_never_reused() -> list[int]:
    assert_clean()
    ids = []
    with shmem.acquire_shmem():
        t = shmem.empty(64)
        base, aid = t.data_ptr(), allocation_info(t)["allocation_id"]
        shmem.free(t)
        ids.append(aid)
        # The heap hands back the same block; the id is new.
        t = shmem.empty(64)
        assert t.data_ptr() == base, "the best-fit heap should reuse the freed block"
        ids.append(allocation_info(t)["allocation_id"])
        shmem.free(t)
    with shmem.acquire_shmem():
        t = shmem.empty(64)
        ids.append(allocation_info(t)["allocation_id"])
        shmem.free(t)
    assert len(set(ids)) == 3 and ids == sorted(ids), ids
    return ids


def _case_heap_exhausted() -> None:
    assert_clean()
    with shmem.acquire_shmem():
        before = shmem.debug_state()
        big = before["heap_size"]  # more than the heap can hold next to the runtime's own records
        expect_error(
            shmem.ShmemOutOfMemoryError,
            lambda: shmem.empty(big, dtype=torch.uint8),
            "symmetric heap exhausted",
            f"requested={big}",
        )
        after = shmem.debug_state()
        assert after["allocated"] == before["allocated"] and after["active_allocations"] == []
        # The largest block that fits still works.
        t = shmem.empty(before["remaining"], dtype=torch.uint8)
        shmem.free(t)


def _case_freed_tensor_guard() -> None:
    """After free, the tensor and every view raise an error naming the allocation, on any op."""
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()
    t = shmem.empty(4, 4)
    sig = shmem.empty(1, dtype=torch.int32)
    out = shmem.empty(world, 4)
    try:
        aid = allocation_info(t)["allocation_id"]
        sig_id = allocation_info(sig)["allocation_id"]
        t.fill_(1.0)
        row, flat = t[1], t.view(-1)
        shmem.free(t)
        named = f"allocation_id={aid}"

        data_ops: dict[str, Callable[[torch.Tensor], Any]] = {
            "sum": lambda x: x.sum(),
            "add_": lambda x: x.add_(1),
            "repr": repr,
            "str": str,
            "print": lambda x: print(x, file=io.StringIO()),
            "clone": lambda x: x.clone(),
            "data_ptr": lambda x: x.data_ptr(),
            "tolist": lambda x: x.tolist(),
            "numpy": lambda x: x.numpy(),
            "mul": lambda x: x * 2,
            "copy_": lambda x: x.copy_(torch.zeros_like(x)),
            "fill_": lambda x: x.fill_(0),
            "eq": lambda x: x == 0,
            "to_double": lambda x: x.double(),
            "index_write": lambda x: x.__setitem__(0, 3.0),
            "slice_write": lambda x: x.__setitem__(slice(0, 1), 3.0),
            "index_read_item": lambda x: x[0].sum().item(),
            "advanced_index": lambda x: x[[0]],
            "mask_index": lambda x: x[torch.ones(x.shape, dtype=torch.bool)],
            "torch.save": lambda x: torch.save(x, io.BytesIO()),
        }
        unclear: list[str] = []  # every op that misbehaves, so one run reports them all
        for name, tensor in (("tensor", t), ("row view", row), ("flat view", flat)):
            for op, fn in data_ops.items():
                try:
                    fn(tensor)
                except RuntimeError as exc:
                    if named not in str(exc):
                        unclear.append(f"{op} on the freed {name}: {str(exc)[:160]!r}")
                else:
                    unclear.append(f"{op} on the freed {name}: no error")
            # Plain indexing may only make a view, but never one that works or fails without naming the allocation.
            for how, index in (("x[0]", 0), ("x[0:1]", slice(0, 1)), ("x[...]", Ellipsis)):
                try:
                    picked = tensor[index]
                    picked.sum()
                except RuntimeError as exc:
                    if named not in str(exc):
                        unclear.append(f"{how} on the freed {name}: {str(exc)[:160]!r}")
                else:
                    unclear.append(f"{how} on the freed {name}: no error")
        assert not unclear, "ops on a freed tensor that do not raise naming the allocation:\n" + "\n".join(unclear)

        # Every SHMEM entry refuses the freed tensor and its views, before anything is sent.
        entries: dict[str, Callable[[torch.Tensor], Any]] = {
            "put": lambda x: shmem.put(x, torch.zeros(x.shape), (rank + 1) % world),
            "get": lambda x: shmem.get(torch.zeros(x.shape), x, (rank + 1) % world),
            "all_gather input": lambda x: shmem.all_gather(out, x),
            "free": lambda x: shmem.free(x),
        }
        for name, tensor in (("tensor", t), ("row view", row)):
            for op, fn in entries.items():
                expect_error(shmem.ShmemStateError, lambda: fn(tensor), FREED, named)

        shmem.free(sig)
        sig_named = f"allocation_id={sig_id}"
        expect_error(shmem.ShmemStateError, lambda: shmem.signal(sig, 1, 0), FREED, sig_named)
        expect_error(shmem.ShmemStateError, lambda: shmem.wait_signal(sig, 1), FREED, sig_named)
        expect_error(shmem.ShmemStateError, lambda: shmem.signal(sig, 1, 0, op="add"), FREED, sig_named)
        shmem.free(out)
        expect_error(shmem.ShmemStateError, lambda: shmem.all_gather(out, torch.zeros(4)), FREED)

        # The runtime is unharmed.
        assert shmem.debug_state()["active_allocations"] == []
        shmem.barrier()
    finally:
        _free_quietly([t, sig, out])
        handle.close()


def _stderr_so_far() -> str:
    """What this rank wrote to fd 2 during the case so far (the harness redirects it into a file)."""
    assert stat.S_ISREG(os.fstat(2).st_mode), "run this case with capture_stderr=True"
    with open("/proc/self/fd/2", "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def _case_leak_is_logged_at_once() -> dict:
    assert_clean()
    rank = dist.get_rank()
    handle = shmem.acquire_shmem()
    try:
        t = shmem.empty(6, dtype=torch.int16)
        info = allocation_info(t)
        aid, base = info["allocation_id"], info["base"]
        tail = t[2:]  # a view keeps the storage (and the allocation) alive
        del t
        gc.collect()
        assert _active_ids() == [aid] and _leaked_ids() == []
        assert "leaked" not in _stderr_so_far()
        del tail  # the last reference dies without free
        runtime_logs.flush()  # the runtime's queued records, through logging (here: its stderr fallback)
        logged = _stderr_so_far()  # at once: before any other SHMEM call
        lines = [line for line in logged.splitlines() if "symmetric allocation leaked" in line]
        assert len(lines) == 1, logged
        line = lines[0]
        assert f"[hyper_parallel.shmem ERROR rank={rank}]" in line, line
        for needle in (f"allocation_id={aid} ", f"base={hex(base)} ", "bytes=12 ", f"root_rank={rank}"):
            assert needle in line, (needle, line)
        state = shmem.debug_state()
        assert _active_ids() == [] and _leaked_ids() == [aid], repr(state)
        assert state["leaked_allocations"][0]["base"] == base
        # The heap still works next to the leak.
        u = shmem.empty(4)
        shmem.free(u)
    finally:
        handle.close()  # a leaked allocation does not block shutdown
    assert handle.closed and shmem.debug_state()["state"] == "uninitialized"
    return {"allocation_id": aid, "base": base}


def _case_share_memory_moves_the_tensor_out_of_the_heap() -> dict:
    assert_clean()
    handle = shmem.acquire_shmem()
    try:
        t = shmem.empty(8)
        t.fill_(3.0)
        aid = allocation_info(t)["allocation_id"]
        t.share_memory_()  # torch copies the data into memory of its own: the tensor leaves the symmetric heap
        runtime_logs.flush()  # the runtime's queued records, through logging (here: its stderr fallback)
        logged = _stderr_so_far()
        lines = [line for line in logged.splitlines() if "symmetric allocation leaked" in line]
        assert len(lines) == 1 and "its tensor was moved to other memory (share_memory_()" in lines[0], logged
        assert f"allocation_id={aid} " in lines[0], lines[0]
        assert _leaked_ids() == [aid] and _active_ids() == []
        assert t.sum().item() == 24.0  # still an ordinary, usable tensor
        expect_error(ValueError, lambda: shmem.put(t, torch.zeros(8), 0), "`dst` must be a symmetric tensor")
    finally:
        handle.close()
    return {"allocation_id": aid}


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.fixture
def world2(world_factory) -> World:
    return world_factory(2, ENV)


def test_empty_is_torch_style(world2: World) -> None:
    offsets = run_case(world2, _case_empty_shapes_and_dtypes)
    assert offsets[0] == offsets[1]  # symmetric: the same heap offsets on every rank
    assert len(set(offsets[0])) == len(offsets[0])


def test_empty_and_free_on_a_single_rank(world_factory) -> None:
    world = world_factory(1, ENV)
    run_case(world, _case_empty_shapes_and_dtypes)
    run_case(world, _case_free_rejects)


def test_bad_sizes_dtypes_and_alignments_are_refused(world2: World) -> None:
    run_case(world2, _case_bad_arguments)


def test_alignment_is_honoured_at_the_same_offset(world2: World) -> None:
    offsets = run_case(world2, _case_alignment)
    assert offsets[0] == offsets[1]


def test_free_rejects_views_double_frees_and_foreign_tensors(world2: World) -> None:
    run_case(world2, _case_free_rejects)


def test_free_rejects_a_tensor_of_an_earlier_lifecycle(world2: World) -> None:
    run_case(world2, _case_free_from_earlier_lifecycle)


def test_mismatched_allocations_fail_on_every_rank_without_corruption(world2: World) -> None:
    offsets = run_case(world2, _case_mismatched_sizes_and_orders)
    assert offsets[0] == offsets[1]


def test_allocation_ids_are_never_reused(world2: World) -> None:
    ids = run_case(world2, _case_ids_never_reused)
    for per_rank in ids:
        assert len(set(per_rank)) == 3


def test_heap_exhaustion_fails_on_every_rank_and_changes_nothing(world2: World) -> None:
    run_case(world2, _case_heap_exhausted)


def test_freed_tensor_and_views_raise_naming_the_allocation(world2: World) -> None:
    run_case(world2, _case_freed_tensor_guard)


def test_leaked_allocation_is_logged_at_once_and_does_not_block_shutdown(world2: World) -> None:
    outputs: list[CaseOutput] = run_case(world2, _case_leak_is_logged_at_once, capture_stderr=True)
    for rank, out in enumerate(outputs):
        aid = out.value["allocation_id"]
        assert f"ERROR rank={rank}] symmetric allocation leaked" in out.stderr
        # Shutdown only warns about it.
        warning = rf"WARNING rank={rank}\] shutting down with a leaked allocation: allocation_id={aid}\b"
        assert re.search(warning, out.stderr), out.stderr


def test_share_memory_of_a_symmetric_tensor_is_reported_as_a_leak(world_factory) -> None:
    run_case(world_factory(1, ENV), _case_share_memory_moves_the_tensor_out_of_the_heap, capture_stderr=True)
