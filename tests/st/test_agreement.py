"""System tests: a call is one decision of every rank, also when a rank gives it up or refuses it on its own.

* A late peer: one rank arrives at an all_reduce well after the others timed out. The ranks that waited raise (one
  ``ShmemTimeoutError`` naming the late rank, the others ``ShmemStateError`` naming the rank that gave the call up),
  then overwrite their input with 99 and run their next call; the late rank's all_reduce must raise too, naming the
  rank that gave it up and why, and never read the tensor that rank took back. The next call (an all_reduce, or an
  all_gather) then returns the same correct result on every rank: the team runs on, its calls numbered alike. On the
  runtime face (symmetric tensors, the root team) and the user API (ordinary tensors), with 1,000 elements and with
  1 M elements (the path that reads the peers' memory), at 2 and 4 ranks.
* A hypothesis sweep on one 3-rank world interleaves late ranks, refusals on some ranks only (a bad op, an
  all_gather input inside another rank's block of the output, a reduce_scatter output inside another rank's part of
  the input) and correct calls, and checks every step on every rank: either every rank raised (with the messages the
  protocol promises), or every rank returned the same correct result.
"""

from __future__ import annotations

import time
import zlib

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import run_case, session
from symm_cases import symm_session

_TIMEOUT_S = 3.0
# Late by half a timeout more than the timeout: the waiting ranks have given the call up when the late rank comes,
# and their next call, which first waits (bounded by the timeout) for every rank to reach the given-up call, sees
# it come half a timeout before that wait would end.
_LATE_S = 1.5 * _TIMEOUT_S
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": str(_TIMEOUT_S)}
_LATE_RANK = 1
_GARBAGE = -7.0
_TAKEN_BACK = 99.0


def _team(ranks: int) -> str:
    return "team_ranks=[" + ",".join(map(str, range(ranks))) + "]"


def _outcome(call) -> dict:
    """Runs ``call``; returns what it did, in a form the parent can compare across ranks."""
    try:
        call()
    except Exception as error:  # every error is compared, none is expected by class alone
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None}


# --------------------------------------------------------------------------
# A late peer (run in the ranks).
# --------------------------------------------------------------------------


def _case_late_peer(face: str, numel: int) -> dict:
    """Rank 1 comes ``_LATE_S`` late to an all_reduce; then every rank's next call is an all_reduce, and after it,
    the same again with an all_gather as the next call. Returns what each call did and what the tensors held."""
    rank, world = dist.get_rank(), dist.get_world_size()
    late = rank == _LATE_RANK
    out: dict = {}
    with (session() if face == "runtime" else symm_session()) as empty:
        if face == "runtime":
            team = shmem.root_team()  # made on first use, which is collective: before anyone is late

            def tensor(n: int) -> torch.Tensor:
                return empty(n)

            def all_reduce(t: torch.Tensor) -> None:
                team.all_reduce(t)

            def all_gather(output: torch.Tensor, input: torch.Tensor) -> None:
                shmem.all_gather(output, input)
        else:
            def tensor(n: int) -> torch.Tensor:
                return torch.empty(n)

            all_reduce, all_gather = symm.shmem_allreduce, symm.shmem_allgather
            # The first call starts the runtime (a bootstrap over gloo): before anyone is late.
            symm.barrier()

        first, second, gather_out = tensor(numel), tensor(numel), tensor(world * numel)
        for next_call in ("all_reduce", "all_gather"):
            first.fill_(10.0 if late else rank + 1.0)
            second.fill_(2.0 + rank)
            gather_out.fill_(_GARBAGE)
            dist.barrier()  # every rank starts the late call together, but the late rank
            if late:
                time.sleep(_LATE_S)
            given_up = _outcome(lambda: all_reduce(first))
            given_up["first_kept"] = bool((first == (10.0 if late else rank + 1.0)).all())
            if not late:
                first.fill_(_TAKEN_BACK)  # taken back: a late peer must never read this
            if next_call == "all_reduce":
                after = _outcome(lambda: all_reduce(second))
                after["sum"] = second.unique().tolist()
            else:
                after = _outcome(lambda: all_gather(gather_out, second))
                after["gathered"] = [gather_out[r * numel:(r + 1) * numel].unique().tolist() for r in range(world)]
            # The tensor of the given-up call, once every rank is past it: nobody wrote into it.
            after["first"] = first.unique().tolist()
            out[next_call] = {"given_up": given_up, "after": after}
            dist.barrier()
        # And the team is still in step for an ordinary call.
        second.fill_(rank + 1.0)
        all_reduce(second)
        out["last"] = second.unique().tolist()
    return out


