"""System tests of code written for upstream hyper-parallel's runtime, run on this project unchanged.

Upstream's own runtime tests (``tests/torch/multicore/shmem/``: lifecycle, allocation, one-sided, all_gather) are
ported here by behaviour, under their names, with real ranks and real gloo groups in place of NPUs: module-level
``shmem.acquire()``/``shmem.release()`` (mixed with ``acquire_shmem`` handles), ``host_barrier()``,
``barrier(blocking=...)``, ``operation=``/``comparison=``, upstream's ``debug_state()`` keys and state names, its
error fields (``error_code=DOUBLE_FREE operation=free ...``) on errors that are RuntimeErrors, a one-PE runtime
without torch.distributed, and the zero-byte all_gather into an ordinary ``torch.empty(0)``. Last, MegaMoE's call
sequence (workspace creation, heap-manager queries, barriers, release) is replayed without its NPU kernels.

The cases run in one reused 2-rank world; the one-PE runtime runs in plain subprocesses without torch.distributed.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

import hyper_parallel
from hyper_parallel.core.multicore import shmem
from st_cases import assert_clean, expect_error, restored_env, run_case

HEAP_VAR = "HYPER_PARALLEL_SHMEM_HEAP_SIZE"
ENV = {HEAP_VAR: "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}
MiB = 1 << 20
ACQUIRE_HINT = "Call shmem.acquire() before using SHMEM capabilities."
# The byte counts of upstream's all_gather boundary matrix (the leading 0: a validated no-op).
BOUNDARY_BYTES = (0, 1, 31, 32, 33, 8191, 8192, 8193, 8223, 8224, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 31,
                  64 * 1024 + 33, MiB - 1, MiB)


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _note(error: BaseException) -> str:
    notes = getattr(error, "__notes__", [])
    assert len(notes) == 1, notes
    return notes[0]


def _assert_fields(error: BaseException, error_code: str, operation: str, phase: str = "Validation") -> str:
    """The error is a RuntimeError carrying upstream's fixed fields, as attributes and as its note."""
    assert isinstance(error, RuntimeError) and isinstance(error, shmem.ShmemError), type(error)
    assert (error.error_code, error.operation, error.phase, error.cann_error_code) == (
        error_code, operation, phase, None), (error.error_code, error.operation, error.phase)
    note = _note(error)
    expected = (f"[HYPER_PARALLEL_SHMEM_ERROR] error_code={error_code} operation={operation} phase={phase} "
                f"cann_error_code=None message=")
    assert note.startswith(expected), note
    assert str(error) in note and str(error) not in ("", note), (str(error), note)
    return note


def _random_bytes(count: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rank * 1009 + count)
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator)


def _reference_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return torch.cat(gathered)


# --------------------------------------------------------------------------
# Lifecycle (upstream's _test_lifecycle.py).
# --------------------------------------------------------------------------


def _case_inactive_runtime_hint() -> None:
    assert_clean()
    empty_in, empty_out = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)
    for operation, call in (
        ("allocate", lambda: shmem.empty(1, dtype=torch.uint8)),
        ("all_gather", lambda: shmem.all_gather(empty_out, empty_in)),
        ("barrier", lambda: shmem.barrier()),
        ("host_barrier", lambda: shmem.host_barrier()),
    ):
        with pytest.raises(RuntimeError) as info:
            call()
        assert isinstance(info.value, shmem.ShmemStateError)
        assert str(info.value).startswith("shmem runtime is not initialised: op="), str(info.value)
        note = _assert_fields(info.value, "INVALID_STATE", operation)
        assert note.endswith(ACQUIRE_HINT), note
    assert shmem.debug_state()["state"] == "Uninitialized"


