"""MindSpore's one-sided calls across nodes, on nodes simulated on this machine (tests/st/simulated_nodes.py).

One msrun job of 2 nodes x 2 ranks runs every case of ms_multinode_worker.py: put, get, signal SET and ADD,
put_with_signal (the data there when the signal is), wait_for_signal woken by the other node, barriers over groups
that span nodes, seed 000's example 1 and its push and pull modes with the producer and the consumer on different
nodes, bad inputs across nodes (refused, nothing written), allocations and frees that differ between the nodes, every
collective and send/recv over a group that spans nodes (the phases of core/multicore/hierarchy.py over the C ABI),
calls that disagree across nodes (every rank raises), the user API's MoE cases over groups that span nodes, and
rendezvous over such a group (refused). Each rank of another
node is reached through the runtime's UCX transport, over TCP on loopback (the simulated nodes share one kernel: UCX's shared-memory transports would find no peer). A second job of
2 nodes x 1 rank runs the seed's example script itself (examples/mindspore_producer_consumer.py, unchanged): its
producer, rank 0, and its consumer, rank 1, are then on different nodes.

Everything skips, with the probe's reason, only where this machine refuses the namespaces; a package built without
UCX fails here (`make mindspore-env` installs UCX's wheel before it builds the package).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_ST = os.path.join(os.path.dirname(_HERE), "st")
if _ST not in sys.path:
    sys.path.insert(0, _ST)

from simulated_nodes import SimulatedJob, unshare_refusal  # noqa: E402

WORKER = os.path.join(_HERE, "ms_multinode_worker.py")
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "examples", "mindspore_producer_consumer.py")
with open(WORKER, encoding="utf-8") as _source:
    CASES = re.findall(r"^def (case_\w+)\(", _source.read(), re.MULTILINE)
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
# The runtime's timeout inside the jobs: a wait that is never woken fails the case in this time, not the job.
TIMEOUT_SEC = 10
# Bounds on a whole job: MindSpore starts in seconds a rank, 2 cores serve 4 ranks and the scheduler.
JOB_TIMEOUT_S = 240

_REFUSAL = unshare_refusal()
pytestmark = pytest.mark.skipif(_REFUSAL is not None, reason=f"simulated nodes need Linux namespaces: {_REFUSAL}")


def _env(results: str, per_node: int) -> dict:
    return {"HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": str(TIMEOUT_SEC), "HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M",
            "UCX_TLS": "tcp,self", "GLOG_v": "3", "HP_MS_RESULTS": results, "HP_MS_PER_NODE": str(per_node)}


def _run(nodes: int, per_node: int, args: list, results: str) -> list:
    """Runs ``args`` under msrun on ``nodes`` x ``per_node`` simulated nodes and returns the nodes' results."""
    with SimulatedJob(nodes, per_node, args, env=_env(results, per_node), launcher="msrun") as job:
        job.start()
        return job.wait(timeout=JOB_TIMEOUT_S, failure_grace=10)


def _outputs(ended: list) -> str:
    return "\n".join(f"--- node{r.node} returncode={r.returncode} ---\n{r.output[-8000:]}" for r in ended)


@pytest.fixture(scope="module")
def job() -> tuple:
    """``(records, ended)`` of one 2 x 2 job: ``records[case][rank]`` is every rank's record of every case (a case
    that failed on some rank fails its own test, not the others'), ``ended`` the nodes' results."""
    with tempfile.TemporaryDirectory(prefix="hp-ms-multinode-") as results:
        ended = _run(NODES, PER_NODE, [WORKER], results)
        found: dict = {}
        for rank in range(WORLD):
            path = os.path.join(results, f"rank{rank}.jsonl")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        record = json.loads(line)
                        found.setdefault(record["case"], {})[rank] = record
    return found, ended


@pytest.fixture(scope="module")
def records(job: tuple) -> dict:
    return job[0]


def test_the_job_ends_cleanly(job: tuple) -> None:
    """Every rank ran every case, freed what it allocated and shut the runtime down; msrun's scheduler and workers
    ended with status 0 on both nodes."""
    found, ended = job
    assert all(r.returncode == 0 for r in ended), _outputs(ended)
    assert sorted(found) == sorted(CASES), sorted(found)


