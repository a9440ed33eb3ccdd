"""Simulate N nodes x M ranks on one machine (a module and a command line tool).

Each simulated node is one ``unshare --mount --uts --pid --fork --kill-child
--propagation private`` process that sets up the node and then ``exec``'s
the node's launcher, ``python -m torch.distributed.run`` (torchrun, the
default) or MindSpore's ``msrun``:

1. ``mount -t tmpfs tmpfs /dev/shm``: the node's own /dev/shm, so shared-memory
   heaps are visible to the node's ranks only (as on separate machines) and
   vanish with the node;
2. ``mount -t proc proc /proc``: a /proc of the node's PID namespace, so the
   PIDs under /proc are the ones ``os.getpid()`` returns;
3. ``hostname node{k}``: the node's own name (UTS namespace);
4. a generated hosts file bind-mounted on /etc/hosts: ``node{j}`` resolves to
   the loopback address ``127.0.1.{j+1}`` for every j, so gloo on node k binds
   to its own address and reaches the other nodes by name;
5. a generated ``nsswitch.conf`` (``hosts: files``) bind-mounted on
   /etc/nsswitch.conf: names resolve from that hosts file only, no DNS look-ups;
6. ``torchrun --nnodes N --node-rank k --nproc-per-node M --rdzv-backend static
   --master-addr node0 --master-port P``: static rendezvous (the c10d
   rendezvous would publish an address that is not resolvable inside the UTS
   namespaces); node 0's agent hosts the store on the free port P. Or, with
   ``launcher="msrun"``: ``msrun --worker_num N*M --local_worker_num M
   --master_addr 127.0.1.1 --master_port P --node_rank k --join=True
   --log_dir ...`` (see :data:`_MSRUN_NODE` for why node 0's msrun is told
   that it hosts the scheduler).

The network namespace is shared: every node sees the host's loopback device,
where all of 127.0.0.0/8 is local. ``--kill-child`` plus the PID namespace make
a node die as a whole: killing its ``unshare`` process kills everything in it,
like a machine that goes down.

Ranks tell their node by ``GROUP_RANK`` and ``LOCAL_RANK`` (set by torchrun),
or ``RANK_ID`` (msrun: ``k * M + local index``), and by their hostname
``node{k}``.

Command line: it prints each node's output as it comes, a line at a time, every
line prefixed by ``[node{k}]``. ``--failure-grace S`` (default 10): once a node has
failed, the others are killed S seconds later (torchrun's exit barrier would
keep them 300 s). Exit status: 0 every node succeeded, 1 some node failed, 2 bad
usage, 3 the timeout passed and the nodes still running were killed,
``EXIT_REFUSED`` = 77 this machine refuses the namespaces (the reason is
printed)::

    python tests/st/simulated_nodes.py --nodes 2 --nproc-per-node 2 [--timeout S] \\
        -- -m hyper_parallel.perf --op all_reduce

This module uses the standard library only (no torch import), so tests can ask
:func:`unshare_refusal` without paying for torch.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Optional

__all__ = [
    "EXIT_REFUSED",
    "LAUNCHERS",
    "NodeResult",
    "SimulatedJob",
    "SimulatedJobTimeout",
    "SimulatedNodesError",
    "main",
    "node_address",
    "node_name",
    "process_alive",
    "unshare_refusal",
]

# Exit status of the command line tool when this machine refuses the namespaces (automake's "skipped").
EXIT_REFUSED = 77
# Exit status of the command line tool when the timeout passed.
EXIT_TIMEOUT = 3

# What a node runs its ranks with: torchrun (torch.distributed.run), or MindSpore's msrun.
LAUNCHERS = ("torchrun", "msrun")

UNSHARE_ARGS = ("unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--propagation", "private")

# How long the refusal probe may take (it starts a shell and `hostname`, well under a second).
_PROBE_TIMEOUT_S = 30.0
# Seconds between wait()'s checks of the nodes.
_POLL_S = 0.05
# How long to wait for a SIGKILLed node's unshare process to be reaped.
_REAP_TIMEOUT_S = 10.0
# Words of the errors with which unshare, mount and hostname report a missing privilege (EPERM, EACCES).
_REFUSAL_WORDS = ("operation not permitted", "permission denied", "must be root", "only root")

# The node's setup; runs as PID 1 of the node's namespaces. $1: node name, $2: hosts file, $3: nsswitch.conf,
# the rest: the command to exec. Each step names itself on failure so a refusal says which privilege is missing.
_SETUP_SCRIPT = r"""
step() { "$@" || { echo "simulated node setup failed: $*" >&2; exit 1; }; }
name=$1; hosts=$2; nsswitch=$3; shift 3
step mount -t tmpfs -o mode=1777 tmpfs /dev/shm
step mount -t proc proc /proc
step hostname "$name"
step mount --bind "$hosts" /etc/hosts
step mount --bind "$nsswitch" /etc/nsswitch.conf
exec "$@"
"""


# A node's msrun, run as `python -c _MSRUN_NODE master|worker MSRUN_ARGS...`: msrun's own process manager with its own
# arguments, but told whether this node hosts the scheduler. msrun decides that by whether --master_addr is one of the
# machine's addresses (`ip -j addr`, then the route to it); the simulated nodes share one network namespace, so that
# test answers alike on every node: 127.0.1.1 is no interface's address (no node would start the scheduler, and the
# workers would wait for it), 127.0.0.1 is lo's (every node would start one on the same port). The scheduler binds
# the master address itself, so node 0 starts it on 127.0.1.1, where the other nodes' workers reach it.
_MSRUN_NODE = """
import sys
from mindspore.parallel.cluster import run
from mindspore.parallel.cluster.process_entity import _api
hosts_scheduler = sys.argv.pop(1) == "master"
sys.argv[0] = "msrun"
manager = _api._ProcessManager(run.get_args())
manager.is_master = hosts_scheduler
manager.run()
"""


class SimulatedNodesError(RuntimeError):
    """A simulated node could not be set up or run for a reason other than a refusal."""


class NodeResult(NamedTuple):
    """How one simulated node ended.

    Attributes:
        node: The node's index k (its hostname is ``node{k}``).
        returncode: The exit status of the node's ``unshare`` process (torchrun's, once set up); negative: killed by
            that signal (``-signal.SIGKILL`` after :meth:`SimulatedJob.kill_node` or a timeout).
        output: Everything the node wrote to stdout and stderr (setup, the launcher and its ranks: msrun copies
            its ranks' logs there), decoded as UTF-8 with undecodable bytes replaced.
    """

    node: int
    returncode: int
    output: str


class SimulatedJobTimeout(SimulatedNodesError):
    """:meth:`SimulatedJob.wait` ran past its timeout; the nodes still running were killed.

    Attributes:
        running: The nodes that were still running when the timeout passed.
        results: Every node's result (the killed ones with ``-SIGKILL``), including its output.
    """

    def __init__(self, timeout: float, running: list[int], results: list[NodeResult]) -> None:
        self.running = running
        self.results = results
        outputs = "\n".join(f"--- node{r.node} (returncode {r.returncode}) ---\n{r.output}" for r in results)
        names = ", ".join(node_name(k) for k in running)
        super().__init__(f"simulated nodes still running after the timeout were killed: timeout_s={timeout:g} "
                         f"running={names}\n{outputs}")


def node_name(k: int) -> str:
    """Return the hostname of simulated node ``k``.

    Args:
        k: The node index, 0-based.

    Returns:
        ``node{k}``.
    """
    return f"node{k}"


def node_address(k: int) -> str:
    """Return the loopback address that simulated node ``k``'s name resolves to.

    Args:
        k: The node index, 0-based, below 254.

    Returns:
        ``127.0.1.{k+1}``.
    """
    return f"127.0.1.{k + 1}"


def _hosts_text(nodes: int) -> str:
    lines = ["127.0.0.1 localhost"] + [f"{node_address(j)} {node_name(j)}" for j in range(nodes)]
    return "\n".join(lines) + "\n"


def _write_node_files(directory: str, nodes: int) -> tuple[str, str]:
    """Write the hosts file and nsswitch.conf every node bind-mounts; return their paths."""
    hosts = os.path.join(directory, "hosts")
    nsswitch = os.path.join(directory, "nsswitch.conf")
    with open(hosts, "w", encoding="ascii") as f:
        f.write(_hosts_text(nodes))
    # The host's nsswitch.conf with its `hosts` line replaced: user, group and other look-ups work as on the host.
    try:
        with open("/etc/nsswitch.conf", encoding="utf-8", errors="replace") as f:
            kept = [line for line in f.read().splitlines() if not line.strip().startswith("hosts:")]
    except OSError:
        kept = []
    with open(nsswitch, "w", encoding="utf-8") as f:
        f.write("\n".join([*kept, "hosts: files"]) + "\n")
    # mount --bind needs the files readable by whoever reads /etc/hosts inside the node.
    os.chmod(hosts, 0o644)
    os.chmod(nsswitch, 0o644)
    return hosts, nsswitch


def _node_command(name: str, hosts: str, nsswitch: str, command: Sequence[str]) -> list[str]:
    return [*UNSHARE_ARGS, "sh", "-c", _SETUP_SCRIPT, "simulated-node", name, hosts, nsswitch, *command]


@functools.lru_cache(maxsize=1)
def unshare_refusal() -> Optional[str]:
    """Say whether this machine refuses what a simulated node needs; probe it for real once.

    The probe runs the nodes' own setup (new mount, UTS and PID namespaces, a tmpfs on /dev/shm, a /proc, a
    hostname, the bind mounts on /etc/hosts and /etc/nsswitch.conf) and checks the hostname it sets.

    Returns:
        None when the machine allows all of it. Otherwise the reason, naming the command and its stderr: the
        platform is not Linux, ``unshare`` or ``sh`` is not installed, or a step failed for lack of privilege
        (EPERM, EACCES).

    Raises:
        SimulatedNodesError: The probe failed for any other reason (a timeout, a wrong hostname, an unknown
            error): that is a fault to fix, not a machine to skip.
    """
    if not sys.platform.startswith("linux"):
        return f"simulated nodes need Linux namespaces, but the platform is {sys.platform}"
    for tool in ("unshare", "sh"):
        if shutil.which(tool) is None:
            return f"simulated nodes need `{tool}`, but it is not on PATH: PATH={os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="simulated-nodes-probe-") as directory:
        hosts, nsswitch = _write_node_files(directory, 1)
        command = _node_command(node_name(0), hosts, nsswitch, ["hostname"])
        try:
            probe = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   errors="replace", timeout=_PROBE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise SimulatedNodesError(f"the simulated-node probe did not finish: timeout_s={_PROBE_TIMEOUT_S:g} "
                                      f"command={' '.join(UNSHARE_ARGS)} ...") from e
    if probe.returncode == 0 and probe.stdout.strip() == node_name(0):
        return None
    stderr = probe.stderr.strip()
    if probe.returncode != 0 and any(word in stderr.lower() for word in _REFUSAL_WORDS):
        return (f"this machine refuses the namespaces of a simulated node: command=`{' '.join(UNSHARE_ARGS)} sh -c "
                f"<setup>` returncode={probe.returncode} stderr={stderr!r}")
    raise SimulatedNodesError(f"the simulated-node probe failed: command=`{' '.join(UNSHARE_ARGS)} sh -c <setup>` "
                              f"returncode={probe.returncode} stdout={probe.stdout.strip()!r} stderr={stderr!r}")


def _die_with_parent(parent: int) -> None:
    """Runs in a node's unshare process before exec: a launcher that dies without close() takes its nodes along."""
    # PR_SET_PDEATHSIG = 1: SIGKILL when the thread that started us ends; --kill-child passes it on to the node.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before prctl
        os._exit(1)