def _case_reinit_with_different_heap_sizes() -> None:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    stale = None
    with restored_env(HEAP_VAR):
        for cycle, (heap_mib, allocation_mib) in enumerate(((4, 1), (8, 6), (4, 1))):
            os.environ[HEAP_VAR] = str(heap_mib * MiB)
            if cycle > 0 and rank == world - 1:
                time.sleep(0.2)  # the ranks reach acquire() skewed
            shmem.acquire()
            assert shmem.debug_state()["config"]["heap_size_bytes"] == heap_mib * MiB
            tensor = shmem.empty((allocation_mib * MiB,), dtype=torch.uint8)
            tensor.fill_(rank + cycle)
            shmem.barrier()
            if stale is not None:
                with pytest.raises(RuntimeError, match="DOUBLE_FREE"):
                    shmem.free(stale)
            shmem.free(tensor)
            shmem.barrier()
            if cycle == 0:
                stale = tensor
            shmem.release()
    # heap_size_bytes= starts a lifecycle with that heap instead of the variable's, and bounds a join.
    shmem.acquire(heap_size_bytes=2 * MiB)
    try:
        assert shmem.debug_state()["config"]["heap_size_bytes"] == 2 * MiB
        shmem.acquire(heap_size_bytes=MiB)  # fits the active heap: counts
        shmem.release()
        with pytest.raises(shmem.ShmemStateError, match="heap is smaller than requested") as info:
            shmem.acquire(heap_size_bytes=4 * MiB)
        _assert_fields(info.value, "INVALID_STATE", "initialize")
        with pytest.raises(ValueError) as info:
            shmem.acquire(heap_size_bytes=0)
        assert str(info.value) == "`heap_size_bytes` must be a positive int, but got 0"
        assert shmem.debug_state()["reference_count"] == 1
    finally:
        shmem.release()
    assert os.environ[HEAP_VAR] == ENV[HEAP_VAR]


def _case_final_release_with_active_allocation_is_retryable() -> None:
    assert_clean()
    shmem.acquire()
    allocation = shmem.empty(1024, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="live allocations remain") as info:
        shmem.release()
    _assert_fields(info.value, "INVALID_STATE", "shutdown")
    assert shmem.debug_state()["reference_count"] == 1 and shmem.debug_state()["state"] == "Ready"
    shmem.free(allocation)
    shmem.release()
    shmem.acquire()
    shmem.release()
    assert shmem.debug_state()["state"] == "Uninitialized"


def _case_mixing_acquire_and_handles() -> None:
    assert_clean()

    def refs() -> int:
        return shmem.debug_state()["reference_count"]

    # acquire() first, the handle closes last: the handle's close is the collective shutdown.
    shmem.acquire()
    handle = shmem.acquire_shmem()
    assert refs() == 2
    shmem.release()
    assert refs() == 1 and shmem.debug_state()["state"] == "Ready" and not handle.closed
    handle.close()
    assert refs() == 0 and shmem.debug_state()["state"] == "Uninitialized"

    # A handle first, release() last: release() is the collective shutdown.
    handle = shmem.acquire_shmem()
    shmem.acquire()
    handle.close()
    assert refs() == 1 and shmem.debug_state()["state"] == "Ready"
    kept = shmem.empty(8)
    with pytest.raises(shmem.ShmemStateError, match="live allocations remain"):
        shmem.release()  # the last reference: refused, and kept
    shmem.free(kept)
    shmem.release()
    assert refs() == 0 and shmem.debug_state()["state"] == "Uninitialized"

    # release() gives back only what acquire() took: a handle's reference is the handle's.
    with shmem.acquire_shmem() as handle:
        with pytest.raises(shmem.ShmemStateError) as info:
            shmem.release()
        assert str(info.value) == (
            "no reference taken by shmem.acquire() is left to release: op=release reference_count=1 "
            "(acquire_shmem() handles are given back with handle.close())"
        )
        _assert_fields(info.value, "INVALID_STATE", "shutdown")
        assert refs() == 1 and not handle.closed
    assert refs() == 0


# --------------------------------------------------------------------------
# Allocation (upstream's _test_allocation.py).
# --------------------------------------------------------------------------


