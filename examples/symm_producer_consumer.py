"""The user API's first example (one rank produces, the other consumes), as its specification writes it for NPUs,
unchanged except that tensors live on the CPU (the host device).

Run:  python -m torch.distributed.run --standalone --nproc-per-node 2 symm_producer_consumer.py
"""

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm

if not dist.is_initialized():
    dist.init_process_group("gloo")
rank = dist.get_rank()

data_buf = symm.empty(4096, dtype=torch.float16)
signal = symm.empty(1, dtype=torch.int32)
signal.zero_()

dist.barrier()

if rank == 0:  # producer
    local_data = torch.randn(4096, dtype=torch.float16, device='cpu')
    symm.shmem_put_with_signal(
        target=data_buf,
        target_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        src=local_data,
        src_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        size=torch.tensor([4096], dtype=torch.int64, device='cpu'),
        signal=signal,
        signal_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        signal_value=torch.tensor([1], dtype=torch.int32, device='cpu'),
        signal_op=0,    # SET
        target_rank=1
    )

elif rank == 1:  # consumer
    symm.shmem_wait_for_signal(
        depend_tensor=data_buf,
        signal=signal,
        signal_offset=torch.tensor([0], dtype=torch.int64, device='cpu'),
        compare_value=torch.tensor([1], dtype=torch.int32, device='cpu'),
        compare_op=0    # EQ
    )
    result = data_buf.sum()  # the data has arrived
    print(f"rank 1 received 4096 halves, sum={result.item():.3f}")

dist.barrier()
symm.free(data_buf)
symm.free(signal)
symm.shutdown()
