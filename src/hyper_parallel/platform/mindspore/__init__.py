"""The MindSpore handler: tensors over symmetric-heap memory, MindSpore's groups and synchronisation, and bprop.

It imports MindSpore and numpy, never torch, and reaches the runtime through
:mod:`hyper_parallel.core.multicore.c_runtime`. Users call it through :mod:`hyper_parallel.core.symmetric_memory`.
"""
