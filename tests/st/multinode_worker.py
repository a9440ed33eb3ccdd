"""The ranks' side of the multi-node system tests (test_multinode.py), run by torchrun on simulated nodes.

``python multinode_worker.py cases OUT_DIR`` runs every case of :data:`CASES` in order on every rank (2 nodes x 2
ranks) and writes ``OUT_DIR/rank<r>.json``: per case, whether it held and what was seen. ``any_shape`` checks every
collective on any number of nodes and ranks per node. ``node_death`` is the node-death scenario: node 1's ranks
announce they are ready and wait to be killed, node 0's ranks wait for a signal from node 1 (through UCX, where it is
installed) while it dies, then call collectives, and record how each fails.

References are torch.distributed's own gloo collectives on the same inputs, or values computed in one process.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tolerances import assert_sums_close  # noqa: E402  (beside this file)
from symm_fw_torch import TorchFramework  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared"))
import symm_api_cases  # noqa: E402  (the user API's cases written once for both frameworks)

import hyper_parallel.core.symmetric_memory as symm  # noqa: E402
from hyper_parallel.core.multicore import shmem  # noqa: E402
from hyper_parallel.core.multicore.shmem._binding import C  # noqa: E402  (a guard of the runtime's own teams)

RANK = WORLD = 0
NODE_OF = {}  # global rank -> its node as the runtime numbers it (the node's lowest rank)

def _same_everywhere(t: torch.Tensor) -> bool:
    """Whether every rank holds these very bits."""
    mine = t.contiguous().view(torch.uint8).reshape(-1).tolist() if t.numel() else []
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, mine)
    return all(other == mine for other in everyone)


def _inputs(count: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + 17 * rank + count)
    if dtype.is_floating_point:
        return torch.randn(count, generator=generator).to(dtype)
    return torch.randint(-50, 50, (count,), generator=generator).to(dtype)


# ---- the cases ---------------------------------------------------------------------------------------------------

def case_nodes_are_found_by_shared_memory():
    state = shmem.debug_state()
    assert state["nodes"] == [0, 0, 2, 2], state["nodes"]
    assert socket.gethostname() == f"node{os.environ['GROUP_RANK']}", socket.gethostname()
    assert shmem.root_team().spans_nodes
    # The heap of a rank of the other node is not mapped here: /dev/shm holds nothing of the library after init.
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("hpshmem-")], os.listdir("/dev/shm")
    return state["nodes"]


def case_all_reduce_matches_gloo():
    team = shmem.root_team()
    checked = 0
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64):
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and not dtype.is_floating_point:
                continue
            for count in (1, 7, 1000, 70001):
                values = _inputs(count, dtype, RANK)
                ours = values.clone()
                team.all_reduce(ours, op)
                reference = values.clone() if op != "avg" else values.double()
                dist.all_reduce(reference, op={"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
                                               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
                if op == "avg":
                    reference = (reference / WORLD).to(dtype)
                if dtype.is_floating_point and op in ("sum", "avg"):
                    # gloo rounds every partial sum to the dtype; we add in float32 and round once.
                    assert_sums_close(ours, reference, WORLD + 1, f"all_reduce {dtype} {op} {count}")
                else:
                    assert torch.equal(ours, reference), (dtype, op, count)
                assert _same_everywhere(ours), ("not bit-identical", dtype, op, count)
                checked += 1
    return checked


def case_all_reduce_out_of_place_leaves_input():
    team = shmem.root_team()
    values = _inputs(1001, torch.float32, RANK)
    before = values.clone()
    out = torch.empty_like(values)
    team.all_reduce(out, input=values)
    in_place = values.clone()
    team.all_reduce(in_place)
    assert torch.equal(values, before)
    assert torch.equal(out, in_place)
    return True


def case_low_precision_all_reduce():
    team = shmem.root_team()
    results = {}
    for wire in (torch.bfloat16, torch.float8_e4m3fn):
        values = _inputs(5000, torch.float32, RANK)
        ours = values.clone()
        team.all_reduce(ours, "sum", wire=wire)
        exact = values.double()
        dist.all_reduce(exact)
        # Each term is rounded to the wire format once on its node and once across nodes: a relative error of at
        # most twice the format's unit roundoff per term (fp8 blocks scale by a power of two: same bound), summed.
        unit = torch.finfo(wire).eps / 2
        magnitude = torch.stack([_inputs(5000, torch.float32, r).abs().double() for r in range(WORLD)]).sum(0)
        assert ((ours.double() - exact).abs() <= 3 * unit * magnitude * 2 + 1e-6).all(), wire
        assert _same_everywhere(ours), wire
        results[str(wire)] = float((ours.double() - exact).abs().max())
    return results


def case_reduce_scatter_matches_gloo():
    team = shmem.root_team()
    for dtype in (torch.float32, torch.int64):
        for op in ("sum", "max", "min", "avg"):
            if op == "avg" and not dtype.is_floating_point:
                continue
            for chunk in (1, 3, 5000):
                values = _inputs(chunk * WORLD, dtype, RANK)
                out = torch.empty(chunk, dtype=dtype)
                team.reduce_scatter(out, values, op)
                reference = values.double() if op == "avg" else values.clone()
                dist.all_reduce(reference, op={"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
                                               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
                if op == "avg":
                    reference = (reference / WORLD).to(dtype)
                mine = reference[RANK * chunk:(RANK + 1) * chunk]
                if dtype.is_floating_point:
                    assert_sums_close(out, mine, WORLD, f"reduce_scatter {dtype} {op} {chunk}")
                else:
                    assert torch.equal(out, mine), (dtype, op, chunk)
    values = _inputs(4 * WORLD, torch.float32, RANK)
    out = torch.empty(4)
    team.reduce_scatter(out, values, "sum", wire=torch.bfloat16)
    exact = values.double()
    dist.all_reduce(exact)
    assert ((out.double() - exact[RANK * 4:RANK * 4 + 4]).abs() < 0.1).all()
    return True


def case_all_gather_matches_gloo():
    team = shmem.root_team()
    for dtype in (torch.float32, torch.int8, torch.bfloat16):
        for count in (1, 13, 40000):
            values = _inputs(count, dtype, RANK)
            out = torch.empty(count * WORLD, dtype=dtype)
            team.all_gather(out, values)
            reference = [torch.empty_like(values) for _ in range(WORLD)]
            dist.all_gather(reference, values)
            assert torch.equal(out, torch.cat(reference)), (dtype, count)
    # The input may be this rank's own part of the output.
    out = torch.zeros(WORLD * 3, dtype=torch.int64)
    out[RANK * 3:RANK * 3 + 3] = RANK + 1
    team.all_gather(out, out[RANK * 3:RANK * 3 + 3])
    assert out.tolist() == [r + 1 for r in range(WORLD) for _ in range(3)], out.tolist()
    return True


def case_all_to_all_v_matches_reference():
    team = shmem.root_team()
    # Rank s sends (s + d) % 3 + 1 elements to rank d, valued 100 s + d.
    def sent(s: int, d: int) -> torch.Tensor:
        return torch.full(((s + d) % 3 + 1,), 100 * s + d, dtype=torch.float32)
    sends = [sent(RANK, d) for d in range(WORLD)]
    counts = [sent(s, RANK).numel() for s in range(WORLD)]
    receive = torch.empty(sum(counts))
    team.all_to_all(sends, receive, counts)
    expected = torch.cat([sent(s, RANK) for s in range(WORLD)])
    assert torch.equal(receive, expected), (receive.tolist(), expected.tolist())
    # Parts past the 64 KiB that ride in a message's header: they cross nodes as messages of their own.
    def large(s: int, d: int) -> torch.Tensor:
        return torch.arange(20000 + 1000 * ((s + d) % 3), dtype=torch.float32) + 1e5 * s + 1e3 * d
    receive = torch.empty(sum(large(s, RANK).numel() for s in range(WORLD)))
    team.all_to_all([large(RANK, d) for d in range(WORLD)], receive, [large(s, RANK).numel() for s in range(WORLD)])
    assert torch.equal(receive, torch.cat([large(s, RANK) for s in range(WORLD)]))
    # In place: the parts are views of the receive buffer, which fills while they are being sent.
    def block(s: int, d: int) -> torch.Tensor:
        return torch.arange(20000, dtype=torch.float32) + 1e5 * s + 1e3 * d
    buffer = torch.cat([block(RANK, d) for d in range(WORLD)])
    team.all_to_all(list(buffer.split(20000)), buffer, [20000] * WORLD)
    assert torch.equal(buffer, torch.cat([block(s, RANK) for s in range(WORLD)]))
    return counts


def case_all_to_all_counts_that_disagree_across_nodes_raise_on_the_receiver():
    """Rank 0 expects one element more from rank 2 (the other node) than rank 2 sends: rank 0 raises, naming both
    counts, once every part is in; the others receive theirs, and the team stays usable."""
    team = shmem.root_team()
    sends = [torch.full((2,), float(10 * RANK + d)) for d in range(WORLD)]
    counts = [3 if RANK == 0 and s == 2 else 2 for s in range(WORLD)]
    receive = torch.empty(sum(counts))
    raised = ""
    try:
        team.all_to_all(sends, receive, counts)
    except shmem.ShmemMismatchError as error:
        raised = str(error)
    if RANK == 0:
        assert "ranks disagree on an all_to_all's counts: rank=0 expects 3 elements from rank=2, which sends 2" in \
            raised, raised
    else:
        assert raised == "", raised
        assert torch.equal(receive, torch.cat([torch.full((2,), float(10 * s + RANK)) for s in range(WORLD)]))
    _still_usable(team)
    return raised


def case_barrier_orders_every_rank():
    team = shmem.root_team()
    marker = torch.tensor([RANK + 1])
    arrived = [None] * WORLD
    for _ in range(3):
        team.barrier()
    shmem.barrier()
    dist.all_gather_object(arrived, int(marker))
    return arrived == [r + 1 for r in range(WORLD)]


def case_root_barrier_waits_for_a_late_rank_of_another_node():
    """The last rank comes 0.3 s late and, with UCX, first writes its rank into every other rank's symmetric word
    (each put complete when it returns): no rank leaves the root barrier before it came, and every write is there
    after it, over the runtime's transport or the root ProcessGroup alike."""
    word = shmem.empty(1, dtype=torch.int64)
    word.zero_()
    shmem.barrier()
    remote = _transport_to_other_node() == "ucx"
    if RANK == WORLD - 1:
        time.sleep(0.3)
        if remote:
            for pe in range(WORLD - 1):
                shmem.put(word, torch.tensor([WORLD - 1]), pe=pe)
    start = time.monotonic()
    shmem.barrier()
    waited = time.monotonic() - start
    seen = int(word)
    shmem.barrier()
    shmem.free(word)
    if RANK != WORLD - 1:
        assert waited > 0.2, waited
        assert seen == (WORLD - 1 if remote else 0), seen
    return True


