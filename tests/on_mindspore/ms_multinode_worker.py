"""The ranks' side of MindSpore's one-sided calls across nodes (test_ms_multinode.py), run by msrun on simulated nodes
(tests/st/simulated_nodes.py, ``launcher="msrun"``): 2 nodes x 2 ranks, ranks 0 and 1 on node0, 2 and 3 on node1.

Every rank runs every ``case_*`` function in order and appends one JSON line per case to
``$HP_MS_RESULTS/rank<r>.jsonl``: ``{"case", "ok", "result"}``, or ``"error"`` and ``"traceback"`` where the case
raised. A case checks what it sees exactly (numpy's ``array_equal`` against values computed here) and returns what the
test asserts on besides. The calls are the user API's (``hyper_parallel.core.symmetric_memory`` on
``mindspore.Tensor``), which MindSpore's handler runs through the runtime's C ABI; the bad inputs also go to the C ABI
directly, below the API's own checks. ``HP_MS_PER_NODE`` says how many ranks each node has (msrun does not say).

``ms_multinode_worker.py node_death OUT_DIR`` runs the node-death scenario instead (:func:`_node_death`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

import mindspore as ms
from mindspore import communication
from mindspore.mint import distributed as md

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import c_runtime
from hyper_parallel.platform.mindspore import tensors as ms_tensors
from hyper_parallel.platform.mindspore.handler import HANDLER

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared"))
import symm_api_cases  # noqa: E402  (the user API's cases written once for both frameworks)
from ms_fw import MindSporeFramework  # noqa: E402

RANK = WORLD = PER_NODE = 0
NODES = 2
SET, ADD = 0, 1                      # signal_op
EQ, GE = 0, 4                        # compare_op
# How late a rank comes to a barrier or raises a signal that others wait for: the waits must last at least half of it
# (the ranks leave the barrier before it at slightly different times on a loaded machine).
LATE_S = 0.5


def _node(rank: int) -> int:
    return rank // PER_NODE


def _lane_peer() -> int:
    """The rank of the other node at this rank's place on its node (2 nodes)."""
    return (RANK + PER_NODE) % WORLD


def _fill(t: ms.Tensor, a: np.ndarray) -> None:
    """Writes ``a`` into the symmetric tensor ``t`` and waits until it is in memory (MindSpore queues ``copy_``)."""
    t.copy_(ms.Tensor(np.ascontiguousarray(a)))
    ms_tensors.synchronize()


def _raised(fn: Callable[..., Any], *args: Any) -> dict:
    """The class and message of what ``fn(*args)`` raised, with its bases' names."""
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 (the record names it)
        return {"type": type(error).__name__, "message": str(error), "mro": [c.__name__ for c in type(error).__mro__]}
    raise AssertionError(f"{getattr(fn, '__name__', fn)} raised nothing")


# ---- the cases ---------------------------------------------------------------------------------------------------

def case_nodes_and_transports():
    """Node-major ranks (msrun's --node_rank), the runtime's nodes found through shared memory, and UCX to the PEs of
    the other node."""
    probe = symm.empty(1, dtype=ms.int32)   # the runtime starts with the first allocation
    state = symm.debug_state()
    symm.free(probe)
    host = socket.gethostname()
    assert host == f"node{_node(RANK)}", (host, RANK)
    assert int(os.environ["RANK_ID"]) == RANK, (os.environ["RANK_ID"], RANK)
    every_host = [None] * WORLD
    md.all_gather_object(every_host, host)
    assert every_host == [f"node{_node(r)}" for r in range(WORLD)], every_host
    return {"nodes": state["nodes"], "transports": state["transports"], "hosts": every_host}


def case_barrier_across_nodes_waits_for_a_late_rank():
    """symm.barrier over the world and over a group of one rank of each node: nobody leaves before the late rank
    came, and what it put into every other rank before it came is there after the barrier."""
    word = symm.empty(1, dtype=ms.int64)
    _fill(word, np.zeros(1, np.int64))
    symm.barrier()
    late = WORLD - 1
    if RANK == late:
        time.sleep(LATE_S)
        for pe in range(WORLD - 1):   # both nodes
            symm.shmem_put(word, 0, ms.Tensor([late], ms.int64), 0, 1, pe)
    start = time.monotonic()
    symm.barrier()
    waited = time.monotonic() - start
    seen = int(word.asnumpy()[0])
    # A group of ranks 1 and PER_NODE (one on each node), in MindSpore's numbering: group rank 1 is world rank 2.
    pair = [1, PER_NODE]
    waited_pair = seen_pair = None
    if RANK in pair:
        communication.create_group("hp_across_nodes", pair)
        if RANK == PER_NODE:
            time.sleep(LATE_S)
            symm.shmem_put(word, 0, ms.Tensor([100], ms.int64), 0, 1, 0, group="hp_across_nodes")
        start = time.monotonic()
        symm.barrier(group="hp_across_nodes")
        waited_pair, seen_pair = time.monotonic() - start, int(word.asnumpy()[0])
    symm.barrier()
    symm.free(word)
    if RANK != late:
        assert waited > LATE_S / 2, waited
        assert seen == late, seen
    if RANK == 1:
        assert waited_pair > LATE_S / 2 and seen_pair == 100, (waited_pair, seen_pair)
    return {"waited_s": waited, "seen": seen, "waited_pair_s": waited_pair, "seen_pair": seen_pair}