def _case_allocation_and_release() -> None:
    assert_clean()
    shmem.acquire()
    regular = shmem.empty((256,), dtype=torch.uint8)
    aligned = shmem.empty((256,), dtype=torch.uint8, alignment=512)
    assert aligned.data_ptr() % 512 == 0, hex(aligned.data_ptr())
    shmem.free(regular)
    shmem.free(aligned)
    shmem.release()


def _case_storage_assoc_double_free() -> None:
    assert_clean()
    shmem.acquire()
    allocation_a = shmem.empty(64, dtype=torch.uint8)
    shmem.free(allocation_a)
    with pytest.raises(RuntimeError, match="DOUBLE_FREE") as info:
        shmem.free(allocation_a)
    _assert_fields(info.value, "DOUBLE_FREE", "free")
    del allocation_a
    gc.collect()
    allocation_b = shmem.empty(64, dtype=torch.uint8)
    shmem.free(allocation_b)
    shmem.release()


def _case_orphan_storage_warning() -> dict:
    assert_clean()
    shmem.acquire()
    allocation = shmem.empty(64, dtype=torch.uint8)
    [active] = shmem.debug_state()["active_allocations"]
    subview = allocation[1:]
    with pytest.raises(RuntimeError, match="not a view") as info:
        shmem.free(subview)
    _assert_fields(info.value, "INVALID_ARGUMENT", "free")
    del info, subview, allocation  # the traceback holds the view too
    gc.collect()
    state = shmem.debug_state()
    # The orphan is still allocated (upstream's count includes it), though no longer active.
    assert state["allocated_count"] == 1 and state["allocated_bytes"] == 64 and state["active_allocations"] == []
    assert [leak["allocation_id"] for leak in state["leaked_allocations"]] == [active["allocation_id"]]
    shmem.barrier()
    shmem.release()  # the project lets a lifecycle with a leak end (with a warning); upstream refuses forever
    return {"allocation_id": active["allocation_id"], "allocation_base": active["allocation_base"]}


def _case_stale_tensor_rejected_by_one_sided_ops() -> None:
    assert_clean()
    shmem.acquire()
    rank = dist.get_rank()
    stale = shmem.empty(16, dtype=torch.uint8)
    local = torch.zeros(16, dtype=torch.uint8)
    shmem.free(stale)
    for operation, call in (
        ("put", lambda: shmem.put(stale, local, rank)),
        ("get", lambda: shmem.get(local, stale, rank)),
        ("signal", lambda: shmem.signal(stale[:4].view(torch.int32), 1, rank)),
    ):
        with pytest.raises(RuntimeError, match="DOUBLE_FREE") as info:
            call()
        _assert_fields(info.value, "DOUBLE_FREE", operation)
    shmem.release()


def _case_error_projection() -> None:
    assert_clean()
    shmem.acquire()
    try:
        with pytest.raises(RuntimeError) as info:
            shmem.empty(1, dtype=torch.uint8, alignment=3)
        assert isinstance(info.value, ValueError)  # the project's contract class too
        note = _assert_fields(info.value, "INVALID_ARGUMENT", "allocate")
        assert ACQUIRE_HINT not in note, note
        failure = shmem.debug_state()["latest_failure"]
        assert failure.startswith("INVALID_ARGUMENT: ") and failure["error_code"] == "INVALID_ARGUMENT", failure
        assert failure["root_rank"] == dist.get_rank() and failure["phase"] == "Validation"
    finally:
        shmem.release()


# --------------------------------------------------------------------------
# One-sided (upstream's _test_one_sided.py).
# --------------------------------------------------------------------------