def case_send_recv_within_and_across_nodes():
    team = shmem.root_team()
    pairs = [(0, 1), (0, 3), (3, 0), (2, 1)]  # node-local, and across nodes both ways
    for src, dst in pairs:
        if RANK == src:
            team.send(torch.arange(5, dtype=torch.float64) + 10 * src + dst, dst)
        elif RANK == dst:
            got = torch.empty(5, dtype=torch.float64)
            team.recv(got, src)
            assert torch.equal(got, torch.arange(5, dtype=torch.float64) + 10 * src + dst), got
    dist.barrier()
    message = ""
    if RANK == 0:
        team.send(torch.zeros(4), 2)
    elif RANK == 2:
        try:
            team.recv(torch.zeros(3), 0)
        except ValueError as error:
            message = str(error)
        assert "`tensor` must have the message's size (16 bytes from rank 0), but got 12 bytes" in message, message
    return message


def _group_cases(groups: dict) -> dict:
    seen = {}
    for name, ranks in groups.items():
        group = dist.new_group(ranks)
        if RANK not in ranks:
            continue
        team = shmem.Team(group)
        me = ranks.index(RANK)
        values = _inputs(9, torch.float32, RANK)
        ours = values.clone()
        team.all_reduce(ours)
        reference = values.clone()
        dist.all_reduce(reference, group=group)
        assert_sums_close(ours, reference, len(ranks), f"group {name}")
        out = torch.empty(2 * len(ranks), dtype=torch.int64)
        team.all_gather(out, torch.tensor([RANK, me]))
        assert out.tolist() == [v for g, r in enumerate(ranks) for v in (r, g)], (name, out.tolist())
        seen[name] = team.spans_nodes
    return seen