def _group_team(name: str) -> dict:
    """What MindSpore's handler holds for group ``name``: whether it has a team, and whether that team runs phases
    across nodes (and on how many nodes)."""
    team = HANDLER.calls._teams.get(name)   # noqa: SLF001 (the handler's record of the group is what is checked)
    return {"team": team is not None, "nodes": None if team is None or team.hierarchy is None
            else team.hierarchy.layout.count}


def case_barrier_first_on_a_group_that_spans_nodes_runs_through_its_team():
    """symm.barrier as the first call on a sub-group that spans both nodes (every rank, under a name of its own) makes
    the group's team, as the group's first collective would, and runs its barrier across nodes: the put each rank
    made into its lane peer on the other node before the barrier (the last rank 0.5 s late) is there after it. The
    runtime holds one more team (this node's team of the group), the handler's record of the group runs phases on 2
    nodes, and send/recv over the group work at once (they need the group's team)."""
    name = "hp_barrier_first"
    communication.create_group(name, list(range(WORLD)))   # group rank = world rank
    word = symm.empty(1, dtype=ms.int64)
    _fill(word, np.full(1, -1, np.int64))
    symm.barrier()   # over the world: no put below lands before every rank has filled its word
    before = {"live_teams": symm.debug_state()["live_teams"], **_group_team(name)}
    if RANK == WORLD - 1:
        time.sleep(LATE_S)
    symm.shmem_put(word, 0, ms.Tensor([RANK], ms.int64), 0, 1, _lane_peer(), group=name)
    start = time.monotonic()
    symm.barrier(group=name)
    waited = time.monotonic() - start
    seen = int(word.asnumpy()[0])
    after = {"live_teams": symm.debug_state()["live_teams"], **_group_team(name)}
    message = ms.Tensor(np.arange(4, dtype=np.float32) + RANK)
    got = ms.Tensor(np.zeros(4, np.float32))
    if _node(RANK) == 0:
        symm.shmem_send(message, _lane_peer(), group=name)
        symm.shmem_recv(got, _lane_peer(), group=name)
    else:
        symm.shmem_recv(got, _lane_peer(), group=name)
        symm.shmem_send(message, _lane_peer(), group=name)
    symm.barrier()
    symm.free(word)
    assert seen == _lane_peer(), seen
    if RANK != WORLD - 1:
        assert waited > LATE_S / 2, waited
    assert before == {"live_teams": before["live_teams"], "team": False, "nodes": None}, before
    assert after == {"live_teams": before["live_teams"] + 1, "team": True, "nodes": NODES}, (before, after)
    assert np.array_equal(got.asnumpy(), np.arange(4, dtype=np.float32) + _lane_peer()), got.asnumpy()
    return {"waited_s": waited, "seen": seen, "before": before, "after": after}


def case_allocation_and_free_that_differ_across_nodes_change_nothing():
    """The runtime agrees on an allocation and a free within a node; the handler checks each across the nodes too (a
    symmetric tensor must lie at the same heap offset on every rank for a put from another node to reach it): an
    allocation whose size differs between the nodes, and a free of different tensors, raise on every rank, naming
    both, with nothing allocated or freed; the next allocation lies where it would have."""
    def active() -> int:
        return len(symm.debug_state()["active_allocations"] or ())

    before = active()
    allocation = _raised(symm.empty, 16 if _node(RANK) == 0 else 32, ms.float32)
    after_allocation = active()
    a = symm.empty(16, dtype=ms.float32)
    b = symm.empty(16, dtype=ms.float32)
    free = _raised(symm.free, a if _node(RANK) == 0 else b)
    after_free = active()
    # Both still work across the nodes.
    _fill(a, np.zeros(16, np.float32))
    symm.barrier()
    symm.shmem_put(a, 0, ms.Tensor(np.full(16, float(RANK), np.float32)), 0, 16, _lane_peer())
    symm.barrier()
    seen = a.asnumpy().copy()
    symm.free(b)
    symm.free(a)
    assert after_allocation == before and after_free == before + 2, (before, after_allocation, after_free)
    assert np.array_equal(seen, np.full(16, float(_lane_peer()), np.float32)), seen
    return {"allocation": allocation, "free": free}