def _case_put_get() -> None:
    assert_clean()
    shmem.acquire()
    rank, world = dist.get_rank(), dist.get_world_size()
    next_pe, previous_pe = (rank + 1) % world, (rank - 1) % world
    put_destination = shmem.empty(16, dtype=torch.uint8)
    remote_source = shmem.empty(16, dtype=torch.uint8)
    local_source = torch.full((16,), rank + 1, dtype=torch.uint8)
    local_destination = torch.empty_like(local_source)
    put_destination.zero_()
    remote_source.fill_(rank + 11)
    shmem.barrier()
    shmem.put(put_destination, local_source, next_pe)
    shmem.barrier()
    assert torch.equal(put_destination, torch.full_like(put_destination, previous_pe + 1))
    shmem.get(local_destination, remote_source, next_pe)
    assert torch.equal(local_destination, torch.full_like(local_destination, next_pe + 11))
    shmem.barrier()
    # Upstream's parameter names, as its callers write them.
    put_destination.zero_()
    shmem.barrier()
    shmem.put(remote_dst=put_destination, local_src=local_source, target_pe=next_pe)
    shmem.barrier()
    assert torch.equal(put_destination, torch.full_like(put_destination, previous_pe + 1))
    local_destination.zero_()
    shmem.get(local_dst=local_destination, remote_src=remote_source, source_pe=next_pe)
    assert torch.equal(local_destination, torch.full_like(local_destination, next_pe + 11))
    expect_error(TypeError, lambda: shmem.put(put_destination, local_source, next_pe, target_pe=next_pe),
                 "`pe` and `target_pe` must not both be given")
    expect_error(TypeError, lambda: shmem.get(local_destination, source_pe=next_pe),
                 "`src` must be a torch.Tensor, but got NoneType")
    shmem.barrier()
    shmem.free(put_destination)
    shmem.free(remote_source)
    shmem.release()


def _case_barrier_blocking_and_config() -> None:
    assert_clean()
    shmem.acquire()
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    config = shmem.debug_state()["config"]
    assert config["heap_size_bytes"] == 16 * MiB and config["timeout_seconds"] == 20, config
    assert config["data_engine"] == "cpu" and config["bootstrap_endpoint_base"] is None, config

    buffer = shmem.empty(world, dtype=torch.int32)
    state = shmem.debug_state()
    [allocation] = state["active_allocations"]
    assert allocation["allocation_base"] == buffer.data_ptr() and allocation["allocation_bytes"] == 4 * world
    assert state["allocated_count"] == 1 and state["allocated_bytes"] == 4 * world
    assert state["remaining_bytes"] == 16 * MiB - 4 * world and state["max_allocated_bytes"] >= 4 * world
    assert state["root_rank"] == rank and state["root_size"] == world and state["reference_count"] == 1
    buffer.zero_()
    shmem.barrier()

    # Ordered on one stream: the get after barrier(blocking=False) sees every rank's put of its own slot.
    payload = torch.full((1,), rank + 10, dtype=torch.int32)
    got = torch.zeros(1, dtype=torch.int32)
    stream = shmem.Stream()
    with stream:
        shmem.put(buffer[rank:rank + 1], payload, rank)
        shmem.barrier(blocking=False)
        shmem.get(got, buffer[peer:peer + 1], peer)
    stream.synchronize()
    assert got.item() == peer + 10, got
    # barrier(blocking=True) returns once the stream has run it and what came before it.
    got.zero_()
    with stream:
        shmem.get(got, buffer[peer:peer + 1], peer)
        shmem.barrier(blocking=True)
        assert got.item() == peer + 10, got
    with pytest.raises(TypeError) as info:
        shmem.barrier(blocking=1)
    assert str(info.value) == "`blocking` must be a bool, but got int"
    stream.destroy()

    shmem.barrier()
    shmem.free(buffer)
    shmem.release()
    final_state = shmem.debug_state()
    assert final_state["state"] == "Uninitialized" and final_state["state"] == "uninitialized"
    assert final_state["config"] is None and final_state["active_allocations"] is None, final_state
    assert final_state["allocated_count"] is None and final_state["root_rank"] is None, final_state


