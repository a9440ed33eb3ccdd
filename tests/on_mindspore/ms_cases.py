"""The MindSpore system-test cases: one rank's side. Run by ms_job under msrun; every rank runs every case.

Every shared case of ``tests/shared/symm_api_cases.py`` (the user API, written once for torch and MindSpore) runs
here through the adapter :class:`ms_fw.MindSporeFramework`, then the cases below, which only MindSpore has. A shared
case passes or raises; a case below returns a JSON-able record (or raises: the record then holds the error).
test_ms_symm.py asserts on every rank's record.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

import mindspore as ms
from mindspore import communication
from mindspore.mint import distributed as md

import hyper_parallel.core.symmetric_memory as symm
from ms_fw import MindSporeFramework

_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared")
if _SHARED not in sys.path:
    sys.path.insert(0, _SHARED)

import symm_api_cases  # noqa: E402

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def raises(fn, *args, **kwargs) -> dict:
    """The class and message of what ``fn`` raised ({} if nothing)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the record names it)
        return {"type": type(e).__name__, "message": str(e), "mro": [c.__name__ for c in type(e).__mro__]}
    return {}


def tensor(a: np.ndarray) -> ms.Tensor:
    return ms.Tensor(a)


@case
def empty_refuses_dtypes_without_collectives(rank, world):
    """MindSpore's empty takes only the dtypes its collectives take (torch's takes any)."""
    return {"complex": raises(symm.empty, 4, dtype=ms.complex64)}


@case
def send_needs_a_channel(rank, world):
    """A point-to-point call on a group that no collective registered yet is refused, naming the group."""
    symm.barrier()
    communication.create_group("hp_fresh", list(range(world)))
    return {"no_channel": raises(symm.shmem_send, tensor(np.zeros(4, np.float32)), (rank + 1) % world,
                                 group="hp_fresh")}


@case
def send_recv_refused_while_recording(rank, world):
    """MindSpore cannot run the receiver's backward (its buffer is never differentiated): refused, not silently
    wrong."""
    nxt = (rank + 1) % world
    symm.barrier()
    seen = {}

    def loss(x):
        seen["error"] = raises(symm.shmem_send, x * 1.0, nxt)
        return (x * 2).sum()

    ms.grad(loss)(tensor(np.arange(4, dtype=np.float32)))
    return seen


@case
def graph_mode_is_refused(rank, world):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        error = raises(symm.barrier)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return {"error": error}


@case
def absent_rank_times_out(rank, world):
    """Rank 0 starts a collective on a new group that the other ranks never join: it raises in time (the last
    case: the group stays blocked)."""
    symm.barrier()
    communication.create_group("hp_absent", list(range(world)))
    if rank != 0:
        return {}
    start = time.monotonic()
    error = raises(symm.barrier, group="hp_absent")
    return {"error": error, "seconds": time.monotonic() - start}


def main() -> None:
    communication.init()
    fw = MindSporeFramework()
    rank, world = fw.rank, fw.world
    runners = {name: (lambda name=name: symm_api_cases.run(fw, name)) for name in symm_api_cases.CASES}
    runners.update({name: (lambda fn=fn: fn(rank, world)) for name, fn in CASES.items()})  # the last case last
    selected = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else list(runners)
    path = os.path.join(os.environ["HP_MS_RESULTS"], f"rank{rank}.jsonl")
    with open(path, "a") as f:
        for name in selected:
            start = time.monotonic()
            try:
                record = {"case": name, "ok": True, "result": runners[name]()}
            except Exception as e:  # noqa: BLE001 (reported to the test)
                record = {"case": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()}
            record["seconds"] = round(time.monotonic() - start, 3)
            f.write(json.dumps(record, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
            f.flush()
            md.barrier()   # cases start together on every rank


if __name__ == "__main__":
    main()