def case_groups_spanning_and_within_nodes():
    # Overlapping groups: two within a node, two across nodes (one in an order that interleaves them).
    return _group_cases({"node0": [0, 1], "node1": [2, 3], "across_a": [1, 2], "across_b": [0, 3]})


def case_group_with_unequal_nodes_is_refused():
    group = dist.new_group([0, 1, 2])
    if RANK == 3:
        return "not a member"
    try:
        shmem.Team(group)
    except ValueError as error:
        assert "`group` must have the same number of ranks on every node it spans, but got" in str(error), error
        return str(error)
    raise AssertionError("a group with 2 ranks on one node and 1 on the other made a team")


def _transport_to_other_node() -> str:
    """What carries this rank's one-sided calls to its lane peer on the other node: "ucx" or "none"."""
    return shmem.debug_state()["transports"][(RANK + 2) % WORLD]


def case_one_sided_calls_across_nodes_name_both_nodes():
    """Without a transport to other nodes every one-sided call there is refused, naming both nodes, the reason and the
    remedy; with UCX, put, get and signal go through and only in-place peer access is refused."""
    buf = shmem.empty(8, dtype=torch.float32)
    flag = shmem.empty(1, dtype=torch.int64)
    user_buf = symm.empty(8, dtype=torch.float32)
    other = (RANK + 2) % WORLD
    remote = _transport_to_other_node()
    reaching = (lambda: shmem.put(buf, torch.ones(8), pe=other),
                lambda: shmem.get(torch.empty(8), buf, pe=other),
                lambda: shmem.signal(flag, 1, other),
                lambda: symm.shmem_put(user_buf, 0, torch.ones(8), 0, 8, other))
    refused = [lambda: shmem.peer_tensor(buf, other)]
    if remote == "ucx":
        for call in reaching:
            call()
        shmem.barrier()  # each completed before it returned: after the barrier no write of theirs is still coming
    else:
        assert remote == "none", remote
        refused.extend(reaching)
    messages = []
    for call in refused:
        try:
            call()
        except shmem.ShmemStateError as error:
            text = str(error)
            assert f"pe={other} pe_node={NODE_OF[other]} rank={RANK} node={NODE_OF[RANK]}" in text, text
            if remote == "none":
                assert "one-sided calls of the host device reach the ranks of this rank's node only" in text, text
                assert "pip install hyper-parallel-shmem[ucx]" in text, text
            else:
                assert "in-place peer access and reductions need mapped memory" in text, text
            messages.append(text)
        else:
            raise AssertionError("a one-sided call to another node went through")
    # A PE on this node is reached as before.
    local = RANK ^ 1
    shmem.put(buf, torch.full((8,), float(RANK)), pe=local)
    shmem.barrier()
    assert torch.equal(buf, torch.full((8,), float(local)))
    shmem.barrier()
    shmem.free(flag)
    shmem.free(buf)
    symm.free(user_buf)
    return messages[-1]


def case_one_sided_transfers_across_nodes():
    """Put, get, signal set and add (64- and 32-bit), put_with_signal and wait_for_signal between the two nodes,
    through UCX, against values computed here; a wait on a signal the other node raises wakes promptly."""
    remote = _transport_to_other_node()
    if remote != "ucx":
        return remote  # test_multinode.py checks that this matches whether UCX is installed
    other = (RANK + 2) % WORLD
    count = 1000
    buf = shmem.empty(count, dtype=torch.float32)
    buf.zero_()
    flag64 = shmem.empty(1, dtype=torch.int64)
    flag32 = shmem.empty(1, dtype=torch.int32)
    flag64.zero_()
    flag32.zero_()
    shmem.barrier()
    mine = torch.arange(count, dtype=torch.float32) + 1000 * RANK
    shmem.put(buf, mine, pe=other)
    shmem.put(buf[10:20], mine[:10] * -1, pe=other)  # a view: its offset inside the heap
    shmem.barrier()
    expected = torch.arange(count, dtype=torch.float32) + 1000 * other
    expected[10:20] = expected[:10] * -1
    assert torch.equal(buf, expected), (buf[:24], expected[:24])
    got = torch.empty(count, dtype=torch.float32)
    shmem.get(got, buf, pe=other)  # other's copy holds what this rank wrote
    reference = mine.clone()
    reference[10:20] = mine[:10] * -1
    assert torch.equal(got, reference), got[:24]
    # Signals: set, then add, from the other node; this rank waits for its peer's to land.
    shmem.signal(flag64, 5, other, op="set")
    shmem.signal(flag64, RANK + 1, other, op="add")
    shmem.signal(flag32, -7, other, op="add")
    shmem.signal(flag32, -7, other, op="add")
    shmem.wait_signal(flag64, 5 + other + 1, cmp="eq")
    shmem.wait_signal(flag32, -14, cmp="eq")
    shmem.barrier()
    # put_with_signal through the symm API, 256 B and 1 MiB: the data is there when the signal is.
    rows = symm.empty((WORLD, 64), dtype=torch.float32)
    big = symm.empty(1 << 18, dtype=torch.float32)
    sig = symm.empty(4, dtype=torch.int32)
    sig.zero_()
    symm.barrier()
    row = torch.arange(64, dtype=torch.float32) * (RANK + 1)
    payload = torch.randn(1 << 18, generator=torch.Generator().manual_seed(RANK))
    symm.shmem_put_with_signal(rows, RANK * 64, row, 0, 64, sig, 0, 1, 1, other)  # ADD 1
    symm.shmem_put_with_signal(big, 0, payload, 0, 1 << 18, sig, 1, 9, 0, other)  # SET 9
    symm.shmem_wait_for_signal(rows, sig, 0, 1, 0)  # EQ 1
    symm.shmem_wait_for_signal(big, sig, 1, 9, 0)
    assert torch.equal(rows[other], torch.arange(64, dtype=torch.float32) * (other + 1)), rows[other]
    assert torch.equal(big, torch.randn(1 << 18, generator=torch.Generator().manual_seed(other)))
    # Ping-pong between the lane peers: each wait is woken by the transport's progress thread, not by the futex
    # sleep's slice running out.
    rounds = 20
    sig.zero_()
    symm.barrier()
    start = time.monotonic()
    for i in range(1, rounds + 1):
        if NODE_OF[RANK] == 0:
            symm.shmem_signal_op(sig, 2, i, 0, other)
            symm.shmem_wait_for_signal(None, sig, 3, i, 0)
        else:
            symm.shmem_wait_for_signal(None, sig, 2, i, 0)
            symm.shmem_signal_op(sig, 3, i, 0, other)
    per_round = (time.monotonic() - start) / rounds
    assert per_round < 0.025, per_round
    symm.barrier()
    for tensor in (rows, big, sig):
        symm.free(tensor)
    for tensor in (flag32, flag64, buf):
        shmem.free(tensor)
    return remote