def _case_signal_and_pull() -> None:
    assert_clean()
    shmem.acquire()
    rank, world = dist.get_rank(), dist.get_world_size()
    next_pe, previous_pe = (rank + 1) % world, (rank - 1) % world
    remote_source = shmem.empty(16, dtype=torch.uint8)
    signal_storage = shmem.empty(16, dtype=torch.int32, alignment=64)
    signal_word = signal_storage[:1]
    local_destination = torch.empty(16, dtype=torch.uint8)
    remote_source.fill_(rank + 11)
    signal_storage.zero_()
    shmem.barrier()

    shmem.signal(remote_signal=signal_word, value=rank + 1, target_pe=next_pe, operation="set")
    shmem.wait_signal(signal_word, previous_pe + 1)
    shmem.get(local_destination, remote_source, previous_pe)
    assert torch.equal(local_destination, torch.full_like(local_destination, previous_pe + 11))
    shmem.barrier()  # every rank saw its signal before anyone overwrites its own below

    shmem.signal(signal_word, 3, rank, operation="set")
    for comparison, value in (("eq", 3), ("ne", 4), ("gt", 2), ("ge", 3), ("lt", 4), ("le", 3)):
        shmem.wait_signal(signal_word, value, comparison=comparison)
    shmem.signal(signal_word, 2, rank, operation="add")
    shmem.wait_signal(signal_word, 5, comparison="eq")
    shmem.signal(signal_word, 1, rank, op="add")  # the project's names beside upstream's
    shmem.wait_signal(signal_word, 6, cmp="eq")

    with pytest.raises(ValueError, match="'set', 'add'") as info:
        shmem.signal(signal_word, 1, rank, operation="SET")
    assert str(info.value) == "`operation` must be one of 'set', 'add', but got 'SET'"
    _assert_fields(info.value, "INVALID_ARGUMENT", "signal")
    with pytest.raises(ValueError, match="'eq', 'ne', 'gt', 'ge', 'lt', 'le'") as info:
        shmem.wait_signal(signal_word, 1, comparison="==")
    assert str(info.value).startswith("`comparison` must be one of")
    _assert_fields(info.value, "INVALID_ARGUMENT", "wait_signal")
    with pytest.raises(TypeError, match="must not both be given"):
        shmem.wait_signal(signal_word, 1, cmp="eq", comparison="eq")
    with pytest.raises(ValueError, match="`operation` must be one of"):
        shmem.signal(signal_word, 1, rank, operation=1)

    shmem.barrier()
    shmem.free(remote_source)
    shmem.free(signal_storage)
    shmem.release()


# --------------------------------------------------------------------------
# all_gather (upstream's _test_all_gather.py).
# --------------------------------------------------------------------------


def _case_all_gather_output_input_overlap_rejected() -> None:
    assert_clean()
    shmem.acquire()
    rank, world = dist.get_rank(), dist.get_world_size()
    allocation = shmem.empty(32 * world, dtype=torch.uint8)
    other = (rank + 1) % world
    with pytest.raises(RuntimeError, match="must not overlap") as info:
        shmem.all_gather(allocation, allocation[other * 32:(other + 1) * 32])
    _assert_fields(info.value, "INVALID_ARGUMENT", "all_gather")
    shmem.free(allocation)
    shmem.release()


def _case_all_gather_output_size_mismatch_rejected() -> None:
    assert_clean()
    shmem.acquire()
    input_tensor = torch.ones(16, dtype=torch.uint8)
    output = shmem.empty(15, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"group_size \* input bytes") as info:
        shmem.all_gather(output, input_tensor)
    _assert_fields(info.value, "INVALID_ARGUMENT", "all_gather")
    shmem.free(output)
    shmem.release()


def _case_all_gather_boundary_matrix() -> None:
    assert_clean()
    shmem.acquire()
    world = dist.get_world_size()
    rank = dist.get_rank()
    for byte_count in BOUNDARY_BYTES:
        input_tensor = _random_bytes(byte_count, rank)
        if byte_count == 0:
            before = shmem.debug_state()["latest_failure"]
            output = torch.empty(0, dtype=torch.uint8)  # an ordinary tensor: a validated no-op needs none symmetric
            shmem.all_gather(output, input_tensor)
            assert output.numel() == 0
            symmetric = shmem.empty(0, dtype=torch.uint8)
            shmem.all_gather(symmetric, input_tensor)
            shmem.all_gather(torch.empty(2, 0), torch.empty(0, 3))  # zero bytes of any shape
            shmem.free(symmetric)
            assert shmem.debug_state()["latest_failure"] == before  # a no-op records no failure
            with pytest.raises(ValueError, match="group_size \\* input bytes"):
                shmem.all_gather(torch.empty(1, dtype=torch.uint8), input_tensor)  # zero input, non-empty output
            continue
        output = shmem.empty(byte_count * world, dtype=torch.uint8)
        shmem.all_gather(output, input_tensor)
        expected = _reference_all_gather(input_tensor)
        assert torch.equal(output, expected), (byte_count, (output != expected).sum().item())
        shmem.barrier()  # every rank has read its output before it is freed
        shmem.free(output)
    shmem.release()


