"""The MindSpore handler: tensors over symmetric-heap memory, MindSpore's groups and synchronisation, and bprop.

It imports MindSpore and numpy, never torch, and nothing of the runtime but its exceptions: the user API
(:mod:`hyper_parallel.core.symmetric_memory`) asks it for tensors, groups and gradients and calls the runtime itself.
"""
