"""MindSpore's groups that span nodes: the phases of :mod:`hyper_parallel.core.multicore.hierarchy` over the C ABI's
calls of a node team, across nodes over the runtime's own transport (the host device's UCX).

MindSpore's handler has no point-to-point link of its own across nodes: a group that spans nodes runs collectives
where the runtime reaches every rank of the other nodes, and is refused otherwise (naming why).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, Sequence

import numpy as np

from hyper_parallel.core.multicore import c_runtime
from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError
from hyper_parallel.core.multicore.hierarchy import Buffer, Hierarchy, NodeLayout, RuntimeLink
from hyper_parallel.platform.mindspore import groups, tensors

_BYTES = c_runtime.ElementType("uint8", 1, "uint8")


def _address(data: Optional[np.ndarray]) -> Optional[int]:
    return None if data is None or data.size == 0 else data.ctypes.data


class CAbiNodeEngine:
    """The node team's calls through the C ABI (:class:`hyper_parallel.core.multicore.hierarchy.NodeEngine`)."""

    def __init__(self, node_team: int, node_size: int) -> None:
        self.node_team = node_team
        self._node_size = node_size
        self.numberings = c_runtime.numberings()

    @staticmethod
    def buffer(tensor: Any, name: str) -> Buffer:
        if not tensors.is_tensor(tensor):
            raise ShmemTypeError(f"`{name}` must be a {tensors.tensor_type_name}, but got {type(tensor).__name__}")
        tensors.check_tensor(tensor, name)
        info = tensors.dtype_info(tensor.dtype)
        nbytes = tensors.nbytes(tensor)
        data = (np.empty(0, dtype=np.uint8) if nbytes == 0 else
                np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(tensors.address(tensor))))
        return Buffer(data, info.name, info.itemsize)

    @staticmethod
    def wait_for_stream() -> None:
        tensors.synchronize()

    def agree(self, collective: str, dtype: str, element_bytes: int, count: int, reduce_op: Optional[str],
              wire: Optional[str], peer: int, values: list, role: str) -> list:
        return c_runtime.agree(self.node_team, self._node_size, collective, dtype, element_bytes, count, reduce_op,
                               wire, peer, values, role)

    def refuse(self, collective: str, error: BaseException, role: str) -> None:
        c_runtime.refuse(self.node_team, collective, error, role)

    def barrier(self, role: str) -> None:
        c_runtime.team_barrier(self.node_team, role)

    def reduce_scatter(self, output: Buffer, input: Buffer, op: str, wire: Optional[str], role: str) -> None:
        c_runtime.reduce_scatter(self.node_team, _address(output.data), output.data.size, _address(input.data),
                                 input.data.size, output.dtype, op, wire, role)

    def all_gather(self, output: np.ndarray, input: np.ndarray, role: str) -> None:
        c_runtime.all_gather(self.node_team, _address(output), output.size, _address(input), input.size, _BYTES, role)

    def all_to_all(self, sends: Sequence[np.ndarray], receive: np.ndarray, counts: Sequence[int], dtype: str,
                   itemsize: int, role: str) -> None:
        c_runtime.all_to_all(self.node_team, [(_address(part), part.size) for part in sends], _address(receive),
                             receive.size, list(counts), c_runtime.ElementType(dtype, itemsize), role)

    def send(self, data: Buffer, local_peer: int) -> None:
        c_runtime.send(self.node_team, _address(data.data), data.data.size,
                       c_runtime.ElementType(data.dtype, data.itemsize), local_peer)

    def recv(self, data: Buffer, local_peer: int) -> None:
        c_runtime.recv(self.node_team, _address(data.data), data.data.size,
                       c_runtime.ElementType(data.dtype, data.itemsize), local_peer)

    def give_up(self, message: str) -> None:
        c_runtime.give_up(self.node_team, message)

    def release(self) -> None:
        if c_runtime.state() == "initialized":
            try:
                c_runtime.team_release(self.node_team)
            except Exception:  # its lifecycle already ended: nothing of it is left to release
                pass

    @staticmethod
    def exchange_messages(tag: int, exchanges: Sequence[tuple]) -> list:
        received, failed, first = c_runtime.exchange_messages(
            tag, [(pe, _address(send), 0 if send is None else send.size, _address(receive),
                   0 if receive is None else receive.size) for pe, send, receive in exchanges])
        failures = set(failed)
        return [(n, (first or "failed") if i in failures else "") for i, n in enumerate(received)]

    @staticmethod
    def moe_row(direction: str, experts: int, members: int, in_splits: list, in_offsets: Optional[list],
                input_rows: int, output_rows: int) -> list:
        return c_runtime.moe_row(direction, experts, members, in_splits, in_offsets, input_rows, output_rows)

    @staticmethod
    def moe_plan(direction: str, experts: int, major_align: int, rows: list, me: int) -> tuple:
        return c_runtime.moe_plan(direction, experts, major_align, rows, me)

    @staticmethod
    def encode(values: Buffer, wire: str) -> np.ndarray:
        # One row of the runtime's row codec: the format MindSpore's MoE exchange sends its rows in.
        payload = np.empty(c_runtime.wire_row_bytes(wire, values.count), dtype=np.uint8)
        c_runtime.encode_rows(wire, values.dtype, _address(values.data), 1, values.count, _address(payload))
        return payload

    @staticmethod
    def decode(payload: np.ndarray, count: int, wire: str, dtype: str) -> np.ndarray:
        wide = "float64" if dtype == "float64" else "float32"
        out = np.empty(count, dtype=np.float64 if wide == "float64" else np.float32)
        if count:
            c_runtime.decode_rows(wire, _address(payload), 1, count, wide, _address(out))
        return out


