"""The user API (``symm.*``), written once for every framework.

An :class:`Api` is the API over one framework's handler (:class:`~.protocol.Handler`): every public function checks
its arguments with the shared checks (:mod:`.checks`, over the handler's tensor facts), turns ``group=`` into the
handler's group key, and hands the checked call to the handler's calls, which go down to the runtime and do not come
back up:

* torch's (:mod:`hyper_parallel.platform.torch`): straight into the runtime face's teams when a call is eager and
  nothing tracks grad, else through the ``torch.library`` operators (torch.compile, autograd, streams). Its ``fast``
  calls take an eager collective *before* the checks where the engine can check it itself (a group whose team
  exists, plain tensors: the small-message path);
* MindSpore's (:mod:`hyper_parallel.platform.mindspore`): the runtime's C ABI (tensors over heap memory,
  synchronisation, groups, bprop).

A collective is one decision of every rank of its group. A check that fails before the group is known (``group=``
itself) raises on this rank alone; any check that fails after it (every other argument, a destroyed group, a freed
tensor: facts only this rank holds) is *refused* through the group's team (the handler's ``refuse``): this rank still
enters the call's first sync with its refusal, and every rank raises the same class and message, naming the rank that
refused. An argument error of a collective (``ValueError``/``TypeError``) is decided in two calls of every rank where
the handler has fast calls: the first finds it (the engine's own checks on the fast path, or the user API's), the
second is the user API's checked call on every rank, so that every rank raises the argument named as the API names it,
whichever path each rank took first (:meth:`Api._again`). Nothing is added to the fast path's success.

A broken contract raises ``ShmemValueError``/``ShmemTypeError`` (``ValueError``/``TypeError`` as well), and every
error a public function raises carries upstream hyper-parallel's fields (``error_code``, ``operation``, ``phase``,
``cann_error_code``, and the ``[HYPER_PARALLEL_SHMEM_ERROR] error_code=... operation=...`` note diagnostics parse):
the operation is the public function's name unless the runtime below named its own call first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Optional, TypeVar, Union

from hyper_parallel.core.multicore.errors import ShmemStateError, attach_fields
from hyper_parallel.core.symmetric_memory.checks import COMPARE_OPS, SIGNAL_OPS, Checks, choice, view_bytes
from hyper_parallel.core.symmetric_memory.checks import shape as checked_shape

# The framework's types, as a handler's users see them (torch: torch.Tensor, torch.dtype, ProcessGroup; MindSpore:
# mindspore.Tensor, its dtype, a group name). The package's own annotations bind them for torch (symm's
# __init__.py); the checks below accept exactly what the framework's handler accepts.
TensorT = TypeVar("TensorT")
DTypeT = TypeVar("DTypeT")
GroupT = TypeVar("GroupT")
# An offset, size or rank: an int or a one-element integer tensor.
Index = Union[int, TensorT]

# What a check that fails after the group is known raises: refused through the group's team (Api._refuse).
_REFUSED = (ValueError, TypeError, ShmemStateError)

_SIGNAL_PADS = ("signal pads are not part of this library: a signal is a symmetric tensor like any other "
                "(symm.empty(n, dtype=int32), raised with shmem_signal_op and waited for with shmem_wait_for_signal)")


class SymmetricMemory(Generic[TensorT, DTypeT]):
    """What :meth:`Api.rendezvous` returns (torch's ``SymmetricMemory`` in small): the group's view of one symmetric
    tensor.

    Attributes:
        rank: this process's rank inside the group.
        world_size: the group's size.
        buffer_size: the tensor's bytes (the same on every rank).
        buffer_ptrs: the address, in this process, of every group rank's copy (index = group rank).
    """

    def __init__(self, checks: Checks, rank: int, buffer_ptrs: Sequence[int], buffer_size: int,
                 view: Callable[[int, int, int, tuple, Any], Any], barrier: Callable[[], None]) -> None:
        """Made by the framework's ``rendezvous`` call: ``view(rank, begin, end, shape, dtype)`` is group rank
        ``rank``'s bytes ``[begin, end)`` as a tensor of ``shape`` and ``dtype`` over that rank's memory, and
        ``barrier()`` the group's barrier."""
        self._checks = checks
        self._view = view
        self._barrier = barrier
        self.rank = rank
        self.world_size = len(buffer_ptrs)
        self.buffer_size = buffer_size
        self.buffer_ptrs = list(buffer_ptrs)

    def get_buffer(self, rank: int, sizes: Union[int, Sequence[int]], dtype: DTypeT,
                   storage_offset: int = 0) -> TensorT:
        """Group rank ``rank``'s copy of the tensor as a tensor of ``sizes`` and ``dtype`` (torch's signature).

        Reads and writes go to that rank's memory in place; order them with signals or :meth:`barrier`.

        Args:
            rank: a rank inside the group.
            sizes: the shape of the view (an int or a sequence of ints).
            dtype: its element type.
            storage_offset: where it starts, in elements of ``dtype``.

        Returns:
            The view. On torch it dies with the allocation (after ``symm.free``, any use raises).

        Raises:
            TypeError: ``dtype`` is not a dtype of the framework, or ``rank``/``storage_offset``/``sizes`` not ints.
            ValueError: ``rank`` outside the group, a negative offset, or a view past the tensor's end.
        """
        rank = self._checks.rank_in_group(rank, "rank", self.world_size)
        itemsize = self._checks.facts.itemsize(dtype)
        offset = self._checks.count(storage_offset, "storage_offset")
        dims = checked_shape(sizes)
        numel = 1
        for d in dims:
            numel *= d
        begin, end = view_bytes(offset, numel, itemsize, self.buffer_size)
        return self._view(rank, begin, end, dims, dtype)

    def barrier(self) -> None:
        """A barrier of the group (``symm.barrier(group)``): writes before it are visible to every rank after it.

        Raises:
            ShmemTimeoutError: a rank did not arrive in time.
        """
        self._barrier()

    def __repr__(self) -> str:
        return f"SymmetricMemory(rank={self.rank}, world_size={self.world_size}, buffer_size={self.buffer_size})"


class Api(Generic[TensorT, DTypeT, GroupT]):
    """The user API's functions over one framework's handler, typed by the framework's tensor, dtype and group."""

    def __init__(self, handler: Any) -> None:
        """Binds the API to ``handler`` (a :class:`~.protocol.Handler`) and registers what its framework must know
        before the first call."""
        handler.register_operators()
        self.handler = handler
        self.checks = Checks(handler.facts)
        self.calls = handler.calls
        self.fast = handler.fast

    # ------------------------------------------------------------------ one decision of every rank
    def _refuse(self, key: Any, operation: str, error: BaseException) -> None:
        """Refuses this rank's call of ``operation`` (a public function's name) on group ``key`` for ``error``, a
        check that failed after the group was known: every rank of the group raises the same class and message,
        naming this rank (or ``error`` on this rank alone where no team can carry the refusal).

        Raises:
            The refusal, always.
        """
        try:
            self.calls.refuse(key, operation, error)
        except BaseException as refused:
            raise refused from None   # the refusal repeats the check's message
        raise error   # a handler's refuse always raises; this is its contract's guard

    def _again(self, first: BaseException, operation: str, checked: Callable[..., Any], *args: Any) -> Any:
        """The second call of a collective whose first call failed with an argument error (``first``): where the
        handler has fast calls, every rank of the group makes it, through the user API's checks (``checked``), so
        that a rank whose engine refused on the fast path names the argument as the API does, and every rank raises
        what that call decides. Without fast calls the first call is the checked one: ``first`` is raised.

        Raises:
            What the second call raises (``first`` without fast calls), with upstream's fields for ``operation``.
        """
        try:
            if self.fast is None:
                raise first
            return checked(*args)
        except Exception as error:
            attach_fields(error, operation)
            raise error from None

    # ------------------------------------------------------------------ lifecycle
    def empty(self, shape: Union[int, Sequence[int]], dtype: Optional[DTypeT] = None) -> TensorT:
        """Allocates a tensor in symmetric memory (collective over the world: every rank, same order, same shape).

        The first call starts the SHMEM runtime over the world group (the framework's distributed layer must be
        initialised). The heap has ``HYPER_PARALLEL_SHMEM_HEAP_SIZE`` bytes per rank (alias
        ``SYMMETRIC_MEMORY_HEAP_SIZE``, default 1 GiB). The contents are uninitialised.

        Args:
            shape: the tensor's shape, an int or a sequence of ints.
            dtype: its dtype (None: float32).

        Returns:
            A tensor whose storage lies in the symmetric heap.

        Raises:
            TypeError, ValueError: a bad shape or dtype.
            ShmemMismatchError: ranks disagree on the allocation.
            ShmemOutOfMemoryError: the heap is full.
            ShmemStateError: the framework's distributed layer is not initialised.
        """
        try:
            return self.calls.empty(checked_shape(shape), dtype)
        except Exception as error:
            attach_fields(error, "empty")
            raise

    def free(self, tensor: TensorT) -> None:
        """Frees a tensor from :meth:`empty` (collective over the world).

        On torch its views raise on any later use; on MindSpore the runtime refuses it in every call.

        Args:
            tensor: the tensor :meth:`empty` returned.

        Raises:
            ValueError: the tensor is not a symmetric allocation.
            ShmemMismatchError: ranks free different allocations.
        """
        try:
            self.calls.free(tensor)
        except Exception as error:
            attach_fields(error, "free")
            raise

    def shutdown(self) -> None:
        """Frees the API's workspace and releases its runtime reference (collective over the world).

        Every tensor from :meth:`empty` must be freed first. A later :meth:`empty` starts afresh.

        Raises:
            ShmemStateError: symmetric tensors are still allocated on some rank (nothing is released).
        """
        try:
            self.calls.shutdown()
        except Exception as error:
            attach_fields(error, "shutdown")
            raise

    # ------------------------------------------------------------------ primitives
    def shmem_put(self, target: TensorT, target_offset: Index[TensorT], src: TensorT, src_offset: Index[TensorT],
                  size: Index[TensorT], target_rank: Index[TensorT], group: Optional[GroupT] = None) -> None:
        """Writes ``src[src_offset : +size]`` into ``target[target_offset : +size]`` on ``target_rank`` (push).

        Offsets and sizes count elements; each may be an int or a one-element integer tensor.

        Args:
            target: a symmetric tensor; its copy on ``target_rank`` is written.
            target_offset: first element of ``target`` written.
            src: any contiguous tensor of ``target``'s dtype.
            src_offset: first element of ``src`` read.
            size: number of elements.
            target_rank: the destination, a rank of ``group``.
            group: a group of the framework (None: the world).

        Raises:
            TypeError: wrong types or differing dtypes.
            ValueError: ranges past a tensor's end, a rank outside the group, ``target`` not symmetric.
        """
        try:
            target, target_at, src, src_at, n = self.checks.windows(target, target_offset, src, src_offset, size)
            rank = self.checks.integer(target_rank, "target_rank")
            self.calls.put(target, target_at, src, src_at, n, rank, self.calls.group_key(group))
        except Exception as error:
            attach_fields(error, "shmem_put")
            raise

    def shmem_get(self, target: TensorT, target_offset: Index[TensorT], src: TensorT, src_offset: Index[TensorT],
                  size: Index[TensorT], target_rank: Index[TensorT], group: Optional[GroupT] = None) -> None:
        """Reads ``src[src_offset : +size]`` as it is on ``target_rank`` into the local ``target`` (pull).

        The parameters are those of :meth:`shmem_put`; the data flows the other way: from ``target_rank``'s copy
        of the symmetric ``src`` into the local ``target``.

        Args:
            target: any contiguous tensor, written locally.
            target_offset: first element of ``target`` written.
            src: a symmetric tensor; its copy on ``target_rank`` is read.
            src_offset: first element of ``src`` read.
            size: number of elements.
            target_rank: the rank read from, a rank of ``group``.
            group: a group of the framework (None: the world).

        Raises:
            TypeError, ValueError: as :meth:`shmem_put`, with ``src`` the symmetric side.
        """
        try:
            target, target_at, src, src_at, n = self.checks.windows(target, target_offset, src, src_offset, size)
            rank = self.checks.integer(target_rank, "target_rank")
            self.calls.get(target, target_at, src, src_at, n, rank, self.calls.group_key(group))
        except Exception as error:
            attach_fields(error, "shmem_get")
            raise

    def shmem_signal_op(self, signal: TensorT, signal_offset: Index[TensorT], signal_value: Index[TensorT],
                        signal_op: int, target_rank: Index[TensorT], group: Optional[GroupT] = None) -> None:
        """Atomically SETs or ADDs ``signal_value`` to ``signal[signal_offset]`` on ``target_rank``.

        Everything this rank issued before the call is visible on ``target_rank`` before the new signal value.

        Args:
            signal: a symmetric int32 or int64 tensor.
            signal_offset: the element updated.
            signal_value: the value (int or one-element tensor); it must fit the signal's dtype.
            signal_op: 0 = SET, 1 = ADD.
            target_rank: a rank of ``group``.
            group: a group of the framework (None: the world).

        Raises:
            TypeError, ValueError: a bad argument; nothing is written.
        """
        try:
            signal, offset = self.checks.signal(signal, signal_offset)
            op = choice(signal_op, "signal_op", SIGNAL_OPS)
            value = self.checks.integer(signal_value, "signal_value")
            rank = self.checks.integer(target_rank, "target_rank")
            self.calls.signal(signal, offset, value, op, rank, self.calls.group_key(group))
        except Exception as error:
            attach_fields(error, "shmem_signal_op")
            raise

    def shmem_wait_for_signal(self, depend_tensor: Optional[TensorT], signal: TensorT, signal_offset: Index[TensorT],
                              compare_value: Index[TensorT], compare_op: int) -> None:
        """Waits until the local ``signal[signal_offset]`` compares true against ``compare_value``.

        Spins briefly, then sleeps in the kernel; gives up after ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``.

        Args:
            depend_tensor: the data the signal guards (orders graph-mode frameworks; unused on the host device).
            signal: a symmetric int32 or int64 tensor.
            signal_offset: the element waited on.
            compare_value: the value compared with (int or one-element tensor).
            compare_op: 0 = EQ, 1 = GT, 2 = LT, 3 = NE, 4 = GE, 5 = LE.

        Raises:
            TypeError, ValueError: a bad argument.
            ShmemTimeoutError: the condition did not hold in time (the message has the observed value).
            ShmemDeviceError: a PE of another node is gone (its process exited or its node died) and the condition
                does not hold: the message names the lost PEs and their nodes.
        """
        try:
            self.checks.optional_tensor(depend_tensor, "depend_tensor")
            signal, offset = self.checks.signal(signal, signal_offset)
            cmp = choice(compare_op, "compare_op", COMPARE_OPS)
            value = self.checks.integer(compare_value, "compare_value")
            self.calls.wait_signal(depend_tensor, signal, offset, value, cmp)
        except Exception as error:
            attach_fields(error, "shmem_wait_for_signal")
            raise

    def shmem_put_with_signal(self, target: TensorT, target_offset: Index[TensorT], src: TensorT,
                              src_offset: Index[TensorT], size: Index[TensorT], signal: TensorT,
                              signal_offset: Index[TensorT], signal_value: Index[TensorT], signal_op: int,
                              target_rank: Index[TensorT], group: Optional[GroupT] = None) -> None:
        """:meth:`shmem_put`, then :meth:`shmem_signal_op` on the same rank: the data is visible before the signal.

        Args:
            target, target_offset, src, src_offset, size: as :meth:`shmem_put`.
            signal, signal_offset, signal_value, signal_op: as :meth:`shmem_signal_op`.
            target_rank: a rank of ``group``.
            group: a group of the framework (None: the world).

        Raises:
            TypeError, ValueError: a bad argument; every argument is checked before anything is written.
        """
        try:
            target, target_at, src, src_at, n = self.checks.windows(target, target_offset, src, src_offset, size)
            signal, offset = self.checks.signal(signal, signal_offset)
            op = choice(signal_op, "signal_op", SIGNAL_OPS)
            value = self.checks.integer(signal_value, "signal_value")
            rank = self.checks.integer(target_rank, "target_rank")
            self.calls.put_with_signal(target, target_at, src, src_at, n, signal, offset, value, op, rank,
                                       self.calls.group_key(group))
        except Exception as error:
            attach_fields(error, "shmem_put_with_signal")
            raise

    def barrier(self, group: Optional[GroupT] = None) -> None:
        """Waits until every rank of ``group`` arrives; writes before it are then visible to all of them.

        Args:
            group: a group of the framework (None: the world). The first collective on a group registers it
                (collective over the group).

        Raises:
            ShmemTimeoutError: a rank did not arrive within ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``.
        """
        try:
            return self._barrier(group)
        except (ValueError, TypeError) as error:
            return self._again(error, "barrier", self._barrier, group)
        except Exception as error:
            attach_fields(error, "barrier")
            raise

    def _barrier(self, group: Optional[Any]) -> None:
        key = self.calls.group_key(group)
        try:
            self.calls.group_size(key)   # a group this rank destroyed is refused, through its team
        except _REFUSED as error:
            self._refuse(key, "barrier", error)
        self.calls.barrier(key)

    # ------------------------------------------------------------------ collectives
    def shmem_allgather(self, output_tensor: TensorT, input_tensor: TensorT,
                        group: Optional[GroupT] = None) -> TensorT:
        """Gathers every rank's ``input_tensor`` into ``output_tensor``, in group-rank order (collective).

        Every collective is one call of the runtime's collective engine, which picks the path (one step for small
        messages, copy-free when every rank passes the same symmetric tensor, staged otherwise) and checks with
        the call's first sync that every rank of the group runs the same call: ranks that disagree (another
        collective, count, dtype, op or wire format) all raise ``ShmemMismatchError`` and the group stays usable.

        Args:
            output_tensor: group-size times the input's elements, same dtype. The same symmetric tensor on every
                rank: peers push into it directly (large messages); otherwise it is filled from staged copies.
            input_tensor: this rank's contribution. It may be this rank's part of ``output_tensor`` (in place).
            group: a group of the framework (None: the world).

        Returns:
            ``output_tensor`` (in the autograd graph when the input requires grad: the gradient of the input is
            the reduce_scatter of the output's).

        Raises:
            TypeError: differing dtypes, a non-tensor.
            ValueError: sizes that do not match, or an input overlapping the output elsewhere than its own part.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            if self.fast is not None and self.fast.all_gather(output_tensor, input_tensor, group):
                return output_tensor
            return self._all_gather(output_tensor, input_tensor, group)
        except (ValueError, TypeError) as error:
            return self._again(error, "shmem_allgather", self._all_gather, output_tensor, input_tensor, group)
        except Exception as error:
            attach_fields(error, "shmem_allgather")
            raise

    def _all_gather(self, output_tensor: Any, input_tensor: Any, group: Optional[Any]) -> Any:
        key = self.calls.group_key(group)
        try:
            output = self.checks.tensor(output_tensor, "output_tensor")
            data = self.checks.tensor(input_tensor, "input_tensor")
            self.checks.same_dtype(data, "input_tensor", output, "output_tensor")
            self.checks.group_multiple(output, "output_tensor", data, "input_tensor", self.calls.group_size(key))
        except _REFUSED as error:
            self._refuse(key, "shmem_allgather", error)
        return self.calls.all_gather(output, data, key)

    def shmem_allreduce(self, tensor: TensorT, op: str = "sum", group: Optional[GroupT] = None,
                        low_precision_dtype: Union[DTypeT, str, None] = None, backward: str = "identity") -> TensorT:
        """Reduces ``tensor`` across the group, in place: every rank ends with bit-identical values (collective).

        Small tensors (up to 256 KiB, or half the staging area if smaller) take one step: each rank reads every
        peer's staged copy. Larger ones reduce-scatter then all-gather: the same symmetric ``tensor`` on every rank
        is reduced in place with no copies; an ordinary tensor is read straight out of the peers' processes where
        the host device reaches them (cross-memory attach), through the staging area otherwise. float16/bfloat16
        accumulate in float32.

        Args:
            tensor: a contiguous tensor of float32, float64, float16, bfloat16, int8, uint8, int32 or int64.
            op: 'sum', 'avg' (floating point only), 'max' or 'min'.
            group: a group of the framework (None: the world).
            low_precision_dtype: travel in this dtype (float16, bfloat16, float8_e4m3fn or float8_e5m2, or its
                name; fp8 with a power-of-two scale per 128-element block) and accumulate in the tensor's dtype
                (float32 at least). None: the default set by ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE``, which
                applies only where it can, else full precision; 'none': full precision whatever the environment
                says. It applies to 'sum' and 'avg' on floating-point tensors wider than it (an explicit dtype
                elsewhere is a ValueError); see :mod:`hyper_parallel.platform.torch.low_precision` for the
                algorithm and the error bounds.
            backward: the gradient when ``tensor`` requires grad. 'identity' (default): ``grad_in = grad_out``
                (scaled by 1/n for 'avg'), right when the computation after the all-reduce is replicated on every
                rank, so every rank's ``grad_out`` is already the full gradient (tensor parallelism). 'allreduce':
                ``grad_in = all_reduce(grad_out)`` (same op), right when ranks go on to compute different losses.

        Returns:
            ``tensor`` (in the autograd graph when it requires grad).

        Raises:
            TypeError: an unsupported dtype.
            ValueError: an unknown op or backward, 'avg' on integers, a low-precision dtype that does not apply,
                'max'/'min' on a tensor that requires grad.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            if self.fast is not None and self.fast.all_reduce(tensor, op, group, low_precision_dtype, backward):
                return tensor
            return self._all_reduce(tensor, op, group, low_precision_dtype, backward)
        except (ValueError, TypeError) as error:
            return self._again(error, "shmem_allreduce", self._all_reduce, tensor, op, group, low_precision_dtype,
                               backward)
        except Exception as error:
            attach_fields(error, "shmem_allreduce")
            raise

    def _all_reduce(self, tensor: Any, op: Any, group: Optional[Any], low_precision_dtype: Optional[Any],
                    backward: Any) -> Any:
        key = self.calls.group_key(group)
        try:
            t = self.checks.tensor(tensor, "tensor")
            op = self.checks.reduce_op(op, t.dtype)
            wire = self.calls.wire(low_precision_dtype, t.dtype, op)
            mode = self.checks.backward_mode(backward)
            self.calls.group_size(key)   # a group this rank destroyed is refused, through its team
        except _REFUSED as error:
            self._refuse(key, "shmem_allreduce", error)
        return self.calls.all_reduce(t, op, key, wire, mode)

    def shmem_reduce_scatter(self, output_tensor: TensorT, input_tensor: TensorT, op: str = "sum",
                             group: Optional[GroupT] = None,
                             low_precision_dtype: Union[DTypeT, str, None] = None) -> TensorT:
        """Reduces ``input_tensor`` across the group; rank r keeps part r of the result (collective).

        Args:
            output_tensor: 1/group-size of the input's elements, same dtype.
            input_tensor: group-size equal parts. The same symmetric tensor on every rank: peers reduce from it
                directly (large messages); otherwise it is staged.
            op: 'sum', 'avg' (floating point only), 'max' or 'min'.
            group: a group of the framework (None: the world).
            low_precision_dtype: as in :meth:`shmem_allreduce`.

        Returns:
            ``output_tensor`` (in the autograd graph when the input requires grad: the gradient of the input is the
            all_gather of the output's, scaled by 1/n for 'avg').

        Raises:
            TypeError: differing or unsupported dtypes.
            ValueError: sizes that do not match, an unknown op, an output overlapping the input elsewhere than this
                rank's part, a low-precision dtype that does not apply, 'max'/'min' on an input that requires grad.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            if self.fast is not None and self.fast.reduce_scatter(output_tensor, input_tensor, op, group,
                                                                  low_precision_dtype):
                return output_tensor
            return self._reduce_scatter(output_tensor, input_tensor, op, group, low_precision_dtype)
        except (ValueError, TypeError) as error:
            return self._again(error, "shmem_reduce_scatter", self._reduce_scatter, output_tensor, input_tensor, op,
                               group, low_precision_dtype)
        except Exception as error:
            attach_fields(error, "shmem_reduce_scatter")
            raise

    def _reduce_scatter(self, output_tensor: Any, input_tensor: Any, op: Any, group: Optional[Any],
                        low_precision_dtype: Optional[Any]) -> Any:
        key = self.calls.group_key(group)
        try:
            output = self.checks.tensor(output_tensor, "output_tensor")
            data = self.checks.tensor(input_tensor, "input_tensor")
            self.checks.same_dtype(output, "output_tensor", data, "input_tensor")
            op = self.checks.reduce_op(op, data.dtype)
            wire = self.calls.wire(low_precision_dtype, data.dtype, op)
            self.checks.group_multiple(data, "input_tensor", output, "output_tensor", self.calls.group_size(key))
        except _REFUSED as error:
            self._refuse(key, "shmem_reduce_scatter", error)
        return self.calls.reduce_scatter(output, data, op, key, wire)

    def shmem_alltoall(self, send_tensor_list: Sequence[TensorT], receive_tensor: TensorT,
                       receive_list: Sequence[int], group: Optional[GroupT] = None) -> TensorT:
        """Sends ``send_tensor_list[j]`` to rank j; ``receive_tensor`` gets every rank's part in rank order
        (collective).

        The counts are exchanged through symmetric memory (no framework collective) and checked on every rank
        before any data moves: a mismatch raises the same error everywhere and writes nothing. Small parts travel
        with the counts. When every rank passes the same symmetric ``receive_tensor``, senders push into it; when
        the send tensors are, on every rank, the blocks of that tensor where the same peer's part lands (in place),
        each pair of ranks swaps its two blocks, moving half the bytes. Anything else is staged.

        Args:
            send_tensor_list: one contiguous tensor per group rank (any sizes, the dtype of ``receive_tensor``);
                they may be views of ``receive_tensor``.
            receive_tensor: the destination; the part from rank i starts after the counts from ranks < i. The
                same symmetric tensor on every rank: senders push into it directly (large messages); otherwise
                each rank reads its parts straight out of the senders' tensors where the host device reaches them,
                or through the staging area.
            receive_list: the element count expected from each rank (ints or a 1-D integer tensor); their sum must
                fit ``receive_tensor``. Elements, not bytes: upstream hyper-parallel's documentation writes bytes,
                but its code offsets ``receive_tensor`` by these counts as elements, and this follows the code.
            group: a group of the framework (None: the world).

        Returns:
            ``receive_tensor`` (in the autograd graph when a send tensor requires grad).

        Raises:
            TypeError: differing dtypes, non-tensors.
            ValueError: a list of the wrong length, counts past ``receive_tensor``'s end, or counts that disagree
                with what the senders send.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            if self.fast is not None and self.fast.all_to_all(send_tensor_list, receive_tensor, receive_list, group):
                return receive_tensor
            return self._all_to_all(send_tensor_list, receive_tensor, receive_list, group)
        except (ValueError, TypeError) as error:
            return self._again(error, "shmem_alltoall", self._all_to_all, send_tensor_list, receive_tensor,
                               receive_list, group)
        except Exception as error:
            attach_fields(error, "shmem_alltoall")
            raise

    def _all_to_all(self, send_tensor_list: Any, receive_tensor: Any, receive_list: Any, group: Optional[Any]) -> Any:
        key = self.calls.group_key(group)
        try:
            sends, receive, counts = self.checks.all_to_all(send_tensor_list, receive_tensor, receive_list,
                                                            self.calls.group_size(key))
        except _REFUSED as error:
            self._refuse(key, "shmem_alltoall", error)
        return self.calls.all_to_all(sends, receive, counts, key)

    def shmem_moe_dispatch(self, output_tensor: TensorT, input_tensor: TensorT, in_splits: TensorT,
                           out_splits_offsets: TensorT, group: Optional[GroupT] = None, major_align: int = 1,
                           low_precision_dtype: Optional[Union[DTypeT, str]] = None) -> TensorT:
        """MoE dispatch (collective): this rank's tokens, grouped by destination, go to the experts of every rank
        of the group; ``output_tensor`` receives, expert after expert, the tokens every rank sent to this rank's
        experts (torch's ``all_to_all_vdev_2d``).

        With n ranks and E experts per rank, ``in_splits[r * E + e]`` rows (dim 0) of ``input_tensor``, packed in
        that order, go to local expert e of rank r. ``output_tensor`` is expert-major: expert e's region starts at
        a multiple of ``major_align`` rows (and takes at least ``major_align`` rows) and holds the chunks of rank 0,
        1, ... in order; ``out_splits_offsets[0][e * n + s]`` and ``[1][e * n + s]`` receive the rows rank s sent to
        expert e and where they start. The splits stay in tensors (never read by Python: the call traces under
        torch.compile); the runtime reads them. Every rank checks every rank's call before anything is written.

        Args:
            output_tensor: the rows received (same dtype, same row shape as the input).
            input_tensor: the rows to send, rank-major.
            in_splits: 1-D int64, n * E values.
            out_splits_offsets: int64 of shape (2, n * E), written.
            group: a group of the framework (None: the world).
            major_align: the alignment of each expert's region, in rows (1: packed).
            low_precision_dtype: the wire format of the rows (float16, bfloat16, float8_e4m3fn, float8_e5m2, a
                dtype or its name; narrower than the input's floating-point dtype): each row travels cast (fp8: with
                a power-of-two scale per row) and is decoded on arrival. None: the rows' own dtype (the
                environment's default applies to reductions only).

        Returns:
            ``output_tensor`` (in the autograd graph when the input requires grad: the input's gradient is the
            combine of the output's, on the layout this call wrote).

        Raises:
            TypeError: differing dtypes, non-tensors, split tables that are not int64.
            ValueError: tables of the wrong shape, a bad ``major_align`` or ``low_precision_dtype``; on every rank,
                before anything is written: a negative split, chunks past the input, or an ``output_tensor`` too
                small for what the peers send (naming the rank, the expert and both sizes).
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            return self._moe("shmem_moe_dispatch", "dispatch", output_tensor, input_tensor, in_splits,
                             out_splits_offsets, group, major_align, low_precision_dtype)
        except Exception as error:
            attach_fields(error, "shmem_moe_dispatch")
            raise

    def shmem_moe_combine(self, output_tensor: TensorT, input_tensor: TensorT, in_splits_offsets: TensorT,
                          out_splits_offsets: TensorT, group: Optional[GroupT] = None, major_align: int = 1,
                          low_precision_dtype: Optional[Union[DTypeT, str]] = None) -> TensorT:
        """MoE combine (collective): every expert's rows go back to the ranks that sent them; ``output_tensor``
        receives them rank-major and packed (torch's ``all_to_all_vdev_2d_offset``), the reverse of
        :meth:`shmem_moe_dispatch`.

        ``in_splits_offsets[0][e * n + r]`` rows of local expert e, starting at row ``in_splits_offsets[1][e * n +
        r]`` of ``input_tensor``, go to rank r (dispatch's ``out_splits_offsets`` is such a table).
        ``output_tensor`` holds, rank after rank, the chunks of that rank's experts 0, 1, ... in order;
        ``out_splits_offsets[0][s * E + e]`` and ``[1][s * E + e]`` receive their rows and offsets.

        Args:
            output_tensor: the rows received (same dtype, same row shape as the input).
            input_tensor: the experts' rows.
            in_splits_offsets: int64 of shape (2, n * E): splits, then offsets.
            out_splits_offsets: int64 of shape (2, n * E), written.
            group: a group of the framework (None: the world).
            major_align: for the gradient only: the alignment of the dispatch whose layout ``input_tensor`` has
                (the input's gradient is dispatched back into that layout).
            low_precision_dtype: the rows' wire format, as for :meth:`shmem_moe_dispatch`.

        Returns:
            ``output_tensor`` (in the autograd graph when the input requires grad: the input's gradient is the
            dispatch of the output's).

        Raises:
            TypeError: differing dtypes, non-tensors, split tables that are not int64.
            ValueError: as :meth:`shmem_moe_dispatch`, on every rank before anything is written.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            return self._moe("shmem_moe_combine", "combine", output_tensor, input_tensor, in_splits_offsets,
                             out_splits_offsets, group, major_align, low_precision_dtype)
        except Exception as error:
            attach_fields(error, "shmem_moe_combine")
            raise

    def _moe(self, operation: str, direction: str, output_tensor: Any, input_tensor: Any, in_splits: Any,
             out_splits_offsets: Any, group: Optional[Any], major_align: Any, low_precision_dtype: Any) -> Any:
        key = self.calls.group_key(group)
        try:
            output, data, splits, offsets, table, align = self.checks.moe(
                direction, output_tensor, input_tensor, in_splits, out_splits_offsets, self.calls.group_size(key),
                major_align)
            # Explicit only: None is the rows' own dtype ("none" turns the environment's default off).
            wire = self.calls.wire("none" if low_precision_dtype is None else low_precision_dtype, data.dtype, "sum")
        except _REFUSED as error:
            self._refuse(key, operation, error)
        return self.calls.moe(direction, output, data, splits, offsets, table, key, align, wire)

    def shmem_send(self, tensor: TensorT, dst_rank: Index[TensorT],
                   group: Optional[GroupT] = None) -> Optional[TensorT]:
        """Sends ``tensor`` to ``dst_rank``, which receives it with :meth:`shmem_recv` (point to point).

        Messages travel through the receiver's mailbox in pieces, up to four in flight: a small message returns
        at once (the tensor may be reused), a larger one waits while the receiver lags four pieces behind.
        Messages between two ranks arrive in the order they were sent.

        Args:
            tensor: a contiguous tensor.
            dst_rank: a rank of ``group`` other than this one.
            group: a group of the framework (None: the world) that ran a collective (or ``barrier``) before.

        Returns:
            None; on torch, when ``tensor`` requires grad, a zero scalar in the autograd graph instead: its backward
            receives the gradient of ``tensor`` from ``dst_rank`` (whose :meth:`shmem_recv` result sends it back in
            its own backward). Add it to the loss or call ``.backward()`` on it.

        Raises:
            ValueError: ``dst_rank`` outside the group or this rank itself.
            ShmemStateError: ``group`` never ran a collective, so it has no channel (or, on MindSpore, a gradient
                is being recorded).
            ShmemTimeoutError: the receiver did not drain a piece in time.
        """
        try:
            if self.fast is not None and self.fast.send(tensor, dst_rank, group):
                return None
            t = self.checks.tensor(tensor, "tensor")
            dst = self.checks.integer(dst_rank, "dst_rank")
            return self.calls.send(t, dst, self.calls.group_key(group))
        except Exception as error:
            attach_fields(error, "shmem_send")
            raise

    def shmem_recv(self, tensor: TensorT, src_rank: Index[TensorT], group: Optional[GroupT] = None) -> TensorT:
        """Receives the next message ``src_rank`` sent with :meth:`shmem_send` into ``tensor``.

        Args:
            tensor: a contiguous tensor of the message's byte size.
            src_rank: a rank of ``group`` other than this one.
            group: a group of the framework (None: the world) that ran a collective (or ``barrier``) before.

        Returns:
            ``tensor``. On torch, when ``tensor`` requires grad (a leaf made with ``requires_grad=True``), a new
            tensor with the message (``tensor`` holds it too) in the autograd graph instead: its backward sends the
            gradient back to ``src_rank`` (whose :meth:`shmem_send` result receives it) and leaves it in
            ``tensor.grad`` as well.

        Raises:
            ValueError: ``src_rank`` outside the group or this rank, or a message of another size (the message is
                drained, so the sender is not left waiting, and ``tensor`` is left unchanged).
            ShmemStateError: ``group`` never ran a collective (or, on MindSpore, a gradient is being recorded).
            ShmemTimeoutError: nothing arrived in time.
        """
        try:
            if self.fast is not None and self.fast.recv(tensor, src_rank, group):
                return tensor
            t = self.checks.tensor(tensor, "tensor")
            src = self.checks.integer(src_rank, "src_rank")
            return self.calls.recv(t, src, self.calls.group_key(group))
        except Exception as error:
            attach_fields(error, "shmem_recv")
            raise

    # ------------------------------------------------------------------ fused ops
    def fused_all_gather_matmul(self, a: TensorT, b: TensorT, c: Optional[TensorT], gather_out: TensorT,
                                signal: Optional[TensorT], block_size: Optional[int] = None,
                                group: Optional[GroupT] = None) -> tuple[TensorT, TensorT]:
        """Gathers every rank's ``a`` along dim 0 and multiplies the result by ``b`` (collective).

        ``gather_out = all_gather(a)`` in group-rank order and ``c = gather_out @ b``. On torch the two overlap:
        each rank's rows travel in blocks of ``block_size`` rows, each block followed by a signal, while the
        calling thread multiplies the rows that have arrived (:mod:`hyper_parallel.platform.torch.fused`).
        On MindSpore one all_gather is followed by one matmul.

        Args:
            a: this rank's rows, (m, k), float32, float16, bfloat16 or float64; m and k the same on every rank.
                It may be this rank's rows of ``gather_out``.
            b: (k, n), the dtype of ``a``.
            c: the product, (size * m, n), the dtype of ``a``; any contiguous tensor (on MindSpore, None: a new
                tensor).
            gather_out: the gathered rows, (size * m, k), the dtype of ``a``: the same symmetric tensor
                (``symm.empty``) on every rank, since peers write into it.
            signal: a symmetric int32 or int64 tensor of at least group-size elements, the same on every rank; its
                first group-size entries are the op's scratch (any contents on entry). On MindSpore, None may stand
                for it.
            block_size: rows per block (a positive int; the last block may be shorter), or None to pick about a
                quarter of m, but at least 1 MiB of ``a`` and at least n rows per block (each block's matmul reads
                all of ``b``).
            group: a group of the framework (None: the world); ranks are group ranks.

        Returns:
            ``(gather_out, c)`` (in the autograd graph when ``a`` or ``b`` requires grad).

        Raises:
            TypeError: a non-tensor, an unsupported or differing dtype, a ``block_size`` that is not an int.
            ValueError: shapes that do not fit, a non-symmetric ``gather_out`` or ``signal``, a non-positive
                ``block_size``, overlapping tensors, or (on every rank alike, before any data moves) ranks that
                pass different allocations or shapes.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            return self._all_gather_matmul(a, b, c, gather_out, signal, block_size, group)
        except (ValueError, TypeError) as error:
            return self._again(error, "fused_all_gather_matmul", self._all_gather_matmul, a, b, c, gather_out, signal,
                               block_size, group)
        except Exception as error:
            attach_fields(error, "fused_all_gather_matmul")
            raise

    def _all_gather_matmul(self, a: Any, b: Any, c: Any, gather_out: Any, signal: Any, block_size: Optional[int],
                           group: Optional[Any]) -> tuple:
        key = self.calls.group_key(group)
        try:
            n = self.calls.group_size(key)
            m, k, columns = self.checks.all_gather_matmul(a, b, c, gather_out, n)
            if signal is not None:
                self.checks.fused_signal(signal, n)
        except _REFUSED as error:
            self._refuse(key, "fused_all_gather_matmul", error)
        return self.calls.all_gather_matmul(a, b, c, gather_out, signal, block_size, key, (m, k, columns))

    def fused_matmul_reduce_scatter(self, x1: TensorT, x2: TensorT, symm_tensor: TensorT, signal: Optional[TensorT],
                                    reduce_op: str = "sum", group: Optional[GroupT] = None) -> TensorT:
        """Multiplies ``x1`` by ``x2`` and reduce-scatters the product along dim 0 (collective).

        Returns ``reduce_scatter(x1 @ x2)``: rank r gets rows ``r * M/size : (r + 1) * M/size`` of the sum (or
        average) over ranks of their products. On torch each rank computes the partial product of every target's
        rows into its ``symm_tensor``, signalling each target as soon as its rows are ready, and adds up its own
        rows straight from its peers' ``symm_tensor`` (float16/bfloat16 accumulate in float32 and round once). On
        MindSpore one matmul is followed by one reduce_scatter.

        Args:
            x1: (M, k), float32, float16, bfloat16 or float64, M a multiple of the group size; the same shape on
                every rank.
            x2: (k, N), the dtype of ``x1``.
            symm_tensor: scratch for the partial products: M * N elements of ``x1``'s dtype (any shape), the same
                symmetric tensor (``symm.empty``) on every rank.
            signal: a symmetric int32 or int64 tensor of at least group-size elements, the same on every rank; its
                first group-size entries are the op's scratch (any contents on entry). On MindSpore, None may stand
                for it.
            reduce_op: 'sum' or 'avg'.
            group: a group of the framework (None: the world); ranks are group ranks.

        Returns:
            A new (M / size, N) tensor of ``x1``'s dtype (in the autograd graph when ``x1`` or ``x2`` requires
            grad).

        Raises:
            TypeError: a non-tensor, an unsupported or differing dtype.
            ValueError: shapes that do not fit, an unknown ``reduce_op``, a non-symmetric ``symm_tensor`` or
                ``signal``, overlapping tensors, or (on every rank alike, before any data moves) ranks that pass
                different allocations or shapes.
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            return self._matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op, group)
        except (ValueError, TypeError) as error:
            return self._again(error, "fused_matmul_reduce_scatter", self._matmul_reduce_scatter, x1, x2, symm_tensor,
                               signal, reduce_op, group)
        except Exception as error:
            attach_fields(error, "fused_matmul_reduce_scatter")
            raise

    def _matmul_reduce_scatter(self, x1: Any, x2: Any, symm_tensor: Any, signal: Any, reduce_op: Any,
                               group: Optional[Any]) -> Any:
        key = self.calls.group_key(group)
        try:
            n = self.calls.group_size(key)
            dims = self.checks.matmul_reduce_scatter(x1, x2, symm_tensor, reduce_op, n)
            if signal is not None:
                self.checks.fused_signal(signal, n)
        except _REFUSED as error:
            self._refuse(key, "fused_matmul_reduce_scatter", error)
        return self.calls.matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op, key, dims)

    # ------------------------------------------------------------------ setup
    def rendezvous(self, tensor: TensorT, group: Optional[GroupT] = None) -> SymmetricMemory[TensorT, DTypeT]:
        """Establishes a symmetric tensor among the ranks of ``group`` (collective over the group).

        Every rank passes its copy of the same ``symm.empty`` tensor (or the same view of it): the ranks compare the
        tensor's heap offset and byte count through symmetric memory, and all of them raise alike when they differ.

        Args:
            tensor: a tensor from ``symm.empty`` (or a contiguous view of one), the same on every rank.
            group: a group of the framework (None: the world). Its first collective registers it.

        Returns:
            A ``SymmetricMemory`` over every rank's copy (torch's shape: ``rank``, ``world_size``, ``buffer_size``,
            ``buffer_ptrs``, ``get_buffer(rank, sizes, dtype, storage_offset)``, ``barrier()``).

        Raises:
            TypeError: ``tensor`` is not a tensor.
            ValueError: ``tensor`` is not symmetric, not contiguous, or not the same allocation range on every rank.
            ShmemStateError: symmetric memory is not initialised (no ``symm.empty`` yet).
            ShmemTimeoutError: a rank did not take part in time.
        """
        try:
            return self._rendezvous(tensor, group)
        except (ValueError, TypeError) as error:
            return self._again(error, "rendezvous", self._rendezvous, tensor, group)
        except Exception as error:
            attach_fields(error, "rendezvous")
            raise

    def _rendezvous(self, tensor: Any, group: Optional[Any]) -> SymmetricMemory:
        key = self.calls.group_key(group)
        try:
            t = self.checks.tensor(tensor, "tensor")
            self.calls.group_size(key)   # a group this rank destroyed is refused, through its team
        except _REFUSED as error:
            self._refuse(key, "rendezvous", error)
        rank, buffer_ptrs, buffer_size, view, barrier = self.calls.rendezvous(t, key)
        return SymmetricMemory(self.checks, rank, buffer_ptrs, buffer_size, view, barrier)

    def is_shmem_available(self) -> bool:
        """Whether symmetric memory can run here: the runtime's library loads and the configured device is built
        into it.

        Never raises and starts nothing. ``HYPER_PARALLEL_SHMEM_DEVICE`` names the device (``host`` by default,
        built into every wheel; ``ascend`` only in a build against CANN).

        Returns:
            True when the first ``symm.empty`` can start the runtime, as far as this process can tell alone.
        """
        return self.calls.available()

    def debug_state(self) -> dict[str, Any]:
        """This process's snapshot of the runtime (local, read-only; works in any state): the runtime face's
        ``debug_state()`` on torch, the same keys through the C ABI on MindSpore, upstream's keys included.

        Returns:
            A read-only dict (:class:`hyper_parallel.core.multicore.snapshot.DebugState`).
        """
        return self.calls.debug_state()

    @staticmethod
    def set_signal_pad_size(size: int) -> None:
        """Upstream's call, with upstream's behaviour: there are no signal pads to size.

        Args:
            size: the pad size upstream would set.

        Raises:
            NotImplementedError: always; the message says how signals are made here.
        """
        raise NotImplementedError(f"set_signal_pad_size is not supported: size={size!r} ({_SIGNAL_PADS})")

    @staticmethod
    def get_signal_pad_size() -> int:
        """Upstream's call, with upstream's behaviour: there are no signal pads to size.

        Raises:
            NotImplementedError: always; the message says how signals are made here.
        """
        raise NotImplementedError(f"get_signal_pad_size is not supported ({_SIGNAL_PADS})")
