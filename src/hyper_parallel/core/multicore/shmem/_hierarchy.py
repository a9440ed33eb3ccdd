"""Teams that span nodes on the torch face: the phases of :mod:`hyper_parallel.core.multicore.hierarchy` over the
torch binding's calls of the node team, and over either link across nodes: the runtime's transport where it reaches
every member of the other nodes, otherwise the team's ProcessGroup (gloo's point to point).

gloo connects every pair of a group once, so lanes need no groups of their own. (torch 2.13's
``new_group(use_local_synchronization=True)`` names a group after the number of groups each member has made so far, so
groups made by the members of different teams would not meet.)
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from hyper_parallel.core.multicore.hierarchy import Buffer, Hierarchy, NodeLayout, RuntimeLink, Transfer, first_line
from hyper_parallel.core.multicore.shmem import codec
from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import _bootstrap, _Root
from hyper_parallel.core.multicore.shmem._streams import DEFAULT_HANDLE, current_handle
from hyper_parallel.core.multicore.errors import project_code

_NUMBERINGS = {"collectives": dict(C.collectives()), "reduce_ops": dict(C.reduce_ops()),
               "wire_formats": dict(C.wire_formats()), "call_roles": dict(C.call_roles()),
               "status_codes": dict(C.status_codes())}


def _tensor(data: Optional[np.ndarray], dtype: str = "uint8") -> Optional[torch.Tensor]:
    """A torch tensor over a flat byte array's memory, as ``dtype``."""
    return None if data is None else torch.from_numpy(data).view(getattr(torch, dtype))


class _GroupLink:
    """Transfers across nodes over the team's ProcessGroup: gloo's point to point, between global ranks."""

    name = "gloo"

    def __init__(self, group: dist.ProcessGroup, global_ranks: Sequence[int]) -> None:
        self._group = group
        self._global = global_ranks

    def transfer(self, tag: int, transfers: Sequence[Transfer], deadline: float) -> dict:
        """Each transfer in turn, in the given order: its send and receive posted at once, or one after the other
        (``send_first`` True or False: on gloo a send that finds its receive posted is a single hand-off, and posting
        both directions at once costs twice as much), each waited for until the deadline.

        Returns:
            The failures: the first line of gloo's message (gloo refuses to post on a connection it saw close) or of
            the timeout, by the transfer's key.
        """
        failures = {}
        for item in transfers:
            rank = self._global[item.member]
            send, receive = _tensor(item.send), _tensor(item.receive)
            posts = []
            if send is not None:
                posts.append(lambda: dist.isend(send, dst=rank, group=self._group, tag=tag))
            if receive is not None:
                posts.append(lambda: dist.irecv(receive, src=rank, group=self._group, tag=tag))
            if item.send_first is False:
                posts.reverse()
            steps = [posts] if item.send_first is None else [[post] for post in posts]
            try:
                for step in steps:
                    for work in [post() for post in step]:
                        work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.05)))
            except RuntimeError as error:
                failures[item.key] = first_line(error)
        return failures


