"""Ring exchange over symmetric memory: every rank puts its row into the next rank's buffer and signals it.

Run on 4 local ranks:  torchrun --standalone --nproc-per-node 4 examples/ring_demo.py
"""

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = shmem.acquire_shmem()  # root_group=None: the WORLD group
    buf = shmem.empty(world, 1024, dtype=torch.float32)
    sig = shmem.empty(1, dtype=torch.int32)
    sig.zero_()
    shmem.barrier()
    nxt = (rank + 1) % world
    shmem.put(buf[rank], torch.full((1024,), float(rank)), nxt)  # my row, into the next rank's buf
    shmem.signal(sig, 1, nxt, op="add")
    shmem.wait_signal(sig, 1, cmp="ge")
    prev = (rank - 1) % world
    assert buf[prev].eq(float(prev)).all()
    shmem.barrier()
    for r in range(world):  # print the states one rank after the other
        if r == rank:
            print(f"rank {rank}: received row {prev} from rank {prev}: ok", flush=True)
            if rank == 0:
                print(shmem.debug_state(), flush=True)
        dist.barrier()
    shmem.free(buf)
    shmem.free(sig)
    handle.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