@pytest.mark.parametrize("numel", [1_000, 1 << 20], ids=["1000", "1M"])
@pytest.mark.parametrize("face", ["runtime", "user"])
@pytest.mark.parametrize("nranks", [2, 4])
def test_a_late_peer_fails_the_given_up_call_and_the_team_runs_on(world_factory, nranks: int, face: str,
                                                                  numel: int) -> None:
    results = run_case(world_factory(nranks, _ENV), _case_late_peer, face, numel, timeout=90)
    team = _team(nranks)
    for next_call in ("all_reduce", "all_gather"):
        given_up = [out[next_call]["given_up"] for out in results]
        # Exactly one waiting rank gave the call up (its timeout won the counter); it names the late rank.
        timed_out = [r for r, g in enumerate(given_up) if g["raised"] == "ShmemTimeoutError"]
        assert len(timed_out) == 1 and timed_out[0] != _LATE_RANK, (next_call, given_up)
        giver = timed_out[0]
        message = given_up[giver]["message"]
        for needle in (f"all_reduce timed out at its first sync: {team}", f"missing_ranks=[{_LATE_RANK}]",
                       "(given up for every member)", "it fails on every member, and the team runs on"):
            assert needle in message, (next_call, needle, message)
        # Every other rank, the late one included, fails the call naming who gave it up and why.
        for rank, g in enumerate(given_up):
            assert g["first_kept"], (next_call, rank, g)  # nothing was written into the given-up call's tensor
            if rank == giver:
                continue
            assert g["raised"] == "ShmemStateError", (next_call, rank, g)
            for needle in (f"all_reduce was given up by a member at its first sync: {team}",
                           f"sync was given up by rank {giver} (it timed out)",
                           "it fails on every member, and the team runs on from the next call"):
                assert needle in g["message"], (next_call, rank, needle, g["message"])
        # The next call: the same correct result on every rank.
        for rank, out in enumerate(results):
            after = out[next_call]["after"]
            assert after["raised"] is None, (next_call, rank, after)
            if next_call == "all_reduce":
                assert after["sum"] == [float(sum(2.0 + r for r in range(nranks)))], (next_call, rank, after)
            else:
                assert after["gathered"] == [[2.0 + r] for r in range(nranks)], (next_call, rank, after)
            assert after["first"] == ([10.0] if rank == _LATE_RANK else [_TAKEN_BACK]), (next_call, rank, after)
    for rank, out in enumerate(results):
        assert out["last"] == [float(nranks * (nranks + 1) // 2)], (rank, out["last"])


# --------------------------------------------------------------------------
# The sweep: late ranks, refusals on some ranks and correct calls, interleaved.
# --------------------------------------------------------------------------

_SWEEP_RANKS = 3
_SWEEP_TIMEOUT_S = 2.0   # margins of a second either side of a late rank: a loaded 2-core machine keeps them
_SWEEP_LATE_S = 1.5 * _SWEEP_TIMEOUT_S
_SWEEP_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "16M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": str(_SWEEP_TIMEOUT_S)}
# A few elements (through the staging area), and more than the reduce path's peer-memory threshold (64 KiB).
_SWEEP_SIZES = st.sampled_from([5, 20_000])
_RULES = {
    "bad_op": "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'",
    "all_gather_overlap": "`input` must not overlap `output` except as this rank's own part",
    "reduce_scatter_overlap": "`output` must be this rank's part of `input` or not overlap it",
}
_OP_OF_RULE = {"bad_op": "all_reduce", "all_gather_overlap": "all_gather", "reduce_scatter_overlap": "reduce_scatter"}

_STEPS = st.one_of(
    st.tuples(st.just("correct"), st.sampled_from(["all_reduce", "all_gather"]), _SWEEP_SIZES),
    st.tuples(st.just("late"), st.sampled_from(["all_reduce", "all_gather"]), _SWEEP_SIZES,
              st.frozensets(st.integers(0, _SWEEP_RANKS - 1), min_size=1, max_size=_SWEEP_RANKS - 1)),
    st.tuples(st.just("refused"), st.sampled_from(sorted(_RULES)),
              st.frozensets(st.integers(0, _SWEEP_RANKS - 1), min_size=1, max_size=_SWEEP_RANKS)),
)


def _rank_input(rank: int, step: int, numel: int) -> torch.Tensor:
    """Small integers in float32: every sum of a few ranks is exact; each rank's and step's differ."""
    return ((torch.arange(numel) * (rank + 3) + step) % 17 + 32 * rank).to(torch.float32)


def _digest(t: torch.Tensor) -> int:
    return zlib.crc32(t.numpy().tobytes())


def _case_steps(steps: list) -> list:
    """Runs ``steps`` in order on this rank; returns one outcome per step: what it raised (and whether its tensors
    were left as they were), or whether its result is right and a digest of it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    symm.barrier()  # the first one starts the runtime (a bootstrap over gloo): before anyone is late
    outcomes = []
    for index, step in enumerate(steps):
        kind = step[0]
        if kind in ("correct", "late"):
            collective, numel = step[1], step[2]
            mine = _rank_input(rank, index, numel)
            everyone = [_rank_input(r, index, numel) for r in range(world)]
            if collective == "all_reduce":
                result, expected = mine.clone(), torch.stack(everyone).sum(0)

                def call(result=result) -> None:
                    symm.shmem_allreduce(result)

                untouched = mine
            else:
                result, expected = torch.full((world * numel,), _GARBAGE), torch.cat(everyone)

                def call(result=result, mine=mine) -> None:
                    symm.shmem_allgather(result, mine)

                untouched = torch.full_like(result, _GARBAGE)
            if kind == "late":
                dist.barrier()  # the late ranks are late against ranks that start together
                if rank in step[3]:
                    time.sleep(_SWEEP_LATE_S)
        else:
            rule, refusing = step[1], rank in step[2]
            other = (rank + 1) % world  # another rank's block: peers write it while this rank would read it
            if rule == "bad_op":
                result = _rank_input(rank, index, 8)
                untouched = result.clone()

                def call(result=result, op="prod" if refusing else "sum") -> None:
                    symm.shmem_allreduce(result, op)
            elif rule == "all_gather_overlap":
                result = torch.full((3 * world,), _GARBAGE)
                data = result[3 * other:3 * other + 3] if refusing else _rank_input(rank, index, 3)
                untouched = result.clone()

                def call(result=result, data=data) -> None:
                    symm.shmem_allgather(result, data)
            else:
                whole = _rank_input(rank, index, 3 * world)
                result = whole[3 * other:3 * other + 3] if refusing else torch.full((3,), _GARBAGE)
                snapshot = (whole.clone(), result.clone())

                def call(result=result, whole=whole) -> None:
                    symm.shmem_reduce_scatter(result, whole)

                untouched = None
        outcome = _outcome(call)
        if outcome["raised"] is not None:
            if kind == "refused" and rule == "reduce_scatter_overlap":
                outcome["untouched"] = torch.equal(whole, snapshot[0]) and torch.equal(result, snapshot[1])
            else:
                outcome["untouched"] = torch.equal(result, untouched)
            if kind == "late":
                # Taken back: a late peer must never read it.
                (result if collective == "all_reduce" else mine).fill_(_TAKEN_BACK)
        elif kind != "refused":
            outcome["right"] = torch.equal(result, expected)
            outcome["digest"] = _digest(result)
        outcomes.append(outcome)
    return outcomes


def _case_shutdown() -> None:
    symm.shutdown()


def _check_step(step: tuple, outcomes: list, counts: dict) -> None:
    """One step is one decision of every rank: every rank raised as the protocol says, or every rank returned the
    same correct result."""
    kind, team = step[0], _team(_SWEEP_RANKS)
    raised = [o["raised"] for o in outcomes]
    if all(r is None for r in raised) and kind != "refused":
        assert all(o["right"] for o in outcomes), (step, outcomes)
        assert len({o["digest"] for o in outcomes}) == 1, (step, outcomes)
        counts[kind + " ran"] += 1
        return
    # Otherwise every rank raised, and no rank's tensors were written.
    assert all(r is not None for r in raised), (step, outcomes)
    assert all(o["untouched"] for o in outcomes), (step, outcomes)
    assert kind != "correct", (step, outcomes)  # a correct call among ranks in step always runs
    counts[kind + " raised"] += 1
    if kind == "refused":
        rule, by = step[1], min(step[2])
        messages = {o["message"] for o in outcomes}
        assert len(messages) == 1, (step, outcomes)  # the same error on every rank
        message = messages.pop()
        assert message.startswith(_RULES[rule]), (step, message)
        assert f"(refused by rank {by}: op={_OP_OF_RULE[rule]} {team}; every member fails this call)" in message, \
            (step, message)
        assert set(raised) == {"ShmemValueError"}, (step, outcomes)
        return
    # A late step: exactly one waiting rank gave the call up, naming the late ranks; every other rank names it.
    op, late = step[1], sorted(step[3])
    timed_out = [r for r, name in enumerate(raised) if name == "ShmemTimeoutError"]
    assert len(timed_out) == 1 and timed_out[0] not in late, (step, outcomes)
    giver = timed_out[0]
    message = outcomes[giver]["message"]
    assert f"{op} timed out at its first sync: {team}" in message, (step, message)
    assert "missing_ranks=[" + ",".join(map(str, late)) + "]" in message, (step, message)
    for rank, o in enumerate(outcomes):
        if rank != giver:
            assert o["raised"] == "ShmemStateError", (step, rank, o)
            assert f"{op} was given up by a member at its first sync: {team}" in o["message"], (step, rank, o)
            assert f"sync was given up by rank {giver} (it timed out)" in o["message"], (step, rank, o)


def test_no_call_returns_a_result_its_peers_did_not_compute_with_it(world_factory) -> None:
    world = world_factory(_SWEEP_RANKS, _SWEEP_ENV)
    counts = {f"{kind} {what}": 0 for kind in ("correct", "late", "refused") for what in ("ran", "raised")}

    # The schedule is drawn here and run in the ranks, so that every rank runs the same calls. No shrinking: each
    # late step costs a timeout and a half.
    @settings(max_examples=12, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(steps=st.lists(_STEPS, min_size=1, max_size=4))
    def sweep(steps: list) -> None:
        results = world.run(_case_steps, steps, timeout=60)
        for index, step in enumerate(steps):
            _check_step(step, [results[rank][index] for rank in range(_SWEEP_RANKS)], counts)

    try:
        sweep()
        world.run(_case_shutdown, timeout=60)
    except BaseException:
        world.close()
        raise
    # The sweep reached every kind of step, and the late ranks made calls fail (a late rank that came before the
    # timeout under load would only make its call run everywhere).
    assert counts["correct ran"] and counts["refused raised"] and counts["late raised"], counts
    assert counts["correct raised"] == 0 and counts["refused ran"] == 0, counts