class _TorchNodeEngine:
    """The node team's calls through the torch binding (:class:`hyper_parallel.core.multicore.hierarchy.NodeEngine`),
    on the default stream (the phases wait for the current stream's work first)."""

    numberings = _NUMBERINGS

    def __init__(self, node_team: int) -> None:
        self.node_team = node_team

    @staticmethod
    def buffer(tensor: object, name: str) -> Buffer:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, but got {type(tensor).__name__}")
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"`{name}` must be a contiguous CPU tensor, but got device={tensor.device} "
                             f"contiguous={tensor.is_contiguous()}")
        data = tensor.detach().reshape(-1).view(torch.uint8).numpy()
        return Buffer(data, str(tensor.dtype).replace("torch.", ""), tensor.element_size())

    @staticmethod
    def wait_for_stream() -> None:
        handle = current_handle()
        if handle != DEFAULT_HANDLE:
            C.synchronize_stream(handle)

    def agree(self, collective: str, dtype: str, element_bytes: int, count: int, reduce_op: Optional[str],
              wire: Optional[str], peer: int, values: list, role: str) -> list:
        return C.agree(self.node_team, _NUMBERINGS["collectives"][collective], dtype, element_bytes, count,
                       0 if reduce_op is None else _NUMBERINGS["reduce_ops"][reduce_op] + 1,
                       _NUMBERINGS["wire_formats"][wire or "full"], peer, values, DEFAULT_HANDLE,
                       _NUMBERINGS["call_roles"][role])

    def refuse(self, collective: str, error: BaseException, role: str) -> None:
        C.refuse(self.node_team, _NUMBERINGS["collectives"][collective],
                 _NUMBERINGS["status_codes"][project_code(error)], str(error), DEFAULT_HANDLE,
                 _NUMBERINGS["call_roles"][role])

    def barrier(self, role: str) -> None:
        C.team_barrier(self.node_team, DEFAULT_HANDLE, _NUMBERINGS["call_roles"][role])

    def reduce_scatter(self, output: Buffer, input: Buffer, op: str, wire: Optional[str], role: str) -> None:
        C.reduce_scatter(self.node_team, _tensor(output.data, output.dtype), _tensor(input.data, input.dtype),
                         _NUMBERINGS["reduce_ops"][op], DEFAULT_HANDLE, _NUMBERINGS["wire_formats"][wire or "full"],
                         _NUMBERINGS["call_roles"][role])

    def all_gather(self, output: np.ndarray, input: np.ndarray, role: str) -> None:
        C.all_gather(self.node_team, _tensor(output), _tensor(input), DEFAULT_HANDLE, _NUMBERINGS["call_roles"][role])

    def all_to_all(self, sends: Sequence[np.ndarray], receive: np.ndarray, counts: Sequence[int], dtype: str,
                   itemsize: int, role: str) -> None:
        del itemsize
        C.all_to_all(self.node_team, [_tensor(part, dtype) for part in sends], _tensor(receive, dtype), list(counts),
                     DEFAULT_HANDLE, _NUMBERINGS["call_roles"][role])

    def send(self, data: Buffer, local_peer: int) -> None:
        C.send(self.node_team, _tensor(data.data, data.dtype), local_peer, DEFAULT_HANDLE)

    def recv(self, data: Buffer, local_peer: int) -> None:
        C.recv(self.node_team, _tensor(data.data, data.dtype), local_peer, DEFAULT_HANDLE)

    def give_up(self, message: str) -> None:
        C.give_up(self.node_team, message)

    def release(self) -> None:
        if C.state() == "initialized":
            try:
                C.team_release(self.node_team)
            except Exception:  # its lifecycle already ended: nothing of it is left to release
                pass

    @staticmethod
    def exchange_messages(tag: int, exchanges: Sequence[tuple]) -> list:
        return C.exchange_messages(tag, [(pe, _tensor(send), _tensor(receive)) for pe, send, receive in exchanges])

    @staticmethod
    def moe_row(direction: str, experts: int, members: int, in_splits: list, in_offsets: Optional[list],
                input_rows: int, output_rows: int) -> list:
        return C.moe_row(0 if direction == "dispatch" else 1, experts, members, in_splits, in_offsets, input_rows,
                         output_rows)

    @staticmethod
    def moe_plan(direction: str, experts: int, major_align: int, rows: list, me: int) -> tuple:
        return C.moe_plan(0 if direction == "dispatch" else 1, experts, major_align, rows, me)

    @staticmethod
    def encode(values: Buffer, wire: str) -> np.ndarray:
        count = values.count
        fp8 = wire not in ("float16", "bfloat16")
        scales = np.empty(codec.scale_count(count) * 4 if fp8 else 0, dtype=np.uint8)
        codes = np.empty(count * (1 if fp8 else 2), dtype=np.uint8)
        codec.encode(_tensor(values.data, values.dtype), (_tensor(scales, "float32") if fp8 else None,
                                                          _tensor(codes, wire)))
        return np.concatenate([scales, codes])

    @staticmethod
    def decode(payload: np.ndarray, count: int, wire: str, dtype: str) -> np.ndarray:
        split = codec.scale_count(count) * 4 if wire not in ("float16", "bfloat16") else 0
        out = np.empty(count, dtype=np.float64 if dtype == "float64" else np.float32)
        codec.decode((_tensor(payload[:split], "float32") if split else None, _tensor(payload[split:], wire)),
                     torch.from_numpy(out), accumulate=False)
        return out


def make_hierarchy(group: dist.ProcessGroup, pes: Sequence[int], me: int, root: _Root, word: int) -> Hierarchy:
    """The phases of a team that spans nodes: its node team (a runtime team of this node's members, made here) and
    its link.

    Collective over the team's members (they call it in the same order).

    Args:
        group: the team's ProcessGroup (the root's for the root team).
        pes: the PE of every group rank.
        me: this member's group rank.
        root: the active root.
        word: a random word every member received from the first (it picks the team's tags).

    Returns:
        The team's hierarchy; its ``engine.node_team`` is the node team's number.

    Raises:
        ValueError: the nodes hold different numbers of the team's members.
        ShmemTimeoutError: a member did not arrive in time.
    """
    layout = NodeLayout(pes, me, root.nodes)
    node_members = layout.members[layout.node]
    all_gather, barrier = _bootstrap(group, "team_create", members=node_members)
    # The node team knows the whole team, so that every message of its phases names the team's ranks.
    engine = _TorchNodeEngine(C.team_create([pes[g] for g in node_members], layout.local, all_gather, barrier,
                                            serves=list(pes)))
    global_ranks = tuple(root.ranks[pe] for pe in pes)
    transport = root.remote_transport(pes)
    link = (_GroupLink(group, global_ranks) if transport is None else
            RuntimeLink(transport, tuple(pes), engine.exchange_messages))
    return Hierarchy(engine, link, layout, global_ranks, word, C.read_config()["timeout_sec"])
