"""System tests of the data plane (issue item 4): put, get, signal, wait_signal and barrier on the host device.

Every case runs in real ranks (tests/st/harness.py) and checks values on the rank that owns the written copy,
after a barrier. References are independent of the code under test: patterns that every rank can rebuild from
the writer's rank, byte-exact comparisons, and Python's own comparison operators for wait_signal.

Worlds (one spawn per size for the module):

* 2 ranks with a 3 s timeout: signals, every cmp, wait timeouts, bad arguments and zero-byte calls. Cases line
  the ranks up with a gloo barrier before every SHMEM collective, so that the short timeout only fires where a
  case wants it to;
* 4 and 8 ranks: writes into views at offsets, put/get between every pair of ranks, every dtype bit-exact;
* a fresh 3-rank world for the barrier timeout, which leaves the barrier counters of its world inconsistent.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

from harness import World
from hyper_parallel.core.multicore import shmem
from st_cases import expect_error, run_case, session

_HEAP = "16M"
_SHORT_TIMEOUT_S = 3.0
# Signals, waits and argument checks: a short timeout keeps the timeout cases cheap.
_SHORT_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": _HEAP, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": str(_SHORT_TIMEOUT_S)}
# Transfers between many ranks on 2 cores: a stuck rank still surfaces as a timeout error before the case's.
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": _HEAP, "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}

_CMPS = {
    "eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le
}
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _pattern(writer: int, target: int, n: int) -> torch.Tensor:
    """Distinct int64 values for every (writer, target) pair."""
    return torch.arange(n, dtype=torch.int64) + writer * 1_000_000 + target * 10_000 + 1


def _random_bits(seed: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``n`` elements of ``dtype`` with random bit patterns (NaN payloads, infinities, subnormals, -0 included)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=gen).view(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _alias(tensor: torch.Tensor, byte_offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over raw memory starting inside ``tensor``'s allocation that torch does not bound-check.

    torch refuses views past a storage's end (as_strided) and cannot grow a symmetric storage (set_), so a view
    that runs past its allocation is built from the address: only the runtime can reject it.
    """
    raw = (ctypes.c_char * nbytes).from_address(tensor.data_ptr() + byte_offset)
    return torch.frombuffer(raw, dtype=dtype)


# --------------------------------------------------------------------------
# Cases: put and get.
# --------------------------------------------------------------------------


def _case_put_get_views_at_offsets() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    with session() as empty:
        buf = empty(2 * world, 33, dtype=torch.float32)
        buf.zero_()
        own = empty(world, 10, dtype=torch.float32)
        own.copy_(torch.arange(world * 10, dtype=torch.float32).view(world, 10) + 100 * rank)
        dist.barrier()
        # A row slice at an odd element offset, and a reshaped 2-D view of a stretch further on.
        shmem.put(buf[2 * rank + 1, 5:17], torch.arange(12, dtype=torch.float32) + rank + 0.5, nxt)
        flat = buf.view(-1)
        start = 2 * rank * 33 + 20
        shmem.put(flat[start : start + 12].view(3, 4), torch.full((3, 4), -1.0 - rank), nxt)
        shmem.barrier()

        expected = torch.zeros(2 * world, 33)
        expected[2 * prev + 1, 5:17] = torch.arange(12, dtype=torch.float32) + prev + 0.5
        expected.view(-1)[2 * prev * 33 + 20 : 2 * prev * 33 + 32] = -1.0 - prev
        assert torch.equal(buf, expected), (buf - expected).nonzero()

        # get reads the same location of `pe`'s copy: a row at an offset, and a 2-D block.
        row = torch.empty(10)
        shmem.get(row, own[rank], nxt)
        assert torch.equal(row, torch.arange(10, dtype=torch.float32) + 10 * rank + 100 * nxt)
        block = torch.empty(2, 5)
        shmem.get(block, own.view(-1)[25:35].view(2, 5), prev)
        assert torch.equal(block.view(-1), torch.arange(25, 35, dtype=torch.float32) + 100 * prev)
        # get does not change the source copy.
        assert torch.equal(own, torch.arange(world * 10, dtype=torch.float32).view(world, 10) + 100 * rank)


