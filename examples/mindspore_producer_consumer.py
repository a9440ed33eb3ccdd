"""The user API's first example (symm_producer_consumer.py) on MindSpore: the same symm calls on
mindspore.Tensors (host device, CPU).

Run:  msrun --worker_num=2 --local_worker_num=2 --join=True mindspore_producer_consumer.py
"""

import mindspore as ms
import numpy as np
from mindspore.communication import get_rank, init
from mindspore.mint import distributed as dist

import hyper_parallel.core.symmetric_memory as symm

init()   # MindSpore's distributed initialisation (the mccl backend on CPU)
rank = get_rank()

data_buf = symm.empty(4096, dtype=ms.float16)
signal = symm.empty(1, dtype=ms.int32)
signal.copy_(ms.Tensor([0], ms.int32))   # MindSpore 2.10 has no zero_ on CPU

dist.barrier()

# The producer's data, which the consumer can recompute to check what arrived.
local = np.random.default_rng(2024).standard_normal(4096).astype(np.float16)

if rank == 0:  # producer
    local_data = ms.Tensor(local)
    symm.shmem_put_with_signal(
        target=data_buf,
        target_offset=ms.Tensor([0], ms.int64),
        src=local_data,
        src_offset=ms.Tensor([0], ms.int64),
        size=ms.Tensor([4096], ms.int64),
        signal=signal,
        signal_offset=ms.Tensor([0], ms.int64),
        signal_value=ms.Tensor([1], ms.int32),
        signal_op=0,    # SET
        target_rank=1
    )

elif rank == 1:  # consumer
    symm.shmem_wait_for_signal(
        depend_tensor=data_buf,
        signal=signal,
        signal_offset=ms.Tensor([0], ms.int64),
        compare_value=ms.Tensor([1], ms.int32),
        compare_op=0    # EQ
    )
    result = data_buf.astype(ms.float32).sum()  # the data has arrived
    intact = bool(np.array_equal(data_buf.asnumpy(), local))
    print(f"rank 1 received 4096 halves, sum={float(result):.3f} intact={intact}", flush=True)

dist.barrier()
symm.free(data_buf)
symm.free(signal)
symm.shutdown()
