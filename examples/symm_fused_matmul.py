"""The user API's fused all-gather + matmul example, with CPU tensors (the host device) in float32.

The API's specification runs it in float16 on NPUs; CPU matmuls in float16 are slow, so this copy uses float32.
Everything else is as written there, followed by a check against the unfused sequence.

Run:  python -m torch.distributed.run --standalone --nproc-per-node 2 symm_fused_matmul.py
"""

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm

if not dist.is_initialized():
    dist.init_process_group("gloo")
world_size = dist.get_world_size()

m_local, k, n = 512, 1024, 2048
m_total = m_local * world_size

a = torch.randn(m_local, k, dtype=torch.float32, device='cpu')
b = torch.randn(k, n, dtype=torch.float32, device='cpu')

gather_out = symm.empty((m_total, k), dtype=torch.float32)
c          = torch.zeros(m_total, n, dtype=torch.float32, device='cpu')
signal     = symm.empty(world_size * 4, dtype=torch.int32)
signal.zero_()

dist.barrier()

gather_result, matmul_result = symm.fused_all_gather_matmul(
    a, b, c, gather_out, signal, block_size=128
)
# gather_result: (m_total, k)  matmul_result: (m_total, n)

# The unfused sequence gives the same result.
parts = [torch.empty_like(a) for _ in range(world_size)]
dist.all_gather(parts, a)
torch.testing.assert_close(gather_result, torch.cat(parts), rtol=0, atol=0)
# The two multiply in different orders (blocks of rows, and whatever kernel the CPU's BLAS picks), so they may
# round differently: each is within gamma_k * (|A| @ |B|) of the exact product (Higham, Accuracy and Stability of
# Numerical Algorithms, §3.5), where gamma_k = k*u / (1 - k*u) and u is float32's unit roundoff. Their difference
# is within twice that, whatever the machine.
unit_roundoff = torch.finfo(torch.float32).eps / 2
gamma_k = k * unit_roundoff / (1 - k * unit_roundoff)
bound = 2 * gamma_k * (torch.cat(parts).abs() @ b.abs())
assert ((matmul_result - torch.cat(parts) @ b).abs() <= bound).all(), "fused matmul differs beyond rounding"
print(f"rank {dist.get_rank()}: gather {tuple(gather_result.shape)}, matmul {tuple(matmul_result.shape)}: ok")

dist.barrier()
symm.free(gather_out)
symm.free(signal)
symm.shutdown()