def _refused_across_nodes(call) -> str:
    """Runs ``call`` (one-sided, to a PE of the other node) where no transport reaches it: the project's refusal."""
    try:
        call()
    except shmem.ShmemStateError as error:
        text = str(error)
        assert "one-sided calls of the host device reach the ranks of this rank's node only" in text, text
        return text
    raise AssertionError("a one-sided call to another node went through without a transport")


# The seed's examples (examples/symm_producer_consumer.py, symm_push.py, symm_pull.py) run their whole script at import,
# shutdown included: these cases make the same calls, with the producer and the consumer on different nodes.

def case_example_producer_consumer_across_nodes():
    """The user API's first example with the producer (rank 0, node 0) and the consumer (rank 2, node 1): the
    consumer's buffer holds the producer's halves once the signal is set."""
    producer, consumer = 0, 2
    assert NODE_OF[producer] != NODE_OF[consumer]
    remote = _transport_to_other_node()
    data_buf = symm.empty(4096, dtype=torch.float16)
    signal = symm.empty(1, dtype=torch.int32)
    signal.zero_()
    data_buf.fill_(-1.0)  # not in the example: what a refused put leaves
    dist.barrier()
    # The example draws unseeded: seeded here so that the consumer knows what the producer sent.
    local_data = torch.randn(4096, dtype=torch.float16, generator=torch.Generator().manual_seed(31))
    produce = lambda: symm.shmem_put_with_signal(  # noqa: E731
        target=data_buf,
        target_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        src=local_data,
        src_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        size=torch.tensor([4096], dtype=torch.int64, device='cpu'),
        signal=signal,
        signal_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        signal_value=torch.tensor([1], dtype=torch.int32, device='cpu'),
        signal_op=0,    # SET
        target_rank=consumer
    )
    result = None
    if RANK == producer:
        if remote == "ucx":
            produce()
        else:
            _refused_across_nodes(produce)
    elif RANK == consumer and remote == "ucx":
        symm.shmem_wait_for_signal(
            depend_tensor=data_buf,
            signal=signal,
            signal_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
            compare_value=torch.tensor([1], dtype=torch.int32, device='cpu'),
            compare_op=0    # EQ
        )
        result = data_buf.sum()  # the data has arrived
    dist.barrier()
    received, raised = data_buf.clone(), int(signal)
    # Checked once every rank is past the collective calls: a failed check fails this case only.
    symm.free(data_buf)
    symm.free(signal)
    if result is not None:
        assert torch.equal(received, local_data), (received[:8], local_data[:8])
        assert torch.equal(result, local_data.sum()), (result, local_data.sum())
        assert raised == 1, raised
    else:  # nobody else's buffer or signal changed
        assert torch.equal(received, torch.full((4096,), -1.0, dtype=torch.float16)), received[:8]
        assert raised == 0, raised
    return remote if result is None else float(result)


def case_example_push_across_nodes():
    """Push mode: every rank writes its row into every rank of both nodes and raises their signal (ADD 1)."""
    remote = _transport_to_other_node()
    ADD, GE = 1, 4
    assert WORLD == 4  # the example's GE threshold counts every rank of this job
    row = torch.full((1024,), float(RANK))
    rows = symm.empty((WORLD, 1024), dtype=torch.float32)     # the receivers' buffer
    arrived = symm.empty(1, dtype=torch.int64)
    arrived.zero_()
    rows.fill_(-1.0)  # not in the example: what a refused put leaves
    symm.barrier()
    if remote != "ucx":
        other = (RANK + 2) % WORLD
        _refused_across_nodes(lambda: symm.shmem_put_with_signal(rows, RANK * 1024, row, 0, 1024, arrived, 0, 1, ADD,
                                                                 target_rank=other))
        expected, expected_count = torch.full((WORLD, 1024), -1.0), 0
    else:
        for peer in range(WORLD):   # write into the peer, then signal it: the data is visible before the signal
            symm.shmem_put_with_signal(rows, RANK * 1024, row, 0, 1024, arrived, 0, 1, ADD, target_rank=peer)
        symm.shmem_wait_for_signal(rows, arrived, 0, WORLD, GE)
        expected, expected_count = torch.arange(WORLD, dtype=torch.float32)[:, None].expand(WORLD, 1024), WORLD
    symm.barrier()   # nobody writes into `rows` any more
    received, count = rows.clone(), int(arrived)
    symm.free(rows)
    symm.free(arrived)
    assert torch.equal(received, expected), received[:, 0]
    assert count == expected_count, count
    return remote