def _case_peer_tensor() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    pattern = torch.arange(3 * 8, dtype=torch.float32).view(3, 8)
    with session() as empty:
        buf = empty(world, 3, 8, dtype=torch.float32)
        buf.copy_(pattern + 100 * rank)
        inbox = empty(world, 5, dtype=torch.int64)
        inbox.fill_(-1)
        dist.barrier()
        for pe in range(world):
            theirs = shmem.peer_tensor(buf, pe)
            assert theirs.shape == buf.shape and theirs.dtype == buf.dtype
            assert torch.equal(theirs, (pattern + 100 * pe).expand(world, 3, 8))
            # Views keep their offset and strides: a strided slice and a transposed row.
            part = shmem.peer_tensor(buf[1, :, 2:7:2], pe)
            assert part.stride() == buf[1, :, 2:7:2].stride()
            assert torch.equal(part, pattern[:, 2:7:2] + 100 * pe)
            assert torch.equal(shmem.peer_tensor(buf[2].t(), pe), (pattern + 100 * pe).t())
            # torch ops read it in place, and write into it.
            assert torch.equal(torch.mm(shmem.peer_tensor(buf[0], pe), torch.eye(8)), pattern + 100 * pe)
            shmem.peer_tensor(inbox[rank], pe).copy_(torch.arange(5) + 10 * rank + pe)
        assert shmem.peer_tensor(buf, rank).data_ptr() == buf.data_ptr()
        shmem.barrier()
        for writer in range(world):
            assert torch.equal(inbox[writer], torch.arange(5) + 10 * writer + rank), inbox

        expect_error(ValueError, lambda: shmem.peer_tensor(torch.zeros(4), 0),
                     "`tensor` must be a symmetric tensor (from shmem.empty, or a view of one), but got a tensor "
                     "whose storage is not a symmetric allocation")
        expect_error(ValueError, lambda: shmem.peer_tensor(buf, world), f"`pe` must be in [0, {world}), but got {world}")
        expect_error(ValueError, lambda: shmem.peer_tensor(buf, -1), f"`pe` must be in [0, {world}), but got -1")
        expect_error(TypeError, lambda: shmem.peer_tensor(buf, 1.0), "`pe` must be an int, but got float")
        expect_error(TypeError, lambda: shmem.peer_tensor([1.0], 0), "`tensor` must be a torch.Tensor")

        # A peer tensor dies with its allocation, and with the runtime.
        gone = shmem.empty(4, dtype=torch.float32)
        dead = shmem.peer_tensor(gone, (rank + 1) % world)
        shmem.free(gone)
        expect_error(RuntimeError, lambda: dead.sum(), "symmetric allocation was freed: allocation_id=")
        expect_error(shmem.ShmemStateError, lambda: shmem.peer_tensor(gone, 0), "freed symmetric allocation")
        survivor = shmem.peer_tensor(buf[0], (rank + 1) % world)
        # An allocation leaked (its tensor died unfreed) stays mapped until shutdown; its peer tensor dies there.
        leaked = shmem.empty(4, dtype=torch.float32)
        ghost = shmem.peer_tensor(leaked, (rank + 1) % world)
        del leaked
        assert ghost.numel() == 4
    expect_error(RuntimeError, lambda: survivor.sum(), "symmetric allocation was freed: allocation_id=")
    expect_error(RuntimeError, lambda: ghost.sum(), "the shmem runtime shut down: allocation_id=")


