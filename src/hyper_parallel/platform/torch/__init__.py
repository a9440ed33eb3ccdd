"""The torch handler's Python side: torch's answers to the user API's questions about tensors.

The rest of the torch handler is the C++ binding ``hyper_parallel._shmem_torch`` (tensors from allocations, storage
invalidation on free, the operators registered with ``torch.library``) and the torch modules of
:mod:`hyper_parallel.core.symmetric_memory` that call it.
"""

# torch's own symmetric-memory API (torch.distributed._symmetric_memory) on CPU tensors over this runtime.
from hyper_parallel.platform.torch import symm_mem_backend  # noqa: E402,F401
