"""System tests of the host device as torch's symmetric-memory backend beyond torch's own tests (real ranks).

torch's tests of its API run ported in ``test_torch_symmetric_memory.py`` and ``test_torch_nvshmem.py``; these cover
what the backend adds or must get right on CPU: tensors of both APIs working in the other, torch.compile of the
operators, the MoE exchanges refusing a receive buffer too small (on every rank, naming the rank, the expert and both
sizes, with nothing written), frees that wait for every rank and every handle, the messages of timed-out waits and
of ranks that pass different allocations, and torch's scaled all-gather matmul against a reference gloo can run.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem
from hyper_parallel.platform.torch import symm_mem_backend
from st_cases import expect_error, run_case
from symm_cases import gathered

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "20"}


def _world():
    return dist.group.WORLD.group_name, dist.get_rank(), dist.get_world_size()


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_tensors_of_either_api_work_in_the_other() -> None:
    group_name, rank, world = _world()
    peer = (rank + 1) % world
    # A tensor of the user API, through torch's: symmetric to torch, rendezvoused, reduced by torch's operator.
    ours = symm.empty(64, torch.float32)
    ours.fill_(rank + 1)
    assert symm_mem.is_symm_mem_tensor(ours)
    hdl = symm_mem.rendezvous(ours, dist.group.WORLD)
    hdl.barrier()
    assert hdl.get_buffer(peer, (64,), torch.float32).eq(peer + 1).all()
    assert torch.ops.symm_mem.one_shot_all_reduce(ours, "sum", group_name).eq(world * (world + 1) / 2).all()
    # First rendezvoused over the whole root, it has a signal pad of its own: the signal calls work.
    hdl.put_signal(peer)
    hdl.wait_signal((rank - 1) % world)
    hdl.barrier()
    # A tensor of torch's API, through the user API and the runtime face.
    theirs = symm_mem.empty(64, device="cpu")
    theirs.fill_(rank + 1)
    symm.barrier()
    symm.shmem_allreduce(theirs)
    assert theirs.eq(world * (world + 1) / 2).all()
    shmem.barrier()  # a peer may still be writing its own result of the all-reduce
    shmem.put(theirs[:4], torch.full((4,), -1.0 - rank), peer)
    shmem.barrier()
    assert theirs[:4].eq(-1.0 - (rank - 1) % world).all()
    # Freed through the user API, its handle raises instead of showing memory the heap hands out again.
    symm.free(ours)
    expect_error(RuntimeError, lambda: hdl.buffer_ptrs, "the symmetric allocation of this handle was freed")
    symm.shutdown()


def _case_a_handle_first_made_over_a_subgroup_has_no_signal_pad() -> None:
    rank = dist.get_rank()
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = halves[rank // 2]
    t = shmem.empty(16, dtype=torch.float32)
    hdl = symm_mem.rendezvous(t, group)
    assert (hdl.rank, hdl.world_size) == (rank % 2, 2)
    t.fill_(rank)
    hdl.barrier()  # the team's barrier
    assert hdl.get_buffer((hdl.rank + 1) % 2, (16,), torch.float32).eq(rank ^ 1).all()
    expect_error(RuntimeError, lambda: hdl.put_signal(1 - hdl.rank), "put_signal: this handle has no signal pad",
                 "first rendezvoused over every rank of the root")
    hdl.barrier()
    del hdl
    shmem.free(t)


def _moe_buffers(rows: int, hidden: int = 4) -> tuple:
    tokens = symm_mem.empty(rows, hidden, device="cpu").fill_(dist.get_rank())
    out = symm_mem.empty(rows, hidden, device="cpu")
    return tokens, out


def _case_a_receive_buffer_too_small_fails_on_every_rank() -> None:
    group_name, rank, world = _world()
    experts = 2
    tokens, out = _moe_buffers(16 * world)
    out.fill_(-7)
    # Every rank sends 5 rows to each expert of the last rank, 1 to every other: the last rank receives
    # 5 x world rows per expert, more than a 6-row `out` holds from its first expert on.
    splits = [5 if r == world - 1 else 1 for r in range(world) for _ in range(experts)]
    in_splits = torch.tensor(splits, dtype=torch.int64)
    table = torch.full((2, experts * world), -3, dtype=torch.int64)
    small = out[:6] if rank == world - 1 else out
    last = world - 1
    message = expect_error(
        RuntimeError,
        lambda: torch.ops.symm_mem.all_to_all_vdev_2d(tokens, small, in_splits, table, group_name, major_align=1),
        f"all_to_all_vdev_2d: `out` of rank {last} must hold the {10 * world} rows its peers send",
        f"the overflow starts at expert {last * experts}, local expert 0 of rank {last}", "but got 6 rows",
        "every rank raises; nothing was written")
    assert "Exception raised from" not in message.splitlines()[0]
    assert out.eq(-7).all() and table.eq(-3).all()
    # The group stays in step: the same exchange with room for it goes through.
    torch.ops.symm_mem.all_to_all_vdev_2d(tokens, out, in_splits, table, group_name, major_align=1)
    assert table[0].sum() == (5 * world * experts if rank == last else world * experts)


def _case_bad_splits_fail_on_every_rank() -> None:
    group_name, rank, world = _world()
    tokens, out = _moe_buffers(8 * world)
    splits = torch.ones(world, dtype=torch.int64)
    if rank == 0:
        splits[1 % world] = -2
    table = torch.zeros(2, world, dtype=torch.int64)
    expect_error(RuntimeError, lambda: torch.ops.symm_mem.all_to_all_vdev(tokens, out, splits, table, group_name),
                 f"all_to_all_vdev: `in_splits` must be non-negative, but got in_splits[{1 % world}]=-2 on rank 0")
    wide = torch.full((world,), 8 * world, dtype=torch.int64)
    expect_error(RuntimeError, lambda: torch.ops.symm_mem.all_to_all_vdev(tokens, out, wide, table, group_name),
                 f"the chunks of `in_splits` must lie inside `input` ({8 * world} rows), but got chunk 1 ending at "
                 f"row {16 * world} on rank 0")


def _case_ordinary_inputs_take_the_engines_all_to_all() -> None:
    """torch.compile's functionalization hands an operator a clone of a symmetric tensor another one mutated: an
    ordinary input (on any rank) moves through the engine's all_to_all instead of the peers' pulls, with the same
    result."""
    group_name, rank, world = _world()
    experts = 3
    tokens, out = _moe_buffers(8 * world)
    tokens.copy_(torch.arange(tokens.numel()).view_as(tokens) + 1000 * rank)
    in_splits = torch.tensor([(r + 2 * e + rank) % 3 for r in range(world) for e in range(experts)],
                             dtype=torch.int64)
    results = []
    for source in (tokens, tokens.clone() if rank == 0 else tokens):
        received = torch.full_like(out, -1)
        dispatched = torch.zeros(2, experts * world, dtype=torch.int64)
        torch.ops.symm_mem.all_to_all_vdev_2d(source, received, in_splits, dispatched, group_name, major_align=4)
        back = torch.full_like(tokens, -1)
        combined = torch.zeros(2, experts * world, dtype=torch.int64)
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(received.clone(), back, dispatched, combined, group_name)
        results.append((received, dispatched, back, combined))
    for pulled, staged in zip(*results):
        assert torch.equal(pulled, staged)
    routed = int(in_splits.sum())
    assert torch.equal(results[1][2][:routed], tokens[:routed])


def _case_operators_trace_under_torch_compile() -> None:
    group_name, rank, world = _world()
    experts = 2
    t = symm_mem.empty(32, device="cpu").fill_(rank + 1)
    tokens = symm_mem.empty(8 * world, 4, device="cpu").copy_(torch.arange(32 * world).view(-1, 4) + 1000 * rank)
    routed = symm_mem.empty(16 * world, 4, device="cpu")
    back = symm_mem.empty(8 * world, 4, device="cpu")
    tile_in = symm_mem.empty(8, 8, device="cpu").fill_(rank)
    tile_out = symm_mem.empty(8, 8, device="cpu").fill_(0)
    in_splits = torch.tensor([(r + e + rank) % 3 for r in range(world) for e in range(experts)], dtype=torch.int64)

    def step(x, splits):
        y = torch.ops.symm_mem.one_shot_all_reduce(x, "sum", group_name) * 2
        dispatched = torch.zeros(2, experts * world, dtype=torch.int64)
        torch.ops.symm_mem.all_to_all_vdev_2d(tokens, routed, splits, dispatched, group_name, major_align=2)
        combined = torch.zeros(2, experts * world, dtype=torch.int64)
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(routed, back, dispatched, combined, group_name)
        torch.ops.symm_mem.tile_reduce(tile_in[2:6, 2:6], tile_out[2:6, 2:6], 0, group_name)
        gathered_rows = torch.ops.symm_mem._low_contention_all_gather(x[:4], group_name)
        return y, combined, gathered_rows

    eager = step(t, in_splits)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(t, in_splits)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert eager[0].eq(world * (world + 1)).all()
    assert torch.equal(eager[1][0], in_splits)
    routed_rows = int(in_splits.sum())
    assert torch.equal(back[:routed_rows], tokens[:routed_rows])
    if rank == 0:
        assert tile_out[2:6, 2:6].eq(world * (world - 1) / 2).all() and tile_out[:2].eq(0).all()


def _case_frees_wait_for_every_rank_and_every_handle() -> None:
    group_name, rank, world = _world()
    keep = symm_mem.empty(8, device="cpu")  # the allocator and the heap up, freed at the end
    before = len(shmem.debug_state()["active_allocations"])
    for _ in range(30):
        t = symm_mem.empty(1024, device="cpu")
        del t
    # Let go of everywhere: freed at the next allocation, which leaves at most the last one pending.
    assert symm_mem_backend.state()["pending_frees"] <= 1
    assert len(shmem.debug_state()["active_allocations"]) <= before + 1
    # A handle keeps its allocation: the tensor dies, the peers' buffers stay readable until the handle goes.
    t = symm_mem.empty(16, device="cpu").fill_(rank)
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    address = t.data_ptr()
    del t
    symm_mem.empty(16, device="cpu")  # a collective allocation: it must not reuse the handle's memory
    hdl.barrier()
    assert hdl.get_buffer((rank + 1) % world, (16,), torch.float32).eq((rank + 1) % world).all()
    assert hdl.buffer_ptrs[rank] == address
    hdl.barrier()
    del hdl, keep


def _case_timed_out_waits_name_the_peer_and_the_channel() -> None:
    _, rank, world = _world()
    t = symm_mem.empty(4, device="cpu")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    if rank == 0:
        expect_error(RuntimeError, lambda: hdl.wait_signal(src_rank=1, channel=3, timeout_ms=200),
                     "wait_signal timed out: rank=0 src_rank=1 channel=3 timeout_ms=200 (no signal arrived from "
                     "rank 1)")
        hdl.put_signal(dst_rank=1, channel=2)
        expect_error(RuntimeError, lambda: hdl.put_signal(dst_rank=1, channel=2, timeout_ms=200),
                     "put_signal timed out: rank=0 dst_rank=1 channel=2 timeout_ms=200 (rank 1 has not waited for "
                     "this rank's previous signal on the channel)")
        expect_error(RuntimeError, lambda: hdl.barrier(channel=5, timeout_ms=200),
                     "barrier timed out: rank=0 peer=", "channel=5 timeout_ms=200 step=wait")
    dist.barrier()
    if rank == 1:
        hdl.wait_signal(src_rank=0, channel=2)  # takes the signal rank 0 left: its channel is clean again


def _case_ranks_that_pass_different_allocations_all_fail() -> None:
    _, rank, world = _world()
    a = symm_mem.empty(8, device="cpu")
    b = symm_mem.empty(16, device="cpu")
    mine = a if rank == 0 else b
    expect_error(RuntimeError, lambda: symm_mem.rendezvous(mine, dist.group.WORLD),
                 "rendezvous: the ranks of group", "must pass the same symmetric allocation")
    assert symm_mem.rendezvous(a, dist.group.WORLD).world_size == world  # and the group goes on


def _case_backend_is_selectable_by_name() -> None:
    symm_mem.set_backend(symm_mem_backend.NAME)
    assert symm_mem.get_backend("cpu") == symm_mem_backend.NAME
    expect_error(RuntimeError, lambda: symm_mem.set_backend("NO_SUCH_BACKEND"),
                 "SymmetricMemory does not find allocation backend NO_SUCH_BACKEND")


def _case_scaled_all_gather_matmul_against_a_gloo_reference() -> None:
    """torch's reference gathers float8 over its process group, which gloo refuses: here the float8 bytes travel as
    uint8, then torch._scaled_mm multiplies, as the fallback does."""
    group_name, rank, world = _world()
    torch.manual_seed(42 + rank)
    a_shard = torch.rand(2, 8 // world, 32).to(torch.float8_e4m3fn)
    bs = [torch.rand(16, 32).to(torch.float8_e4m3fn).T for _ in range(2)]
    a_scale = torch.full((2, 8 // world, 1), 0.1)  # row-wise, sharded with the rows
    b_scales = [torch.full((1, 16), 0.1) for _ in bs]
    a, outputs = torch.ops.symm_mem.fused_all_gather_scaled_matmul(
        a_shard, bs, a_scale, b_scales, gather_dim=1, group_name=group_name, biases=[None, None],
        result_scales=[None, None], out_dtypes=[torch.bfloat16, torch.float32], use_fast_accum=[False, False])
    shards = [s.view(torch.float8_e4m3fn) for s in gathered(a_shard.view(torch.uint8))]
    reference_a = torch.cat(shards, dim=1)
    scales = torch.cat(gathered(a_scale), dim=1)
    assert torch.equal(a.view(torch.uint8), reference_a.view(torch.uint8))
    for out, b, b_scale, dtype in zip(outputs, bs, b_scales, (torch.bfloat16, torch.float32)):
        expected = torch._scaled_mm(reference_a.flatten(0, -2).contiguous(), b, scales.flatten(0, -2).contiguous(),
                                    b_scale, out_dtype=dtype).view(2, 8, 16)
        assert out.dtype == dtype
        torch.testing.assert_close(out, expected)


# --------------------------------------------------------------------------
# Tests (run in the test process).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("case", [
    _case_tensors_of_either_api_work_in_the_other,
    _case_a_receive_buffer_too_small_fails_on_every_rank,
    _case_bad_splits_fail_on_every_rank,
    _case_ordinary_inputs_take_the_engines_all_to_all,
    _case_operators_trace_under_torch_compile,
    _case_frees_wait_for_every_rank_and_every_handle,
    _case_timed_out_waits_name_the_peer_and_the_channel,
    _case_ranks_that_pass_different_allocations_all_fail,
    _case_backend_is_selectable_by_name,
    _case_scaled_all_gather_matmul_against_a_gloo_reference,
], ids=lambda case: case.__name__[len("_case_"):])
def test_torch_symm_mem_backend(world_factory, case, nranks: int) -> None:
    run_case(world_factory(nranks, _ENV), case, timeout=120)


def test_a_handle_first_made_over_a_subgroup_has_no_signal_pad(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_a_handle_first_made_over_a_subgroup_has_no_signal_pad, timeout=120)
