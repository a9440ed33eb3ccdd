"""Tests of the system-test harness itself (tests/st/harness.py).

The ``_case_*`` functions run inside the spawned ranks; they are module-level
so that they pickle by reference, which also checks that test modules of this
directory are importable in the children.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

from harness import CaseOutput, CaseTimeout, RankFailure, World

_HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_rank_and_sum() -> tuple[int, int, int]:
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t)
    return rank, size, int(t.item())


def _case_echo(a: int, b: list[str], *, scale: int = 1, tag: str = "") -> dict[str, object]:
    return {"rank": dist.get_rank(), "a": a * scale, "b": b, "tag": tag}


def _case_raise_on(bad_rank: int, text: str) -> int:
    if dist.get_rank() == bad_rank:
        raise ValueError(text)
    return dist.get_rank()


class _UnpicklableError(Exception):
    """An exception that cannot cross a process boundary by pickling."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lock = threading.Lock()


def _case_raise_unpicklable(text: str) -> None:
    raise _UnpicklableError(text)


def _case_write_stderr(text: str) -> int:
    rank = dist.get_rank()
    # os.write bypasses Python's sys.stderr, like C/C++ code writing to fd 2.
    os.write(2, f"{text} from fd2 of rank {rank}\n".encode())
    print(f"{text} from sys.stderr of rank {rank}", file=sys.stderr)
    return rank


def _case_write_stderr_then_fail(text: str) -> None:
    os.write(2, f"{text} before failing\n".encode())
    raise RuntimeError("failing after writing")


def _case_sleep_on(rank: int, seconds: float) -> int:
    if dist.get_rank() == rank:
        time.sleep(seconds)
    return dist.get_rank()


def _case_exit_on(rank: int, code: int) -> int:
    if dist.get_rank() == rank:
        os.write(2, b"last words before _exit\n")
        os._exit(code)
    return dist.get_rank()


def _case_getenv(name: str) -> str | None:
    return os.environ.get(name)


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [1, 2, 4, 8])
def test_values_come_back_in_rank_order(world_factory, nranks: int) -> None:
    world = world_factory(nranks)
    assert world.nranks == nranks and world.alive
    results = world.run(_case_rank_and_sum, timeout=30)
    expected_sum = nranks * (nranks + 1) // 2
    assert results == [(r, nranks, expected_sum) for r in range(nranks)]


def test_factory_reuses_the_world(world_factory) -> None:
    assert world_factory(2) is world_factory(2)


def test_args_and_kwargs_pass_through(world_factory) -> None:
    world = world_factory(2)
    results = world.run(_case_echo, 21, ["x", "y"], scale=2, tag="t")
    assert results == [{"rank": r, "a": 42, "b": ["x", "y"], "tag": "t"} for r in range(2)]


def test_exception_on_one_rank_is_reported_and_world_survives(world_factory) -> None:
    world = world_factory(2)
    with pytest.raises(RankFailure) as excinfo:
        world.run(_case_raise_on, 1, "boom 4711 on the second rank", timeout=30)
    message = str(excinfo.value)
    assert excinfo.value.ranks == [1]
    assert "rank 1" in message and "rank 0 " not in message
    assert "ValueError: boom 4711 on the second rank" in message
    assert "_case_raise_on" in message  # the full traceback, not only the message
    assert world.alive and world_factory(2) is world
    assert world.run(_case_rank_and_sum) == [(0, 2, 3), (1, 2, 3)]


def test_unpicklable_exception_reaches_the_parent(world_factory) -> None:
    world = world_factory(2)
    with pytest.raises(RankFailure) as excinfo:
        world.run(_case_raise_unpicklable, "cannot pickle 0815")
    assert excinfo.value.ranks == [0, 1]
    assert "_UnpicklableError: cannot pickle 0815" in str(excinfo.value)
    assert world.alive


def test_unpicklable_case_leaves_the_world_usable(world_factory) -> None:
    world = world_factory(2)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        world.run(lambda: 1)  # not picklable by reference
    assert world.run(_case_rank_and_sum) == [(0, 2, 3), (1, 2, 3)]


