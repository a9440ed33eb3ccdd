"""Framework handlers that reach the runtime through its C ABI (seed 000 §7's platform adaptation layer).

The torch handler is the C++ binding ``hyper_parallel._shmem_torch`` with the torch modules of
:mod:`hyper_parallel.core.symmetric_memory`; :mod:`hyper_parallel.platform.mindspore` is MindSpore's.
"""