def case_example_pull_across_nodes():
    """Pull mode: every rank stages its row, announces it to every rank of both nodes, then reads every rank's row."""
    remote = _transport_to_other_node()
    ADD, GE = 1, 4
    assert WORLD == 4  # the example's GE threshold counts every rank of this job
    staged = symm.empty(1024, dtype=torch.float32)             # the senders' buffer
    ready = symm.empty(1, dtype=torch.int64)
    ready.zero_()
    symm.barrier()
    staged.fill_(float(RANK))
    pulled = torch.full((WORLD, 1024), -1.0)
    if remote != "ucx":
        other = (RANK + 2) % WORLD
        _refused_across_nodes(lambda: symm.shmem_signal_op(ready, 0, 1, ADD, target_rank=other))
        _refused_across_nodes(lambda: symm.shmem_get(pulled[other], 0, staged, 0, 1024, target_rank=other))
        expected, expected_count = torch.full((WORLD, 1024), -1.0), 0
    else:
        for peer in range(WORLD):   # announce: my row is staged
            symm.shmem_signal_op(ready, 0, 1, ADD, target_rank=peer)
        symm.shmem_wait_for_signal(staged, ready, 0, WORLD, GE)
        for peer in reversed(range(WORLD)):   # any order the consumer likes
            symm.shmem_get(pulled[peer], 0, staged, 0, 1024, target_rank=peer)
        expected, expected_count = torch.arange(WORLD, dtype=torch.float32)[:, None].expand(WORLD, 1024), WORLD
    symm.barrier()   # nobody reads `staged` any more
    count = int(ready)
    symm.free(staged)
    symm.free(ready)
    assert torch.equal(pulled, expected), pulled[:, 0]
    assert count == expected_count, count
    return remote


_SWEEP_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int32, torch.int64)
_SWEEP_ELEMENTS = 1 << 15  # up to 256 KiB a transfer: past UCX's eager sizes
_SWEEP_OPS = ("shmem.put", "shmem.get", "symm.shmem_put", "symm.shmem_get")


