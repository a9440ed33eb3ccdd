"""System tests of the simulated-node launcher (tests/st/simulated_nodes.py): real torchrun jobs of 2 nodes x 2 ranks.

The ranks run tests/st/simulated_nodes_worker.py (torch + gloo only; the project need not be installed). One job
serves every check of what ranks see; the kill, failure and timeout paths each run their own job. Everything skips,
with the probe's reason, only where this machine refuses the namespaces.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from simulated_nodes import (
    EXIT_TIMEOUT,
    SimulatedJob,
    SimulatedJobTimeout,
    SimulatedNodesError,
    node_address,
    node_name,
    process_alive,
    unshare_refusal,
)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "simulated_nodes_worker.py")
LAUNCHER = os.path.join(HERE, "simulated_nodes.py")
NODES, NPROC = 2, 2
# Bound on a whole 2 x 2 job: start-up takes seconds; this leaves room for 4 engineers on 2 cores.
JOB_TIMEOUT_S = 120.0
# The process-group timeout of node 0's ranks in the kill job, and the bound on node 0 ending by itself after node 1
# is killed: the group's timeout, plus torchrun stopping its workers, plus slack for a loaded machine.
PG_TIMEOUT_S = 20.0
NODE0_END_BOUND_S = PG_TIMEOUT_S + 25.0


@pytest.fixture(scope="module", autouse=True)
def _namespaces_allowed() -> None:
    reason = unshare_refusal()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def check_job() -> Iterator[dict[str, Any]]:
    """Run the ``check`` job once; hand out its tag, per-node results, rank reports and temp directory."""
    tag = f"simnodes-{uuid.uuid4().hex}"
    with SimulatedJob(NODES, NPROC, [WORKER, "check", tag], env={"SIMULATED_NODES_TEST_MARKER": tag}) as job:
        job.start()
        directory = job.directory
        results = job.wait(JOB_TIMEOUT_S)
    outputs = "\n".join(f"--- node{r.node} ---\n{r.output}" for r in results)
    assert [r.returncode for r in results] == [0] * NODES, outputs
    lines = [line for line in results[0].output.splitlines() if line.startswith("REPORT ")]
    assert len(lines) == 1, outputs
    reports = json.loads(lines[0][len("REPORT "):])
    assert [r["rank"] for r in reports] == list(range(NODES * NPROC)), outputs
    yield {"tag": tag, "results": results, "reports": reports, "directory": directory}


def test_ranks_live_on_their_node(check_job: dict[str, Any]) -> None:
    for report in check_job["reports"]:
        node = report["rank"] // NPROC
        assert report["world"] == NODES * NPROC
        assert report["group_rank"] == node, report
        assert report["local_rank"] == report["rank"] % NPROC, report
        assert report["hostname"] == node_name(node), report


def test_node_names_resolve_to_their_own_loopback_address(check_job: dict[str, Any]) -> None:
    for report in check_job["reports"]:
        node = report["rank"] // NPROC
        assert report["address"] == node_address(node), report
        # gloo picks its address from the hostname: its listening sockets are on the node's own address only.
        assert report["listen"] == [node_address(node)], report


def test_every_node_name_resolves_from_every_node(check_job: dict[str, Any]) -> None:
    expected = {"localhost": "127.0.0.1", **{node_name(j): node_address(j) for j in range(NODES)}}
    for report in check_job["reports"]:
        assert report["names"] == expected, report


def test_environment_reaches_the_ranks(check_job: dict[str, Any]) -> None:
    for report in check_job["reports"]:
        assert report["marker"] == check_job["tag"], report


def test_dev_shm_is_shared_within_a_node_only(check_job: dict[str, Any]) -> None:
    tag = check_job["tag"]
    for report in check_job["reports"]:
        node = report["rank"] // NPROC
        same_node = sorted(f"{tag}-{rank}" for rank in range(node * NPROC, (node + 1) * NPROC))
        assert report["visible"] == same_node, report


def test_gloo_all_reduce_spans_the_nodes(check_job: dict[str, Any]) -> None:
    world = NODES * NPROC
    # Every rank contributed rank + 1; small integers are exact in float32.
    for report in check_job["reports"]:
        assert report["sum"] == world * (world + 1) / 2, report


def test_job_leaves_nothing_behind(check_job: dict[str, Any]) -> None:
    tag = check_job["tag"]
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(tag)]
    assert check_job["directory"] is not None
    assert not os.path.exists(check_job["directory"])


def test_killed_node_shows_the_kill_and_the_other_node_fails_by_itself() -> None:
    with SimulatedJob(NODES, NPROC, [WORKER, "kill", str(PG_TIMEOUT_S)]) as job:
        job.start()
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while job.output(1).count("SLEEPING") < NPROC or job.output(0).count("COLLECTIVE") < NPROC:
            if time.monotonic() > deadline or None not in job.poll():
                pytest.fail(f"the ranks did not reach the kill point:\n{job.output(0)}\n{job.output(1)}")
            time.sleep(0.1)
        killed_at = time.monotonic()
        job.kill_node(1)
        results = job.wait(NODE0_END_BOUND_S)  # raises SimulatedJobTimeout when node 0 does not end by itself
        ended_after = time.monotonic() - killed_at
    outputs = "\n".join(f"--- node{r.node} ---\n{r.output}" for r in results)
    assert results[1].returncode == -signal.SIGKILL, outputs
    assert results[0].returncode != 0, outputs
    assert ended_after < NODE0_END_BOUND_S, outputs
    assert "FINISHED" not in results[0].output, outputs


def test_timeout_kills_every_node_and_names_them() -> None:
    with SimulatedJob(NODES, NPROC, [WORKER, "sleep"]) as job:
        job.start()
        # A file that never comes: the wait for it ends at its timeout, naming it and the nodes that ended (none).
        never = os.path.join(job.directory, "never")
        with pytest.raises(SimulatedNodesError) as waited:
            job.wait_for_paths([never], timeout=0.5)
        assert str(waited.value).startswith(f"simulated nodes never wrote what was awaited: missing=['{never}'] "
                                            "ended_nodes=[] timeout_s=0.5\n--- node0 ---"), str(waited.value)
        with pytest.raises(SimulatedJobTimeout) as caught:
            job.wait(1.0)
    assert caught.value.running == list(range(NODES))
    assert [r.returncode for r in caught.value.results] == [-signal.SIGKILL] * NODES
    assert "node0" in str(caught.value) and "node1" in str(caught.value)
    assert not os.path.exists(job.directory)


def test_command_line_reports_a_failed_node(tmp_path: Any) -> None:
    # Node 1's ranks exit with 3; node 0's wait in torchrun's exit barrier until the failure grace kills them.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, LAUNCHER, "--nodes", str(NODES), "--nproc-per-node", str(NPROC),
                           "--timeout", str(JOB_TIMEOUT_S), "--failure-grace", "1", "--", WORKER, "exit", "1"],
                          capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S + 30, check=False)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert elapsed < JOB_TIMEOUT_S, done.stdout + done.stderr
    # torchrun stops a node's other ranks once one fails, so some of node 1's ranks may not get to print.
    assert any(f"[node1] EXITING {rank}" in done.stdout for rank in range(NPROC, 2 * NPROC)), done.stdout
    assert "[node0] EXITING" not in done.stdout, done.stdout
    assert "simulated node failed: node=node1" in done.stderr, done.stderr
    assert "simulated node killed by the launcher: node=node0" in done.stderr, done.stderr
    assert not os.listdir(tmp_path)  # the job's files are gone


def test_command_line_timeout_names_the_running_nodes() -> None:
    done = subprocess.run([sys.executable, LAUNCHER, "--nodes", str(NODES), "--nproc-per-node", str(NPROC),
                           "--timeout", "1", "--", WORKER, "sleep"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == EXIT_TIMEOUT, done.stdout + done.stderr
    assert "running=node0, node1" in done.stderr, done.stderr


def test_command_line_prints_output_as_it_comes_and_ends_its_nodes_on_sigterm(tmp_path: Any) -> None:
    proc = subprocess.Popen([sys.executable, LAUNCHER, "--nodes", str(NODES), "--nproc-per-node", str(NPROC),
                             "--timeout", str(JOB_TIMEOUT_S), "--", WORKER, "sleep"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.stdout is not None
    try:
        seen = b""
        deadline = time.monotonic() + JOB_TIMEOUT_S
        # Every rank's line arrives while the job still runs (the ranks sleep for an hour).
        while seen.count(b"SLEEPING") < NODES * NPROC:
            assert time.monotonic() < deadline and proc.poll() is None, seen.decode(errors="replace")
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                seen += os.read(proc.stdout.fileno(), 1 << 16)
        lines = seen.decode(errors="replace").splitlines()
        assert proc.poll() is None, "\n".join(lines)
        for k in range(NODES):
            assert any(line.startswith(f"[{node_name(k)}] SLEEPING") for line in lines), "\n".join(lines)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, (seen + rest).decode(errors="replace")
    # The tool's exit removed its job's files, which it does only after every node has ended.
    assert not os.listdir(tmp_path), os.listdir(tmp_path)


def test_command_line_needs_a_command() -> None:
    done = subprocess.run([sys.executable, LAUNCHER, "--nodes", "2", "--"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "must follow `--`" in done.stderr, done.stderr


def test_a_launcher_it_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^`launcher` must be one of torchrun, msrun, but got 'mpirun'$"):
        SimulatedJob(NODES, NPROC, [WORKER, "sleep"], launcher="mpirun")


def test_msrun_nodes_number_their_ranks_from_node_rank_and_node0_hosts_the_scheduler() -> None:
    """The msrun command of each node (test_ms_multinode.py runs real msrun jobs, where MindSpore is installed):
    node-major rank ids through --node_rank, the scheduler at node0's address, and only node0 starting it; msrun
    starts its ranks with `python` from PATH: the given interpreter's."""
    python = "/opt/ms/bin/python"
    job = SimulatedJob(NODES, NPROC, ["worker.py", "--flag"], python=python, launcher="msrun")
    try:
        job.start()
        commands = [job._launch_command(k) for k in range(NODES)]  # noqa: SLF001 (what each node execs)
        assert job.env["PATH"].split(os.pathsep)[0] == "/opt/ms/bin"
        for k, command in enumerate(commands):
            assert command[:2] == [python, "-c"], command
            assert command[3] == ("master" if k == 0 else "worker"), command
            assert command[4:10] == [f"--worker_num={NODES * NPROC}", f"--local_worker_num={NPROC}",
                                     f"--master_addr={node_address(0)}", f"--master_port={job.port}",
                                     f"--node_rank={k}", "--join=True"], command
            assert command[10].startswith("--log_dir=") and command[11:] == ["worker.py", "--flag"], command
    finally:
        job.close()


