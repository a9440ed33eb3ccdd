"""Seed 000 section 5: the push and the pull mode, each gathering one row per rank into every rank's `rows`.

Push: every rank writes its row into every peer's symmetric buffer and raises the peer's signal (ADD 1); a rank
waits until the signal counts every rank. Pull: every rank stages its row in its own symmetric buffer and
raises the signals; each rank then reads the rows it needs, in the order it chooses (deterministic
consumption, at the price of one more local copy).

Run:  python -m torch.distributed.run --standalone --nproc-per-node 4 symm_push_pull.py
"""

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm

ADD, GE = 1, 4

if not dist.is_initialized():
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
row = torch.full((1024,), float(rank))

rows = symm.empty((world, 1024), dtype=torch.float32)     # push: the receivers' buffer
staged = symm.empty(1024, dtype=torch.float32)             # pull: the senders' buffer
signals = symm.empty(2, dtype=torch.int64)                 # [0]: push arrivals, [1]: pull readiness
signals.zero_()
symm.barrier()

# Push mode: write into the peers, then signal them.
for peer in range(world):
    symm.shmem_put_with_signal(rows, rank * 1024, row, 0, 1024, signals, 0, 1, ADD, target_rank=peer)
symm.shmem_wait_for_signal(rows, signals, 0, world, GE)
assert all(rows[r].eq(r).all() for r in range(world))

# Pull mode: stage locally, announce it, then read from every peer into an ordinary tensor.
staged.copy_(row)
for peer in range(world):
    symm.shmem_signal_op(signals, 1, 1, ADD, target_rank=peer)
symm.shmem_wait_for_signal(staged, signals, 1, world, GE)
pulled = torch.empty(world, 1024)
for peer in range(world):
    symm.shmem_get(pulled[peer], 0, staged, 0, 1024, target_rank=peer)
assert all(pulled[r].eq(r).all() for r in range(world))

symm.barrier()   # nobody reads `staged` any more
print(f"rank {rank}: push and pull gathered {world} rows")
symm.free(rows)
symm.free(staged)
symm.free(signals)
symm.shutdown()
