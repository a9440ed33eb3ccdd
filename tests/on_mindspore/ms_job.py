"""Runs a script on N MindSpore ranks of this machine under ``msrun`` (the mccl backend on CPU) and collects what
each rank reported.

A rank's script appends one JSON line per finished case to ``$HP_MS_RESULTS/rank<r>.jsonl``; a case that hangs
leaves its line missing, and the job is killed at the deadline, so one hang fails the cases it stopped, not the run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JobResult:
    """What a job's ranks reported: ``cases[name][rank]`` is that rank's record of the case."""

    returncode: int
    cases: dict = field(default_factory=dict)
    logs: str = ""
    timed_out: bool = False

    def case(self, name: str, nranks: int) -> list:
        """Every rank's record of case ``name``.

        Raises:
            AssertionError: a rank did not report it (with the job's logs).
        """
        records = self.cases.get(name, {})
        missing = [r for r in range(nranks) if r not in records]
        assert not missing, (f"ranks {missing} did not finish case {name!r} (returncode={self.returncode} "
                             f"timed_out={self.timed_out})\n{self.logs[-6000:]}")
        return [records[r] for r in range(nranks)]


def run(script: str, nranks: int, timeout: float, env: dict | None = None, args: tuple = ()) -> JobResult:
    """Runs ``script`` on ``nranks`` ranks and returns what they reported.

    Args:
        script: the Python file each rank runs.
        nranks: the number of ranks (msrun workers, all on this machine).
        timeout: seconds before the job is killed.
        env: extra environment variables of the ranks.
        args: the script's arguments.

    Returns:
        The ranks' records and logs.
    """
    workdir = tempfile.mkdtemp(prefix="hp-ms-job-")
    results = os.path.join(workdir, "results")
    logs = os.path.join(workdir, "logs")
    os.makedirs(results)
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["HP_MS_RESULTS"] = results
    # msrun starts `python` from PATH: this interpreter's.
    child_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + child_env.get("PATH", "")
    child_env.setdefault("GLOG_v", "3")   # MindSpore's own logs: errors only
    command = [sys.executable, "-m", "mindspore.parallel.cluster.run", f"--worker_num={nranks}",
               f"--local_worker_num={nranks}", f"--master_port={free_port()}", f"--log_dir={logs}", "--join=True",
               script, *args]
    timed_out = False
    try:
        proc = subprocess.run(command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, start_new_session=True)
        returncode, output = proc.returncode, proc.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as expired:
        timed_out, returncode = True, -9
        output = (expired.stdout or b"").decode(errors="replace")
        subprocess.run(["pkill", "-9", "-f", script], check=False)
    cases: dict = {}
    for rank in range(nranks):
        path = os.path.join(results, f"rank{rank}.jsonl")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                cases.setdefault(record["case"], {})[rank] = record
    text = [output]
    if os.path.isdir(logs):
        for name in sorted(os.listdir(logs)):
            with open(os.path.join(logs, name), errors="replace") as f:
                lines = [line for line in f if not line.startswith(("[WARNING]", "[INFO]"))]
            text.append(f"==== {name}\n" + "".join(lines[-60:]))
    shutil.rmtree(workdir, ignore_errors=True)
    return JobResult(returncode, cases, "\n".join(text), timed_out)
