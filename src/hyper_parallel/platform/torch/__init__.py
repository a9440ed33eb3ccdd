"""The torch handler: the user API's calls on torch, over the runtime face and its C++ binding
(``ccsrc/bindings/torch``). :mod:`.handler` holds the handler object; ``docs/architecture.md`` shows the modules.
"""

# The user API binds this package's handler when it is imported (hyper_parallel.core.symmetric_memory._framework):
# importing it first lets any module of this package be imported first without an import cycle.
import hyper_parallel.core.symmetric_memory  # noqa: F401

# torch's own symmetric-memory API (torch.distributed._symmetric_memory) on CPU tensors over this runtime.
from hyper_parallel.platform.torch import symm_mem_backend  # noqa: E402,F401