def _case_all_gather_stream_order_and_visibility() -> None:
    assert_clean()
    shmem.acquire()
    rank, world = dist.get_rank(), dist.get_world_size()
    byte_count = 8193
    output = shmem.empty(byte_count * world, dtype=torch.uint8)
    stream = shmem.Stream()
    time.sleep(rank * 0.05)
    with stream:
        input_tensor = _random_bytes(byte_count, rank)
        shmem.all_gather(output, input_tensor)
    stream.synchronize()
    expected = _reference_all_gather(input_tensor)
    assert torch.equal(output, expected), (output != expected).sum().item()
    stream.destroy()
    shmem.barrier()
    shmem.free(output)
    shmem.release()


# --------------------------------------------------------------------------
# symmetric_memory's setup calls (upstream's symmetric_memory/__init__.py).
# --------------------------------------------------------------------------


def _case_symm_setup_calls() -> None:
    import hyper_parallel.core.symmetric_memory as symm

    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert symm.is_shmem_available()
    with pytest.raises(shmem.ShmemStateError, match="op=rendezvous"):
        symm.rendezvous(torch.zeros(4))  # before any symm.empty: nothing collective starts
    buf = symm.empty((world, 4), torch.float32)
    buf.zero_()
    try:
        for group in (None, dist.new_group(list(range(world)))):
            handle = symm.rendezvous(buf, group)
            assert (handle.rank, handle.world_size, handle.buffer_size) == (rank, world, 16 * world), handle
            assert handle.buffer_ptrs[rank] == buf.data_ptr() and len(set(handle.buffer_ptrs)) == world
            handle.barrier()
            for peer in range(world):  # write my row into every rank's copy, in place
                handle.get_buffer(peer, (4,), torch.float32, storage_offset=rank * 4).fill_(float(rank + 1))
            handle.barrier()
            assert torch.equal(buf, torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(4).view(world, 4))
            handle.barrier()
            buf.zero_()
            with pytest.raises(ValueError, match="must lie inside the tensor"):
                handle.get_buffer(0, (world * 4 + 1,), torch.float32)
        with pytest.raises(ValueError, match="the same symmetric tensor on every rank") as info:
            symm.rendezvous(buf[rank])  # a different view on every rank: all of them refuse
        assert "rank0=(offset=" in str(info.value) and "rank1=(offset=" in str(info.value), str(info.value)
        with pytest.raises(ValueError, match="offset=-1"):
            symm.rendezvous(torch.zeros(4))  # not symmetric, on every rank
        for call in (lambda: symm.set_signal_pad_size(1024), symm.get_signal_pad_size):
            with pytest.raises(NotImplementedError, match="signal pads are not part of this library"):
                call()
        # upstream's zero-byte all_gather into ordinary tensors, through the user API too
        out = symm.shmem_allgather(torch.empty(0), torch.empty(0))
        assert out.numel() == 0
    finally:
        symm.free(buf)
        symm.shutdown()
    assert shmem.debug_state()["state"] == "Uninitialized"


# --------------------------------------------------------------------------
# MegaMoE's call sequence (upstream's modules/mega_moe: module, workspace, heap_manager), without its kernels.
# --------------------------------------------------------------------------

_WORKSPACE_ALIGNMENT = 512
_FIELDS = ("expert_buffer", "routed_buffer", "forward_event_counters", "backward_event_counters")


