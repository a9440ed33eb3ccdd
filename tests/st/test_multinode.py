"""Jobs that span machines, simulated on this one: 2 nodes x 2 ranks (simulated_nodes.py).

Each node has its own /dev/shm, hostname and PID namespace; gloo runs across the nodes' loopback addresses. One
job runs every case of multinode_worker.py (every collective against gloo, groups within and across nodes, the
user API and fused ops, one-sided calls across nodes (through UCX where it is installed, refused with the remedy
where not: the primitives, the seed's producer/consumer, push and pull examples, a hypothesis sweep of put/get
windows), mismatches within and across nodes, an allocation that differs across
nodes, the user API's MoE cases over groups that span nodes); two more check every collective on 4 nodes x 2 ranks and 2 nodes x 4; another kills a node while the other
one waits for a signal from it (through UCX) and checks that the wait and the collectives after it fail in time,
naming the dead ranks; and a short hp-shmem-perf run under mpiexec (simulated_mpi.py) checks the one-sided rows
across the nodes beside the UCX floor and MPI's RMA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time

import pytest

from simulated_mpi import mpiexec_path, run_mpiexec
from simulated_nodes import SimulatedJob, unshare_refusal

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multinode_worker.py")
with open(WORKER) as _source:
    CASES = re.findall(r"^def (case_\w+)\(", _source.read(), re.MULTILINE)
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
# The runtime's timeout inside the jobs: every wait of a failure path is bounded by it.
TIMEOUT_SEC = 10

_REFUSAL = unshare_refusal()
pytestmark = pytest.mark.skipif(_REFUSAL is not None, reason=f"simulated nodes need Linux namespaces: {_REFUSAL}")


# Whether the package was built with UCX: `make test` installs libucx before it builds the package.
UCX_INSTALLED = importlib.util.find_spec("libucx") is not None


def _env() -> dict:
    # UCX over TCP on loopback: the simulated nodes share this machine's network namespace (their shared-memory
    # transports would find the other node's /dev/shm missing).
    return dict(os.environ, HYPER_PARALLEL_SHMEM_TIMEOUT_SEC=str(TIMEOUT_SEC), HYPER_PARALLEL_SHMEM_HEAP_SIZE="64M",
                UCX_TLS=os.environ.get("UCX_TLS", "tcp"), UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))


@pytest.fixture(scope="module")
def case_results(tmp_path_factory) -> dict:
    """Every rank's results of every case, from one 2 x 2 job."""
    out = tmp_path_factory.mktemp("multinode")
    with SimulatedJob(NODES, PER_NODE, [WORKER, "cases", str(out)], env=_env()) as job:
        job.start()
        results = job.wait(timeout=300, failure_grace=10)
    failed = [r for r in results if r.returncode != 0]
    assert not failed, "\n".join(f"--- node {r.node} ---\n{r.output[-6000:]}" for r in failed)
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)}


def test_every_case_is_found():
    assert len(CASES) >= 15, CASES


@pytest.mark.parametrize("case", CASES)
def test_case_holds_on_every_rank(case_results: dict, case: str) -> None:
    for rank in range(WORLD):
        result = case_results[rank][case]
        assert result["ok"], f"rank {rank}:\n{result['value']}"


def test_one_sided_calls_cross_nodes_exactly_where_ucx_is_installed(case_results: dict) -> None:
    expected = "'ucx'" if UCX_INSTALLED else "'none'"
    for rank in range(WORLD):
        transport = case_results[rank]["case_one_sided_transfers_across_nodes"]["value"]
        assert transport == expected, (f"rank {rank} reaches the other node through {transport}, expected {expected} "
                                       "(a package built before libucx was installed? build it again)")


def test_ranks_that_disagree_across_nodes_all_name_both_calls(case_results: dict) -> None:
    for rank in range(WORLD):
        message = case_results[rank]["case_mismatch_across_nodes_raises_everywhere"]["value"]
        lane_peer = (rank + PER_NODE) % WORLD
        mine, theirs = (8, 16) if rank < PER_NODE else (16, 8)
        assert f"rank={rank} collective=all_reduce op=sum wire=full count={mine}" in message, message
        assert f"rank={lane_peer} collective=all_reduce op=sum wire=full count={theirs}" in message, message