def results(records: dict, case: str) -> list:
    """Every rank's result of ``case``; fails with a rank's error and traceback where it raised."""
    got = records.get(case, {})
    missing = [rank for rank in range(WORLD) if rank not in got]
    assert not missing, f"ranks {missing} did not report {case} (the job's end is in test_the_job_ends_cleanly)"
    for rank in range(WORLD):
        assert got[rank]["ok"], f"rank {rank} failed {case}: {got[rank]['error']}\n{got[rank]['traceback']}"
    return [got[rank]["result"] for rank in range(WORLD)]


def test_every_case_is_found():
    assert len(CASES) >= 10, CASES


@pytest.mark.parametrize("case", CASES)
def test_case_holds_on_every_rank(records: dict, case: str) -> None:
    """Each case checks its values exactly on its rank; a failure carries the rank's traceback."""
    results(records, case)


def test_ranks_are_node_major_and_reach_the_other_node_through_ucx(records: dict) -> None:
    for rank, seen in enumerate(results(records, "case_nodes_and_transports")):
        assert seen["hosts"] == ["node0", "node0", "node1", "node1"], seen
        assert seen["nodes"] == [0, 0, 2, 2], seen
        node = rank // PER_NODE
        expected = ["self" if r == rank else "node" if r // PER_NODE == node else "ucx" for r in range(WORLD)]
        assert seen["transports"] == expected, (f"rank {rank}: {seen['transports']} (a package built before libucx "
                                                "was installed? make mindspore-env installs it first)")


def test_signals_hold_what_the_other_node_set_and_added(records: dict) -> None:
    for rank, seen in enumerate(results(records, "case_signal_set_and_add_across_nodes")):
        other = (rank + PER_NODE) % WORLD
        assert seen == {"int64": [(1 << 40) + other, 5 + other + 1], "int32": [-14, 0]}, (rank, seen)


def test_a_wait_is_woken_by_the_other_nodes_signal(records: dict) -> None:
    for rank, seen in enumerate(results(records, "case_wait_for_signal_woken_by_the_other_node")):
        if rank < PER_NODE:
            assert 0.25 < seen["waited_s"] < 5.5, seen   # the signal came 0.5 s late; the timeout is 10 s
        # A round trip across the nodes is two UCX signals and two wakes: well under the futex sleep's slices.
        assert seen["per_round_s"] < 0.1, seen


def test_seed_example_one_consumer_on_the_other_node_gets_the_data(records: dict) -> None:
    roles = [seen["role"] for seen in results(records, "case_seed_example_one_across_nodes")]
    assert roles == ["producer", "bystander", "consumer", "bystander"], roles


def test_push_and_pull_gather_every_rank_of_both_nodes(records: dict) -> None:
    for seen in results(records, "case_push_example_across_nodes"):
        assert seen == {"rows": [0.0, 1.0, 2.0, 3.0], "arrived": WORLD}, seen
    for seen in results(records, "case_pull_example_across_nodes"):
        assert seen == {"rows": [0.0, 1.0, 2.0, 3.0], "ready": WORLD}, seen


def test_bad_inputs_across_nodes_are_refused_with_the_projects_messages(records: dict) -> None:
    """The user API refuses before the runtime is asked; the runtime's C ABI refuses on its own, past the allocation's
    end by the byte and outside the heap alike (the case checked that nothing was written anywhere)."""
    for rank, seen in enumerate(results(records, "case_bad_inputs_across_nodes_write_nothing")):
        errors, base = seen["errors"], seen["buf_address"]
        assert all(error["type"] == "ShmemValueError" and "ValueError" in error["mro"] for error in errors.values()), \
            (rank, errors)
        messages = {name: error["message"] for name, error in errors.items()}
        assert messages["window_past_end"] == \
            "`target_offset + size` must be at most target.numel() (16), but got 8 + 16 = 24", messages
        assert messages["ordinary_target"].startswith(
            "`target` must be a symmetric tensor from symm.empty, but got an ordinary tensor at 0x"), messages
        assert messages["rank_outside_group"] == f"`target_rank` must be in [0, {WORLD}), but got {WORLD}", messages
        assert messages["get_window_past_end"] == \
            "`src_offset + size` must be at most src.numel() (16), but got 4 + 16 = 20", messages
        assert messages["signal_past_end"] == \
            "`signal_offset + size` must be at most signal.numel() (2), but got 2 + 1 = 3", messages
        for name, what in (("c_put_past_allocation", "dst"), ("c_get_past_allocation", "src")):
            assert messages[name].startswith(
                f"`{what}` must lie inside its symmetric allocation, but got bytes [{base + 32:#x},{base + 96:#x}) "
                f"past the end of allocation_id="), messages
            assert messages[name].endswith(f" (base={base:#x} bytes=64)"), messages
        assert messages["c_put_outside_heap"].startswith("`dst` must be a symmetric tensor allocated by shmem.empty, "
                                                         "but got an address 0x"), messages
        assert messages["c_put_outside_heap"].endswith(" outside every active allocation"), messages
        assert messages["c_put_pe_outside_world"] == f"`pe` must be in [0, {WORLD}), but got {WORLD}", messages


def test_rendezvous_over_a_group_that_spans_nodes_is_refused(records: dict) -> None:
    expected = (f"`group` must lie on one node for rendezvous on MindSpore, but got ranks {list(range(WORLD))} on "
                f"nodes [0, {PER_NODE}] (a group that spans nodes takes one-sided calls, barrier, the collectives and "
                f"send/recv here): op=rendezvous group=")
    for seen in results(records, "case_rendezvous_across_nodes_is_refused"):
        error = seen["error"]
        assert error["type"] == "ShmemValueError", error
        assert error["message"].startswith(expected), error


def test_collectives_across_nodes_that_disagree_fail_on_every_rank_naming_both(records: dict) -> None:
    for rank, seen in enumerate(results(records, "case_collectives_across_nodes_that_disagree_fail_on_every_rank")):
        mismatch, refused = seen["mismatch"], seen["refused"]
        assert mismatch["type"] == "ShmemMismatchError", (rank, mismatch)
        assert "count=4" in mismatch["message"] and "count=8" in mismatch["message"], (rank, mismatch)
        assert refused["type"] == "ShmemValueError", (rank, refused)
        # Node 0's team of the group refused it, and names the whole group first; node 1 heard it from its lane.
        assert refused["message"].endswith(
            f" (refused by rank 0: op=reduce_scatter team_ranks=[{','.join(map(str, range(WORLD)))}] "
            f"node_team_ranks=[{','.join(map(str, range(PER_NODE)))}]; every member fails this call)"), (rank, refused)


def test_an_allocation_or_a_free_that_differs_across_nodes_is_refused_on_every_rank(records: dict) -> None:
    for rank, seen in enumerate(results(records, "case_allocation_and_free_that_differ_across_nodes_change_nothing")):
        for what, error in seen.items():
            assert error["type"] == "ShmemMismatchError", (rank, error)
            assert error["message"].startswith(f"ranks disagree on a symmetric {what} across nodes: rank={rank} "), \
                (rank, error)
        mine, theirs = (64, 128) if rank < PER_NODE else (128, 64)
        allocation = seen["allocation"]["message"]
        assert f"rank={rank} bytes={mine} offset=0x" in allocation, allocation
        other = re.search(r", rank=(\d+) bytes=(\d+) offset=", allocation)
        assert other and int(other[1]) // PER_NODE != rank // PER_NODE and int(other[2]) == theirs, allocation


def test_barrier_over_a_group_that_spans_nodes_waits_for_the_late_rank(records: dict) -> None:
    for rank, seen in enumerate(results(records, "case_barrier_across_nodes_waits_for_a_late_rank")):
        if rank != WORLD - 1:
            assert seen["waited_s"] > 0.25 and seen["seen"] == WORLD - 1, (rank, seen)   # 0.5 s late
        if rank == 1:
            assert seen["waited_pair_s"] > 0.25 and seen["seen_pair"] == 100, seen


def test_a_barrier_as_a_groups_first_call_across_nodes_makes_its_team(records: dict) -> None:
    """The case checked the put before the barrier on every rank; here: the group had no team before its barrier and
    one that runs phases on both nodes after it, one more runtime team (the node team) on every rank."""
    case = "case_barrier_first_on_a_group_that_spans_nodes_runs_through_its_team"
    for rank, seen in enumerate(results(records, case)):
        assert seen["seen"] == (rank + PER_NODE) % WORLD, (rank, seen)
        assert (seen["before"]["team"], seen["after"]["team"], seen["after"]["nodes"]) == (False, True, NODES), seen
        assert seen["after"]["live_teams"] == seen["before"]["live_teams"] + 1, (rank, seen)
        if rank != WORLD - 1:
            assert seen["waited_s"] > 0.25, (rank, seen)   # the last rank came 0.5 s late


def test_the_seed_example_script_runs_with_producer_and_consumer_on_two_nodes(tmp_path) -> None:
    """examples/mindspore_producer_consumer.py, unchanged, on 2 nodes x 1 rank: rank 0 produces on node0, rank 1
    consumes on node1, through UCX."""
    ended = _run(2, 1, [EXAMPLE], str(tmp_path))
    assert all(r.returncode == 0 for r in ended), _outputs(ended)
    consumer = ended[1].output
    assert "rank 1 received 4096 halves" in consumer and "intact=True" in consumer, consumer[-8000:]


def test_collectives_across_nodes_without_a_transport_are_refused_naming_the_remedy(tmp_path) -> None:
    """UCX unable to serve (UCX_TLS=no_such_transport): MindSpore's collectives cross nodes over the runtime's transport
    only, so one over the world is refused on every rank, naming the group's nodes and the remedy; a barrier over a
    sub-group that spans the nodes is MindSpore's own there, and makes no team."""
    env = dict(_env(str(tmp_path), PER_NODE), UCX_TLS="no_such_transport")
    with SimulatedJob(NODES, PER_NODE, [WORKER, "without_a_transport", str(tmp_path)], env=env,
                      launcher="msrun") as job:
        job.start()
        ended = job.wait(timeout=JOB_TIMEOUT_S, failure_grace=10)
    assert all(r.returncode == 0 for r in ended), _outputs(ended)
    for rank in range(WORLD):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "none" in record["transports"], record
        # A sub-group that spans the nodes: MindSpore's own barrier, and no team made for it.
        assert record["sub_group_barrier"] == {"live_teams_added": 0, "team": False, "nodes": None}, record
        error = record["error"]
        assert error["type"] == "ShmemValueError", error
        assert error["message"] == (
            f"`group` must lie on one node for shmem_allreduce where the runtime reaches no other node, but got ranks "
            f"{list(range(WORLD))} on nodes [0, {PER_NODE}] (MindSpore's collectives cross nodes over the runtime's "
            f"transport: build the package with UCX, pip install hyper-parallel-shmem[ucx]): op=shmem_allreduce "
            f"group=hccl_world_group"), error


def test_a_dead_node_fails_the_world_barrier_at_once_naming_its_ranks(tmp_path) -> None:
    """symm.barrier over the world meets the other node's ranks over the runtime's transport: when node 1 dies while
    node 0's ranks are in it, they fail as soon as its connections close, naming its ranks, not at the timeout."""
    env = _env(str(tmp_path), PER_NODE)
    with SimulatedJob(NODES, PER_NODE, [WORKER, "node_death", str(tmp_path)], env=env, launcher="msrun") as job:
        job.start()
        announced = [f"ready{rank}" for rank in range(PER_NODE, WORLD)] + [f"waiting{rank}" for rank in range(PER_NODE)]
        job.wait_for_paths([str(tmp_path / name) for name in announced], timeout=JOB_TIMEOUT_S)
        time.sleep(0.5)   # node 0's ranks are in their barriers by now
        killed_at = time.time()
        job.kill_node(1)
        (tmp_path / "node1_killed").touch()
        job.wait_for_paths([str(tmp_path / f"rank{rank}.json") for rank in range(PER_NODE)],
                           timeout=3 * TIMEOUT_SEC + 30, running=[0])
        job.kill_node(0)
    for rank in range(PER_NODE):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        barrier = record["barrier"]
        assert barrier["raised"].startswith("ShmemTimeoutError: barrier across nodes failed: op=barrier "
                                            f"missing_ranks=[{PER_NODE}, {PER_NODE + 1}] "), barrier
        assert "(ucx: " in barrier["raised"], barrier
        assert killed_at < barrier["ended"] < killed_at + TIMEOUT_SEC / 4, (killed_at, barrier)
        assert set(record["transports"][PER_NODE:]) <= {"lost", "ucx"}, record
