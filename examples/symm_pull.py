"""Pull mode: every rank stages its row in its own symmetric buffer and announces it; each
rank then reads the rows it needs, in the order it chooses (deterministic consumption, one more local copy than
push mode).

Run:  python -m torch.distributed.run --standalone --nproc-per-node 4 symm_pull.py
"""

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm

ADD, GE = 1, 4

if not dist.is_initialized():
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

staged = symm.empty(1024, dtype=torch.float32)             # the senders' buffer
ready = symm.empty(1, dtype=torch.int64)
ready.zero_()
symm.barrier()

staged.fill_(float(rank))
for peer in range(world):   # announce: my row is staged
    symm.shmem_signal_op(ready, 0, 1, ADD, target_rank=peer)
symm.shmem_wait_for_signal(staged, ready, 0, world, GE)
pulled = torch.empty(world, 1024)
for peer in reversed(range(world)):   # any order the consumer likes
    symm.shmem_get(pulled[peer], 0, staged, 0, 1024, target_rank=peer)
assert all(pulled[r].eq(r).all() for r in range(world))

symm.barrier()   # nobody reads `staged` any more
print(f"rank {rank}: pull gathered {world} rows")
symm.free(staged)
symm.free(ready)
symm.shutdown()