def _case_all_pairs(n: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        buf = empty(world, n, dtype=torch.int64)
        buf.fill_(-7)
        dist.barrier()
        # Every rank writes its row of every rank's buf (itself included) with a pattern for that pair.
        for pe in range(world):
            shmem.put(buf[rank], _pattern(rank, pe, n), pe)
        shmem.barrier()
        for writer in range(world):
            assert torch.equal(buf[writer], _pattern(writer, rank, n)), f"row {writer} on rank {rank}: {buf[writer]}"
        # Every rank reads every row of every rank's copy.
        dst = torch.empty(n, dtype=torch.int64)
        for pe in range(world):
            for row in range(world):
                dst.fill_(0)
                shmem.get(dst, buf[row], pe)
                assert torch.equal(dst, _pattern(row, pe, n)), f"get of row {row} from pe {pe} on rank {rank}"


def _case_dtypes_bit_exact(n: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    with session() as empty:
        for index, dtype in enumerate(_DTYPES):
            inbox = empty(n, dtype=dtype)
            own = empty(n, dtype=dtype)
            own.copy_(_random_bits(1000 * index + rank, n, dtype))
            dist.barrier()
            shmem.put(inbox, _random_bits(1000 * index + 500 + rank, n, dtype), nxt)
            shmem.barrier()
            assert _same_bits(inbox, _random_bits(1000 * index + 500 + prev, n, dtype)), f"put of {dtype}"
            fetched = torch.empty(n, dtype=dtype)
            shmem.get(fetched, own, prev)
            assert _same_bits(fetched, _random_bits(1000 * index + prev, n, dtype)), f"get of {dtype}"


def _case_barrier_waits_for_the_last_rank() -> list:
    rank = dist.get_rank()
    with session():
        times = []
        for round_ in range(3):
            dist.barrier()
            time.sleep(0.05 * ((rank + round_) % dist.get_world_size()))  # a different rank arrives last each round
            arrived = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
            shmem.barrier()
            times.append((arrived, time.monotonic()))
        # Many barriers in a row keep their count (epochs only grow, nothing is reset).
        for _ in range(200):
            shmem.barrier()
    return times


# --------------------------------------------------------------------------
# Cases: signals.
# --------------------------------------------------------------------------


def _case_signal_set_and_add() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    with session() as empty:
        counter = empty(1, dtype=torch.int32)
        flag = empty(1, dtype=torch.int32)
        wide = empty(1, dtype=torch.int64)
        # Signals inside an int32 array: only the signal's own 4 bytes change.
        row = empty(4, dtype=torch.int32)
        counter.zero_()
        flag.fill_(-5)
        wide.fill_(2**32 - 1)
        row.fill_(0x5A5A5A5A)
        dist.barrier()

        for pe in range(world):  # every rank adds to every rank's counter
            shmem.signal(counter, 10 * (rank + 1), pe, op="add")
        total = 10 * world * (world + 1) // 2
        shmem.wait_signal(counter, total, cmp="eq")
        shmem.signal(flag, 1000 + rank, peer)  # op defaults to "set"
        shmem.wait_signal(flag, 1000 + (rank - 1) % world)
        shmem.signal(wide, 1, peer, op="add")  # carries into bit 32: a 64-bit add
        shmem.wait_signal(wide, 2**32, cmp="eq")
        shmem.barrier()  # everyone saw the add before anyone overwrites it
        shmem.signal(wide, -(2**40) - rank, peer, op="set")
        shmem.wait_signal(wide, -(2**40) - (rank - 1) % world, cmp="eq")
        shmem.signal(row[1:2], -1, peer, op="set")
        shmem.signal(row[2:3], 3, peer, op="add")
        shmem.barrier()
        assert counter.item() == total
        assert flag.item() == 1000 + (rank - 1) % world
        assert row.tolist() == [0x5A5A5A5A, -1, 0x5A5A5A5A + 3, 0x5A5A5A5A]


def _case_signal_orders_data(rounds: int) -> None:
    """Ping-pong: every put is visible to the peer once the signal after it is; signals only grow."""
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = 1 - rank
    n = 4096
    with session() as empty:
        data = empty(n, dtype=torch.int64)
        sig = empty(1, dtype=torch.int32)
        sig.zero_()
        dist.barrier()
        for round_ in range(1, rounds + 1):
            if (round_ % 2 == 1) == (rank == 0):  # rank 0 sends the odd rounds, rank 1 the even ones
                shmem.put(data, torch.arange(n, dtype=torch.int64) * round_ + rank, peer)
                shmem.signal(sig, round_, peer)
            else:
                shmem.wait_signal(sig, round_, cmp="ge")
                assert torch.equal(data, torch.arange(n, dtype=torch.int64) * round_ + peer), f"round {round_}"


def _case_wait_signal_every_cmp(dtype: torch.dtype, value: int, observed_values: list) -> dict:
    """Every cmp against values below, equal to and above ``value``; the false ones must time out.

    The false conditions wait in parallel threads (one signal each), so they cost one timeout, not nine.
    """
    results = {}
    with session() as empty:
        pending = []
        for (name, op), observed in itertools.product(_CMPS.items(), observed_values):
            sig = empty(1, dtype=dtype)
            sig.fill_(observed)
            if op(observed, value):
                shmem.wait_signal(sig, value, cmp=name)  # true already: returns at once
                results[(name, observed)] = "ok"
            else:
                pending.append((name, observed, sig))

        def wait(entry):
            name, _, sig = entry
            started = time.monotonic()
            try:
                shmem.wait_signal(sig, value, cmp=name)
                message = "returned"
            except shmem.ShmemTimeoutError as exc:
                message = str(exc)
            return message, time.monotonic() - started

        with ThreadPoolExecutor(max_workers=len(pending)) as pool:
            for (name, observed, _), outcome in zip(pending, pool.map(wait, pending)):
                results[(name, observed)] = outcome
    return results


def _case_wait_signal_timeout() -> dict:
    with session() as empty:
        sig = empty(1, dtype=torch.int32)
        wide = empty(1, dtype=torch.int64)
        sig.fill_(3)
        wide.fill_(2**40 + 1)
        out = {}
        started = time.monotonic()
        try:
            shmem.wait_signal(sig, 7)
        except shmem.ShmemTimeoutError as exc:
            out["int32"] = (str(exc), exc.code, isinstance(exc, shmem.ShmemError), isinstance(exc, RuntimeError))
        out["elapsed"] = time.monotonic() - started
        out["latest_failure"] = shmem.debug_state()["latest_failure"]
        try:
            shmem.wait_signal(wide, 2**41, cmp="ge")
        except shmem.ShmemTimeoutError as exc:
            out["int64"] = str(exc)
        # The runtime stays usable after a timeout.
        shmem.signal(sig, 7, dist.get_rank())
        shmem.wait_signal(sig, 7)
    return out


def _case_ctrl_c_interrupts_a_wait() -> dict:
    # The harness's ranks ignore SIGINT; this case restores Python's default: KeyboardInterrupt in the main thread.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with session() as empty:
            sig = empty(1, dtype=torch.int32)
            sig.zero_()
            out = {}
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            started = time.monotonic()
            timer.start()
            try:
                shmem.wait_signal(sig, 1)  # nobody raises it: only Ctrl-C can end this wait before 30 s
            except KeyboardInterrupt:
                out["interrupted"] = True
            out["elapsed"] = time.monotonic() - started
            timer.join()
            out["latest_failure"] = shmem.debug_state()["latest_failure"]
            # The runtime stays usable afterwards.
            shmem.signal(sig, 1, dist.get_rank())
            shmem.wait_signal(sig, 1)
        return out
    finally:
        signal.signal(signal.SIGINT, previous)


def _case_barrier_timeout(absent: int) -> dict:
    dist.barrier()
    handle = shmem.acquire_shmem()
    out = {}
    if dist.get_rank() != absent:
        started = time.monotonic()
        try:
            shmem.barrier()
        except shmem.ShmemTimeoutError as exc:
            out["message"] = str(exc)
        out["elapsed"] = time.monotonic() - started
    dist.barrier()
    # The barrier counters of this world are now inconsistent: the world is thrown away, not shut down.
    del handle
    return out


# --------------------------------------------------------------------------
# Cases: bad arguments and zero bytes.
# --------------------------------------------------------------------------


def _case_bad_arguments_write_nothing() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = 1 - rank
    with session() as empty:
        target = empty(16, dtype=torch.float32)
        guard = empty(16, dtype=torch.float32)  # next in the heap (right behind target): catches writes past its end
        sig = empty(1, dtype=torch.int32)
        pair = empty(2, dtype=torch.int32)
        gone = shmem.empty(16, dtype=torch.float32)
        shmem.free(gone)
        target.fill_(-1.0)
        guard.fill_(-2.0)
        sig.fill_(7)
        pair.fill_(9)
        src = torch.arange(16, dtype=torch.float32)
        dst = torch.full((16,), 5.0)
        past_end = _alias(target, 0, 128, torch.float32)  # 32 floats from target's start
        straddling = _alias(target, 32, 64, torch.float32)  # the last 8 floats of target and 8 beyond
        in_range = f"must be in [0, {world}), but got"
        dist.barrier()

        checks = [
            # pe
            (lambda: shmem.put(target, src, world), ValueError, f"`pe` {in_range} {world}"),
            (lambda: shmem.put(target, src, -1), ValueError, f"`pe` {in_range} -1"),
            (lambda: shmem.put(target, src, 1.0), TypeError, "`pe` must be an int, but got float"),
            (lambda: shmem.put(target, src, True), TypeError, "`pe` must be an int, but got bool"),
            (lambda: shmem.get(dst, target, world + 3), ValueError, f"`pe` {in_range} {world + 3}"),
            # byte counts
            (lambda: shmem.put(target, src[:15], peer), ValueError,
             "`src` must have as many bytes as `dst` (64), but got 60"),
            (lambda: shmem.put(target[:8], src, peer), ValueError,
             "`src` must have as many bytes as `dst` (32), but got 64"),
            (lambda: shmem.put(target, src.to(torch.float64), peer), ValueError, "(64), but got 128"),
            (lambda: shmem.get(dst[:8], target, peer), ValueError,
             "`src` must have as many bytes as `dst` (32), but got 64"),
            # layout
            (lambda: shmem.put(target.view(4, 4).t(), src.view(4, 4), peer), ValueError,
             "`dst` must be contiguous, but got a tensor of shape [4, 4] and strides [1, 4]"),
            (lambda: shmem.put(target, torch.arange(32.0)[::2], peer), ValueError,
             "`src` must be contiguous, but got a tensor of shape [16] and strides [2]"),
            (lambda: shmem.get(torch.empty(32)[::2], target, peer), ValueError, "`dst` must be contiguous"),
            # not symmetric, or past the allocation
            (lambda: shmem.put(torch.zeros(16), src, peer), ValueError,
             "`dst` must be a symmetric tensor allocated by shmem.empty, but got an address 0x"),
            (lambda: shmem.get(dst, torch.zeros(16), peer), ValueError,
             "`src` must be a symmetric tensor allocated by shmem.empty"),
            (lambda: shmem.put(past_end, torch.arange(32.0), peer), ValueError,
             "`dst` must lie inside its symmetric allocation, but got bytes [", "past the end of allocation_id="),
            (lambda: shmem.put(straddling, torch.arange(16.0), peer), ValueError,
             "`dst` must lie inside its symmetric allocation"),
            (lambda: shmem.get(torch.empty(32), past_end, peer), ValueError,
             "`src` must lie inside its symmetric allocation"),
            # types
            (lambda: shmem.put([0.0] * 16, src, peer), TypeError, "`dst` must be a torch.Tensor, but got list"),
            (lambda: shmem.put(target, 3.0, peer), TypeError, "`src` must be a torch.Tensor, but got float"),
            (lambda: shmem.get(None, target, peer), TypeError, "`dst` must be a torch.Tensor, but got NoneType"),
            # a freed allocation
            (lambda: shmem.put(gone, src, peer), shmem.ShmemStateError,
             "tensor of a freed symmetric allocation: argument=dst", "symmetric allocation was freed"),
            # signals
            (lambda: shmem.signal(target[:1], 1, peer), TypeError,
             "`signal_tensor` must be an int32 or int64 tensor, but got torch.float32"),
            (lambda: shmem.signal(torch.zeros(1, dtype=torch.int16), 1, peer), TypeError, "but got torch.int16"),
            (lambda: shmem.signal(pair, 1, peer), ValueError,
             "`signal_tensor` must have exactly one element, but got 2"),
            (lambda: shmem.signal(sig, 2**31, peer), ValueError,
             "`value` must fit in torch.int32 [-2147483648, 2147483647], but got 2147483648"),
            (lambda: shmem.signal(sig, 1.5, peer), TypeError, "`value` must be an int, but got float"),
            (lambda: shmem.signal(sig, 1, world), ValueError, f"`pe` {in_range} {world}"),
            (lambda: shmem.signal(sig, 1, peer, op="mul"), ValueError,
             "`op` must be one of 'set', 'add', but got 'mul'"),
            (lambda: shmem.signal(torch.zeros(1, dtype=torch.int32), 1, peer), ValueError,
             "`signal_tensor` must be a symmetric tensor allocated by shmem.empty"),
            (lambda: shmem.wait_signal(sig, 7, cmp="=="), ValueError,
             "`cmp` must be one of 'eq', 'ne', 'gt', 'ge', 'lt', 'le', but got '=='"),
            (lambda: shmem.wait_signal(target[:1], 7), TypeError, "`signal_tensor` must be an int32 or int64 tensor"),
            (lambda: shmem.wait_signal(pair, 9), ValueError,
             "`signal_tensor` must have exactly one element, but got 2"),
        ]
        for index, (call, exc_type, *fragments) in enumerate(checks):
            try:
                expect_error(exc_type, call, *fragments)
            except BaseException as exc:
                raise AssertionError(f"check {index} ({fragments[0]!r}): {exc}") from exc
            # A failed get writes nothing into its local destination either.
            assert torch.equal(dst, torch.full((16,), 5.0)), f"check {index} wrote into the local dst"
        shmem.barrier()
        # Nothing reached this rank's copies.
        assert torch.equal(target, torch.full((16,), -1.0)), target
        assert torch.equal(guard, torch.full((16,), -2.0)), guard
        assert sig.item() == 7 and pair.tolist() == [9, 9]


def _case_zero_bytes_are_no_ops() -> None:
    rank = dist.get_rank()
    peer = 1 - rank
    with session() as empty:
        target = empty(16, dtype=torch.float32)
        nothing = empty(0, dtype=torch.float32)
        target.fill_(-1.0)
        dist.barrier()
        shmem.put(target[3:3], torch.empty(0), peer)  # an empty view inside an allocation
        shmem.put(target[16:], torch.empty(0), peer)  # ... at its very end
        shmem.put(nothing, torch.empty(0), peer)  # a zero-byte allocation
        shmem.put(target[3:3], torch.empty(0, dtype=torch.int64), peer)  # the byte counts agree: 0 == 0
        shmem.get(torch.empty(0), target[5:5], peer)
        shmem.get(torch.empty(0, 4), nothing, peer)
        shmem.barrier()
        assert torch.equal(target, torch.full((16,), -1.0))


def _case_zero_bytes_are_still_validated() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = 1 - rank
    with session() as empty:
        target = empty(16, dtype=torch.float32)
        target.fill_(-1.0)
        dist.barrier()
        expect_error(ValueError, lambda: shmem.put(target[3:3], torch.empty(0), world),
                     f"`pe` must be in [0, {world}), but got {world}")
        expect_error(ValueError, lambda: shmem.get(torch.empty(0), target[3:3], -2),
                     "`pe` must be in [0, 2), but got -2")
        expect_error(ValueError, lambda: shmem.put(target[3:3], torch.ones(1), peer),
                     "`src` must have as many bytes as `dst` (0), but got 4")
        expect_error(TypeError, lambda: shmem.put(target[3:3], None, peer),
                     "`src` must be a torch.Tensor, but got NoneType")
        expect_error(TypeError, lambda: shmem.put(target[3:3], torch.empty(0), 0.0),
                     "`pe` must be an int, but got float")
        shmem.barrier()
        assert torch.equal(target, torch.full((16,), -1.0))


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


def test_put_and_get_address_views_at_offsets(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_put_get_views_at_offsets)



def test_peer_tensor_reads_and_writes_every_peers_copy(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_peer_tensor)

@pytest.mark.parametrize("nranks", [4, 8])
def test_put_get_between_every_pair(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_all_pairs, 257, timeout=120)


def test_every_dtype_round_trips_bit_exactly(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_dtypes_bit_exact, 1027)


def test_barrier_waits_for_the_last_rank(world_factory) -> None:
    times = run_case(world_factory(4, _ENV), _case_barrier_waits_for_the_last_rank)
    for round_ in range(3):
        last_arrival = max(rank_times[round_][0] for rank_times in times)
        for rank, rank_times in enumerate(times):
            assert rank_times[round_][1] >= last_arrival, f"rank {rank} left barrier {round_} before the last arrival"


def test_signal_set_and_add_int32_and_int64(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_signal_set_and_add)
    run_case(world_factory(2, _SHORT_ENV), _case_signal_set_and_add)


def test_signal_makes_earlier_puts_visible(world_factory) -> None:
    run_case(world_factory(2, _SHORT_ENV), _case_signal_orders_data, 200)


@pytest.mark.parametrize(
    "dtype,value,observed",
    [
        (torch.int32, 5, [4, 5, 6]),
        # 64-bit signals: values that agree in their low 32 bits, so a truncated compare gives itself away.
        (torch.int64, 2**33 + 5, [2**33 + 5 - 2**32, 2**33 + 5, 2**33 + 5 + 2**32]),
    ],
)
def test_wait_signal_every_cmp(world_factory, dtype, value, observed) -> None:
    results = run_case(world_factory(2, _SHORT_ENV), _case_wait_signal_every_cmp, dtype, value, observed, timeout=60)
    for rank_results in results:
        for (name, obs), outcome in rank_results.items():
            if _CMPS[name](obs, value):
                assert outcome == "ok", (name, obs)
                continue
            message, elapsed = outcome
            assert message.startswith("signal wait timed out"), (name, obs, message)
            for fragment in (f"cmp={name}", f"expected={value}", f"observed={obs}", "timeout_sec=3"):
                assert fragment in message, (name, obs, fragment, message)
            assert _SHORT_TIMEOUT_S * 0.9 <= elapsed < _SHORT_TIMEOUT_S + 10, (name, obs, elapsed)


def test_wait_signal_times_out_with_expected_and_observed(world_factory) -> None:
    for out in run_case(world_factory(2, _SHORT_ENV), _case_wait_signal_timeout):
        message, code, is_shmem_error, is_runtime_error = out["int32"]
        assert code == "TIMEOUT" and is_shmem_error and is_runtime_error
        assert message.startswith("signal wait timed out: signal=0x"), message
        for fragment in ("heap_offset=0x", "cmp=eq", "expected=7", "observed=3", "timeout_sec=3"):
            assert fragment in message, (fragment, message)
        assert _SHORT_TIMEOUT_S * 0.9 <= out["elapsed"] < _SHORT_TIMEOUT_S + 10
        assert out["latest_failure"] == "TIMEOUT: " + message
        for fragment in ("cmp=ge", f"expected={2**41}", f"observed={2**40 + 1}"):
            assert fragment in out["int64"], (fragment, out["int64"])


def test_ctrl_c_interrupts_a_wait(world_factory) -> None:
    (out,) = run_case(world_factory(1, _ENV), _case_ctrl_c_interrupts_a_wait)
    assert out.get("interrupted"), out
    assert out["elapsed"] < 10, out  # well before the 30 s timeout
    assert out["latest_failure"] == "INTERRUPTED: wait interrupted by a signal to the process (e.g. Ctrl-C)", out


def test_barrier_times_out_naming_the_missing_rank() -> None:
    # A fresh world: the timed-out barrier leaves this world's barrier counters inconsistent.
    with World(3, env=_SHORT_ENV) as world:
        results = world.run(_case_barrier_timeout, 2, timeout=60)
    assert results[2] == {}
    for rank in (0, 1):
        message = results[rank]["message"]
        assert message.startswith("barrier timed out"), message
        for fragment in ("expected_arrivals=3", "observed_arrivals=2", "missing_ranks=[2]", "timeout_sec=3"):
            assert fragment in message, (fragment, message)
        assert _SHORT_TIMEOUT_S * 0.9 <= results[rank]["elapsed"] < _SHORT_TIMEOUT_S + 10


def test_bad_arguments_raise_and_write_nothing(world_factory) -> None:
    run_case(world_factory(2, _SHORT_ENV), _case_bad_arguments_write_nothing)


def test_zero_byte_calls_are_no_ops(world_factory) -> None:
    run_case(world_factory(2, _SHORT_ENV), _case_zero_bytes_are_no_ops)


def test_zero_byte_calls_are_still_validated(world_factory) -> None:
    run_case(world_factory(2, _SHORT_ENV), _case_zero_bytes_are_still_validated)
