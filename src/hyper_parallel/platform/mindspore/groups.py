"""MindSpore's communication groups as the runtime needs them: names, ranks, and a bootstrap over each.

A group is named by a string (``mindspore.communication.create_group`` or
``mindspore.mint.distributed.new_group``); None is the world group. The runtime's bootstrap (its initialisation
and each team's creation) exchanges bytes with ``all_gather_object`` and waits with ``barrier`` over the group,
never with MindSpore's point-to-point calls (broken on CPU in 2.10).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple, Optional

import mindspore as ms
from mindspore import communication, context
from mindspore.mint import distributed

from hyper_parallel.core.multicore import c_runtime
from hyper_parallel.core.multicore.errors import (UNNAMED_CALL, ShmemStateError, ShmemTimeoutError, ShmemTypeError,
                                                 ShmemValueError)

_DEFAULT_TIMEOUT_SEC = 120.0   # the runtime's default (runtime/config.h)
_initialized = False           # MindSpore's communication was seen initialised (it stays so)

WORLD = communication.GlobalComm.WORLD_COMM_GROUP


def require_initialized(op: Optional[str]) -> None:
    """Raises ShmemStateError unless MindSpore's communication is initialised and the call runs eagerly.

    Args:
        op: the call the message names; None where only the public function above knows it (the API names it).

    Raises:
        ShmemStateError: ``mindspore.communication.init()`` was not called, or MindSpore runs in graph mode (its
            compiler cannot run the host device's calls, which are Python calls into the runtime).
    """
    global _initialized
    named = UNNAMED_CALL if op is None else f"op={op}"
    if not _initialized:
        if not distributed.is_initialized():
            raise ShmemStateError(f"mindspore communication is not initialised (call mindspore.communication.init() "
                                  f"on every rank first): {named}")
        _initialized = True
    # context._get_mode is what get_context("mode") reads, without its argument checks: this runs on every call.
    if context._get_mode() != ms.PYNATIVE_MODE:
        raise ShmemStateError(f"symmetric memory on MindSpore runs in PyNative mode only (the host device's calls "
                              f"are Python calls into the runtime, which graph mode cannot compile): {named} "
                              f"mode=GRAPH_MODE")


def _timeout_sec() -> float:
    """The runtime's timeout (``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``, read by the runtime)."""
    try:
        return float(c_runtime.read_config()["timeout_sec"])
    except ValueError:
        return _DEFAULT_TIMEOUT_SEC   # the runtime refuses the bad value with its own message first


def _bounded(step: Callable[[], object], what: str, group: str) -> object:
    """Runs one of MindSpore's blocking collectives, giving up after the runtime's timeout.

    MindSpore's collectives wait without a deadline; this waits for ``step`` on a helper thread and raises when
    the timeout passes (the thread stays blocked: the group is unusable from then on, as after any timeout).
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = step()
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            outcome["error"] = e

    timeout = _timeout_sec()
    worker = threading.Thread(target=run, name=f"hp-shmem-bootstrap-{what}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise ShmemTimeoutError(f"bootstrap {what} over the MindSpore group timed out (a rank did not take part): "
                                f"group={group} timeout_sec={timeout:g}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def name(group: Optional[str]) -> str:
    """The group's name (None: the world group).

    Raises:
        TypeError: not a string or None.
    """
    if group is None:
        return WORLD
    if not isinstance(group, str):
        raise ShmemTypeError(f"`group` must be a MindSpore group name (str) or None, but got {type(group).__name__}")
    return group


def ranks(group: str) -> list:
    """The world ranks of ``group``, in group-rank order.

    Raises:
        ShmemValueError: MindSpore knows no group of that name (never created here, or destroyed).
    """
    if group == WORLD:
        return list(range(distributed.get_world_size()))
    try:
        return list(communication.get_process_group_ranks(group))
    except (RuntimeError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ShmemValueError(f"`group` must name a MindSpore group of this process, but got {group!r} "
                              f"(mindspore: {reason})") from None


def world_rank() -> int:
    """This process's world rank."""
    return distributed.get_rank()


class Exchange(NamedTuple):
    """What the runtime's bootstrap needs of a group: this rank's group rank, the group's size, an all_gather of
    bytes (every rank's in rank order) and a barrier."""

    rank: int
    size: int
    all_gather: Callable[[bytes], bytes]
    barrier: Callable[[], None]


def bootstrap(group: str) -> Exchange:
    """The exchange the runtime's bootstrap runs over ``group``."""
    members = ranks(group)
    me = members.index(world_rank())
    size = len(members)
    scope = None if group == WORLD else group

    def all_gather(payload: bytes) -> bytes:
        gathered = [None] * size
        _bounded(lambda: distributed.all_gather_object(gathered, payload, group=scope), "all_gather", group)
        return b"".join(gathered)

    def barrier() -> None:
        _bounded(lambda: distributed.barrier(group=scope), "barrier", group)

    return Exchange(me, size, all_gather, barrier)