def _case_mega_moe_call_sequence() -> dict:
    assert_clean()
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, routed_slots, capacity, event_bytes = 64, 8, 8 * world, 256
    group = dist.group.WORLD
    with restored_env(HEAP_VAR):
        # configure_symmetric_heap: the heap size, in plain bytes, written to the variable before acquire().
        os.environ[HEAP_VAR] = str(4 * MiB)
        # _MegaMoeExecutionResources.__init__, then MegaMoeExperts._retain_runtime: two references.
        shmem.acquire(group)
        shmem.acquire(group)
        runtime_release = shmem.release
    # MegaMoeWorkspace.ensure: four symmetric buffers, 512-byte aligned.
    workspace = {
        "expert_buffer": shmem.empty((capacity, hidden), dtype=torch.bfloat16, alignment=_WORKSPACE_ALIGNMENT),
        "routed_buffer": shmem.empty((routed_slots, hidden), dtype=torch.bfloat16, alignment=_WORKSPACE_ALIGNMENT),
        "forward_event_counters": shmem.empty((event_bytes,), dtype=torch.uint8, alignment=_WORKSPACE_ALIGNMENT),
        "backward_event_counters": shmem.empty((event_bytes,), dtype=torch.uint8, alignment=_WORKSPACE_ALIGNMENT),
    }
    # MegaMoeHeapManager.bind and _preflight read the snapshot in upstream's vocabulary.
    state = shmem.debug_state()
    heap_bytes = state["config"]["heap_size_bytes"]
    assert heap_bytes == 4 * MiB
    assert state["reference_count"] == 2, state
    pointers = {tensor.data_ptr() for tensor in workspace.values()}
    assert pointers == {record["allocation_base"] for record in state["active_allocations"]}, state
    assert all(pointer % _WORKSPACE_ALIGNMENT == 0 for pointer in pointers)
    # prepare_event_counters: zero the counters, then a host barrier before any peer signals them.
    for name in ("forward_event_counters", "backward_event_counters"):
        workspace[name].zero_()
    shmem.host_barrier()
    # What the kernel does, on the host: dispatch this rank's routed rows into its slot of every peer's expert
    # buffer, count them in the peer's event counters, and wait for every peer's rows.
    rows = torch.full((routed_slots, hidden), float(rank + 1), dtype=torch.bfloat16)
    counter = workspace["forward_event_counters"][:4].view(torch.int32)
    for pe in range(world):
        shmem.put(workspace["expert_buffer"][rank * routed_slots:(rank + 1) * routed_slots], rows, pe)
        shmem.signal(counter, 1, pe, operation="add")
    shmem.wait_signal(counter, world, comparison="ge")
    for pe in range(world):
        block = workspace["expert_buffer"][pe * routed_slots:(pe + 1) * routed_slots]
        assert block.eq(float(pe + 1)).all(), pe
    # MegaMoeWorkspace.close: a host barrier, the four frees in field order, a host barrier, then both releases.
    shmem.host_barrier()
    for name in _FIELDS:
        shmem.free(workspace.pop(name))
    shmem.host_barrier()
    shmem.release()
    assert shmem.debug_state()["state"] == "Ready"
    runtime_release()
    state = shmem.debug_state()
    assert state["state"] == "Uninitialized" and state["active_allocations"] is None, state
    return {"heap_bytes": heap_bytes}


# --------------------------------------------------------------------------
# Tests (run in the test process).
# --------------------------------------------------------------------------

CASES = [
    _case_inactive_runtime_hint,
    _case_reinit_with_different_heap_sizes,
    _case_final_release_with_active_allocation_is_retryable,
    _case_mixing_acquire_and_handles,
    _case_allocation_and_release,
    _case_storage_assoc_double_free,
    _case_stale_tensor_rejected_by_one_sided_ops,
    _case_error_projection,
    _case_put_get,
    _case_barrier_blocking_and_config,
    _case_signal_and_pull,
    _case_all_gather_output_input_overlap_rejected,
    _case_all_gather_output_size_mismatch_rejected,
    _case_all_gather_boundary_matrix,
    _case_all_gather_stream_order_and_visibility,
    _case_symm_setup_calls,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("_case_") for c in CASES])
