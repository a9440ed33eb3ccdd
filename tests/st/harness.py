"""Multi-process system-test harness.

A :class:`World` starts ``nranks`` real ranks once (each an independent Python
process with a gloo process group over a ``FileStore``) and then runs many
test cases in them, so a test module pays the cost of starting a rank only once
per world size. The ranks fork from multiprocessing's fork server, which has
imported torch once for the test process: a rank starts without importing
torch again (the import is most of a rank's start, and the suites start
hundreds of ranks).

Each case runs ``fn(*args, **kwargs)`` on every rank. ``fn`` must be a
module-level function of an importable module (typically the test module
itself, which pytest's default "prepend" import mode makes importable in the
children); it finds its rank and world size through ``torch.distributed``.

Failure model:

* an exception in ``fn`` on some ranks -> :class:`RankFailure` carrying each
  failed rank's formatted traceback; the world stays usable;
* a rank that does not answer within the case timeout -> Python stack dumps
  of the silent ranks are collected, the world is killed and
  :class:`CaseTimeout` is raised;
* a rank process that dies during a case -> :class:`RankFailure` with its exit
  code, raised as soon as the death is seen; the world is killed.

A killed world reports ``alive == False``; the ``world_factory`` fixture in
``conftest.py`` replaces it on the next request.

The ranks see the test process's environment as it is when the world starts,
with the world's variables applied, as a spawned process would; torch itself
was imported by the fork server with the test process's environment, so a
world's variables must not be ones that torch reads at import (the package's
are read when it is imported or initialized, in the rank).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from typing import Any, Callable, NamedTuple

__all__ = ["CaseOutput", "CaseTimeout", "RankFailure", "World", "WorldStartError"]

# How long close() lets workers shut down cleanly before killing them.
_CLOSE_GRACE_S = 10.0
# How long to wait for faulthandler to write a stack dump after SIGUSR1.
_DUMP_WAIT_S = 3.0

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


class CaseOutput(NamedTuple):
    """One rank's result of a case run with ``capture_stderr=True``.

    Attributes:
        value: What ``fn`` returned on the rank.
        stderr: Everything written to file descriptor 2 during the case,
            decoded as UTF-8 (undecodable bytes replaced).
    """

    value: Any
    stderr: str


class RankFailure(AssertionError):
    """One or more ranks raised, died or sent an unreadable reply.

    Attributes:
        failures: Rank -> formatted traceback (or description) for each rank
            whose ``fn`` raised or whose reply could not be transferred.
        exitcodes: Rank -> exit code for each rank whose process died during
            the case (negative: killed by that signal number).
        ranks: Sorted ranks of both kinds.
    """

    def __init__(self, message: str, failures: dict[int, str], exitcodes: dict[int, int | None]):
        super().__init__(message)
        self.failures = failures
        self.exitcodes = exitcodes
        self.ranks = sorted(set(failures) | set(exitcodes))


class CaseTimeout(AssertionError):
    """Some ranks did not answer a case within its timeout; the world was killed.

    Attributes:
        ranks: Sorted ranks that did not answer.
        stacks: Rank -> Python stack dump taken just before the kill.
        failures: Rank -> traceback for ranks that raised meanwhile (they are
            often the reason the others hang in a collective).
    """

    def __init__(self, message: str, ranks: list[int], stacks: dict[int, str], failures: dict[int, str]):
        super().__init__(message)
        self.ranks = ranks
        self.stacks = stacks
        self.failures = failures


class WorldStartError(RuntimeError):
    """The ranks of a world could not be started and connected."""


# --------------------------------------------------------------------------
# Worker side (runs in the ranks).
# --------------------------------------------------------------------------


def _watch_parent(alive: multiprocessing.connection.Connection) -> None:
    """Exit the worker once the test process is gone, even while a case hangs: the test process holds the only
    writing end of ``alive``, so reading it ends when that process does. (The worker's parent is the fork server,
    which outlives the test process while its ranks live.)"""
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(70)


def _run_case(
    fn: Callable[..., Any], args: tuple, kwargs: dict, stderr_path: str | None
) -> tuple[str, Any, str | None]:
    """Run one case, optionally with fd 2 redirected into ``stderr_path``.

    Returns:
        ``("ok", value, stderr)`` or ``("err", formatted_traceback, stderr)``.
    """
    saved_fd = None
    capture = None
    if stderr_path is not None:
        sys.stderr.flush()
        capture = open(stderr_path, "w+b")
        saved_fd = os.dup(2)
        # dup2 rather than swapping sys.stderr so that C/C++ writes are caught.
        os.dup2(capture.fileno(), 2)
    try:
        try:
            result: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # pytest.fail() & co. are BaseExceptions too
            # Drop this frame so the traceback starts in fn.
            tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            result = ("err", "".join(traceback.format_exception(type(exc), exc, tb)))
    finally:
        stderr = None
        if capture is not None:
            # The runtime's records reach stderr through Python's logging, from a thread of the package's: hand
            # over what the case logged before the capture ends.
            runtime_logs = sys.modules.get("hyper_parallel.core.multicore.runtime_logs")
            if runtime_logs is not None:
                runtime_logs.flush()
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            capture.seek(0)
            stderr = capture.read().decode("utf-8", errors="replace")
            capture.close()
    return result[0], result[1], stderr


def _worker_main(
    rank: int,
    nranks: int,
    environ: dict[str, str],
    tmpdir: str,
    conn: multiprocessing.connection.Connection,
    alive: multiprocessing.connection.Connection,
) -> None:
    """Body of one rank: init the process group, then serve cases until "stop"."""
    # The test process's environment with the world's variables, in place before the package reads them; the fork
    # server's own is the test process's at the server's start.
    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None  # TMPDIR is read again, as in a fresh interpreter
    # Ctrl-C goes to the whole process group; the parent decides what to do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(alive,), name="harness-parent-watch", daemon=True).start()
    stack_file = open(os.path.join(tmpdir, f"stacks.{rank}"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # On a crash (SIGSEGV, abort) print the Python stacks to fd 2, captured or not.
    faulthandler.enable(all_threads=True)
    stderr_path = os.path.join(tmpdir, f"stderr.{rank}")

    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            store=dist.FileStore(os.path.join(tmpdir, "store"), nranks),
            rank=rank,
            world_size=nranks,
        )
    except BaseException:
        conn.send_bytes(pickle.dumps(("err", traceback.format_exc(), None)))
        return
    conn.send_bytes(pickle.dumps(("ready", os.getpid(), None)))

    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):  # parent gone
            os._exit(71)
        try:
            msg = pickle.loads(raw)
        except BaseException:
            conn.send_bytes(pickle.dumps(("err", "could not unpickle the case:\n" + traceback.format_exc(), None)))
            continue
        if msg[0] == "stop":
            code = 0
            try:
                dist.destroy_process_group()
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            # Skip interpreter teardown: with torch loaded it costs ~0.5 s of CPU per rank.
            os._exit(code)
        _, fn, args, kwargs, capture = msg
        status, payload, stderr = _run_case(fn, args, kwargs, stderr_path if capture else None)
        try:
            reply = pickle.dumps((status, payload, stderr), protocol=_PICKLE_PROTOCOL)
        except BaseException:
            what = f"could not pickle the return value (a {type(payload).__module__}.{type(payload).__qualname__})"
            reply = pickle.dumps(("err", f"{what}:\n" + traceback.format_exc(), stderr))
        conn.send_bytes(reply)


# --------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------


def _reap(
    procs: list[multiprocessing.process.BaseProcess], conns: list[Any], alive_ends: list[Any], tmpdir: str
) -> None:
    """Kill every process still running, close the pipes, delete temp files."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5.0)
    for c in conns + alive_ends:
        c.close()
    shutil.rmtree(tmpdir, ignore_errors=True)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exit code {code} (killed by signal {-code})"
    return f"exit code {code}"


