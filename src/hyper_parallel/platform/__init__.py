"""The framework handlers, one package per framework, siblings behind one handler protocol
(:mod:`hyper_parallel.core.symmetric_memory.protocol`): :mod:`hyper_parallel.platform.torch` (over the runtime face
and its C++ binding) and :mod:`hyper_parallel.platform.mindspore` (over the runtime's C ABI).
"""