def _world_sum(values: Callable[[int], np.ndarray]) -> np.ndarray:
    """What a sum over every rank gives, from what each rank contributes."""
    return np.sum([values(r) for r in range(WORLD)], axis=0)


def case_collectives_over_a_group_that_spans_nodes():
    """Every collective over the world, which spans both nodes, in phases (the node's engine, then the other node over
    UCX): each result exactly numpy's (the values are small integers, exact in every dtype and wire format used)."""
    mine = lambda r, n: (np.arange(n) % 13 + 3 * r).astype(np.float32)   # noqa: E731
    seen = {}
    for count in (10, 7, 70000):   # 7: a count the node's members do not split evenly; 70000: past the eager size
        t = ms.Tensor(mine(RANK, count))
        symm.shmem_allreduce(t)
        assert np.array_equal(t.asnumpy(), _world_sum(lambda r: mine(r, count))), (count, t.asnumpy()[:8])
    t = ms.Tensor(np.array([RANK, -RANK, 7 * RANK], np.int32))
    symm.shmem_allreduce(t, op="max")
    assert t.asnumpy().tolist() == [WORLD - 1, 0, 7 * (WORLD - 1)], t.asnumpy()
    t = ms.Tensor(np.full(5, 4.0 * RANK, np.float32))
    symm.shmem_allreduce(t, op="avg")
    assert np.array_equal(t.asnumpy(), np.full(5, 2.0 * (WORLD - 1), np.float32)), t.asnumpy()
    t = ms.Tensor(mine(RANK, 9)).astype(ms.bfloat16)
    symm.shmem_allreduce(t)
    assert np.array_equal(t.astype(ms.float32).asnumpy(), _world_sum(lambda r: mine(r, 9))), t
    for wire in ("bfloat16", "float8_e4m3fn"):   # small integers: exact in both formats, and their sums in float32
        t = ms.Tensor(mine(RANK, 40) % 5)
        symm.shmem_allreduce(t, low_precision_dtype=wire)
        assert np.array_equal(t.asnumpy(), _world_sum(lambda r: mine(r, 40) % 5)), (wire, t.asnumpy())
        out = ms.Tensor(np.zeros(6, np.float32))
        symm.shmem_reduce_scatter(out, ms.Tensor(mine(RANK, 6 * WORLD) % 5), low_precision_dtype=wire)
        expected = _world_sum(lambda r: mine(r, 6 * WORLD) % 5)[6 * RANK:6 * RANK + 6]
        assert np.array_equal(out.asnumpy(), expected), (wire, out.asnumpy(), expected)
    gathered = ms.Tensor(np.zeros(3 * WORLD, np.float32))
    symm.shmem_allgather(gathered, ms.Tensor(np.full(3, float(RANK), np.float32)))
    assert np.array_equal(gathered.asnumpy(), np.repeat(np.arange(WORLD, dtype=np.float32), 3)), gathered.asnumpy()
    out = ms.Tensor(np.zeros(5, np.float32))
    symm.shmem_reduce_scatter(out, ms.Tensor(mine(RANK, 5 * WORLD)))
    assert np.array_equal(out.asnumpy(), _world_sum(lambda r: mine(r, 5 * WORLD))[5 * RANK:5 * RANK + 5]), out
    # all_to_all: rank r sends rank j r + j + 1 values of 100 r + j; parts of other lengths on every pair.
    sends = [ms.Tensor(np.full(RANK + j + 1, 100 * RANK + j, np.int64)) for j in range(WORLD)]
    counts = [i + RANK + 1 for i in range(WORLD)]
    receive = ms.Tensor(np.zeros(sum(counts), np.int64))
    symm.shmem_alltoall(sends, receive, counts)
    expected = np.concatenate([np.full(i + RANK + 1, 100 * i + RANK, np.int64) for i in range(WORLD)])
    assert np.array_equal(receive.asnumpy(), expected), receive.asnumpy()
    seen["alltoall"] = receive.asnumpy()[:4].tolist()
    # send/recv with the lane peer: node0 sends first, node1 receives first.
    message = ms.Tensor(np.arange(6, dtype=np.float32) + RANK)
    got = ms.Tensor(np.zeros(6, np.float32))
    if _node(RANK) == 0:
        symm.shmem_send(message, _lane_peer())
        symm.shmem_recv(got, _lane_peer())
    else:
        symm.shmem_recv(got, _lane_peer())
        symm.shmem_send(message, _lane_peer())
    assert np.array_equal(got.asnumpy(), np.arange(6, dtype=np.float32) + _lane_peer()), got.asnumpy()
    symm.barrier()
    debug = symm.debug_state()
    seen["teams"] = len(debug.get("teams", []))
    return seen