def test_a_mismatch_inside_one_node_reaches_the_other_node(case_results: dict) -> None:
    # Node 0's ranks saw it themselves; node 1's heard it from their lane, as node 0 raised it: one error everywhere.
    messages = [case_results[rank]["case_mismatch_within_a_node_reaches_the_other_node"]["value"]
                for rank in range(WORLD)]
    for rank in range(PER_NODE):   # each names both calls, its own first
        # Named after the whole team (every rank of the job), then node 0's members, whose node team found it.
        assert ("ranks disagree on a collective (collective): team_ranks=[0,1,2,3] node_team_ranks=[0,1] rank "
                in messages[rank]), messages[rank]
        assert "rank 1 calls collective=all_gather" in messages[rank], messages[rank]
        assert "rank 0 calls collective=all_reduce" in messages[rank], messages[rank]
    for rank in range(PER_NODE, WORLD):
        assert messages[rank] in messages[:PER_NODE], (rank, messages)


# UCX_TLS naming no transport UCX has: UCX cannot serve, the runtime reaches no other node, and a team's phase across
# nodes runs over its ProcessGroup (gloo) instead of the runtime's transport.
NO_UCX_TRANSPORT = "no_such_transport"


@pytest.mark.parametrize("nodes, per_node, link", [(4, 2, "ucx"), (2, 4, "ucx"), (2, 2, "gloo")])
def test_every_collective_on_more_nodes_or_more_ranks_per_node(tmp_path, nodes: int, per_node: int,
                                                               link: str) -> None:
    """4 nodes exchange with 3 lane peers each; 4 ranks per node run 4 lanes (8 ranks on this machine's cores); the
    phase across nodes over the runtime's transport where the package has UCX, and over gloo where UCX cannot
    serve."""
    env = _env() if link == "ucx" else dict(_env(), UCX_TLS=NO_UCX_TRANSPORT)
    with SimulatedJob(nodes, per_node, [WORKER, "any_shape", str(tmp_path)], env=env) as job:
        job.start()
        results = job.wait(timeout=240, failure_grace=10)
    failed = [r for r in results if r.returncode != 0]
    assert not failed, "\n".join(f"--- node {r.node} ---\n{r.output[-6000:]}" for r in failed)
    expected_link = link if UCX_INSTALLED else "gloo"
    for rank in range(nodes * per_node):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["wrong"] == [], rank
        assert record["link"] == expected_link, (rank, record)


def test_a_dead_node_is_named_by_the_others_in_time(tmp_path) -> None:
    with SimulatedJob(NODES, PER_NODE, [WORKER, "node_death", str(tmp_path)], env=_env()) as job:
        job.start()
        # Node 1 ready to die; with UCX, node 0's ranks waiting for a signal from it.
        announced = [f"ready{rank}" for rank in range(PER_NODE, WORLD)]
        announced += [f"waiting{rank}" for rank in range(PER_NODE)] if UCX_INSTALLED else []
        job.wait_for_paths([str(tmp_path / name) for name in announced], timeout=120)
        time.sleep(0.5)  # the waits are asleep by now
        killed_at = time.time()
        job.kill_node(1)
        (tmp_path / "node1_killed").touch()
        # Node 0's ranks record what they saw and leave; torchrun's agent would then wait for node 1's forever.
        job.wait_for_paths([str(tmp_path / f"rank{rank}.json") for rank in range(PER_NODE)],
                           timeout=3 * TIMEOUT_SEC + 30, running=[0])
        job.kill_node(0)
    dead = [str(rank) for rank in range(PER_NODE, WORLD)]
    for rank in range(PER_NODE):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # With UCX, the wait for a signal from the dying node fails as soon as its connections close, naming its
        # ranks (those whose loss this rank had seen then) and their node.
        assert ("wait_signal" in record) == UCX_INSTALLED, record
        if UCX_INSTALLED:
            wait = record["wait_signal"]
            assert wait["raised"].startswith("ShmemDeviceError: signal wait failed: pes of another node are gone "),\
                wait
            lost = wait["raised"].split("lost_pes=[", 1)[1].split("]", 1)[0].split(",")
            assert lost and set(lost) <= set(dead), wait
            assert f"lost_nodes=[{PER_NODE}] rank={rank} " in wait["raised"], wait
            assert killed_at < wait["ended"] < killed_at + TIMEOUT_SEC / 4, (killed_at, wait)
            put = record["put"]
            assert put["raised"].startswith("ShmemDeviceError: "), put
            assert "put" in put["raised"] and f" pe={rank + PER_NODE} " in put["raised"], put
            assert put["seconds"] < 1, put
            # debug_state() says which ranks are gone: every rank the wait named, and no rank of this node.
            transports = record["transports"]
            assert all(transports[int(pe)] == "lost" for pe in lost), (lost, transports)
            assert transports[:PER_NODE] == ["node" if r != rank else "self" for r in range(PER_NODE)], transports
            assert set(transports[PER_NODE:]) <= {"lost", "ucx"}, transports
        # Every member of the surviving node fails the all_to_all at once (a closed connection, not the timeout),
        # naming a rank of the dead node: the one whose lane peer died, and its node-mate through the node's sync.
        all_to_all = record["all_to_all"]
        assert all_to_all["raised"].startswith("ShmemTimeoutError: "), all_to_all
        assert "cross-node phase failed: op=all_to_all missing_ranks=[" in all_to_all["raised"], all_to_all
        named = all_to_all["raised"].split("missing_ranks=[", 1)[1].split("]", 1)[0].split(", ")
        assert named and set(named) <= set(dead), all_to_all
        assert all_to_all["seconds"] < TIMEOUT_SEC / 2, record
        # The team is broken from then on: its next call says so at once.
        all_reduce = record["all_reduce"]
        assert "cross-node phase failed: op=all_to_all" in all_reduce["raised"], all_reduce
        assert all_reduce["seconds"] < TIMEOUT_SEC / 2, record
        # The root's barrier meets the other node's ranks over the runtime's transport (UCX), else over gloo.
        barrier = record["barrier"]
        across = "barrier across nodes failed: op=barrier " if UCX_INSTALLED else "bootstrap "
        assert barrier["raised"].startswith(f"ShmemTimeoutError: {across}"), barrier
        assert "missing_ranks=[2, 3]" in barrier["raised"], barrier
        assert barrier["seconds"] < TIMEOUT_SEC + 5, record
        assert record["dev_shm"] == [], record