def test_upstream_runtime_behaviour(world_factory, case) -> None:
    run_case(world_factory(2, ENV), case, timeout=120)


def test_binding_orphan_storage_warning(world_factory) -> None:
    outputs = run_case(world_factory(2, ENV), _case_orphan_storage_warning, timeout=60, capture_stderr=True)
    for output in outputs:
        leaks = [line for line in output.stderr.splitlines() if "symmetric allocation leaked" in line]
        assert len(leaks) == 1, output.stderr
        assert f"allocation_id={output.value['allocation_id']}" in leaks[0], leaks
        assert f"base={hex(output.value['allocation_base'])}" in leaks[0] and "bytes=64" in leaks[0], leaks


@pytest.mark.parametrize("nranks", [2, 8])
def test_mega_moe_call_sequence(world_factory, nranks) -> None:
    outputs = run_case(world_factory(nranks, ENV), _case_mega_moe_call_sequence, timeout=120)
    assert outputs == [{"heap_bytes": 4 * MiB}] * nranks


_ONE_PE_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    from hyper_parallel.core.multicore import shmem

    assert not dist.is_initialized()
    shmem.acquire()
    state = shmem.debug_state()
    assert state["state"] == "Ready" and state["root_rank"] == 0 and state["root_size"] == 1, state
    allocation = shmem.empty(32, dtype=torch.uint8)
    signal = shmem.empty(1, dtype=torch.int32)
    signal.zero_()
    shmem.put(allocation, torch.arange(32, dtype=torch.uint8), 0)
    shmem.signal(signal, 7, 0, operation="set")
    shmem.wait_signal(signal, 7, comparison="eq")
    shmem.host_barrier()
    shmem.barrier(blocking=True)
    gathered = shmem.empty(32, dtype=torch.uint8)
    shmem.all_gather(gathered, allocation)
    assert torch.equal(gathered, torch.arange(32, dtype=torch.uint8))
    with shmem.acquire_shmem() as handle:  # a handle joins the one-PE runtime
        assert shmem.debug_state()["reference_count"] == 2
    for tensor in (allocation, signal, gathered):
        shmem.free(tensor)
    try:
        shmem.acquire(object())  # any group: a one-PE root has none
    except shmem.ShmemStateError as error:
        assert "root_group" in str(error) and error.error_code == "INVALID_STATE", error
    else:
        raise AssertionError("a root group without torch.distributed must be refused")
    shmem.release()
    assert shmem.debug_state()["state"] == "Uninitialized"
    try:
        shmem.acquire_shmem()  # the runtime face's own call still needs torch.distributed to start a lifecycle
    except shmem.ShmemStateError as error:
        assert "torch.distributed is not initialised" in str(error), error
    else:
        raise AssertionError("acquire_shmem() without torch.distributed must start nothing")
    print("ONE-PE OK", flush=True)
    """
)

_LARGER_JOB_SCRIPT = textwrap.dedent(
    """
    from hyper_parallel.core.multicore import shmem

    try:
        shmem.acquire()
    except shmem.ShmemStateError as error:
        assert "WORLD_SIZE=2" in str(error), error
        print("REFUSED", flush=True)
    assert shmem.debug_state()["state"] == "Uninitialized"
    """
)


def _run_script(script: str, **env: str) -> str:
    src = os.path.dirname(os.path.dirname(os.path.abspath(hyper_parallel.__file__)))
    full_env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    full_env.update(ENV)
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, full_env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", script], env=full_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_binding_single_process_without_distributed() -> None:
    assert "ONE-PE OK" in _run_script(_ONE_PE_SCRIPT)


def test_acquire_without_distributed_refuses_a_rank_of_a_larger_job() -> None:
    assert "REFUSED" in _run_script(_LARGER_JOB_SCRIPT, WORLD_SIZE="2")