def _free_port() -> int:
    # Node 0's agent binds the port shortly after; another process taking it in between makes the job fail loudly.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimulatedJob:
    """One torchrun or msrun job over ``nodes`` simulated nodes of ``nproc_per_node`` ranks each, on this machine.

    Use it as a context manager (leaving it kills every node still running and removes the job's files)::

        with SimulatedJob(2, 2, ["worker.py", "--flag"]) as job:
            job.start()
            results = job.wait(timeout=60)

    Global rank r lives on node ``r // nproc_per_node`` (torchrun's static rendezvous orders ranks by node rank;
    msrun numbers node k's ranks from ``k * nproc_per_node`` when given ``--node_rank``).
    """

    def __init__(self, nodes: int, nproc_per_node: int, args: Sequence[str], env: Optional[Mapping[str, str]] = None,
                 cwd: Optional[str] = None, python: Optional[str] = None, launcher: str = "torchrun") -> None:
        """Describe the job; nothing starts before :meth:`start`.

        Args:
            nodes: Number of simulated nodes, 1 to 254.
            nproc_per_node: Ranks per node, at least 1.
            args: What the launcher runs in each rank: a script and its arguments, or ``["-m", module, ...]``
                (torchrun) or ``["python", "-m", module, ...]`` (msrun).
            env: Variables set on top of this process's environment (which is passed through: PYTHONPATH,
                HYPER_PARALLEL_*, OMP_NUM_THREADS, ...). ``PYTHONUNBUFFERED=1`` is added unless given, so the output
                of a killed node is not lost in its buffers. Each node gets a ``TMPDIR`` of its own in the job's
                temporary directory (torchrun leaves its log directories there), removed with the job. With
                msrun, ``python``'s directory comes first on ``PATH``: msrun starts its ranks with ``python``.
            cwd: Working directory of the nodes; this process's when None.
            python: The interpreter that runs the launcher; ``sys.executable`` when None.
            launcher: ``"torchrun"`` or ``"msrun"`` (MindSpore's, which ``python`` must have; its ranks' logs are
                in the node's output, its scheduler's in ``node0-msrun-logs/scheduler.log`` of
                :attr:`directory` while the job runs).

        Raises:
            ValueError: ``nodes``, ``nproc_per_node``, ``args`` or ``launcher`` is out of range.
        """
        if not 1 <= nodes <= 254:
            raise ValueError(f"`nodes` must be in [1, 254], but got {nodes}")
        if nproc_per_node < 1:
            raise ValueError(f"`nproc_per_node` must be at least 1, but got {nproc_per_node}")
        if not args:
            raise ValueError("`args` must name what the ranks run, but got an empty list")
        if launcher not in LAUNCHERS:
            raise ValueError(f"`launcher` must be one of {', '.join(LAUNCHERS)}, but got {launcher!r}")
        self.nodes = nodes
        self.nproc_per_node = nproc_per_node
        self.args = list(args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd
        self.python = python or sys.executable
        self.launcher = launcher
        if launcher == "msrun":
            self.env["PATH"] = os.path.dirname(self.python) + os.pathsep + self.env.get("PATH", "")
        self.port: Optional[int] = None
        self._dir: Optional[str] = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[str] = []
        self._results: Optional[list[NodeResult]] = None
        self._pid1s: dict[int, list[int]] = {}  # node -> host PID of its namespace's PID 1, while being killed
        self._killed: set[int] = set()  # nodes ended by kill_node, whose failure is the caller's doing

    @property
    def directory(self) -> Optional[str]:
        """The job's temporary directory (hosts file, nsswitch.conf, per-node output), removed by :meth:`close`;
        None before :meth:`start`."""
        return self._dir

    def __enter__(self) -> SimulatedJob:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Start every node (its setup, then its launcher); returns at once.

        The nodes die with the thread that calls this (PR_SET_PDEATHSIG), so a launcher killed before
        :meth:`close` leaves no node behind; call it from a thread that outlives the job.

        Raises:
            SimulatedNodesError: The job was started before.
            OSError: ``unshare`` could not be executed.
        """
        if self._dir is not None:
            raise SimulatedNodesError(f"a simulated job starts once: port={self.port}")
        self._dir = tempfile.mkdtemp(prefix="simulated-nodes-")
        hosts, nsswitch = _write_node_files(self._dir, self.nodes)
        self.port = _free_port()
        try:
            for k in range(self.nodes):
                launch = self._launch_command(k)
                log = os.path.join(self._dir, f"{node_name(k)}.log")
                self._logs.append(log)
                # The node's own TMPDIR, removed with the job: torchrun leaves its log directories there.
                tmp = os.path.join(self._dir, f"{node_name(k)}-tmp")
                os.mkdir(tmp)
                env = {**self.env, "TMPDIR": tmp}
                with open(log, "wb") as out:
                    # start_new_session: a terminal's Ctrl-C reaches this process only, whose close() ends the nodes.
                    self._procs.append(subprocess.Popen(
                        _node_command(node_name(k), hosts, nsswitch, launch), stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.cwd, start_new_session=True,
                        preexec_fn=functools.partial(_die_with_parent, os.getpid())))
        except BaseException:
            self.close()
            raise

    def _launch_command(self, k: int) -> list[str]:
        """The command node ``k`` runs once set up: its launcher, node 0 hosting the rendezvous (torchrun's store,
        msrun's scheduler) on :attr:`port`."""
        if self.launcher == "torchrun":
            return [self.python, "-m", "torch.distributed.run", "--nnodes", str(self.nodes), "--node-rank", str(k),
                    "--nproc-per-node", str(self.nproc_per_node), "--rdzv-backend", "static",
                    "--master-addr", node_name(0), "--master-port", str(self.port), *self.args]
        assert self._dir is not None
        # The master as an address: msrun would resolve a name itself, and the scheduler binds what it is given.
        return [self.python, "-c", _MSRUN_NODE, "master" if k == 0 else "worker",
                f"--worker_num={self.nodes * self.nproc_per_node}", f"--local_worker_num={self.nproc_per_node}",
                f"--master_addr={node_address(0)}", f"--master_port={self.port}", f"--node_rank={k}",
                "--join=True", f"--log_dir={os.path.join(self._dir, f'{node_name(k)}-msrun-logs')}", *self.args]

    def output(self, k: int) -> str:
        """Return what node ``k`` has written so far (stdout and stderr together).

        Args:
            k: The node index.

        Returns:
            The node's output up to now; its final output once it has ended.

        Raises:
            SimulatedNodesError: The job has not been started, or its files are gone (after :meth:`close`; use the
                results of :meth:`wait` then).
        """
        if self._dir is None or not os.path.isdir(self._dir):
            raise SimulatedNodesError(f"a simulated job's output is read between start() and close(): node={k}")
        with open(self._logs[k], "rb") as f:
            return f.read().decode("utf-8", errors="replace")

    def poll(self) -> list[Optional[int]]:
        """Return each node's exit status, None for the nodes still running (see :attr:`NodeResult.returncode`).

        Raises:
            SimulatedNodesError: The job has not been started.
        """
        if not self._procs:
            raise SimulatedNodesError("a simulated job is polled after start()")
        return [p.poll() for p in self._procs]

    def wait_for_paths(self, paths: Sequence[str], timeout: float, running: Optional[Sequence[int]] = None) -> None:
        """Wait until every one of ``paths`` exists (files the ranks create to say where they are), while the nodes
        of ``running`` (every node when None) keep running.

        Args:
            paths: The files to wait for.
            timeout: Seconds to wait at most.
            running: The nodes that must not end meanwhile.

        Raises:
            SimulatedNodesError: The timeout passed, or a node of ``running`` ended (the message has the nodes'
                output and the paths still missing).
        """
        nodes = range(self.nodes) if running is None else running
        deadline = time.monotonic() + timeout
        while True:
            missing = [path for path in paths if not os.path.exists(path)]
            if not missing:
                return
            ended = [k for k, code in enumerate(self.poll()) if k in nodes and code is not None]
            if ended or time.monotonic() >= deadline:
                outputs = "\n".join(f"--- {node_name(k)} ---\n{self.output(k)[-6000:]}" for k in range(self.nodes))
                raise SimulatedNodesError(f"simulated nodes never wrote what was awaited: missing={missing} "
                                          f"ended_nodes={ended} timeout_s={timeout:g}\n{outputs}")
            time.sleep(0.1)

    def namespace_pid(self, k: int) -> int:
        """Return the host PID of node ``k``'s PID 1: ``nsenter -t PID -m -u -p`` runs a command inside the node
        (its /dev/shm, hostname and processes), as MPI's launcher does (simulated_mpi.py).

        Raises:
            SimulatedNodesError: The job has not been started, or node ``k`` is not running.
            IndexError: There is no node ``k``.
        """
        if not self._procs:
            raise SimulatedNodesError(f"a simulated node's PID 1 is looked up after start(): node={k}")
        proc = self._procs[k]
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children", encoding="ascii") as f:
                children = f.read().split()
        except OSError:
            children = []
        if proc.poll() is not None or not children:
            raise SimulatedNodesError(f"a simulated node's PID 1 is looked up while it runs: node={node_name(k)} "
                                      f"returncode={proc.poll()}")
        return int(children[0])

    def kill_node(self, k: int) -> None:
        """Kill node ``k`` like a machine that dies: SIGKILL to its ``unshare`` process.

        ``--kill-child`` then kills the node's PID 1, and with it every process of the node's PID namespace
        (torchrun and its ranks); its /dev/shm goes with its mount namespace. Returns once every process of the node
        has ended (bounded).

        Args:
            k: The node index.

        Raises:
            SimulatedNodesError: The job has not been started.
            IndexError: There is no node ``k``.
        """
        if not self._procs:
            raise SimulatedNodesError(f"a simulated node is killed after start(): node={k}")
        self._killed.add(k)
        self._kill(k)

    def wait(self, timeout: float, failure_grace: Optional[float] = None) -> list[NodeResult]:
        """Wait for every node to end and return their results; then remove the job's files.

        Args:
            timeout: Seconds to wait, counted from this call.
            failure_grace: When not None, the nodes still running this many seconds after some node ended non-zero
                by itself (not by :meth:`kill_node`) are killed (their returncode is ``-SIGKILL``). Without it,
                the surviving nodes of a job whose ranks succeeded wait in torchrun's exit barrier (300 s) for the
                failed node.

        Returns:
            One :class:`NodeResult` per node, in node order.

        Raises:
            SimulatedJobTimeout: Some nodes were still running after ``timeout``: every node still running was
                killed; the error names them and carries every node's result and output.
            SimulatedNodesError: The job has not been started.
        """
        if self._results is not None:
            return self._results
        if not self._procs:
            raise SimulatedNodesError("a simulated job is waited for after start()")
        now = time.monotonic()
        deadline, cut_at = now + timeout, None
        running: list[int] = []
        while True:
            codes = [p.poll() for p in self._procs]
            running = [k for k, code in enumerate(codes) if code is None]
            if not running:
                break
            now = time.monotonic()
            if now >= deadline:
                break
            failed = [k for k, code in enumerate(codes) if code not in (None, 0) and k not in self._killed]
            if failure_grace is not None and failed and cut_at is None:
                cut_at = now + failure_grace
            if cut_at is not None and now >= cut_at:
                running = []  # killed for the failure, not for the timeout
                break
            time.sleep(_POLL_S)
        self._kill_all()
        results = [NodeResult(k, proc.returncode, self.output(k)) for k, proc in enumerate(self._procs)]
        self._results = results
        self.close()
        if running:
            raise SimulatedJobTimeout(timeout, running, results)
        return results

    def close(self) -> None:
        """Kill every node still running, reap them and remove the job's files. Idempotent."""
        self._kill_all()
        if self._dir is not None and os.path.isdir(self._dir):
            shutil.rmtree(self._dir, ignore_errors=True)

    def _kill_all(self) -> None:
        for k in range(len(self._procs)):
            self._kill(k)

    def _kill(self, k: int) -> None:
        """SIGKILL node ``k`` if it runs; return once its unshare process and its PID 1 have ended."""
        proc = self._procs[k]
        if proc.poll() is None:
            # Reaping unshare is not enough: its PID 1 (and with it the namespace's other processes, which the kernel
            # kills before PID 1 ends) may run on for a moment, writing to the job's files. Stopped, unshare cannot
            # fork between the read of its children and the kill.
            proc.send_signal(signal.SIGSTOP)
            try:
                with open(f"/proc/{proc.pid}/task/{proc.pid}/children", encoding="ascii") as f:
                    self._pid1s[k] = [int(pid) for pid in f.read().split()]
            except OSError:
                pass  # unshare ended meanwhile: it waited for its child
            proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + _REAP_TIMEOUT_S
        try:
            proc.wait(timeout=_REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            # SIGKILL of a process that does not end within seconds is a kernel fault; say so instead of hanging.
            raise SimulatedNodesError(f"a SIGKILLed simulated node did not end: node={node_name(k)} pid={proc.pid} "
                                      f"timeout_s={_REAP_TIMEOUT_S:g}") from e
        for pid in self._pid1s.pop(k, []):
            while process_alive(pid):
                if time.monotonic() > deadline:
                    raise SimulatedNodesError(f"a SIGKILLed simulated node's PID 1 did not end: node={node_name(k)} "
                                              f"pid={pid} timeout_s={_REAP_TIMEOUT_S:g}")
                time.sleep(_POLL_S)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended: its namespace's processes are gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


class _LinePrinter:
    """Prints the nodes' output as it comes, a whole line at a time, each prefixed by ``[node{k}]``."""

    def __init__(self, nodes: int) -> None:
        self._printed = [0] * nodes  # characters of each node's output printed so far

    def emit(self, k: int, text: str, final: bool) -> None:
        """Print node ``k``'s complete lines of ``text`` (all of it when ``final``) not printed before."""
        start = self._printed[k]
        end = len(text) if final else text.rfind("\n", start) + 1
        if end > start:
            for line in text[start:end].splitlines():
                print(f"[{node_name(k)}] {line}", flush=True)
            self._printed[k] = end


# Seconds between the command line tool's reads of the nodes' output.
_FOLLOW_S = 0.2


def _follow(job: SimulatedJob, printer: _LinePrinter, stop: threading.Event) -> None:
    """Print the nodes' output while the job runs, until ``stop`` or until the job's files are gone."""
    while not stop.wait(_FOLLOW_S):
        for k in range(job.nodes):
            try:
                text = job.output(k)
            except (SimulatedNodesError, OSError):
                return
            printer.emit(k, text, final=False)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line tool (see the module's docstring for the exit statuses).

    Args:
        argv: The arguments, ``sys.argv[1:]`` when None.

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(
        description="Run a torchrun or msrun job on N simulated nodes x M ranks on this machine (own /dev/shm, "
                    "hostname node{k} resolving to 127.0.1.{k+1}, rendezvous at node0).",
        epilog=f"exit status: 0 every node succeeded, 1 some node failed, 2 bad usage, {EXIT_TIMEOUT} timeout, "
               f"{EXIT_REFUSED} this machine refuses the namespaces")
    parser.add_argument("--nodes", type=int, default=2, help="number of simulated nodes (default 2)")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="ranks per node (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before every node is killed "
                        "(default 600)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="torchrun", help="what starts each node's ranks "
                        "(default torchrun; msrun: MindSpore's, run by this interpreter)")
    parser.add_argument("--failure-grace", type=float, default=10.0, help="seconds the other nodes get to end "
                        "after a node failed, before they are killed (default 10)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then what the launcher runs: a script and its "
                        "arguments, or -m module ... (msrun: python -m module ...)")
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if not args:
        parser.error("what the ranks run must follow `--`, but got nothing")
    if ns.nodes < 1 or ns.nodes > 254 or ns.nproc_per_node < 1:
        parser.error(f"--nodes must be in [1, 254] and --nproc-per-node at least 1, but got {ns.nodes} and "
                     f"{ns.nproc_per_node}")
    reason = unshare_refusal()
    if reason is not None:
        print(reason, file=sys.stderr)
        return EXIT_REFUSED
    # A SIGTERM to the tool ends it through SystemExit, so the context manager kills the nodes.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    printer = _LinePrinter(ns.nodes)
    with SimulatedJob(ns.nodes, ns.nproc_per_node, args, launcher=ns.launcher) as job:
        job.start()
        stop = threading.Event()
        follower = threading.Thread(target=_follow, args=(job, printer, stop), daemon=True)
        follower.start()
        running: list[int] = []
        try:
            results = job.wait(ns.timeout, failure_grace=ns.failure_grace)
        except SimulatedJobTimeout as e:
            results, running = e.results, e.running
        finally:
            stop.set()
            follower.join()
    for r in results:
        printer.emit(r.node, r.output, final=True)
    failed = [r for r in results if r.returncode != 0]
    for r in failed:
        what = "killed by the launcher" if r.returncode == -signal.SIGKILL else "failed"
        print(f"simulated node {what}: node={node_name(r.node)} returncode={r.returncode}", file=sys.stderr)
    print(f"simulated job ended: nodes={ns.nodes} nproc_per_node={ns.nproc_per_node} "
          f"seconds={time.monotonic() - started:.1f}", file=sys.stderr)
    if running:
        print(f"simulated nodes still running after the timeout were killed: timeout_s={ns.timeout:g} "
              f"running={', '.join(node_name(k) for k in running)}", file=sys.stderr)
        return EXIT_TIMEOUT
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