@pytest.mark.skipif(not UCX_INSTALLED, reason="one-sided calls across nodes need the package built with UCX")
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
                    reason="mpi4py and mpiexec are not installed (pip install mpi4py mpich)")
def test_perf_times_one_sided_ops_across_nodes_beside_the_floor_and_mpi_rma(tmp_path) -> None:
    """``hp-shmem-perf --peer across --baseline gloo,mpi`` on 2 x 2 under mpiexec (simulated_mpi.py): put, get and
    put_with_signal from rank 0 to rank 2 (the other node) move every byte right; the transport's own put/get (the
    floor column) and MPI's one-sided RMA across the nodes are timed beside them and move every byte right too. A
    tiny sweep: it checks the rows, never the speed."""
    json_path = tmp_path / "perf.json"
    program = [sys.executable, "-m", "hyper_parallel.perf", "--op", "put,get,put_with_signal", "--peer", "across",
               "--baseline", "gloo,mpi", "-b", "8", "-e", "64K", "-f", "8192", "-n", "3", "-w", "1", "-r", "1",
               "--progress", "off", "--json", str(json_path)]
    # MPICH's UCX fails with UCX_NET_DEVICES=lo (simulated_mpi.py); tcp and self serve both UCX users.
    env = {key: value for key, value in _env().items() if key != "UCX_NET_DEVICES"}
    result = run_mpiexec(NODES, PER_NODE, program, timeout=120, env={**env, "UCX_TLS": "tcp,self"})
    assert result.returncode == 0, result.stdout[-6000:]
    document = json.loads(json_path.read_text())
    settings = document["settings"]
    assert (settings["peer"], settings["peer_crosses_nodes"], settings["peer_transport"]) == (PER_NODE, True, "ucx")
    assert (settings["floor"], settings["floor_absent"], settings["mpi"]) == ("ucx", None, True)
    rows = document["rows"]
    assert [(row["op"], row["size"]) for row in rows] == [
        (op, size) for op in ("put", "get", "put_with_signal") for size in (8, 65536)]
    for row in rows:
        assert row["wrong"] == 0 and row["floor_wrong"] == 0, (row["op"], row["size"], row["wrong"], row["floor_wrong"])
        assert row["time_us"] > 0 and row["baseline_time_us"] > 0 and row["floor_time_us"] > 0
        assert row["over_floor"] == pytest.approx(row["time_us"] / row["floor_time_us"])
        assert row["floor_algbw"] == pytest.approx(row["size"] / row["floor_time_us"] / 1e3)
        if row["op"] == "put_with_signal":  # no MPI side
            assert row["mpi_time_us"] is None
        else:
            assert row["mpi_wrong"] == 0 and row["mpi_time_us"] > 0, row["op"]
    assert "# one-sided ops: rank 0 and rank 2 (on another node, reached through ucx)" in result.stdout
    assert "ucx floor" in result.stdout
