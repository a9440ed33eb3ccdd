"""The one timing loop that serves every side of a row (ours, gloo, MPI, memcpy), and how its times are combined.

A timed loop is: the side's own barrier, a high-resolution clock started when the barrier returns on this rank,
``iterations`` back-to-back operations (each complete when it returns: the host device's default stream is the
calling thread, and gloo's and MPI's calls wait for their work), the clock stopped. Repetitions alternate the sides, so
that noise on this shared machine hits all of them alike. The reported time of a side is the median over
repetitions of the slowest rank's loop time, divided by ``iterations`` (and by the op's ``time_divisor``).

Only :func:`slowest_rank` needs torch (it imports it when called): the loop itself also times the MindSpore tool
(:mod:`hyper_parallel.perf.mindspore`), whose processes have no torch.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, NamedTuple, Optional


class Side(NamedTuple):
    """One implementation of a row's operation.

    Attributes:
        name: ``"ours"``, ``"in_place"``, ``"low_precision"``, ``"gloo"``, ``"mpi"`` or ``"memcpy"``.
        run: one operation.
        barrier: the barrier that lines the ranks up before its loop (the side's own).
        complete: waits until every operation run so far has finished, before the clock stops (a framework whose
            operations return before they finish: MindSpore's); None where each operation is complete when it
            returns.
    """

    name: str
    run: Callable[[], None]
    barrier: Callable[[], None]
    complete: Optional[Callable[[], None]] = None


def timed_loop(side: Side, iterations: int) -> float:
    """Runs ``side`` ``iterations`` times back to back after its barrier.

    Args:
        side: what to run.
        iterations: how many operations (0 runs only the barrier).

    Returns:
        This rank's seconds from the barrier's return to the last operation's return (its completion, with
        ``side.complete``).
    """
    run = side.run
    side.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    if side.complete is not None:
        side.complete()
    return time.perf_counter() - start


def measure(
    sides: list[Side],
    iterations: int,
    warmup: int,
    repeat: int,
    on_repetition: Callable[[], None] | None = None,
) -> list[list[float]]:
    """Warms every side up, then times ``repeat`` rounds of every side in turn.

    Args:
        sides: the sides, timed in this order within each round.
        iterations: operations per timed loop (``-n``).
        warmup: untimed operations per side first (``-w``).
        repeat: rounds.
        on_repetition: called after each round (progress).

    Returns:
        ``elapsed[round][side]``: this rank's seconds of each timed loop.
    """
    for side in sides:
        timed_loop(side, warmup)
    elapsed = []
    for _ in range(repeat):
        elapsed.append([timed_loop(side, iterations) for side in sides])
        if on_repetition is not None:
            on_repetition()
    return elapsed


def slowest_rank(elapsed: list[list[float]]) -> list[list[float]]:
    """The maximum over ranks of every timed loop (a gloo all_reduce, outside any timed region; collective).

    Args:
        elapsed: this rank's ``elapsed[round][side]``.

    Returns:
        The same shape, each entry the slowest rank's seconds.
    """
    import torch
    import torch.distributed as dist

    table = torch.tensor(elapsed, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return table.tolist()


def time_per_operation_us(loop_seconds: list[float], iterations: int, divisor: int = 1) -> float:
    """The reported time of one side: the median over rounds of ``loop_seconds / iterations / divisor``, in µs.

    Args:
        loop_seconds: the slowest rank's seconds of each round's loop.
        iterations: operations per loop.
        divisor: the op's ``time_divisor`` (2 for a ping-pong's one-way latency).

    Returns:
        Microseconds per operation.

    Raises:
        ValueError: no rounds, or no iterations.
    """
    if not loop_seconds or iterations < 1:
        raise ValueError(f"`loop_seconds` must hold at least one round of at least one iteration, "
                         f"but got {len(loop_seconds)} rounds of {iterations}")
    return statistics.median(loop_seconds) / iterations / divisor * 1e6
