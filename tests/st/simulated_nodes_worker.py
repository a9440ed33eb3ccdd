"""Rank script for tests/st/test_simulated_nodes.py, run by torchrun inside simulated nodes (torch + gloo only).

Usage: ``simulated_nodes_worker.py check TAG``, ``... kill TIMEOUT_S``, ``... exit NODE`` or ``... sleep``.

``check``: every rank reports what a rank of a real multi-node job would see (its hostname, what that name resolves
to, what every node's name and localhost resolve to, the addresses its gloo sockets listen on, the variable
SIMULATED_NODES_TEST_MARKER, which /dev/shm files named TAG-* it can see after every rank created its own) and the
result of a gloo all_reduce; rank 0 prints every rank's report as one ``REPORT <json>`` line. The
/dev/shm files are left in place on purpose: they must vanish with their node.

``kill``: after a barrier, the ranks of node 1 print ``SLEEPING <rank>`` and sleep; the ranks of node 0 print
``COLLECTIVE <rank>`` and run an all_reduce that cannot finish until the test kills node 1, in a process group
whose timeout is TIMEOUT_S. A rank of node 0 whose collective raises prints ``FAILED <rank>`` and exits with 1.

``exit``: the ranks of node NODE print ``EXITING <rank>`` and exit with 3, the others with 0 (no torch, no group).

``sleep``: every rank prints ``SLEEPING <rank>`` and sleeps (no torch, no group), for the tests of timeouts.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time


def _listen_addresses() -> list[str]:
    """Return the IPv4 addresses this process's TCP sockets listen on (from /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    addresses = []
    with open("/proc/net/tcp", encoding="ascii") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                host = bytes.fromhex(local.split(":")[0])[::-1]  # little-endian on x86 and arm
                addresses.append(socket.inet_ntoa(host))
    return sorted(set(addresses))


def check(tag: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(f"/dev/shm/{tag}-{rank}", "w", encoding="ascii") as f:
        f.write(str(rank))
    dist.barrier()
    visible = sorted(name for name in os.listdir("/dev/shm") if name.startswith(f"{tag}-"))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    hostname = socket.gethostname()
    report = {
        "rank": rank,
        "world": world,
        "group_rank": int(os.environ["GROUP_RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "hostname": hostname,
        "address": socket.gethostbyname(hostname),
        "names": {name: socket.gethostbyname(name)
                  for name in ["localhost", *(f"node{j}" for j in range(int(os.environ["GROUP_WORLD_SIZE"])))]},
        "marker": os.environ.get("SIMULATED_NODES_TEST_MARKER"),
        "listen": _listen_addresses(),
        "visible": visible,
        "sum": total.item(),
    }
    reports: list[object] = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        print("REPORT " + json.dumps(reports), flush=True)
    dist.destroy_process_group()


def kill(timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    dist.barrier()
    if int(os.environ["GROUP_RANK"]) == 1:
        print(f"SLEEPING {rank}", flush=True)
        time.sleep(3600)  # the test kills this node long before
        return
    print(f"COLLECTIVE {rank}", flush=True)
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as e:  # noqa: BLE001 - any failure of the collective is the expected outcome
        print(f"FAILED {rank}: {type(e).__name__}", flush=True)
        sys.exit(1)
    print(f"FINISHED {rank}", flush=True)


def exit_on(node: int) -> None:
    if int(os.environ["GROUP_RANK"]) == node:
        print(f"EXITING {os.environ['RANK']}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    if sys.argv[1] == "exit":
        exit_on(int(sys.argv[2]))
    elif sys.argv[1] == "sleep":
        print(f"SLEEPING {os.environ['RANK']}", flush=True)
        time.sleep(3600)  # the test's timeout kills it long before
    elif sys.argv[1] == "check":
        check(sys.argv[2])
    elif sys.argv[1] == "kill":
        kill(float(sys.argv[2]))
    else:
        sys.exit(f"the mode must be `check`, `kill`, `exit` or `sleep`, but got {sys.argv[1]!r}")