def _probe_in_subprocess(prefix: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run unshare_refusal() in a fresh interpreter (its answer is cached per process); print its answer or error."""
    code = ("import simulated_nodes as s\n"
            "try:\n    print('REASON', s.unshare_refusal())\n"
            "except s.SimulatedNodesError as e:\n    print('ERROR', e)\n")
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": HERE}, timeout=60, check=False)


def test_probe_reports_a_refusal_without_the_capability() -> None:
    # Without capabilities (an empty bounding set), even root may not create the namespaces: a real refusal.
    # util-linux ships `setpriv` beside `unshare`, which this module needs anyway.
    assert shutil.which("setpriv"), "dropping capabilities needs `setpriv` (util-linux), which is not on PATH"
    done = _probe_in_subprocess(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all"],
                                dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("REASON this machine refuses"), done.stdout + done.stderr
    assert "unshare --mount --uts --pid --fork --kill-child" in done.stdout, done.stdout
    assert "not permitted" in done.stdout.lower(), done.stdout


def test_probe_raises_for_a_failure_that_is_not_a_refusal(tmp_path: Any) -> None:
    # An `unshare` that fails for another reason must fail the tests, not skip them.
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: something else went wrong' >&2\nexit 1\n")
    fake.chmod(0o755)
    done = _probe_in_subprocess([], {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ERROR the simulated-node probe failed"), done.stdout + done.stderr
    assert "something else went wrong" in done.stdout, done.stdout


def test_nodes_die_with_a_launcher_that_dies(tmp_path: Any) -> None:
    # A launcher killed before close() (a test runner's timeout, say) must not leave nodes running. Its job's
    # directory does stay: TMPDIR puts it under pytest's tmp_path.
    code = (f"import os, sys, time\nsys.path.insert(0, {HERE!r})\nfrom simulated_nodes import SimulatedJob\n"
            f"job = SimulatedJob({NODES}, {NPROC}, [{WORKER!r}, 'sleep'])\njob.start()\n"
            "time.sleep(1)\n"
            "pid1s = [open(f'/proc/{p.pid}/task/{p.pid}/children').read().split() for p in job._procs]\n"
            "print(' '.join(str(p.pid) for p in job._procs), ' '.join(sum(pid1s, [])), flush=True)\n"
            "os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    # Each node's unshare process and its namespace's PID 1 (which ends after every other process of the node).
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2 * NODES, done.stdout
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"nodes outlived their launcher: pids={pids}"
        time.sleep(0.1)
