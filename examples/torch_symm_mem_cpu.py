"""torch's own symmetric-memory API on CPU tensors, over HyperParallel SHMEM's host device.

Code written for ``torch.distributed._symmetric_memory`` runs unchanged on CPU once this package is imported:
``symm_mem.empty`` / ``rendezvous`` / the handle's ``get_buffer`` and ``barrier``, and the ``symm_mem`` operators
(one-shot and two-shot all-reduce, reduce-scatter, MoE dispatch and combine), eagerly and under
``torch.compile(fullgraph=True)``.

Run (any number of ranks on one machine)::

    HYPER_PARALLEL_SHMEM_HEAP_SIZE=64M torchrun --standalone --nproc-per-node 4 examples/torch_symm_mem_cpu.py
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import hyper_parallel.platform.torch  # noqa: F401  (the torch handler: registers the host device as a CPU backend)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    symm_mem.set_backend("HYPER_PARALLEL_SHMEM")  # the CPU backend already: naming it is optional
    assert symm_mem.get_backend("cpu") == "HYPER_PARALLEL_SHMEM"

    # A symmetric tensor, its handle, and a peer's copy read in place after a barrier.
    t = symm_mem.empty(1024, dtype=torch.float32, device="cpu")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    t.fill_(rank)
    hdl.barrier(channel=0)
    peer = (rank + 1) % world
    assert hdl.get_buffer(peer, (1024,), torch.float32).eq(peer).all()
    hdl.barrier(channel=0)

    # Point to point: a write into the peer's buffer, then its signal.
    hdl.get_buffer(peer, (4,), torch.float32, 8).fill_(100 + rank)
    hdl.put_signal(dst_rank=peer)
    hdl.wait_signal(src_rank=(rank - 1) % world)
    assert t[8:12].eq(100 + (rank - 1) % world).all()

    # One-shot and two-shot all-reduce (torch's: sum).
    t.fill_(rank + 1)
    total = world * (world + 1) / 2
    assert torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group_name).eq(total).all()
    torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group_name)
    assert t.eq(total).all()

    # MoE dispatch (rank-major in, expert-major out) and combine (its inverse), the splits in tensors.
    experts, hidden, capacity = 2, 8, 64
    tokens = symm_mem.empty(capacity, hidden, device="cpu")
    received = symm_mem.empty(capacity * world, hidden, device="cpu")
    returned = symm_mem.empty(capacity, hidden, device="cpu")
    in_splits = torch.tensor([(rank + e) % 3 + 1 for e in range(experts * world)], dtype=torch.int64)
    routed = int(in_splits.sum())
    tokens[:routed] = torch.randn(routed, hidden)
    out_splits_offsets = torch.empty(2, experts * world, dtype=torch.int64)
    back_splits_offsets = torch.empty(2, experts * world, dtype=torch.int64)
    torch.ops.symm_mem.all_to_all_vdev_2d(tokens, received, in_splits, out_splits_offsets, group_name, major_align=4)
    torch.ops.symm_mem.all_to_all_vdev_2d_offset(
        received, returned, out_splits_offsets, back_splits_offsets, group_name
    )
    assert torch.equal(returned[:routed], tokens[:routed])
    assert torch.equal(back_splits_offsets[0], in_splits)

    # The same operators traced whole by torch.compile (the splits stay in tensors: no graph break). The aot_eager
    # backend runs them: inductor's own lowering of the symm_mem operators allocates CUDA buffers only (torch 2.13).
    @torch.compile(fullgraph=True, backend="aot_eager")
    def all_reduce_then_dispatch(x: torch.Tensor, splits: torch.Tensor) -> tuple:
        y = torch.ops.symm_mem.one_shot_all_reduce(x, "sum", group_name) * 2
        layout = torch.zeros(2, experts * world, dtype=torch.int64)
        torch.ops.symm_mem.all_to_all_vdev_2d(tokens, received, splits, layout, group_name, major_align=4)
        return y, layout

    t.fill_(1)
    doubled, layout = all_reduce_then_dispatch(t, in_splits)
    assert doubled.eq(2 * world).all()
    assert torch.equal(layout, out_splits_offsets)

    dist.barrier()
    if rank == 0:
        print(f"torch.distributed._symmetric_memory on CPU over {symm_mem.get_backend('cpu')}: {world} ranks OK")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