def _fn_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _rank_context(start_method: str) -> multiprocessing.context.BaseContext:
    """multiprocessing's context for ``start_method``; the fork server's imports torch before it forks a rank."""
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"`start_method` must be 'forkserver' or 'spawn', but got {start_method!r}")
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


class World:
    """``nranks`` ranks with a gloo process group, running cases on demand.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self, nranks: int, env: dict[str, str] | None = None, start_timeout: float = 120,
        start_method: str = "forkserver",
    ) -> None:
        """Start the ranks and wait until all of them joined the process group.

        Args:
            nranks: Number of ranks (processes), >= 1.
            env: Environment variables applied in every rank before the package
                is imported (torch's import: see the module's docstring).
            start_timeout: Seconds to wait for all ranks to be ready.
            start_method: ``"forkserver"``: the ranks fork from the fork server (started once for this process,
                torch imported); ``"spawn"``: fresh interpreters started by the calling thread, for ranks that
                must inherit what only that thread has (a mount namespace it entered).

        Raises:
            ValueError: ``nranks`` < 1, or an unknown ``start_method``.
            WorldStartError: A rank failed, died or did not become ready in time.
        """
        if nranks < 1:
            raise ValueError(f"nranks must be >= 1, got {nranks}")
        ctx = _rank_context(start_method)
        self._nranks = nranks
        self._env = dict(env or {})
        self._dead = False
        self._closed = False
        self._tmpdir = tempfile.mkdtemp(prefix="hpshmem-world-")
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        # The ranks watch this pipe for this process's end (_watch_parent); its writing end stays here until the reap.
        watched_end, alive_end = ctx.Pipe(duplex=False)
        # Kills the ranks if the World is dropped or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _reap, self._procs, self._conns, [alive_end], self._tmpdir)

        environ = {**os.environ, **self._env}
        try:
            for rank in range(nranks):
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(rank, nranks, environ, self._tmpdir, child_end, watched_end),
                    name=f"hpshmem-rank{rank}",
                    daemon=True,
                )
                proc.start()
                # Drop our copy of the child's end so that its death shows up as EOF.
                child_end.close()
                self._procs.append(proc)
                self._conns.append(parent_end)
            watched_end.close()
            # A rank that fails to start leaves the others blocked in init, so stop at the first error.
            replies, exitcodes, pending = self._gather(time.monotonic() + start_timeout, stop_on_error=True)
        except BaseException:
            watched_end.close()
            self._kill()
            raise

        errors = {r: rep[1] for r, rep in replies.items() if rep[0] != "ready"}
        if errors or exitcodes or pending:
            # Stacks only matter for a plain start timeout; otherwise the error is the cause.
            stacks = self._dump_stacks(pending) if pending and not (errors or exitcodes) else {}
            self._kill()
            parts = [f"could not start a world of {nranks} ranks"]
            parts += [f"rank {r} failed during start:\n{tb}" for r, tb in sorted(errors.items())]
            parts += [f"rank {r} died during start ({_describe_exit(c)})" for r, c in sorted(exitcodes.items())]
            parts += [f"rank {r} not ready after {start_timeout} s; stack:\n{stacks[r]}" for r in sorted(stacks)]
            raise WorldStartError("\n".join(parts))

    # ------------------------------------------------------------------ API

    @property
    def nranks(self) -> int:
        """Number of ranks in this world."""
        return self._nranks

    @property
    def env(self) -> dict[str, str]:
        """A copy of the environment applied in the ranks."""
        return dict(self._env)

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the ranks, in rank order."""
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        """True while the world can run cases (not closed, not killed, all ranks up)."""
        return not (self._dead or self._closed) and all(p.is_alive() for p in self._procs)

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float = 60.0,
        capture_stderr: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank and collect the results.

        Args:
            fn: Module-level function (pickled by reference); it learns its
                rank through ``torch.distributed``.
            *args: Positional arguments for ``fn`` (pickled).
            timeout: Seconds all ranks together may take before the case is
                declared hung.
            capture_stderr: Redirect file descriptor 2 of each rank into a file
                for the duration of the case and return what was written.
            **kwargs: Keyword arguments for ``fn`` (pickled); ``timeout`` and
                ``capture_stderr`` are taken by ``run`` itself.

        Returns:
            The return values in rank order, or with ``capture_stderr`` a list
            of :class:`CaseOutput` in rank order.

        Raises:
            RuntimeError: The world is dead or closed.
            RankFailure: Some ranks raised (world stays usable), or some rank
                process died (world killed).
            CaseTimeout: Some ranks did not answer within ``timeout`` (world
                killed).
            pickle.PicklingError, TypeError, AttributeError: The case could not
                be pickled (nothing was sent, world stays usable).
        """
        if not self.alive:
            raise RuntimeError(f"world of {self._nranks} ranks is {'closed' if self._closed else 'dead'}")
        # Pickle once, before anything is sent, so that a bad case leaves the world in sync.
        payload = pickle.dumps(("run", fn, args, kwargs, capture_stderr), protocol=_PICKLE_PROTOCOL)
        name = _fn_name(fn)

        try:
            exitcodes: dict[int, int | None] = {}
            for rank, conn in enumerate(self._conns):
                try:
                    conn.send_bytes(payload)
                except OSError:
                    exitcodes[rank] = self._exitcode(rank)
            if exitcodes:
                replies: dict[int, tuple] = {}
                pending: list[int] = []
            else:
                replies, exitcodes, pending = self._gather(time.monotonic() + timeout)
        except BaseException:
            # Interrupted (e.g. KeyboardInterrupt): the ranks are out of sync now.
            self._kill()
            raise

        values: list[Any] = [None] * self._nranks
        failures: dict[int, str] = {}
        for rank, (status, payload_back, stderr) in replies.items():
            if status == "ok":
                values[rank] = CaseOutput(payload_back, stderr or "") if capture_stderr else payload_back
            else:
                text = payload_back
                if stderr:
                    text += f"\n--- stderr of rank {rank} ---\n{stderr}"
                failures[rank] = text

        if exitcodes:
            # A crashing rank's last words (e.g. a C++ abort message) may sit in its capture file.
            partial = self._captured_stderr(list(exitcodes)) if capture_stderr else {}
            self._kill()
            lines = [f"case {name}: rank process died, world killed"]
            for r, c in sorted(exitcodes.items()):
                lines.append(f"rank {r} died ({_describe_exit(c)})")
                if partial.get(r):
                    lines.append(f"--- stderr of rank {r} ---\n{partial[r]}")
            lines += [f"rank {r} failed:\n{tb}" for r, tb in sorted(failures.items())]
            raise RankFailure("\n".join(lines), failures, exitcodes)
        if pending:
            stacks = self._dump_stacks(pending)
            partial = self._captured_stderr(pending) if capture_stderr else {}
            self._kill()
            lines = [f"case {name}: ranks {pending} did not answer within {timeout} s, world killed"]
            for r in pending:
                lines.append(f"--- stack of rank {r} ---\n{stacks[r]}")
                if partial.get(r):
                    lines.append(f"--- stderr of rank {r} ---\n{partial[r]}")
            lines += [f"rank {r} failed:\n{tb}" for r, tb in sorted(failures.items())]
            raise CaseTimeout("\n".join(lines), pending, stacks, failures)
        if failures:
            lines = [f"case {name} failed on ranks {sorted(failures)}"]
            lines += [f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items())]
            raise RankFailure("\n".join(lines), failures, {})
        return values

    def close(self) -> None:
        """Stop the ranks (destroying their process group) and delete temp files.

        Ranks that do not exit within a grace period are killed. Safe to call
        more than once.
        """
        if self._closed:
            return
        self._closed = True
        if not self._dead:
            stop = pickle.dumps(("stop",))
            for conn in self._conns:
                try:
                    conn.send_bytes(stop)
                except OSError:
                    pass
            deadline = time.monotonic() + _CLOSE_GRACE_S
            for proc in self._procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("dead" if self._dead else "alive")
        return f"World(nranks={self._nranks}, env={self._env!r}, {state})"

    # ------------------------------------------------------------- internals

    def _kill(self) -> None:
        """Kill all ranks at once and mark the world dead."""
        self._dead = True
        self._finalizer()

    def _exitcode(self, rank: int) -> int | None:
        proc = self._procs[rank]
        proc.join(5.0)  # it is dying or dead; give the OS a moment to report it
        return proc.exitcode

    def _gather(
        self, deadline: float, stop_on_error: bool = False
    ) -> tuple[dict[int, tuple], dict[int, int | None], list[int]]:
        """Wait for one reply per rank until ``deadline`` or until a rank dies.

        Args:
            deadline: ``time.monotonic()`` value after which to give up.
            stop_on_error: Also stop waiting once some rank replied with an error.

        Returns:
            ``(replies, exitcodes, pending)``: decoded replies by rank, exit
            codes of ranks that died, and ranks that neither replied nor died.
        """
        pending = set(range(self._nranks))
        replies: dict[int, tuple] = {}
        exitcodes: dict[int, int | None] = {}
        while pending and not exitcodes:
            if stop_on_error and any(rep[0] == "err" for rep in replies.values()):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            owner: dict[Any, int] = {}
            for rank in pending:
                owner[self._conns[rank]] = rank
                owner[self._procs[rank].sentinel] = rank
            # Blocks in select(); wakes on a reply, on EOF or on process exit.
            ready = multiprocessing.connection.wait(list(owner), timeout=remaining)
            for obj in ready:
                rank = owner[obj]
                if rank not in pending:
                    continue
                conn = self._conns[rank]
                try:
                    # A dead rank may still have left its reply in the pipe.
                    raw = conn.recv_bytes() if conn.poll() else None
                except (EOFError, OSError):
                    raw = None
                pending.discard(rank)
                if raw is None:
                    exitcodes[rank] = self._exitcode(rank)
                    continue
                try:
                    replies[rank] = pickle.loads(raw)
                except BaseException:
                    why = "could not unpickle the reply in the parent:\n" + traceback.format_exc()
                    replies[rank] = ("err", why, None)
        if exitcodes or (pending and stop_on_error):
            # Collect what the survivors already sent, without waiting for more.
            for rank in list(pending):
                conn = self._conns[rank]
                try:
                    if conn.poll():
                        replies[rank] = pickle.loads(conn.recv_bytes())
                        pending.discard(rank)
                except BaseException:
                    pass
        return replies, exitcodes, sorted(pending)

    def _captured_stderr(self, ranks: list[int]) -> dict[int, str]:
        """Read what ``ranks`` wrote to their stderr capture files so far."""
        out = {}
        for r in ranks:
            try:
                with open(os.path.join(self._tmpdir, f"stderr.{r}"), "rb") as f:
                    out[r] = f.read().decode("utf-8", errors="replace")
            except OSError:
                out[r] = ""
        return out

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Ask ``ranks`` for faulthandler stack dumps and read them back."""
        paths = {r: os.path.join(self._tmpdir, f"stacks.{r}") for r in ranks}
        start = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
        for r in ranks:
            try:
                os.kill(self._procs[r].pid, signal.SIGUSR1)
            except (OSError, TypeError):
                pass
        # faulthandler writes synchronously from its signal handler; wait until
        # every file grew and then stopped growing.
        deadline = time.monotonic() + _DUMP_WAIT_S
        sizes = dict(start)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
            if all(now[r] > start[r] for r in ranks) and now == sizes:
                break
            sizes = now
        stacks = {}
        for r, path in paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(start[r])
                    text = f.read().decode("utf-8", errors="replace")
            except OSError:
                text = ""
            stacks[r] = text or "(no stack dump received)"
        return stacks
