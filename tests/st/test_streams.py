"""System tests of host streams (issue item 5): the synchronous default stream and ordered worker queues.

Ordering and overlap are proven without timing assumptions wherever possible: a stream is held back by a
wait_signal on a local "gate" that only the calling thread opens, after it has checked what must (not) have
happened yet. If an enqueue blocked until completion, the caller could never open the gate and the case would
fail with a timeout error instead of passing. Every case runs on 2 real ranks with a 3 s SHMEM timeout; cases
line the ranks up with a gloo barrier before SHMEM collectives so that only the waits a case wants time out.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from st_cases import run_case, session
from tolerances import assert_matmul_close

_TIMEOUT_S = 3.0
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": str(_TIMEOUT_S)}


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _payload(rank: int, n: int, salt: int = 0) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1000.0 * rank + 0.25 + salt


# --------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------


def _case_default_stream_is_synchronous() -> None:
    rank = dist.get_rank()
    peer = 1 - rank
    n = 1 << 20  # 4 MiB: not done in an instant if it were deferred
    assert shmem.current_stream() is shmem.default_stream()
    assert shmem.default_stream().is_default and repr(shmem.default_stream()) == "Stream(default)"
    with session(zero=True) as empty:
        data = empty(n, dtype=torch.float32)
        sig = empty(1, dtype=torch.int32)
        fetched = torch.zeros(n)
        dist.barrier()
        shmem.put(data, _payload(rank, n), peer)
        shmem.signal(sig, 5 + rank, peer, op="add")
        shmem.default_stream().synchronize()  # nothing to wait for: a no-op
        # Only gloo in between: whatever the peer did on its default stream is complete in our copies.
        dist.barrier()
        assert sig.item() == 5 + peer
        assert torch.equal(data, _payload(peer, n))
        shmem.get(fetched, data, peer)
        assert torch.equal(fetched, _payload(rank, n))  # complete when get returned


def _case_stream_orders_put_before_signal(use_stream_fn: bool) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = 1 - rank
    pieces, n = 64, 4096
    with session(zero=True) as empty:
        data = empty(pieces, n, dtype=torch.float32)
        sig = empty(1, dtype=torch.int32)
        gathered = empty(world, 8, dtype=torch.int64)
        fetched = torch.zeros(pieces, n)
        s = shmem.Stream()
        dist.barrier()
        with shmem.stream(s) if use_stream_fn else s:
            assert shmem.current_stream() is s
            for i in range(pieces):
                # The source is a temporary, dropped at once: the stream must keep it alive until it ran.
                shmem.put(data[i], _payload(rank, n, salt=i), peer)
            shmem.signal(sig, 1, peer)
        assert shmem.current_stream() is shmem.default_stream()
        shmem.wait_signal(sig, 1)  # on the default stream: the peer's puts are all visible now
        for i in range(pieces):
            assert torch.equal(data[i], _payload(peer, n, salt=i)), f"piece {i}"
        s.synchronize()

        # get, barrier and all_gather on a stream, checked after synchronize().
        with s:
            shmem.barrier()  # both ranks have checked their data: it may be overwritten now
            shmem.get(fetched, data, peer)
            shmem.all_gather(gathered, torch.full((8,), 10 + rank, dtype=torch.int64))
        s.synchronize()
        for i in range(pieces):
            assert torch.equal(fetched[i], _payload(rank, n, salt=i)), f"get of piece {i}"
        assert gathered.tolist() == [[10 + r] * 8 for r in range(world)]
        s.destroy()


def _case_wait_stream_orders_across_streams() -> None:
    rank = dist.get_rank()
    peer = 1 - rank
    n = 1 << 16
    with session(zero=True) as empty:
        gate = empty(1, dtype=torch.int32)  # only this rank's main thread opens it
        ready = empty(1, dtype=torch.int32)
        data = empty(n, dtype=torch.float32)
        s1, s2 = shmem.Stream(), shmem.Stream()
        dist.barrier()
        with s1:
            shmem.wait_signal(gate, 1)
            shmem.put(data, _payload(rank, n), peer)
        s2.wait_stream(s1)
        with s2:
            shmem.signal(ready, 1, peer)
        dist.barrier()  # both ranks have enqueued; both gates are still shut
        # The peer's s2 signal is held back behind its s1, which waits for the peer's gate.
        assert ready.item() == 0, "s2 ran ahead of the s1 work it waits for"
        assert torch.equal(data, torch.zeros(n))
        dist.barrier()  # both checked before any gate opens
        shmem.signal(gate, 1, rank)
        shmem.wait_signal(ready, 1)
        assert torch.equal(data, _payload(peer, n)), "the signal came before the puts of the stream it waited for"
        s1.synchronize()
        s2.synchronize()

        # wait_stream waits for the work enqueued on the other stream so far, not for later work.
        gate_a = empty(1, dtype=torch.int32)
        gate_b = empty(1, dtype=torch.int32)
        done = empty(1, dtype=torch.int32)
        with s1:
            shmem.wait_signal(gate_a, 1)
        s2.wait_stream(s1)
        with s1:
            shmem.wait_signal(gate_b, 1)  # enqueued after wait_stream: s2 does not wait for it
        with s2:
            shmem.signal(done, 1, rank)
        shmem.signal(gate_a, 1, rank)
        shmem.wait_signal(done, 1)  # reached while s1 still waits for gate_b
        shmem.signal(gate_b, 1, rank)
        s1.synchronize()
        s2.synchronize()
        s1.destroy()
        s2.destroy()


def _case_default_stream_waits_for_a_stream() -> None:
    rank = dist.get_rank()
    n = 1 << 16
    with session(zero=True) as empty:
        gate = empty(1, dtype=torch.int32)
        data = empty(n, dtype=torch.float32)
        s = shmem.Stream()
        with s:
            shmem.wait_signal(gate, 1)
            shmem.put(data, _payload(rank, n), rank)
        seen = {}

        def waiter():
            shmem.default_stream().wait_stream(s)  # the calling thread is the default stream
            seen["data"] = data.clone()

        thread = threading.Thread(target=waiter)
        thread.start()
        thread.join(0.5)
        # Its stream waits for the gate, which only this thread opens: wait_stream cannot have returned.
        assert thread.is_alive() and not seen, "default_stream().wait_stream(s) returned before s was done"
        shmem.signal(gate, 1, rank)
        thread.join(_TIMEOUT_S + 10)
        assert not thread.is_alive()
        assert torch.equal(seen["data"], _payload(rank, n)), "wait_stream returned before the stream's put ran"
        s.destroy()


def _case_stream_overlaps_the_caller() -> float:
    rank = dist.get_rank()
    peer = 1 - rank
    n = 1 << 16
    with session(zero=True) as empty:
        gate = empty(1, dtype=torch.int32)
        flag = empty(1, dtype=torch.int32)
        data = empty(n, dtype=torch.float32)
        s = shmem.Stream()
        dist.barrier()
        started = time.monotonic()
        with s:
            shmem.wait_signal(gate, 1, cmp="ge")
            shmem.put(data, _payload(rank, n), peer)
            shmem.signal(flag, 1, peer)
        enqueued = time.monotonic() - started
        # The stream now waits for the gate while this thread computes. Only this thread opens the gate, so
        # had the enqueue waited for completion we could not be here: the wait would have timed out instead.
        x = torch.randn(128, 128, generator=torch.Generator().manual_seed(rank))
        y = x @ x.T
        assert_matmul_close(y.T, x, x.T, "x @ x.T, transposed")
        assert gate.item() == 0
        shmem.signal(gate, 1, rank)
        shmem.wait_signal(flag, 1)
        assert torch.equal(data, _payload(peer, n))
        s.synchronize()  # the gated wait completed without error
        s.destroy()
    return enqueued


def _case_error_on_a_stream() -> dict:
    rank = dist.get_rank()
    peer = 1 - rank
    n = 4096
    out = {}
    with session(zero=True) as empty:
        never = empty(1, dtype=torch.int32)
        flag = empty(1, dtype=torch.int32)
        data = empty(n, dtype=torch.float32)
        s, doomed = shmem.Stream(), shmem.Stream()
        dist.barrier()
        with s:
            shmem.wait_signal(never, 1)  # times out after _TIMEOUT_S
            shmem.put(data, _payload(rank, n), peer)  # skipped
            shmem.signal(flag, 1, peer)  # skipped
        with doomed:
            shmem.wait_signal(never, 2, cmp="ge")  # fails too; reported by destroy()
        try:
            s.synchronize()
        except shmem.ShmemTimeoutError as exc:
            out["synchronize"] = str(exc)
        try:
            doomed.destroy()
        except shmem.ShmemTimeoutError as exc:
            out["destroy"] = str(exc)
        with pytest.raises(shmem.ShmemStateError, match="stream is no longer usable: destroyed=True"):
            doomed.synchronize()
        dist.barrier()
        # The operations after the failed one were skipped on the peer's stream.
        assert flag.item() == 0 and torch.equal(data, torch.zeros(n)), "ops after a failed one still ran"
        dist.barrier()  # both checked before new data arrives
        # The error was reported once; the stream runs new work.
        s.synchronize()
        with s:
            shmem.put(data, _payload(rank, n, salt=1), peer)
            shmem.signal(flag, 2, peer)
        s.synchronize()
        shmem.wait_signal(flag, 2)
        assert torch.equal(data, _payload(peer, n, salt=1))
        s.destroy()
    return out


def _case_stream_api_and_lifecycles() -> dict:
    rank = dist.get_rank()
    out = {}
    with pytest.raises(shmem.ShmemStateError, match=r"shmem runtime is not initialised: op=Stream"):
        shmem.Stream()
    with pytest.raises(TypeError, match=r"`s` must be a Stream or None, but got int"):
        shmem.stream(5)
    assert shmem.stream(None) is shmem.default_stream()
    shmem.default_stream().destroy()  # a no-op

    dist.barrier()
    handle = shmem.acquire_shmem()
    lifecycle = shmem.debug_state()["lifecycle"]
    data = shmem.empty(4, dtype=torch.float32)
    data.zero_()
    old = shmem.Stream()
    s = shmem.Stream()
    assert not s.is_default
    text = repr(s)
    assert text.startswith("Stream(handle=0x") and f"lifecycle={lifecycle}" in text and "destroyed=False" in text, text

    # current_stream(): innermost `with`, per thread.
    other_thread = {}
    with s:
        assert shmem.current_stream() is s
        with shmem.stream(None):
            assert shmem.current_stream() is shmem.default_stream()
            with old:
                assert shmem.current_stream() is old
            assert shmem.current_stream() is shmem.default_stream()
        assert shmem.current_stream() is s
        probe = threading.Thread(target=lambda: other_thread.setdefault("current", shmem.current_stream()))
        probe.start()
        probe.join()
    assert other_thread["current"] is shmem.default_stream()
    with pytest.raises(ZeroDivisionError):
        with s:
            raise ZeroDivisionError
    assert shmem.current_stream() is shmem.default_stream()
    with pytest.raises(TypeError, match=r"`other` must be a Stream, but got int"):
        s.wait_stream(5)

    # destroy(): waits for the work, is idempotent, and the stream is refused afterwards.
    with s:
        shmem.put(data, torch.full((4,), 3.0 + rank), rank)
    s.destroy()
    assert torch.equal(data, torch.full((4,), 3.0 + rank))
    s.destroy()
    assert "destroyed=True" in repr(s)
    refused = "stream is no longer usable: destroyed=True"
    with pytest.raises(shmem.ShmemStateError, match=refused):
        s.synchronize()
    with pytest.raises(shmem.ShmemStateError, match=refused):
        with s:
            shmem.put(data, torch.zeros(4), rank)
    with pytest.raises(shmem.ShmemStateError, match=refused):
        old.wait_stream(s)
    with pytest.raises(shmem.ShmemStateError, match=refused):
        shmem.default_stream().wait_stream(s)
    assert torch.equal(data, torch.full((4,), 3.0 + rank))  # the refused put wrote nothing

    # A stream of an earlier lifecycle: refused with no runtime, and refused in the next lifecycle.
    shmem.free(data)
    handle.close()
    with pytest.raises(shmem.ShmemStateError, match=r"shmem runtime is not initialised: op=stream"):
        old.synchronize()
    dist.barrier()
    handle = shmem.acquire_shmem()
    try:
        data = shmem.empty(4, dtype=torch.float32)
        data.zero_()
        assert shmem.debug_state()["lifecycle"] == lifecycle + 1
        stale = f"stream is no longer usable: destroyed=False stream_lifecycle={lifecycle} lifecycle={lifecycle + 1}"
        for use in (
            old.synchronize,
            old.destroy,
            lambda: shmem.default_stream().wait_stream(old),
            lambda: shmem.put(data, torch.ones(4), rank),
        ):
            with pytest.raises(shmem.ShmemStateError) as info:
                with old:
                    use()
            out.setdefault("stale", str(info.value))
            assert stale in str(info.value), str(info.value)
        assert torch.equal(data, torch.zeros(4))
        fresh = shmem.Stream()  # the new lifecycle's streams work
        with fresh:
            shmem.put(data, torch.full((4,), 7.0), rank)
        fresh.synchronize()
        assert torch.equal(data, torch.full((4,), 7.0))
        fresh.destroy()
        shmem.free(data)
    finally:
        handle.close()
    return out


def _case_stream_barrier_and_allocation_in_program_order() -> None:
    """A barrier enqueued on a stream, then empty() on the default stream, in the same order on every rank.

    Rank 0's stream reaches its barrier at once; rank 1's stream waits for a gate that opens 0.5 s later, while
    rank 1 is already in empty(). The stream's barrier must pair with the other rank's stream barrier, and
    empty()'s internal exchange with the other rank's empty(), whatever the timing of the two threads.
    """
    rank = dist.get_rank()
    with session(zero=True) as empty:
        gate = empty(1, dtype=torch.int32)
        s = shmem.Stream()
        with s:
            shmem.wait_signal(gate, 1)
            shmem.barrier()
        opener = None
        if rank == 0:
            shmem.signal(gate, 1, rank)
        dist.barrier()
        if rank == 0:
            time.sleep(0.3)  # rank 1 enters empty() first
        else:
            opener = threading.Timer(0.5, lambda: shmem.signal(gate, 1, rank))
            opener.start()
        try:
            extra = empty(16, dtype=torch.float32)
        finally:
            if opener is not None:
                opener.join()
        extra.fill_(rank)
        s.synchronize()
        s.destroy()


# --------------------------------------------------------------------------
def _case_stream_error_survives_a_collective() -> str:
    with session(zero=True) as empty:
        gate = empty(1, dtype=torch.int32)
        scratch = shmem.empty(16)
        s = shmem.Stream()
        with s:
            shmem.wait_signal(gate, 1)  # nobody opens it: times out on the stream
        shmem.free(scratch)  # a collective waits for the stream, and must leave its error for synchronize()
        try:
            s.synchronize()
        except shmem.ShmemTimeoutError as exc:
            return str(exc)
        finally:
            s.destroy()
        return "synchronize() raised nothing"


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))  # C++ stream workers included


def _case_dropped_stream_finishes_its_work() -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = 1 - rank
    with session(zero=True) as empty:
        data = empty(4096, dtype=torch.float32)
        sig, gate = empty(1, dtype=torch.int32), empty(1, dtype=torch.int32)
        dist.barrier()
        s = shmem.Stream()
        with s:
            shmem.wait_signal(gate, 1)  # holds the queue until the caller opens the gate below
            shmem.put(data, _payload(rank, 4096), peer)
            shmem.signal(sig, 1, peer)
        del s  # dropped with work queued: like a CUDA stream, the work still runs
        gc.collect()
        shmem.signal(gate, 1, rank)
        shmem.wait_signal(sig, 1)
        assert torch.equal(data, _payload(peer, 4096))

        # Streams created and dropped in a loop do not pile up worker threads.
        before = _thread_count()
        for _ in range(50):
            with shmem.Stream():
                shmem.signal(gate, 1, rank)
        gc.collect()
        shmem.Stream().destroy()  # a new stream reaps the finished workers of the dropped ones
        return _thread_count() - before


# Tests.
# --------------------------------------------------------------------------


def test_default_stream_completes_before_returning(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_default_stream_is_synchronous)


@pytest.mark.parametrize("use_stream_fn", [False, True], ids=["with-s", "with-shmem.stream(s)"])
def test_stream_runs_in_order(world_factory, use_stream_fn: bool) -> None:
    run_case(world_factory(2, _ENV), _case_stream_orders_put_before_signal, use_stream_fn)


def test_wait_stream_orders_across_streams(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_wait_stream_orders_across_streams)


def test_default_stream_wait_stream_blocks_until_done(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_default_stream_waits_for_a_stream)


def test_stream_work_overlaps_the_caller(world_factory) -> None:
    enqueued = run_case(world_factory(2, _ENV), _case_stream_overlaps_the_caller)
    # Implied by the case passing at all; stated so that a regression reads plainly.
    assert all(t < _TIMEOUT_S for t in enqueued), enqueued


def test_stream_error_is_raised_by_synchronize_and_skips_later_ops(world_factory) -> None:
    for out in run_case(world_factory(2, _ENV), _case_error_on_a_stream, timeout=60):
        expectations = (("synchronize", "cmp=eq expected=1 observed=0"), ("destroy", "cmp=ge expected=2 observed=0"))
        for key, expected in expectations:
            assert key in out, f"{key}() raised no ShmemTimeoutError: {out}"
            assert out[key].startswith("signal wait timed out") and expected in out[key], out[key]


def test_stream_api_and_streams_of_an_earlier_lifecycle(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_stream_api_and_lifecycles)


def test_stream_barrier_does_not_pair_with_an_allocation(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_stream_barrier_and_allocation_in_program_order)


def test_dropped_streams_finish_their_work_and_release_their_workers(world_factory) -> None:
    extra_threads = run_case(world_factory(2, _ENV), _case_dropped_stream_finishes_its_work)
    assert all(n <= 2 for n in extra_threads), extra_threads


def test_a_stream_error_survives_an_intervening_collective(world_factory) -> None:
    for message in run_case(world_factory(2, _ENV), _case_stream_error_survives_a_collective, timeout=60):
        assert message.startswith("signal wait timed out") and "cmp=eq expected=1 observed=0" in message, message
