"""The user API on torch: the shared :class:`._api.Api` over torch's tensor facts and torch's calls.

torch's calls are the functions of :mod:`._primitives`, :mod:`._collectives`, :mod:`._fused` and :mod:`._setup`:
they run the operators of :mod:`._ops` (torch.compile, autograd, streams) over the C++ binding
``hyper_parallel._shmem_torch`` (tensors from allocations, storage invalidation on free). Groups are
``torch.distributed`` ProcessGroups, passed to the operators by name (:mod:`._groups`).
"""

from __future__ import annotations

from hyper_parallel.core.symmetric_memory import _collectives, _fused, _groups, _primitives, _setup
from hyper_parallel.core.symmetric_memory._api import Api
from hyper_parallel.platform.torch import tensors as torch_tensors


def _group_size(group_name: str) -> int:
    return _groups.size(_groups.resolve(group_name))


class TorchCalls:
    """torch's calls into the runtime, as :class:`._api.Api` takes them (its module docstring lists them)."""

    fast = _collectives.Fast

    group_key = staticmethod(_groups.name)
    group_size = staticmethod(_group_size)

    empty = staticmethod(_primitives.empty)
    free = staticmethod(_primitives.free)
    shutdown = staticmethod(_primitives.shutdown)
    put = staticmethod(_primitives.put)
    get = staticmethod(_primitives.get)
    signal = staticmethod(_primitives.signal)
    wait_signal = staticmethod(_primitives.wait_signal)
    put_with_signal = staticmethod(_primitives.put_with_signal)
    barrier = staticmethod(_primitives.barrier)

    wire = staticmethod(_collectives.wire)
    all_gather = staticmethod(_collectives.all_gather)
    all_reduce = staticmethod(_collectives.all_reduce)
    reduce_scatter = staticmethod(_collectives.reduce_scatter)
    all_to_all = staticmethod(_collectives.all_to_all)
    send = staticmethod(_collectives.send)
    recv = staticmethod(_collectives.recv)

    all_gather_matmul = staticmethod(_fused.all_gather_matmul)
    matmul_reduce_scatter = staticmethod(_fused.matmul_reduce_scatter)

    available = staticmethod(_setup.available)
    rendezvous = staticmethod(_setup.rendezvous)


API = Api(torch_tensors, TorchCalls)
