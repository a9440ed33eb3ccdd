"""The MindSpore handler: the user API's calls on MindSpore, over the runtime's C ABI (``docs/mindspore.md``).
:mod:`.handler` holds the handler object; ``docs/architecture.md`` shows the modules.
"""

# The user API binds this package's handler when it is imported (hyper_parallel.core.symmetric_memory._framework):
# importing it first lets any module of this package be imported first without an import cycle.
import hyper_parallel.core.symmetric_memory  # noqa: F401