def _draw_transfers(count: int) -> list:
    """``count`` one-sided transfers: (op, dtype index, heap offset, local offset, size, initiator, peer on the other
    node). Hypothesis (derandomized) draws the windows and the peer; the op and the initiator take every value in turn
    (hypothesis' draws lean to a few of them)."""
    @st.composite
    def window(draw):
        size = draw(st.one_of(st.integers(1, 64), st.integers(1, _SWEEP_ELEMENTS)))
        return (draw(st.sampled_from(range(len(_SWEEP_DTYPES)))), draw(st.integers(0, _SWEEP_ELEMENTS - size)),
                draw(st.integers(0, _SWEEP_ELEMENTS - size)), size, draw(st.sampled_from(range(WORLD // 2))))

    drawn = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(window())
    def collect(one) -> None:
        drawn.append(one)

    collect()
    transfers = []
    for i, (dtype_index, at, local_at, size, which_peer) in enumerate(drawn):
        initiator = (i // len(_SWEEP_OPS)) % WORLD
        peers = [r for r in range(WORLD) if NODE_OF[r] != NODE_OF[initiator]]
        transfers.append((_SWEEP_OPS[i % len(_SWEEP_OPS)], dtype_index, at, local_at, size, initiator,
                          peers[which_peer % len(peers)]))
    return transfers


def _sweep_values(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers: exact in every dtype of the sweep, int8 included."""
    return torch.randint(-100, 100, (_SWEEP_ELEMENTS,), generator=torch.Generator().manual_seed(seed)).to(dtype)


def case_one_sided_offsets_and_sizes_across_nodes():
    """Put and get of random (offset, size, dtype) windows of a heap tensor between a rank and a rank of the other
    node, through both APIs: the addressed bytes and nothing else change, on both sides (refused where no transport
    reaches the other node, and then nothing changes). Rank 0 draws the transfers; every rank runs them all."""
    remote = _transport_to_other_node()
    transfers = [_draw_transfers(40) if RANK == 0 else None]
    dist.broadcast_object_list(transfers, src=0)
    heaps = [symm.empty(_SWEEP_ELEMENTS, dtype=dtype) for dtype in _SWEEP_DTYPES]
    outcomes = {"done": 0, "refused": 0}
    wrong = []
    for i, (op, dtype_index, at, local_at, size, initiator, peer) in enumerate(transfers[0]):
        dtype = _SWEEP_DTYPES[dtype_index]
        heap = heaps[dtype_index]
        heap.copy_(_sweep_values(100 * i + RANK, dtype))
        local = _sweep_values(100 * i + WORLD + RANK, dtype)
        shmem.barrier()
        done = remote == "ucx"
        if RANK == initiator:
            window, local_window = heap[at:at + size], local[local_at:local_at + size]
            call = {"shmem.put": lambda: shmem.put(window, local_window, pe=peer),
                    "shmem.get": lambda: shmem.get(local_window, window, pe=peer),
                    "symm.shmem_put": lambda: symm.shmem_put(heap, at, local, local_at, size, peer),
                    "symm.shmem_get": lambda: symm.shmem_get(local, local_at, heap, at, size, peer)}[op]
            if done:
                call()
            else:
                _refused_across_nodes(call)
            outcomes["done" if done else "refused"] += 1
        shmem.barrier()  # each transfer completed before it returned
        expected_heap = _sweep_values(100 * i + RANK, dtype)
        expected_local = _sweep_values(100 * i + WORLD + RANK, dtype)
        if done and op.endswith("put") and RANK == peer:
            expected_heap[at:at + size] = _sweep_values(100 * i + WORLD + initiator, dtype)[local_at:local_at + size]
        if done and op.endswith("get") and RANK == initiator:
            expected_local[local_at:local_at + size] = _sweep_values(100 * i + peer, dtype)[at:at + size]
        for name, seen, expected in (("heap", heap, expected_heap), ("local", local, expected_local)):
            if not torch.equal(seen, expected):
                differ = (seen != expected).nonzero().reshape(-1)
                wrong.append(f"example {i} {op} {dtype} at={at} local_at={local_at} size={size} "
                             f"{initiator}->{peer}: rank {RANK}'s {name} differs at {differ[:4].tolist()} "
                             f"({differ.numel()} elements)")
    shmem.barrier()
    for heap in heaps:
        symm.free(heap)
    assert not wrong, wrong[:5]
    assert len(transfers[0]) >= 30, len(transfers[0])
    return outcomes


def case_symmetric_memory_collectives_across_nodes():
    x = symm.empty(6, dtype=torch.float32)
    x.copy_(torch.arange(6, dtype=torch.float32) + RANK)
    reduced = symm.shmem_allreduce(x)
    assert torch.equal(reduced, torch.arange(6, dtype=torch.float32) * WORLD + sum(range(WORLD))), reduced
    gathered = symm.shmem_allgather(torch.empty(WORLD * 2), torch.full((2,), float(RANK)))
    assert gathered.tolist() == [float(r) for r in range(WORLD) for _ in range(2)], gathered
    low = symm.shmem_allreduce(torch.full((64,), 1.5), low_precision_dtype=torch.bfloat16)
    assert torch.equal(low, torch.full((64,), 1.5 * WORLD)), low
    group = dist.new_group([1, 2])
    if RANK in (1, 2):
        t = symm.shmem_allreduce(torch.full((3,), float(RANK)), group=group)
        assert torch.equal(t, torch.full((3,), 3.0)), t
    symm.free(x)
    return True


def case_fused_ops_across_nodes():
    a = _inputs(2 * 3, torch.float32, RANK).reshape(2, 3)
    b = _inputs(3 * 4, torch.float32, 99).reshape(3, 4)
    gather_out = symm.empty((2 * WORLD, 3), dtype=torch.float32)
    sig = symm.empty(WORLD, dtype=torch.int64)
    c = torch.empty(2 * WORLD, 4)
    symm.fused_all_gather_matmul(a, b, c, gather_out, sig)
    every_a = torch.cat([_inputs(6, torch.float32, r).reshape(2, 3) for r in range(WORLD)])
    assert torch.equal(gather_out, every_a)
    torch.testing.assert_close(c, every_a @ b)
    x1 = _inputs(WORLD * 2 * 3, torch.float32, RANK).reshape(WORLD * 2, 3)
    scratch = symm.empty(WORLD * 2 * 4, dtype=torch.float32)
    reduced = symm.fused_matmul_reduce_scatter(x1, b, scratch, sig)
    total = sum(_inputs(WORLD * 6, torch.float32, r).reshape(WORLD * 2, 3) @ b for r in range(WORLD))
    assert_sums_close(reduced, total[RANK * 2:RANK * 2 + 2], WORLD + 3, "fused_matmul_reduce_scatter")
    for t in (gather_out, sig, scratch):
        symm.free(t)
    return True


def case_mismatch_across_nodes_raises_everywhere():
    team = shmem.root_team()
    count = 8 if NODE_OF[RANK] == 0 else 16
    try:
        team.all_reduce(torch.ones(count))
    except shmem.ShmemMismatchError as error:
        text = str(error)
        assert "ranks disagree on a collective across nodes" in text, text
    else:
        raise AssertionError("a mismatch across nodes went through")
    _still_usable(team)
    return text


def _still_usable(team) -> None:
    t = torch.ones(4)
    team.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(WORLD)))


def case_mismatch_within_a_node_reaches_the_other_node():
    team = shmem.root_team()
    try:
        if RANK == 1:
            team.all_gather(torch.empty(4 * WORLD), torch.ones(4))
        else:
            team.all_reduce(torch.ones(4))
    except shmem.ShmemMismatchError as error:
        text = str(error)
    else:
        raise AssertionError("a mismatch within node 0 went through")
    _still_usable(team)
    return text


def case_allocation_mismatch_across_nodes_changes_nothing():
    before = len(shmem.debug_state()["active_allocations"])
    try:
        shmem.empty(16 if NODE_OF[RANK] == 0 else 32, dtype=torch.float32)
    except shmem.ShmemMismatchError as error:
        text = str(error)
        assert "ranks disagree on a symmetric allocation across nodes" in text, text
    else:
        raise AssertionError("an allocation that differs across nodes went through")
    assert len(shmem.debug_state()["active_allocations"]) == before
    t = shmem.empty(16, dtype=torch.float32)  # allocation still works, at the same offset everywhere
    shmem.free(t)
    return text


def case_bad_inputs_on_a_spanning_team_raise_and_move_nothing():
    team = shmem.root_team()
    seen = []
    # Every rank passes the same bad input: each node's lowest rank is the one its node team names, and the message
    # names the whole team (every rank of the job), then this node's members.
    node = [r for r in range(WORLD) if NODE_OF[r] == NODE_OF[RANK]]
    whole = (f"team_ranks=[{','.join(map(str, range(WORLD)))}] "
             f"node_team_ranks=[{','.join(map(str, node))}]")

    def by_the_team(op):
        return f" (refused by rank {node[0]}: op={op} {whole}; every member fails this call)"

    def refused(exc, call, *fragments):
        try:
            call()
        except exc as error:
            text = str(error)
            assert all(f in text for f in fragments), (fragments, text)
            seen.append(text)
        else:
            raise AssertionError(f"accepted: {fragments}")

    refused(ValueError, lambda: team.all_reduce(torch.ones(4), input=torch.ones(5)),
            "`input` must have the dtype and size of `tensor` (float32, 4), but got float32, 5",
            by_the_team("all_reduce"))
    refused(ValueError, lambda: team.all_reduce(torch.ones(4, dtype=torch.int32), "avg"),
            "`op` must be sum, max or min for int32, but got avg" + by_the_team("all_reduce"))
    refused(ValueError, lambda: team.reduce_scatter(torch.empty(2), torch.ones(7)),
            f"`input` must hold {WORLD} x output's 2 elements of float32, but got 7 of float32"
            + by_the_team("reduce_scatter"))
    refused(ValueError, lambda: team.all_gather(torch.empty(3), torch.ones(1)),
            f"`output` must hold {WORLD} x input's 4 bytes, but got 12 bytes" + by_the_team("all_gather"))
    refused(ValueError, lambda: team.all_to_all([torch.ones(1)] * (WORLD - 1), torch.empty(WORLD), [1] * WORLD),
            f"`sends` and `receive_counts` must have one entry per member ({WORLD}), but got {WORLD - 1} and {WORLD}"
            + by_the_team("all_to_all"))
    refused(ValueError, lambda: team.all_to_all([torch.ones(1)] * WORLD, torch.empty(WORLD), [2] * WORLD),
            f"`receive_counts` must be non-negative and sum to receive's {WORLD} elements, but got",
            by_the_team("all_to_all"))
    refused(ValueError, lambda: team.all_reduce(torch.ones(4, 2).t()), "`tensor` must be a contiguous CPU tensor",
            by_the_team("all_reduce"))
    refused(TypeError, lambda: team.all_gather([1.0], torch.ones(1)),
            "`output` must be a torch.Tensor, but got list" + by_the_team("all_gather"))
    refused(ValueError, lambda: team.send(torch.ones(1), RANK), "`peer` must be another group rank in [0, 4)")
    # MoE's exchange on the spanning team checks its own arguments in the phases across nodes (the user API checks
    # them before; the runtime face's Team does not).
    splits = torch.zeros(WORLD, dtype=torch.int64)
    table = torch.zeros(2, WORLD, dtype=torch.int64)
    refused(ValueError, lambda: team.moe_exchange("dispatch", torch.ones(4, 2), torch.ones(4, 3), splits, None, table,
                                                  1),
            "`output` must have the dtype and row size of `input` (rows along dim 0), but got input float32 (4 rows "
            "of 8 bytes) and output float32 (4 rows of 12 bytes)" + by_the_team("moe_dispatch"))
    refused(ValueError, lambda: team.moe_exchange("dispatch", torch.ones(4, 2), torch.ones(4, 2), splits[:3], None,
                                                  table, 1),
            f"`in_splits` must be {WORLD} int64 values (group size x experts), but got 3 int64 values"
            + by_the_team("moe_dispatch"))
    # The runtime's own teams are node-local: a direct call with a rank of the other node is refused before any
    # exchange (the library's teams never ask it).
    other = (RANK + 2) % WORLD
    refused(ValueError, lambda: C.team_create(sorted((RANK, other)), sorted((RANK, other)).index(RANK),
                                              lambda payload: payload, lambda: None),
            "`pes` must lie on this rank's node (host device: a team's members map each other's heaps), but got")
    # The exchange across nodes (what the teams' phase across nodes runs on) refuses a whole batch before sending
    # anything: a PE of this node (beside one of the other node), an argument that is not a tensor, an entry that is not a triple,
    # and (where UCX reaches the other node) a tag too wide.
    byte = torch.ones(1, dtype=torch.uint8)
    refused(shmem.ShmemStateError, lambda: C.exchange_messages(1, [(RANK ^ 1, byte, None), (other, byte, None)]),
            f"`pe` must lie on another node and be reached by a remote transport, but got pe={RANK ^ 1} "
            f"(op=exchange_messages transport=")
    refused(TypeError, lambda: C.exchange_messages(1, [(other, "bytes", None)]),
            "`send` must be a torch.Tensor, but got str")
    refused(ValueError, lambda: C.exchange_messages(1, [(other, byte)]),
            "`exchanges` must hold (pe, send, receive) triples, but entry 0 has 2 items")
    if _transport_to_other_node() == "ucx":
        refused(ValueError, lambda: C.exchange_messages(1 << 40, [(other, byte, None)]),
                "`tag` must be below 2^40, but got 1099511627776")
    _still_usable(team)
    return seen


def case_moe_dispatch_and_combine_across_nodes():
    """The user API's MoE cases, written once for both frameworks (tests/shared/symm_api_cases.py), here over the
    world and over sub-groups that span both nodes (evens {0, 2}, odds {1, 3}): dispatch lays every token out where
    torch's all_to_all_vdev_2d would, into ordinary and symmetric outputs, combine brings every one back, an output
    one row short fails every rank alike with nothing written, and low-precision rows cross the nodes."""
    fw = TorchFramework()
    for name in ("moe_dispatch_and_combine", "moe_receive_buffer_too_small", "moe_low_precision"):
        symm_api_cases.run(fw, name)
    return shmem.root_team().link_across_nodes


CASES = [value for name, value in list(globals().items()) if name.startswith("case_")]


def _run_cases(out_dir: str) -> None:
    results = {}
    with shmem.acquire_shmem():
        for case in CASES:
            print(f"rank {RANK}: {case.__name__}", file=sys.stderr, flush=True)  # in the job's output on a hang
            try:
                results[case.__name__] = {"ok": True, "value": repr(case())}
            except Exception:
                results[case.__name__] = {"ok": False, "value": traceback.format_exc()}
            dist.barrier()
    with open(os.path.join(out_dir, f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)


def _any_shape(out_dir: str) -> None:
    """Every collective of the root team, a group of every other rank, and send/recv across the job, on any number of
    nodes and ranks per node; each rank records what differed from the reference ("" when nothing did)."""
    wrong = []
    with shmem.acquire_shmem():
        team = shmem.root_team()
        for count in (1, 5, 100003):
            for dtype in (torch.float32, torch.int64):
                t = (torch.arange(count) * (RANK + 1)).to(dtype)
                reference = t.clone()
                dist.all_reduce(reference)
                team.all_reduce(t)
                if not torch.equal(t, reference):
                    wrong.append(f"all_reduce {dtype} {count}")
        out = torch.empty(WORLD * 7)
        team.all_gather(out, torch.full((7,), float(RANK)))
        if out.tolist() != [float(r) for r in range(WORLD) for _ in range(7)]:
            wrong.append("all_gather")
        part = torch.empty(3)
        team.reduce_scatter(part, torch.arange(3 * WORLD, dtype=torch.float32))
        if not torch.equal(part, torch.arange(3 * WORLD, dtype=torch.float32)[3 * RANK:3 * RANK + 3] * WORLD):
            wrong.append("reduce_scatter")
        sends = [torch.full(((RANK + d) % 3 + 1,), 100.0 * RANK + d) for d in range(WORLD)]
        counts = [(s + RANK) % 3 + 1 for s in range(WORLD)]
        receive = torch.empty(sum(counts))
        team.all_to_all(sends, receive, counts)
        if not torch.equal(receive, torch.cat([torch.full((c,), 100.0 * s + RANK) for s, c in enumerate(counts)])):
            wrong.append("all_to_all")
        team.barrier()
        every_other = dist.new_group(list(range(0, WORLD, 2)))  # one rank in two of every node: spans every node
        if RANK % 2 == 0:
            x = torch.ones(3)
            shmem.Team(every_other).all_reduce(x)
            if not torch.equal(x, torch.full((3,), WORLD / 2)):
                wrong.append("every_other")
        if RANK == 0:
            team.send(torch.arange(4.0), WORLD - 1)
        if RANK == WORLD - 1:
            y = torch.empty(4)
            team.recv(y, 0)
            if not torch.equal(y, torch.arange(4.0)):
                wrong.append("send_recv")
        link = team.link_across_nodes
        shmem.barrier()
    with open(os.path.join(out_dir, f"rank{RANK}.json"), "w") as f:
        json.dump({"wrong": wrong, "link": link}, f)


def _node_death(out_dir: str) -> None:
    """Node 1 dies (the test kills it) while node 0 carries on: node 0's calls fail in time, naming node 1's ranks."""
    handle = shmem.acquire_shmem()
    team = shmem.root_team()
    flag = shmem.empty(1, dtype=torch.int64)
    flag.zero_()
    t = torch.ones(8)
    team.all_reduce(t)  # after it, every rank's flag is zero
    if NODE_OF[RANK] != 0:
        open(os.path.join(out_dir, f"ready{RANK}"), "w").close()
        time.sleep(600)  # killed with its node
    record = {}
    if _transport_to_other_node() == "ucx":
        # First a wait for a signal that the lane peer on node 1 was to raise: node 1 dies during it (the test kills
        # it once this rank announced the wait), and the wait fails at once, naming the lost ranks, not at the timeout.
        open(os.path.join(out_dir, f"waiting{RANK}"), "w").close()
        try:
            shmem.wait_signal(flag, 1, cmp="eq")
            record["wait_signal"] = {"raised": "", "ended": time.time()}
        except Exception as error:  # what the test checks
            record["wait_signal"] = {"raised": f"{type(error).__name__}: {error}", "ended": time.time()}
        # Then a put to the lane peer, lost too (or its connection found broken by the put itself).
        start = time.monotonic()
        try:
            shmem.put(flag, torch.ones(1, dtype=torch.int64), pe=(RANK + 2) % WORLD)
            record["put"] = {"raised": "", "seconds": time.monotonic() - start}
        except Exception as error:  # what the test checks
            record["put"] = {"raised": f"{type(error).__name__}: {error}", "seconds": time.monotonic() - start}
        record["transports"] = list(shmem.debug_state()["transports"])
    while not os.path.exists(os.path.join(out_dir, "node1_killed")):
        time.sleep(0.05)
    # The all_to_all first: its cross-node phase runs on one member of each node while the other waits in the node's
    # sync; both must fail at once, naming a rank of the dead node. The team is broken after it; the root barrier
    # (its own step across nodes) then names the dead ranks.
    sends = [torch.full((2,), float(RANK)) for _ in range(WORLD)]
    for name, call in (("all_to_all", lambda: team.all_to_all(sends, torch.empty(2 * WORLD), [2] * WORLD)),
                       ("all_reduce", lambda: team.all_reduce(torch.ones(8))),
                       ("barrier", lambda: shmem.barrier())):
        start = time.monotonic()
        try:
            call()
            record[name] = {"raised": "", "seconds": time.monotonic() - start}
        except Exception as error:  # what the test checks
            record[name] = {"raised": f"{type(error).__name__}: {error}", "seconds": time.monotonic() - start}
    record["dev_shm"] = [name for name in os.listdir("/dev/shm") if name.startswith("hpshmem-")]
    partial = os.path.join(out_dir, f".rank{RANK}.json")
    with open(partial, "w") as f:
        json.dump(record, f)
    os.replace(partial, os.path.join(out_dir, f"rank{RANK}.json"))  # whole when it appears
    del handle
    os._exit(0)  # the job is broken: no collective shutdown


def main() -> None:
    global RANK, WORLD
    mode, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    NODE_OF.update({r: r // per_node * per_node for r in range(WORLD)})
    if mode == "cases":
        _run_cases(out_dir)
        dist.destroy_process_group()
    elif mode == "any_shape":
        _any_shape(out_dir)
        dist.destroy_process_group()
    else:
        _node_death(out_dir)


if __name__ == "__main__":
    main()
