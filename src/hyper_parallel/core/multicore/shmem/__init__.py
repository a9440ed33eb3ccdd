"""The HyperParallel SHMEM runtime face: symmetric memory and one-sided communication over the C++ runtime.

Typical use, on every rank of an initialised ``torch.distributed`` WORLD::

    from hyper_parallel.core.multicore import shmem

    with shmem.acquire_shmem():
        buf = shmem.empty(world, 1024, dtype=torch.float32)
        shmem.put(buf[rank], torch.ones(1024), pe=(rank + 1) % world)
        shmem.barrier()
        shmem.free(buf)

The runtime runs on the ``host`` device: POSIX shared memory between the processes of one machine.

Code written for upstream hyper-parallel's runtime runs too: ``shmem.acquire()``/``shmem.release()`` (the same
reference count as handles), ``host_barrier()``, ``barrier(blocking=...)``, ``signal(..., operation=...)``,
``wait_signal(..., comparison=...)``, upstream's ``debug_state()`` keys and its error fields.
"""

from hyper_parallel.core.multicore.shmem._debug import (
    DebugState,
    Failure,
    StateName,
    debug_state,
    remote_transport_transfer,
)
from hyper_parallel.core.multicore.shmem._lifecycle import (
    Handle,
    device_available,
    low_precision_default,
    read_config,
)
from hyper_parallel.core.multicore.shmem._memory import empty, free, peer_tensor
from hyper_parallel.core.multicore.shmem._references import acquire, acquire_shmem, host_barrier, release
from hyper_parallel.core.multicore.shmem._rma import (
    all_gather,
    barrier,
    get,
    put,
    put_with_signal,
    reduce,
    signal,
    wait_signal,
)
from hyper_parallel.core.multicore.shmem._streams import Stream, current_stream, default_stream, stream
from hyper_parallel.core.multicore.shmem._teams import CALL_ROLES, COLLECTIVES, REDUCE_OPS, Team, plain_eager, root_team
from hyper_parallel.core.multicore.errors import (
    ShmemDeviceError,
    ShmemError,
    ShmemMismatchError,
    ShmemOutOfMemoryError,
    ShmemStateError,
    ShmemTimeoutError,
    ShmemTypeError,
    ShmemValueError,
)

__all__ = [
    "CALL_ROLES",
    "COLLECTIVES",
    "REDUCE_OPS",
    "Team",
    "root_team",
    "DebugState",
    "Failure",
    "Handle",
    "ShmemDeviceError",
    "ShmemError",
    "ShmemMismatchError",
    "ShmemOutOfMemoryError",
    "ShmemStateError",
    "ShmemTimeoutError",
    "ShmemTypeError",
    "ShmemValueError",
    "StateName",
    "Stream",
    "acquire",
    "acquire_shmem",
    "all_gather",
    "barrier",
    "current_stream",
    "debug_state",
    "default_stream",
    "device_available",
    "empty",
    "free",
    "get",
    "host_barrier",
    "low_precision_default",
    "peer_tensor",
    "plain_eager",
    "put",
    "put_with_signal",
    "read_config",
    "reduce",
    "release",
    "remote_transport_transfer",
    "signal",
    "stream",
    "wait_signal",
]