def case_collectives_across_nodes_that_disagree_fail_on_every_rank():
    """Node 0 reduces 4 values, node 1 8: every rank raises ShmemMismatchError naming both calls; a bad input on one
    rank (rank 0's output of another size) is refused on every rank with its message; the group then works on."""
    t = ms.Tensor(np.ones(4 if _node(RANK) == 0 else 8, np.float32))
    mismatch = _raised(symm.shmem_allreduce, t)
    assert np.array_equal(t.asnumpy(), np.ones(t.shape[0], np.float32)), t.asnumpy()   # nothing was written
    out = ms.Tensor(np.zeros(3 if RANK == 0 else 2, np.float32))
    refused = _raised(symm.shmem_reduce_scatter, out, ms.Tensor(np.ones(2 * WORLD, np.float32)))
    t = ms.Tensor(np.full(4, float(RANK), np.float32))
    symm.shmem_allreduce(t)
    assert np.array_equal(t.asnumpy(), np.full(4, float(WORLD * (WORLD - 1) // 2), np.float32)), t.asnumpy()
    return {"mismatch": mismatch, "refused": refused}


def case_put_across_nodes():
    """Each rank writes a whole tensor, then a window at an offset, into its lane peer on the other node."""
    other, count = _lane_peer(), 1000
    buf = symm.empty(count, dtype=ms.float32)
    _fill(buf, np.zeros(count, np.float32))
    symm.barrier()
    mine = np.arange(count, dtype=np.float32) + 1000 * RANK
    symm.shmem_put(buf, 0, ms.Tensor(mine), 0, count, other)
    symm.shmem_put(buf, 10, ms.Tensor(-mine), 500, 10, other)   # buf[10:20] = -mine[500:510]
    symm.barrier()
    seen = buf.asnumpy().copy()
    symm.free(buf)
    expected = np.arange(count, dtype=np.float32) + 1000 * other
    expected[10:20] = -expected[500:510]
    assert np.array_equal(seen, expected), (seen[:24], expected[:24])
    return {"from": other, "checked": count}


def case_get_across_nodes():
    """Each rank reads its lane peer's copy, whole and a window into an offset of an ordinary tensor; float16, int64
    and a 1 MiB float32 read (past UCX's eager sizes)."""
    other = _lane_peer()
    checked = {}
    for dtype, numpy_dtype, count in ((ms.float16, np.float16, 4096), (ms.int64, np.int64, 333),
                                      (ms.float32, np.float32, 1 << 18)):
        buf = symm.empty(count, dtype=dtype)
        theirs = lambda r: ((np.arange(count) * 7 + 31 * r) % 1001 - 500).astype(numpy_dtype)  # noqa: E731
        _fill(buf, theirs(RANK))
        symm.barrier()
        got = ms.Tensor(np.full(count + 8, -1, numpy_dtype))
        symm.shmem_get(got, 0, buf, 0, count, other)
        window = ms.Tensor(np.full(16, -1, numpy_dtype))
        symm.shmem_get(window, 3, buf, count - 10, 10, other)   # window[3:13] = theirs[-10:]
        symm.barrier()   # nobody changes `buf` before every rank read it
        symm.free(buf)
        expected = np.concatenate([theirs(other), np.full(8, -1, numpy_dtype)])
        assert np.array_equal(got.asnumpy(), expected), (dtype, got.asnumpy()[:8], expected[:8])
        expected_window = np.full(16, -1, numpy_dtype)
        expected_window[3:13] = theirs(other)[-10:]
        assert np.array_equal(window.asnumpy(), expected_window), (dtype, window.asnumpy())
        checked[str(dtype)] = count
    return checked


def case_signal_set_and_add_across_nodes():
    """SET then ADD on int64, two ADDs of a negative value on int32, from the lane peer; each rank waits for its own
    signals to reach the value its peer's calls make, then reads them."""
    other = _lane_peer()
    flag64 = symm.empty(2, dtype=ms.int64)
    flag32 = symm.empty(2, dtype=ms.int32)
    _fill(flag64, np.zeros(2, np.int64))
    _fill(flag32, np.zeros(2, np.int32))
    symm.barrier()
    symm.shmem_signal_op(flag64, 1, 5, SET, other)
    symm.shmem_signal_op(flag64, 1, RANK + 1, ADD, other)
    symm.shmem_signal_op(flag32, 0, -7, ADD, other)
    symm.shmem_signal_op(flag32, 0, -7, ADD, other)
    symm.shmem_signal_op(flag64, 0, (1 << 40) + RANK, SET, other)   # a value only 64 bits hold
    symm.shmem_wait_for_signal(None, flag64, 1, 5 + other + 1, EQ)
    symm.shmem_wait_for_signal(None, flag32, 0, -14, EQ)
    symm.shmem_wait_for_signal(None, flag64, 0, (1 << 40) + other, EQ)
    symm.barrier()
    seen64, seen32 = flag64.asnumpy().tolist(), flag32.asnumpy().tolist()
    symm.free(flag64)
    symm.free(flag32)
    assert seen64 == [(1 << 40) + other, 5 + other + 1], seen64
    assert seen32 == [-14, 0], seen32
    return {"int64": seen64, "int32": seen32}


def case_put_with_signal_data_visible_with_the_signal():
    """put_with_signal of 256 B (ADD) and 1 MiB (SET) into the lane peer: once a rank's signal holds the value, the
    data it guards is there, whole; the consumer reads it before any barrier."""
    other = _lane_peer()
    rows = symm.empty((WORLD, 64), dtype=ms.float32)
    big = symm.empty(1 << 18, dtype=ms.float32)
    sig = symm.empty(4, dtype=ms.int32)
    _fill(rows, np.full((WORLD, 64), -1, np.float32))
    _fill(big, np.full(1 << 18, -1, np.float32))
    _fill(sig, np.zeros(4, np.int32))
    symm.barrier()
    row = lambda r: np.arange(64, dtype=np.float32) * (r + 1)  # noqa: E731
    payload = lambda r: np.random.default_rng(r).standard_normal(1 << 18).astype(np.float32)  # noqa: E731
    symm.shmem_put_with_signal(rows, RANK * 64, ms.Tensor(row(RANK)), 0, 64, sig, 0, 1, ADD, other)
    symm.shmem_put_with_signal(big, 0, ms.Tensor(payload(RANK)), 0, 1 << 18, sig, 1, 9, SET, other)
    symm.shmem_wait_for_signal(rows, sig, 0, 1, EQ)
    got_rows = rows.asnumpy().copy()
    symm.shmem_wait_for_signal(big, sig, 1, 9, EQ)
    got_big = big.asnumpy().copy()
    symm.barrier()
    signals = sig.asnumpy().tolist()
    for t in (rows, big, sig):
        symm.free(t)
    expected_rows = np.full((WORLD, 64), -1, np.float32)
    expected_rows[other] = row(other)
    assert np.array_equal(got_rows, expected_rows), got_rows[:, :4]
    assert np.array_equal(got_big, payload(other)), got_big[:4]
    assert signals == [1, 9, 0, 0], signals
    return {"signals": signals, "bytes": 64 * 4 + (1 << 20)}


def case_wait_for_signal_woken_by_the_other_node():
    """A wait that starts long before the other node's signal wakes when it lands (not at the timeout); then a
    ping-pong between the lane peers, each wait woken by the other node's signal."""
    other = _lane_peer()
    sig = symm.empty(4, dtype=ms.int64)
    _fill(sig, np.zeros(4, np.int64))
    symm.barrier()
    waited = None
    if _node(RANK) == 1:
        time.sleep(LATE_S)
        symm.shmem_signal_op(sig, 0, 42, SET, other)
    else:
        start = time.monotonic()
        symm.shmem_wait_for_signal(None, sig, 0, 42, EQ)
        waited = time.monotonic() - start
    symm.barrier()
    rounds = 20
    start = time.monotonic()
    for i in range(1, rounds + 1):
        if _node(RANK) == 0:
            symm.shmem_signal_op(sig, 1, i, SET, other)
            symm.shmem_wait_for_signal(None, sig, 2, i, EQ)
        else:
            symm.shmem_wait_for_signal(None, sig, 1, i, EQ)
            symm.shmem_signal_op(sig, 2, i, SET, other)
    per_round = (time.monotonic() - start) / rounds
    symm.barrier()
    seen = sig.asnumpy().tolist()
    symm.free(sig)
    if _node(RANK) == 0:
        assert seen == [42, 0, rounds, 0], seen
        assert LATE_S / 2 < waited < LATE_S + 5, waited   # woken by the signal, long before the 10 s timeout
    else:
        assert seen == [0, rounds, 0, 0], seen
    return {"waited_s": waited, "per_round_s": per_round, "rounds": rounds}


def case_seed_example_one_across_nodes():
    """Seed 000's example 1 (put + signal, producer and consumer) with the producer rank 0 on node0 and the consumer
    rank PER_NODE on node1, written as examples/mindspore_producer_consumer.py writes it on MindSpore."""
    producer, consumer = 0, PER_NODE
    assert _node(producer) != _node(consumer)
    data_buf = symm.empty(4096, dtype=ms.float16)
    signal = symm.empty(1, dtype=ms.int32)
    signal.copy_(ms.Tensor([0], ms.int32))
    data_buf.copy_(ms.Tensor(np.full(4096, -1, np.float16)))   # not in the example: what a missing put leaves
    md.barrier()
    # The example's data is drawn unseeded; seeded here so that the consumer knows what the producer sent.
    local = np.random.default_rng(2024).standard_normal(4096).astype(np.float16)
    result = None
    if RANK == producer:
        local_data = ms.Tensor(local)
        symm.shmem_put_with_signal(
            target=data_buf,
            target_offset=ms.Tensor([0], ms.int64),
            src=local_data,
            src_offset=ms.Tensor([0], ms.int64),
            size=ms.Tensor([4096], ms.int64),
            signal=signal,
            signal_offset=ms.Tensor([0], ms.int64),
            signal_value=ms.Tensor([1], ms.int32),
            signal_op=0,    # SET
            target_rank=consumer
        )
    elif RANK == consumer:
        symm.shmem_wait_for_signal(
            depend_tensor=data_buf,
            signal=signal,
            signal_offset=ms.Tensor([0], ms.int64),
            compare_value=ms.Tensor([1], ms.int32),
            compare_op=0    # EQ
        )
        result = float(data_buf.astype(ms.float32).sum())  # the data has arrived
        received = data_buf.asnumpy().copy()
    md.barrier()
    raised = signal.asnumpy().tolist()
    untouched = data_buf.asnumpy().copy()
    symm.free(data_buf)
    symm.free(signal)
    if RANK == consumer:
        assert np.array_equal(received, local), (received[:8], local[:8])
        assert result == float(ms.Tensor(local).astype(ms.float32).sum()), result
        assert raised == [1], raised
        return {"role": "consumer", "sum": result}
    assert np.array_equal(untouched, np.full(4096, -1, np.float16)), untouched[:8]   # nobody else's changed
    assert raised == [0], raised
    return {"role": "producer" if RANK == producer else "bystander"}


def case_push_example_across_nodes():
    """Seed 000's push mode (examples/symm_push.py) over both nodes: every rank writes its row into every rank and
    raises its signal (ADD 1); a rank's rows are complete once its signal counts every rank."""
    row = ms.Tensor(np.full(1024, float(RANK), np.float32))
    rows = symm.empty((WORLD, 1024), dtype=ms.float32)     # the receivers' buffer
    arrived = symm.empty(1, dtype=ms.int64)
    _fill(arrived, np.zeros(1, np.int64))
    _fill(rows, np.full((WORLD, 1024), -1, np.float32))   # not in the example: what a missing put leaves
    symm.barrier()
    for peer in range(WORLD):   # write into the peer, then signal it: the data is visible before the signal
        symm.shmem_put_with_signal(rows, RANK * 1024, row, 0, 1024, arrived, 0, 1, ADD, target_rank=peer)
    symm.shmem_wait_for_signal(rows, arrived, 0, WORLD, GE)
    received = rows.asnumpy().copy()   # before the barrier: the signal alone says the rows are there
    symm.barrier()   # nobody writes into `rows` any more
    count = int(arrived.asnumpy()[0])
    symm.free(rows)
    symm.free(arrived)
    expected = np.repeat(np.arange(WORLD, dtype=np.float32)[:, None], 1024, axis=1)
    assert np.array_equal(received, expected), received[:, 0]
    assert count == WORLD, count
    return {"rows": received[:, 0].tolist(), "arrived": count}


def case_pull_example_across_nodes():
    """Seed 000's pull mode (examples/symm_pull.py) over both nodes: every rank stages its row, announces it to every
    rank, then reads every rank's row in the order it chooses."""
    staged = symm.empty(1024, dtype=ms.float32)             # the senders' buffer
    ready = symm.empty(1, dtype=ms.int64)
    _fill(ready, np.zeros(1, np.int64))
    symm.barrier()
    _fill(staged, np.full(1024, float(RANK), np.float32))
    for peer in range(WORLD):   # announce: my row is staged
        symm.shmem_signal_op(ready, 0, 1, ADD, target_rank=peer)
    symm.shmem_wait_for_signal(staged, ready, 0, WORLD, GE)
    pulled = ms.Tensor(np.full(WORLD * 1024, -1, np.float32))
    for peer in reversed(range(WORLD)):   # any order the consumer likes
        symm.shmem_get(pulled, peer * 1024, staged, 0, 1024, target_rank=peer)
    symm.barrier()   # nobody reads `staged` any more
    count = int(ready.asnumpy()[0])
    symm.free(staged)
    symm.free(ready)
    got = pulled.asnumpy().reshape(WORLD, 1024)
    expected = np.repeat(np.arange(WORLD, dtype=np.float32)[:, None], 1024, axis=1)
    assert np.array_equal(got, expected), got[:, 0]
    assert count == WORLD, count
    return {"rows": got[:, 0].tolist(), "ready": count}


def case_bad_inputs_across_nodes_write_nothing():
    """Puts and gets aimed at the other node that do not fit: refused with the project's message, through the user
    API (a window past the target's end, an ordinary tensor as the target, a rank outside the group) and through the
    runtime's C ABI directly (bytes past the allocation, an address outside the heap): nothing is written anywhere,
    and a good put after them goes through."""
    other = _lane_peer()
    buf = symm.empty(16, dtype=ms.float32)
    guard = symm.empty(16, dtype=ms.float32)   # the next allocation: what a put past buf's end would reach
    flag = symm.empty(2, dtype=ms.int64)
    sentinel = lambda r: np.full(16, 100 + r, np.float32)  # noqa: E731
    _fill(buf, sentinel(RANK))
    _fill(guard, sentinel(RANK))
    _fill(flag, np.zeros(2, np.int64))
    symm.barrier()
    src = ms.Tensor(np.full(32, 7, np.float32))
    ordinary = ms.Tensor(np.zeros(16, np.float32))
    seen = {
        "window_past_end": _raised(symm.shmem_put, buf, 8, src, 0, 16, other),
        "ordinary_target": _raised(symm.shmem_put, ordinary, 0, src, 0, 16, other),
        "rank_outside_group": _raised(symm.shmem_put, buf, 0, src, 0, 16, WORLD),
        "get_window_past_end": _raised(symm.shmem_get, ordinary, 0, buf, 4, 16, other),
        "signal_past_end": _raised(symm.shmem_put_with_signal, buf, 0, src, 0, 16, flag, 2, 1, SET, other),
    }
    base, source = ms_tensors.address(buf), ms_tensors.address(src)
    seen["c_put_past_allocation"] = _raised(c_runtime.put, base + 32, source, 64, 64, other)
    seen["c_put_outside_heap"] = _raised(c_runtime.put, ms_tensors.address(ordinary), source, 64, 64, other)
    seen["c_get_past_allocation"] = _raised(c_runtime.get, ms_tensors.address(ordinary), base + 32, 64, 64, other)
    seen["c_put_pe_outside_world"] = _raised(c_runtime.put, base, source, 64, 64, WORLD)
    symm.barrier()
    untouched = (buf.asnumpy().copy(), guard.asnumpy().copy(), ordinary.asnumpy().copy(), flag.asnumpy().copy())
    symm.barrier()   # every rank has read its copy before the peer's good put below lands in it
    # The runtime carries on: a good put to the same peer lands.
    symm.shmem_put(buf, 0, ms.Tensor(np.arange(16, dtype=np.float32) + RANK), 0, 16, other)
    symm.barrier()
    after = buf.asnumpy().copy()
    symm.free(flag)
    symm.free(guard)
    symm.free(buf)
    assert np.array_equal(untouched[0], sentinel(RANK)), untouched[0]
    assert np.array_equal(untouched[3], np.zeros(2, np.int64)), untouched[3]
    assert np.array_equal(untouched[1], sentinel(RANK)), untouched[1]
    assert np.array_equal(untouched[2], np.zeros(16, np.float32)), untouched[2]
    assert np.array_equal(after, np.arange(16, dtype=np.float32) + other), after
    return {"errors": seen, "buf_address": base}


def case_rendezvous_across_nodes_is_refused():
    """In-place access to another node's copy needs mapped memory: rendezvous over a group that spans both nodes
    refuses on every rank, naming the PE of the other node, and one-sided calls go on afterwards."""
    buf = symm.empty(8, dtype=ms.float32)
    _fill(buf, np.zeros(8, np.float32))
    symm.barrier()
    error = _raised(symm.rendezvous, buf)
    symm.shmem_put(buf, 0, ms.Tensor(np.full(8, float(RANK), np.float32)), 0, 8, _lane_peer())
    symm.barrier()
    after = buf.asnumpy().copy()
    symm.free(buf)
    assert np.array_equal(after, np.full(8, float(_lane_peer()), np.float32)), after
    return {"error": error}


def case_moe_dispatch_and_combine_across_nodes():
    """The user API's MoE cases, written once for both frameworks (tests/shared/symm_api_cases.py), over the world
    and over sub-groups that span both nodes (evens {0, 2}, odds {1, 3}), as torch's multinode job runs them: every
    token laid out and brought back, an output too small refused on every rank, low-precision rows."""
    fw = MindSporeFramework()
    for name in ("moe_dispatch_and_combine", "moe_receive_buffer_too_small", "moe_low_precision"):
        symm_api_cases.run(fw, name)


CASES = [value for name, value in list(globals().items()) if name.startswith("case_")]


def _run_cases() -> bool:
    """Runs every case, recording each; returns whether every case held on this rank."""
    path = os.path.join(os.environ["HP_MS_RESULTS"], f"rank{RANK}.jsonl")
    held = True
    with open(path, "a", encoding="utf-8") as f:
        for case in CASES:
            print(f"rank {RANK}: {case.__name__}", file=sys.stderr, flush=True)   # in the node's output on a hang
            start = time.monotonic()
            try:
                record = {"case": case.__name__, "ok": True, "result": case()}
            except Exception as error:  # noqa: BLE001 (reported to the test)
                record = {"case": case.__name__, "ok": False, "error": f"{type(error).__name__}: {error}",
                          "traceback": traceback.format_exc()}
                held = False
            record["seconds"] = round(time.monotonic() - start, 3)
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            md.barrier()   # cases start together on every rank
    return held


def _node_death(out_dir: str) -> None:
    """The node-death scenario: node 1's ranks announce they are ready and wait to be killed; node 0's ranks announce
    they are entering the world barrier, which the test then kills node 1 during, and record how it failed (class,
    message, when) before they leave. The test kills node 0 afterwards (msrun would wait for node 1 forever)."""
    probe = symm.empty(1, dtype=ms.int32)   # the runtime starts, and connects the other node
    md.barrier()
    if _node(RANK) == 1:
        open(os.path.join(out_dir, f"ready{RANK}"), "w").close()
        time.sleep(3600)   # killed with its node
    while not all(os.path.exists(os.path.join(out_dir, f"ready{r}")) for r in range(PER_NODE, WORLD)):
        time.sleep(0.05)
    open(os.path.join(out_dir, f"waiting{RANK}"), "w").close()
    record: dict = {}
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:   # until node 1 is gone, which fails the barrier
            symm.barrier()
            if os.path.exists(os.path.join(out_dir, "node1_killed")):
                break
        record["barrier"] = {"raised": "nothing"}
    except Exception as error:  # noqa: BLE001 (the record names it)
        record["barrier"] = {"raised": f"{type(error).__name__}: {error}", "ended": time.time()}
    record["transports"] = symm.debug_state()["transports"]
    del probe   # never freed: the free is collective over both nodes
    with open(os.path.join(out_dir, f"rank{RANK}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    os._exit(0)   # no shutdown: it is collective over the world, half of which is gone


def _without_a_transport(out_dir: str) -> None:
    """The job runs with UCX unable to serve (UCX_TLS names no transport it has): the runtime reaches no other node, so
    a collective over the world, which spans both, is refused on every rank naming the remedy; the barrier still
    works (MindSpore's own), over the world and over a sub-group that spans both nodes (which gets no team). Each rank
    records what it saw."""
    error = _raised(symm.shmem_allreduce, ms.Tensor(np.ones(4, np.float32)))
    symm.barrier()
    # A sub-group that spans both nodes has no team here: its barrier is MindSpore's own, and makes none.
    name = "hp_no_transport"
    communication.create_group(name, list(range(WORLD)))
    teams = symm.debug_state()["live_teams"]
    symm.barrier(group=name)
    sub_group = {"live_teams_added": symm.debug_state()["live_teams"] - teams, **_group_team(name)}
    record = {"error": error, "transports": symm.debug_state()["transports"], "sub_group_barrier": sub_group}
    with open(os.path.join(out_dir, f"rank{RANK}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    symm.shutdown()


def main() -> None:
    global RANK, WORLD, PER_NODE
    communication.init()
    RANK, WORLD = md.get_rank(), md.get_world_size()
    PER_NODE = int(os.environ["HP_MS_PER_NODE"])
    if len(sys.argv) > 2 and sys.argv[1] == "node_death":
        _node_death(sys.argv[2])
    if len(sys.argv) > 2 and sys.argv[1] == "without_a_transport":
        _without_a_transport(sys.argv[2])
        return
    if not _run_cases():
        # A failed case may have left its allocations, which shutdown would refuse: the records say what failed.
        sys.exit(1)
    symm.shutdown()


if __name__ == "__main__":
    main()