def _node_bootstrap(group: str, members: Sequence[int], local: int) -> c_runtime.Bootstrap:
    """The runtime's bootstrap of a node team: this node's ``members`` (group ranks) exchange over the whole group,
    whose every node makes its own node team at the same time, each member keeping its node's parts."""
    exchange = groups.bootstrap(group)

    def all_gather(payload: bytes) -> bytes:
        gathered = exchange.all_gather(payload)
        size = len(payload)
        return b"".join(gathered[g * size:(g + 1) * size] for g in members)

    return c_runtime.Bootstrap(local, len(members), all_gather, exchange.barrier)


def make_node_team(group: str, pes: Sequence[int], me: int, op: str) -> int:
    """This node's team of group ``group``, which spans nodes: a runtime team of the group's ranks on this node, made
    knowing every rank of the group, whose ranks its messages then name.

    Collective over the group's ranks (every node makes its own at the same time).

    Args:
        group: the group's name.
        pes: the world rank (PE) of every group rank.
        me: this rank's group rank.
        op: the public call that makes the team, for messages.

    Returns:
        The node team's id.

    Raises:
        ShmemValueError: the nodes hold different numbers of the group's ranks.
        ShmemTimeoutError: a rank did not arrive in time.
    """
    try:
        layout = NodeLayout(pes, me, c_runtime.debug_state()["nodes"])
    except ValueError as error:
        raise ShmemValueError(f"{error}: op={op} group={group}") from None
    members = layout.members[layout.node]
    return c_runtime.node_team_create([pes[g] for g in members], list(pes),
                                      _node_bootstrap(group, members, layout.local))


def make_hierarchy(group: str, pes: Sequence[int], me: int, transport: Optional[str], op: str,
                   node_team: Optional[int] = None) -> Hierarchy:
    """The phases of group ``group``, which spans nodes: its node team (made here unless given) and the runtime's
    link.

    Collective over the group's ranks (they call it in the same order).

    Args:
        group: the group's name.
        pes: the world rank (PE) of every group rank.
        me: this rank's group rank.
        transport: the runtime's transport to every rank of the other nodes ("ucx"), or None where it does not reach
            every one.
        op: the public call that makes the team, for messages.
        node_team: this node's team of the group, made already (:func:`make_node_team`), or None: made here. The
            hierarchy owns it from then on.

    Returns:
        The group's phases; its ``engine.node_team`` is the node team's id.

    Raises:
        ShmemValueError: the runtime does not reach every rank of the other nodes (a package without UCX), or the
            nodes hold different numbers of the group's ranks.
        ShmemTimeoutError: a rank did not arrive in time.
    """
    nodes = c_runtime.debug_state()["nodes"]
    if transport is None:
        raise ShmemValueError(
            f"`group` must lie on one node for {op} where the runtime reaches no other node, but got ranks "
            f"{list(pes)} on nodes {sorted({nodes[pe] for pe in pes})} (MindSpore's collectives cross nodes over the "
            f"runtime's transport: build the package with UCX, pip install hyper-parallel-shmem[ucx]): op={op} "
            f"group={group}")
    try:
        layout = NodeLayout(pes, me, nodes)
    except ValueError as error:
        raise ShmemValueError(f"{error}: op={op} group={group}") from None
    word = int.from_bytes(groups.bootstrap(group).all_gather(os.urandom(4))[:4], "little")
    if node_team is None:
        node_team = make_node_team(group, pes, me, op)
    engine = CAbiNodeEngine(node_team, layout.per_node)
    link = RuntimeLink(transport, tuple(pes), engine.exchange_messages)
    return Hierarchy(engine, link, layout, tuple(pes), word, c_runtime.read_config()["timeout_sec"])