def test_capture_stderr_catches_fd_level_writes(world_factory) -> None:
    world = world_factory(2)
    outputs = world.run(_case_write_stderr, "hello", capture_stderr=True)
    assert all(isinstance(o, CaseOutput) for o in outputs)
    assert [o.value for o in outputs] == [0, 1]
    for rank, out in enumerate(outputs):
        assert f"hello from fd2 of rank {rank}\n" in out.stderr
        assert f"hello from sys.stderr of rank {rank}\n" in out.stderr
    # Each case captures only its own output, and fd 2 was restored in between.
    assert world.run(_case_write_stderr, "uncaptured") == [0, 1]
    outputs = world.run(_case_write_stderr, "again", capture_stderr=True)
    assert "hello" not in outputs[1].stderr and "uncaptured" not in outputs[1].stderr
    assert "again from fd2 of rank 1" in outputs[1].stderr


def test_captured_stderr_is_part_of_a_failure(world_factory) -> None:
    world = world_factory(2)
    with pytest.raises(RankFailure) as excinfo:
        world.run(_case_write_stderr_then_fail, "last words", capture_stderr=True)
    message = str(excinfo.value)
    assert "RuntimeError: failing after writing" in message
    assert "last words before failing" in message


def test_hang_times_out_and_factory_respawns(world_factory) -> None:
    world = world_factory(2)
    start = time.monotonic()
    with pytest.raises(CaseTimeout) as excinfo:
        world.run(_case_sleep_on, 1, 1000, timeout=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 15
    assert excinfo.value.ranks == [1]
    message = str(excinfo.value)
    assert "rank 1" in message
    # The stack dump shows where rank 1 hung.
    assert "_case_sleep_on" in excinfo.value.stacks[1] and "_case_sleep_on" in message
    assert not world.alive
    with pytest.raises(RuntimeError, match="dead"):
        world.run(_case_rank_and_sum)

    fresh = world_factory(2)
    assert fresh is not world and fresh.alive
    assert fresh.run(_case_rank_and_sum) == [(0, 2, 3), (1, 2, 3)]


def test_dying_rank_is_reported_promptly(world_factory) -> None:
    world = world_factory(2)
    start = time.monotonic()
    with pytest.raises(RankFailure) as excinfo:
        world.run(_case_exit_on, 1, 3, timeout=60, capture_stderr=True)
    assert time.monotonic() - start < 10
    assert excinfo.value.exitcodes == {1: 3}
    message = str(excinfo.value)
    assert "rank 1" in message and "exit code 3" in message
    assert "last words before _exit" in message  # captured stderr of the dead rank
    assert not world.alive
    assert world_factory(2).run(_case_rank_and_sum) == [(0, 2, 3), (1, 2, 3)]


def test_env_context_manager_and_close() -> None:
    with World(1, env={"HPSHMEM_HARNESS_PROBE": "42"}) as world:
        assert world.run(_case_getenv, "HPSHMEM_HARNESS_PROBE") == ["42"]
        procs = list(world._procs)
        tmpdir = world._tmpdir
    assert not world.alive
    assert all(not p.is_alive() for p in procs)
    assert all(p.exitcode == 0 for p in procs)  # clean shutdown, not killed
    assert not os.path.exists(tmpdir)
    world.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        world.run(_case_getenv, "HOME")


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # zombie: exited, not reaped
    except FileNotFoundError:
        return True


def test_ranks_exit_when_the_parent_dies(tmp_path) -> None:
    # A parent that starts a 1-rank world, makes the rank hang in a case and is
    # then killed with SIGKILL, so that no cleanup code of it runs.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {_HERE!r})
        import time
        from harness import World
        world = World(1)
        print(world.pids[0], flush=True)
        world.run(time.sleep, 1000, timeout=1000)  # a stdlib case keeps this parent light
        """
    )
    # TMPDIR: the killed parent cannot remove its world's temp dir, keep it under tmp_path.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        rank_pid = int(parent.stdout.readline())
        time.sleep(0.5)  # let the case start
        assert not _pid_gone(rank_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _pid_gone(rank_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pid_gone(rank_pid)
    finally:
        parent.kill()
        parent.wait()
