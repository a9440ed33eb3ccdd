"""Push mode: every rank writes its row into every peer's symmetric buffer and raises the
peer's signal (ADD 1); a rank's rows are complete once its signal counts every rank. One copy per row.

Run:  python -m torch.distributed.run --standalone --nproc-per-node 4 symm_push.py
"""

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm

ADD, GE = 1, 4

if not dist.is_initialized():
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
row = torch.full((1024,), float(rank))

rows = symm.empty((world, 1024), dtype=torch.float32)     # the receivers' buffer
arrived = symm.empty(1, dtype=torch.int64)
arrived.zero_()
symm.barrier()

for peer in range(world):   # write into the peer, then signal it: the data is visible before the signal
    symm.shmem_put_with_signal(rows, rank * 1024, row, 0, 1024, arrived, 0, 1, ADD, target_rank=peer)
symm.shmem_wait_for_signal(rows, arrived, 0, world, GE)
assert all(rows[r].eq(r).all() for r in range(world))

symm.barrier()   # nobody writes into `rows` any more
print(f"rank {rank}: push gathered {world} rows")
symm.free(rows)
symm.free(arrived)
symm.shutdown()
