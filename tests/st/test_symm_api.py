"""System tests of the user API's primitives, groups, examples and argument checks (real ranks, gloo groups).

* the examples: the API's first example (only the device changed) and the push and pull examples, run as written;
* primitives with int and one-element tensor offsets, get's direction, every signal and compare op;
* groups: group-local ranks, overlapping DP {0,1},{2,3} and TP {0,2},{1,3} groups in use at once, on two
  streams at once, and mixed with torch.distributed collectives on the other group in the same step;
* every bad argument raises ValueError/TypeError in the project's form and writes nothing.
"""

from __future__ import annotations

import os
import re
import runpy
from collections import UserList
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from st_cases import expect_error, restored_env, run_case
from symm_cases import gathered, rank_input, symm_session

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}
SET, ADD = 0, 1
EQ, GT, LT, NE, GE, LE = range(6)


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _readme_block(heading: str) -> str:
    with open(os.path.join(_REPO, "README.md"), encoding="utf-8") as f:
        section = f.read().split(heading, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"README.md has no python block under {heading!r}"
    return match.group(1)


def _case_readme(code: str) -> None:
    with mock.patch.object(dist, "init_process_group"):  # the harness has initialised it already
        exec(compile(code, "README.md", "exec"), {})
    assert shmem.debug_state()["state"] == "uninitialized"


def _case_example(name: str) -> None:
    runpy.run_path(os.path.join(_REPO, "examples", name), run_name="__main__")
    assert shmem.debug_state()["state"] == "uninitialized"


def _case_primitives() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    with symm_session() as empty:
        buf = empty((world, 8), torch.int64)
        buf.fill_(-1)
        sig = empty(4, torch.int32)
        sig.zero_()
        symm.barrier()
        row = torch.arange(8, dtype=torch.int64) + 100 * rank
        # Tensor offsets (the API takes one-element tensors) for the first half, ints for the second.
        symm.shmem_put(buf, torch.tensor([rank * 8]), row, torch.tensor([0]), torch.tensor([4]), peer)
        symm.shmem_put(buf, rank * 8 + 4, row, 4, 4, torch.tensor(peer))
        symm.shmem_signal_op(sig, 0, 1, ADD, peer)
        symm.shmem_wait_for_signal(buf, sig, 0, 1, EQ)
        left = (rank - 1) % world
        assert torch.equal(buf[left], torch.arange(8, dtype=torch.int64) + 100 * left)
        symm.barrier()
        # Every compare op, against a signal the peer sets.
        symm.shmem_signal_op(sig, 1, torch.tensor([5], dtype=torch.int32), SET, peer)
        for op, value in [(EQ, 5), (GT, 4), (LT, 6), (NE, 0), (GE, 5), (LE, 5)]:
            symm.shmem_wait_for_signal(None, sig, torch.tensor([1]), value, op)
        # put_with_signal: the data is there when the signal is.
        symm.shmem_put_with_signal(buf, rank * 8, row * 2, 0, 8, sig, 2, 7, SET, peer)
        symm.shmem_wait_for_signal(buf, sig, 2, 7, EQ)
        assert torch.equal(buf[left], (torch.arange(8, dtype=torch.int64) + 100 * left) * 2)
        symm.barrier()


def _case_get_direction() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        src = empty(16, torch.float32)
        src.copy_(torch.arange(16.0) + 1000 * rank)
        symm.barrier()
        for target_rank in range(world):
            got = torch.zeros(16)
            symm.shmem_get(got, 4, src, 2, 10, target_rank)
            expected = torch.zeros(16)
            expected[4:14] = torch.arange(2.0, 12.0) + 1000 * target_rank
            assert torch.equal(got, expected), f"from {target_rank}"
        symm.barrier()


def _case_group_local_ranks() -> None:
    rank = dist.get_rank()
    odd = dist.new_group([1, 3])
    even = dist.new_group([0, 2])
    mine = odd if rank % 2 else even
    with symm_session() as empty:
        buf = empty(4, torch.int64)
        buf.zero_()
        symm.barrier()
        if rank in (0, 1):  # group rank 0 writes to group rank 1 of its own group: global rank 2 or 3
            symm.shmem_put(buf, 0, torch.full((4,), rank + 10, dtype=torch.int64), 0, 4, 1, group=mine)
        symm.barrier()
        expected = {2: 10, 3: 11}.get(rank, 0)
        assert buf.eq(expected).all(), (rank, buf)
        expect_error(ValueError, lambda: symm.shmem_put(buf, 0, buf, 0, 1, 2, group=mine),
                     "`target_rank` must be in [0, 2), but got 2")
        symm.barrier()


def _case_overlapping_groups(use_streams: bool, mix_torch: bool) -> None:
    rank = dist.get_rank()
    dp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    tp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    with symm_session():
        symm.barrier()  # acquires the runtime (streams need it) and registers WORLD
        for step in range(3):
            for count in (5, 70_001):
                grads = rank_input(rank, count, torch.float32, salt=step)
                acts = rank_input(rank, count, torch.int64, salt=step + 7)
                ref_grads = grads.clone()
                dist.all_reduce(ref_grads, group=dp)
                ref_acts = torch.cat(gathered(acts, tp))
                out = torch.empty(2 * count, dtype=torch.int64)
                if use_streams:
                    s1, s2 = shmem.Stream(), shmem.Stream()
                    with shmem.stream(s1):
                        symm.shmem_allreduce(grads, group=dp)
                    with shmem.stream(s2):
                        symm.shmem_allgather(out, acts, group=tp)
                    s1.synchronize()
                    s2.synchronize()
                    s1.destroy()
                    s2.destroy()
                elif mix_torch:  # symm on DP, torch.distributed on TP, in the same step
                    symm.shmem_allreduce(grads, group=dp)
                    dist.all_gather_into_tensor(out, acts, group=tp)
                else:
                    symm.shmem_allreduce(grads, group=dp)
                    symm.shmem_allgather(out, acts, group=tp)
                assert torch.equal(grads, ref_grads), f"dp all_reduce, step {step}"
                assert torch.equal(out, ref_acts), f"tp all_gather, step {step}"


def _case_bad_arguments() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session() as empty:
        buf = empty(8, torch.float32)
        buf.fill_(1.0)
        sig = empty(2, torch.int32)
        sig.zero_()
        symm.barrier()
        src = torch.full((8,), 5.0)
        big = torch.zeros(3 * world + 3)
        cases = [
            (ValueError, lambda: symm.shmem_put(buf, 6, src, 0, 4, 0), "`target_offset + size` must be at most target.numel() (8), but got 6 + 4 = 10"),
            (ValueError, lambda: symm.shmem_put(buf, 0, src, 7, 2, 0), "`src_offset + size` must be at most src.numel() (8)"),
            (TypeError, lambda: symm.shmem_put(buf, 0, src.double(), 0, 2, 0), "`src` must have the dtype of `target` (torch.float32), but got torch.float64"),
            (ValueError, lambda: symm.shmem_put(buf, -1, src, 0, 2, 0), "`target_offset` must be non-negative, but got -1"),
            (TypeError, lambda: symm.shmem_put(buf, 0.5, src, 0, 2, 0), "`target_offset` must be an int or a one-element integer tensor, but got float"),
            (TypeError, lambda: symm.shmem_put(buf, torch.tensor([0, 1]), src, 0, 2, 0), "`target_offset` must be an int or a one-element integer tensor"),
            (ValueError, lambda: symm.shmem_put(buf, 0, src, 0, 2, world), f"`target_rank` must be in [0, {world}), but got {world}"),
            (ValueError, lambda: symm.shmem_put(src, 0, src, 0, 2, 0), "`target` must be a symmetric tensor from symm.empty, but got an ordinary tensor"),
            (TypeError, lambda: symm.shmem_signal_op(buf, 0, 1, SET, 0), "`signal` must have dtype torch.int32 or torch.int64, but got torch.float32"),
            (ValueError, lambda: symm.shmem_signal_op(sig, 2, 1, SET, 0), "`signal_offset + size` must be at most signal.numel() (2)"),
            (ValueError, lambda: symm.shmem_signal_op(sig, 0, 1, 2, 0), "`signal_op` must be one of 0 (SET), 1 (ADD), but got 2"),
            (ValueError, lambda: symm.shmem_wait_for_signal(buf, sig, 0, 1, 6), "`compare_op` must be one of 0 (EQ)"),
            (ValueError, lambda: symm.shmem_allreduce(torch.ones(3), op="prod"), "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'"),
            (ValueError, lambda: symm.shmem_allreduce(torch.ones(3, dtype=torch.int32), op="avg"), "`op` must be 'sum', 'max' or 'min' for the integer dtype torch.int32, but got 'avg'"),
            (TypeError, lambda: symm.shmem_allreduce(torch.ones(3, dtype=torch.complex64)), "`tensor` must have one of dtypes"),
            (ValueError, lambda: symm.shmem_allreduce(torch.ones(4, 4).t()), "`tensor` must be contiguous"),
            (ValueError, lambda: symm.shmem_allgather(torch.empty(world * 3 + 1), torch.ones(3)), f"`output_tensor.numel()` must be {world} x input_tensor.numel() ({world * 3}), but got {world * 3 + 1}"),
            (TypeError, lambda: symm.shmem_allgather(torch.empty(world * 3), torch.ones(3, dtype=torch.int32)), "`input_tensor` must have the dtype of `output_tensor`"),
            (ValueError, lambda: symm.shmem_reduce_scatter(torch.empty(2), torch.ones(world * 2 + 1)), f"`input_tensor.numel()` must be {world} x output_tensor.numel() ({world * 2}), but got {world * 2 + 1}"),
            (ValueError, lambda: symm.shmem_alltoall([torch.ones(1)] * (world + 1), torch.empty(world), [1] * world), f"`send_tensor_list` must have one tensor per rank of the group ({world}), but got {world + 1}"),
            (ValueError, lambda: symm.shmem_alltoall([torch.ones(1)] * world, torch.empty(world), [1] * (world - 1)), f"`receive_list` must have one count per rank of the group ({world}), but got {world - 1}"),
            (ValueError, lambda: symm.shmem_alltoall([torch.ones(1)] * world, torch.empty(world - 1), [1] * world), f"`sum(receive_list)` must be at most receive_tensor.numel() ({world - 1}), but got {world}"),
            (ValueError, lambda: symm.shmem_send(torch.ones(2), rank), f"`dst_rank` must be another rank than this one ({rank}), but got {rank}"),
            (TypeError, lambda: symm.shmem_alltoall(torch.ones(world), torch.empty(world), [1] * world), f"`send_tensor_list` must be a sequence of {world} tensors, but got Tensor"),
            (TypeError, lambda: symm.shmem_alltoall([torch.ones(1)] * world, torch.empty(world), "1" * world), f"`receive_list` must be a sequence of {world} ints, but got str"),
            (TypeError, lambda: symm.shmem_alltoall([torch.ones(1)] * world, torch.empty(world), torch.ones(world)), "`receive_list` must be a sequence of"),
            # Overlaps are the engine's check (the runtime's message names its own arguments). Every rank refuses
            # here, each with its own offset: every rank raises the lowest refusing rank's message.
            (ValueError, lambda: symm.shmem_allgather(big[:3 * world], big[1:4]), "`input` must not overlap `output` except as this rank's own part (offset 0), but got an input at offset 4 of the output (refused by rank 0: op=all_gather"),
            (ValueError, lambda: symm.shmem_reduce_scatter(big[1:4], big[:3 * world]), "`output` must be this rank's part of `input` or not overlap it, but got an overlap at byte 4 of the input"),
            (ValueError, lambda: symm.shmem_allreduce(torch.ones(2, device="meta")), "`tensor` must be a tensor on cpu (the SHMEM device), but got meta"),
            (TypeError, lambda: symm.shmem_wait_for_signal([1], sig, 0, 1, 0), "`depend_tensor` must be a torch.Tensor or None, but got list"),
            (TypeError, lambda: symm.shmem_signal_op(sig, 0, 1.5, SET, 0), "`signal_value` must be an int or a one-element integer tensor, but got float"),
            (TypeError, lambda: symm.shmem_allreduce(torch.ones(2), group="dp"), "`group` must be a torch.distributed.ProcessGroup or None, but got str"),
        ]
        for exc, fn, needle in cases:
            expect_error(exc, fn, needle)
        assert buf.eq(1.0).all() and sig.eq(0).all(), "a rejected call wrote"
        symm.barrier()
        # Counts that disagree between sender and receiver: every rank raises the same error, nothing is written.
        out = torch.full((world + 1,), -3.0)
        counts = [1] * world
        if rank == 0:
            counts[world - 1] = 2
        message = expect_error(ValueError, lambda: symm.shmem_alltoall([torch.ones(1)] * world, out, counts),
                               f"`send_tensor_list[0]` of rank {world - 1} must have the 2 elements rank 0 expects")
        assert out.eq(-3.0).all(), "a rejected all_to_all wrote"
        assert gathered(torch.tensor([len(message)]))  # every rank got here (none hangs)
        # A message of the wrong size is drained and refused by the receiver; the sender's next send, once the
        # refusal is in, raises it (sending nothing); the one after that arrives.
        small = torch.zeros(3)
        if rank == 1:
            expect_error(ValueError, lambda: symm.shmem_recv(small, 0), "`tensor` must be a receive buffer for the float32 message of 20 bytes rank 0 sent, but got float32 of 12 bytes")
            assert small.eq(0).all()
        elif rank == 0:
            symm.shmem_send(torch.ones(5), 1)
        dist.barrier()   # rank 1 has refused the message
        if rank == 0:
            expect_error(ValueError, lambda: symm.shmem_send(torch.full((2,), 4.0), 1), "a message this rank sent must match the receive buffer of rank 1 in dtype and size, but that rank refused it (its recv raised, naming both): op=send")
            symm.shmem_send(torch.full((2,), 4.0), 1)
        elif rank == 1:
            good = torch.zeros(2)
            symm.shmem_recv(good, 0)
            assert good.eq(4.0).all()
        symm.barrier()


def _case_team_all_to_all_sequences() -> None:
    """The runtime face's all_to_all (and the user API's fast path over it) hands lists and tuples to the runtime as
    they are; a count that is not a non-negative int is refused before any sync, on every rank, naming it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with symm_session():
        symm.barrier()
        team = shmem.Team()
        try:
            sends = tuple(torch.full((2,), float(rank * 10 + j)) for j in range(world))
            expected = torch.tensor([float(i * 10 + rank) for i in range(world) for _ in range(2)])
            for send_list, counts in ((sends, (2,) * world), (list(sends), [2] * world),
                                      (UserList(sends), UserList([2] * world))):  # other sequences: as lists
                out = torch.full((2 * world,), -1.0)
                team.all_to_all(send_list, out, counts)
                assert torch.equal(out, expected), f"Team.all_to_all({type(send_list).__name__}, {type(counts).__name__})"
            out = torch.full((2 * world,), -1.0)
            expect_error(ValueError, lambda: team.all_to_all(sends, out, (2,) * (world - 1) + (-1,)),
                         f"`receive_counts[{world - 1}]` must fit in [0, 9223372036854775807], but got -1")
            expect_error(TypeError, lambda: team.all_to_all(sends, out, (2,) * (world - 1) + (2.0,)),
                         f"`receive_counts[{world - 1}]` must be an int, but got float")
            expect_error(TypeError, lambda: team.all_to_all(sends[:-1] + ("x",), out, (2,) * world),
                         f"`sends[{world - 1}]` must be a torch.Tensor, but got str")
            assert out.eq(-1.0).all(), "a refused all_to_all wrote"
            # The fast entries convert their ints as the data plane does, naming them.
            expect_error(TypeError, lambda: team.send(torch.ones(1), "1"), "`peer` must be an int, but got str")
            expect_error(TypeError, lambda: team.recv(torch.ones(1), 1.0), "`peer` must be an int, but got float")
            # A wire format is refused before any sync, alike on every rank: one that is none, one that cannot carry
            # the reduction.
            values = torch.ones(4)
            expect_error(ValueError, lambda: team.all_reduce(values, "sum", wire=torch.int8),
                         "`wire` must be one of float8_e4m3fn, float8_e5m2, float16, bfloat16 or None, but got "
                         "torch.int8")
            expect_error(ValueError, lambda: team.all_reduce(values, "max", wire=torch.bfloat16),
                         "`low_precision_dtype` must be used with sum or avg only (dtype=float32 op=max), but got "
                         "bfloat16")
            expect_error(ValueError, lambda: team.reduce_scatter(torch.ones(1, dtype=torch.float16),
                                                                 torch.ones(world, dtype=torch.float16), "sum",
                                                                 wire=torch.bfloat16),
                         "`low_precision_dtype` must be narrower than the tensor's dtype (dtype=float16 op=sum), but "
                         "got bfloat16")
            assert values.eq(1.0).all(), "a refused all_reduce wrote"
            symm.shmem_alltoall(sends, out, (2,) * world)  # the user API's fast path, with tuples
            assert torch.equal(out, expected), "shmem_alltoall with tuples"
        finally:
            team.release()


def _case_team_all_reduce_out_of_place() -> None:
    """The runtime face's all_reduce reduces ``input`` into ``tensor`` with ``input=``: the same values as in place
    on every path (one step, reading out of the peers' tensors or staged, a symmetric output), the input left as it
    was; a bad input is refused before any sync, on every rank, writing nothing."""
    rank = dist.get_rank()
    with symm_session() as empty:
        symm.barrier()
        team = shmem.Team()
        try:
            for count in (5, 70_001):
                for dtype in (torch.float32, torch.int64):
                    values = rank_input(rank, count, dtype)
                    expected = values.clone()
                    dist.all_reduce(expected)
                    for symmetric in (False, True):
                        output = empty(count, dtype) if symmetric else torch.empty(count, dtype=dtype)
                        output.fill_(-1)
                        kept = values.clone()
                        team.all_reduce(output, "sum", input=values)
                        what = f"{dtype} x{count} symmetric={symmetric}"
                        assert torch.equal(output, expected), what
                        assert torch.equal(values, kept), f"{what}: the input changed"
                        if symmetric:
                            empty.free(output)
            # Low precision out of place: the in-place call's values, bit for bit.
            values = rank_input(rank, 70_001, torch.float32)
            in_place = values.clone()
            team.all_reduce(in_place, "sum", wire=torch.bfloat16)
            output = torch.empty_like(values)
            team.all_reduce(output, "sum", wire=torch.bfloat16, input=values)
            assert torch.equal(output, in_place), "low precision out of place"
            output = torch.full((8,), -1.0)
            expect_error(TypeError, lambda: team.all_reduce(output, input=torch.ones(8, dtype=torch.int32)),
                         "`input` must have the dtype of `tensor` (torch.float32), but got torch.int32")
            expect_error(ValueError, lambda: team.all_reduce(output, input=torch.ones(4)),
                         "`input` must have the 32 bytes of `tensor`, but got 16")
            expect_error(ValueError, lambda: team.all_reduce(output[:4], input=output[2:6]),
                         "`input` must be `tensor` itself or not overlap it, but got an overlap at byte 8")
            assert output.eq(-1.0).all(), "a refused all_reduce wrote"
            team.all_reduce(output, input=output)  # the tensor itself: in place
            assert output.eq(-1.0 * dist.get_world_size()).all()
        finally:
            team.release()


def _case_group_checks() -> None:
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    with symm_session():
        symm.barrier()  # acquires the runtime (every rank)
        if rank in (0, 1):
            # send/recv need a channel, which only a collective of the whole group can create.
            expect_error(shmem.ShmemStateError, lambda: symm.shmem_send(torch.ones(1), 1 - rank, group=pair),
                         "group has no symmetric-memory channel yet: op=shmem_send group_ranks=[0, 1]")
        else:
            expect_error(ValueError, lambda: symm.shmem_allreduce(torch.ones(1), group=pair),
                         f"`group` must contain this rank ({rank}), but got a group it is not a member of")


def _case_one_sided_calls_never_acquire() -> None:
    """Before any symm.empty, one-sided and point-to-point calls fail at once instead of waiting for the others."""
    rank = dist.get_rank()
    sig = torch.zeros(1, dtype=torch.int32)
    expect_error(ValueError, lambda: symm.shmem_signal_op(sig, 0, 1, SET, 1 - rank),
                 "`signal` must be a symmetric tensor from symm.empty, but got an ordinary tensor")
    expect_error(shmem.ShmemStateError, lambda: symm.shmem_send(torch.ones(1), 1 - rank),
                 "symmetric memory is not initialised: op=group_ranks (call symm.empty() on every rank first)")
    assert shmem.debug_state()["state"] == "uninitialized"


def _case_world_takes_the_fast_path() -> None:
    """group=dist.group.WORLD is the WORLD: an eager small all-reduce on it goes straight to the engine and never
    enters the user API's checks, as group=None does and a sub-group does once its team exists. A call the fast path
    leaves (an explicit low_precision_dtype) takes the checks once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = dist.new_group(list(range(world)))
    expected = [float(world * (world + 1) // 2)] * 4
    with symm_session():
        symm.barrier()
        symm.barrier(everyone)  # its team exists from here on
        checked = mock.Mock(wraps=symm.API.checks.tensor)
        with mock.patch.object(symm.API.checks, "tensor", checked):
            for group in (dist.group.WORLD, None, everyone):
                t = torch.full((4,), float(rank + 1))
                symm.shmem_allreduce(t, group=group)
                assert t.tolist() == expected, (group, t)
            assert checked.call_count == 0, checked.call_args_list
            t = torch.full((4,), float(rank + 1))
            symm.shmem_allreduce(t, group=dist.group.WORLD, low_precision_dtype="none")
            assert t.tolist() == expected and checked.call_count == 1, checked.call_args_list


def _case_team_slots_and_churn() -> None:
    """64 groups live at once besides WORLD; the next is refused on all its ranks; destroyed groups give their
    slots back, so that a layout that creates and destroys groups for ever never runs out."""
    groups = [dist.new_group([0, 1]) for _ in range(65)]
    with symm_session():
        symm.barrier()  # WORLD's team is the root team
        for group in groups[:64]:
            symm.barrier(group)
        expect_error(shmem.ShmemStateError, lambda: symm.barrier(groups[64]),
                     "every team slot is taken on some member: slots=64")
        for group in groups[:64]:
            dist.destroy_process_group(group)
        for group in groups[64:]:
            symm.barrier(group)  # the destroyed groups' teams were released: slots are free again
        for round_ in range(150):
            group = dist.new_group([0, 1])
            value = torch.full((4,), float(dist.get_rank() + round_))
            symm.shmem_allreduce(value, group=group)
            assert value.tolist() == [float(1 + 2 * round_)] * 4, (round_, value)
            dist.destroy_process_group(group)
        assert shmem.debug_state()["live_teams"] <= 3, shmem.debug_state()["live_teams"]


def _case_heap_alias() -> None:
    with restored_env("SYMMETRIC_MEMORY_HEAP_SIZE"), restored_env("HYPER_PARALLEL_SHMEM_HEAP_SIZE"):
        os.environ.pop("HYPER_PARALLEL_SHMEM_HEAP_SIZE", None)
        os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = "48M"
        with symm_session() as empty:
            empty(1, torch.int32)
            assert shmem.debug_state()["heap_size"] == 48 << 20
        os.environ["HYPER_PARALLEL_SHMEM_HEAP_SIZE"] = "32M"
        expect_error(ValueError, lambda: symm.empty(1, torch.int32),
                     "`SYMMETRIC_MEMORY_HEAP_SIZE` must equal `HYPER_PARALLEL_SHMEM_HEAP_SIZE` when both are set, "
                     "but got '48M' and '32M'")
        assert shmem.debug_state()["state"] == "uninitialized"


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name,nranks", [("symm_producer_consumer.py", 2), ("symm_push.py", 4), ("symm_pull.py", 3),
                                        ("symm_fused_matmul.py", 2)])
def test_examples_run_as_written(world_factory, name: str, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_example, name)


def test_readme_user_api_block_runs(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_readme, _readme_block("## The user API"))


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_primitives(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_primitives)
    run_case(world_factory(nranks, _ENV), _case_get_direction)


def test_group_local_ranks(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_group_local_ranks)


@pytest.mark.parametrize("use_streams,mix_torch", [(False, False), (True, False), (False, True)])
def test_overlapping_dp_and_tp_groups(world_factory, use_streams: bool, mix_torch: bool) -> None:
    run_case(world_factory(4, _ENV), _case_overlapping_groups, use_streams, mix_torch, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_bad_arguments_write_nothing(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_bad_arguments)


@pytest.mark.parametrize("nranks", [1, 3])
def test_team_all_to_all_takes_lists_and_tuples(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_team_all_to_all_sequences)


def test_group_checks(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_group_checks)


def test_one_sided_calls_never_acquire_the_runtime(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_one_sided_calls_never_acquire)


@pytest.mark.parametrize("nranks", [2, 3])
def test_team_all_reduce_out_of_place(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), _case_team_all_reduce_out_of_place)


def test_world_takes_the_fast_path(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_world_takes_the_fast_path)


def test_team_slots_run_out_with_a_clear_error_and_are_reused(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_team_slots_and_churn)


def test_heap_size_alias(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_heap_alias)
