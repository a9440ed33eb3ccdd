"""The user API's argument checks, written once for every framework: the rules that need no framework (the tables
of ops, shapes, counts, ranks) and :class:`Checks`, which runs over one framework's *tensor facts*.

A handler's tensor facts answer what a tensor is, how many elements it has and what its dtype can do: torch's are
:mod:`hyper_parallel.platform.torch.tensors`, MindSpore's :mod:`hyper_parallel.platform.mindspore.tensors`
(:class:`~hyper_parallel.core.symmetric_memory.protocol.TensorFacts` names them). The same bad call therefore raises
the same class and message on both frameworks; only the framework's own names (``torch.Tensor``,
``mindspore.int32``) differ. A broken contract raises :class:`ShmemValueError` or :class:`ShmemTypeError` (a
``ValueError``/``TypeError`` of the runtime's, which the user API gives upstream's fields).

Every check runs before anything is written, so that a bad argument changes nothing.

The primitives' checks (:meth:`Checks.windows`, :meth:`Checks.signal`, :meth:`Checks.integer`) first try the common
call: Python ints and tensors the runtime reads as they are, whose every check holds. Any other call (a tensor
index, a subclass, a check that fails) takes the full checks in their order, so that the first broken contract is
the one reported; the fast path only skips checks that hold.

The tensor facts the checks ask for:

=================================  =================================================================================
``tensor_type_name``               the tensor class as messages name it
``signal_dtype_names``             the dtypes a signal may have, as messages name them
``is_tensor(value)``               whether ``value`` is a tensor of the framework
``numel(tensor)``                  its element count
``ndim(tensor)``                   its number of dimensions
``tolist(tensor)``                 its elements as Python values
``check_tensor(tensor, name)``     the framework's own contract of a tensor the runtime reads (device, dtype)
``readable_numel(value)``          the element count of a tensor that passes :meth:`Checks.tensor` (a tensor of
                                   the framework that meets ``check_tensor`` and is contiguous), else None; it
                                   never raises (the primitives' fast path: see above)
``is_integer_dtype(dtype)``        whether ``dtype`` holds integers (not bool)
``is_floating_dtype(dtype)``       whether ``dtype`` is floating point
``is_reducible_dtype(dtype)``      whether the reduction kernels take ``dtype``
``reducible_dtype_names()``        those dtypes, as messages name them
``is_signal_dtype(dtype)``         whether a signal may have ``dtype``
``itemsize(dtype)``                bytes per element
``is_matmul_dtype(dtype)``         whether the fused ops' matmuls take ``dtype``
``matmul_dtype_names()``           those dtypes, as messages name them
=================================  =================================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError, type_name

SIGNAL_OPS = {0: "set", 1: "add"}
# The API's numbering: EQ, GT and LT as upstream's symmetric-memory API numbers them; the rest extend it.
COMPARE_OPS = {0: "eq", 1: "gt", 2: "lt", 3: "ne", 4: "ge", 5: "le"}
REDUCE_OPS = ("sum", "avg", "max", "min")
BACKWARD_MODES = ("identity", "allreduce")
# The reductions that have a gradient, and those the fused matmul + reduce-scatter takes.
DIFFERENTIABLE_OPS = ("sum", "avg")
FUSED_REDUCE_OPS = ("sum", "avg")
LOW_PRECISION_NAMES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
_OFF = ("", "none")


def choice(value: object, name: str, choices: dict) -> str:
    """The name of an op given by its number in ``choices``.

    Raises:
        ValueError: not one of the numbers.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value not in choices:
        listed = ", ".join(f"{k} ({v.upper()})" for k, v in choices.items())
        raise ShmemValueError(f"`{name}` must be one of {listed}, but got {value!r}")
    return choices[value]


def integer(value: object, name: str) -> int:
    """A Python int (frameworks unwrap their one-element tensors first).

    Raises:
        TypeError: not an int.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ShmemTypeError(f"`{name}` must be an int or a one-element integer tensor, but got {type_name(value)}")


def rank_in_group(value: int, name: str, size: int) -> int:
    """A rank inside a group of ``size`` ranks.

    Raises:
        ValueError: outside [0, size).
    """
    if not 0 <= value < size:
        raise ShmemValueError(f"`{name}` must be in [0, {size}), but got {value}")
    return value


def peer(value: int, name: str, size: int, me: int) -> int:
    """A rank of a group of ``size`` ranks other than this one (``me``), for point to point.

    Raises:
        ShmemValueError: outside the group, or this rank itself.
    """
    rank = rank_in_group(value, name, size)
    if rank == me:
        raise ShmemValueError(f"`{name}` must be another rank than this one ({me}), but got {rank}")
    return rank


def low_precision_rule(facts: Any, low_itemsize: int, dtype: Any, op: str) -> Optional[str]:
    """Why a wire format of ``low_itemsize`` bytes cannot carry a reduction of ``dtype`` with ``op`` (the rule a
    message states), or None when it can (``facts``: the framework's tensor facts)."""
    if op not in DIFFERENTIABLE_OPS:
        return f"None for op {op!r} (low precision applies to 'sum' and 'avg')"
    if not facts.is_floating_dtype(dtype):
        return f"None for the integer dtype {dtype} (low precision applies to floating-point tensors)"
    if low_itemsize >= facts.itemsize(dtype):
        return f"narrower than the tensor's dtype {dtype} ({facts.itemsize(dtype)} bytes)"
    return None


def shape(value: object) -> tuple:
    """A shape from an int or a sequence of non-negative ints.

    Raises:
        TypeError: neither.
        ValueError: a negative dimension.
    """
    dims = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ShmemTypeError(f"`shape` must be an int or a sequence of ints, but got {value!r}")
    if any(d < 0 for d in dims):
        raise ShmemValueError(f"`shape` must have non-negative dimensions, but got {tuple(dims)}")
    return tuple(dims)


def low_precision_name(value: object, what: str) -> Optional[str]:
    """A low-precision wire format from its name; None for an off name ("none", "").

    Raises:
        TypeError: not a string.
        ValueError: an unknown name.
    """
    if not isinstance(value, str):
        raise ShmemTypeError(f"`{what}` must be a dtype, its name or None, but got {type_name(value)}")
    name = value.strip().lower()
    if name in _OFF:
        return None
    for prefix in ("torch.", "mindspore."):
        name = name.removeprefix(prefix)
    if name not in LOW_PRECISION_NAMES:
        raise ShmemValueError(f"`{what}` must be one of {', '.join(LOW_PRECISION_NAMES)} or 'none', but got {value!r}")
    return name


def require_symmetric(symmetric: bool, name: str, address: int) -> None:
    """Raises ValueError unless the tensor ``name`` at ``address`` is ``symmetric`` (inside a symmetric allocation).

    Raises:
        ValueError: it is not.
    """
    if not symmetric:
        raise ShmemValueError(f"`{name}` must be a symmetric tensor from symm.empty, but got an ordinary tensor at "
                              f"{address:#x}")


def rendezvous_mismatch(rows: Sequence[Sequence[int]]) -> Optional[str]:
    """The message when the group's ranks passed different tensors to ``rendezvous``, or None when they agree.

    Args:
        rows: each group rank's (heap offset, bytes); offset -1 for a tensor outside the heap.
    """
    if rows[0][0] >= 0 and all(list(row) == list(rows[0]) for row in rows):
        return None
    shown = ", ".join(f"rank{r}=(offset={o}, bytes={b})" for r, (o, b) in enumerate(rows))
    return (f"`tensor` must be the same symmetric tensor on every rank of the group (from symm.empty; offset -1: "
            f"not symmetric), but got {shown}")


def view_bytes(offset: int, numel: int, itemsize: int, buffer_size: int) -> tuple:
    """The byte range ``[begin, end)`` of a view of ``numel`` elements starting at element ``offset`` of a
    symmetric tensor of ``buffer_size`` bytes (``SymmetricMemory.get_buffer``).

    Raises:
        ValueError: the view runs past the tensor's end.
    """
    begin = offset * itemsize
    end = begin + numel * itemsize
    if end > buffer_size:
        raise ShmemValueError(f"`sizes` and `storage_offset` must lie inside the tensor ({buffer_size} bytes), but got "
                              f"bytes [{begin}, {end})")
    return begin, end


class Checks:
    """The argument checks over one framework's tensor facts (see the module's table)."""

    def __init__(self, facts: Any) -> None:
        self.facts = facts

    # ------------------------------------------------------------------ scalars
    def integer(self, value: object, name: str) -> int:
        """An integer given as a Python int or a one-element integer tensor (the user API's convention).

        Raises:
            TypeError: neither an int nor a one-element integer tensor.
        """
        if type(value) is int:   # the common call (never a tensor, never a bool)
            return value
        f = self.facts
        if f.is_tensor(value):
            if f.numel(value) != 1 or not f.is_integer_dtype(value.dtype):
                raise ShmemTypeError(f"`{name}` must be an int or a one-element integer tensor, but got a tensor of "
                                     f"{f.numel(value)} {value.dtype} elements")
            return int(value.item())
        return integer(value, name)

    def count(self, value: object, name: str) -> int:
        """A non-negative element count or offset (see :meth:`integer`).

        Raises:
            TypeError: neither an int nor a one-element integer tensor.
            ValueError: a negative value.
        """
        if type(value) is int and value >= 0:   # the common call
            return value
        result = self.integer(value, name)
        if result < 0:
            raise ShmemValueError(f"`{name}` must be non-negative, but got {result}")
        return result

    def rank_in_group(self, value: object, name: str, size: int) -> int:
        """A rank inside a group of ``size`` ranks (see :meth:`integer`).

        Raises:
            TypeError: neither an int nor a one-element integer tensor.
            ValueError: outside [0, size).
        """
        return rank_in_group(self.integer(value, name), name, size)

    # ------------------------------------------------------------------ tensors
    def tensor(self, value: object, name: str) -> Any:
        """A contiguous tensor the runtime can read (the framework adds its own contract: device, dtype).

        Raises:
            TypeError: not a tensor (or, by the framework's contract, a dtype it does not carry).
            ValueError: not contiguous (or, by the framework's contract, on another device).
        """
        f = self.facts
        if not f.is_tensor(value):
            raise ShmemTypeError(f"`{name}` must be a {f.tensor_type_name}, but got {type_name(value)}")
        f.check_tensor(value, name)
        if not value.is_contiguous():
            raise ShmemValueError(f"`{name}` must be contiguous, but got strides {tuple(value.stride())}")
        return value

    def optional_tensor(self, value: object, name: str) -> None:
        """Raises TypeError unless ``value`` is a tensor or None (``depend_tensor``: never read here)."""
        if value is not None and not self.facts.is_tensor(value):
            raise ShmemTypeError(f"`{name}` must be a {self.facts.tensor_type_name} or None, but got "
                                 f"{type_name(value)}")

    @staticmethod
    def same_dtype(value: Any, name: str, reference: Any, reference_name: str) -> None:
        """Raises TypeError unless ``value`` has the dtype of ``reference``."""
        if value.dtype != reference.dtype:
            raise ShmemTypeError(f"`{name}` must have the dtype of `{reference_name}` ({reference.dtype}), but got "
                                 f"{value.dtype}")

    def window(self, value: Any, name: str, offset: int, size: int, offset_name: str) -> None:
        """Raises ValueError unless the flat slice ``value[offset : offset + size]`` lies inside ``value``."""
        numel = self.facts.numel(value)
        if offset + size > numel:
            raise ShmemValueError(f"`{offset_name} + size` must be at most {name}.numel() ({numel}), but got "
                                  f"{offset} + {size} = {offset + size}")

    def windows(self, target: object, target_offset: object, src: object, src_offset: object,
                size: object) -> tuple:
        """put/get's two windows: ``(target, target_offset, src, src_offset, size)`` checked, offsets and size as
        ints.

        Raises:
            TypeError: non-tensors, differing dtypes, bad counts.
            ValueError: a window past its tensor's end, a tensor the runtime cannot read.
        """
        readable_numel = self.facts.readable_numel
        target_numel = readable_numel(target)
        if target_numel is not None and type(size) is int and type(target_offset) is int and \
                type(src_offset) is int and 0 <= size and 0 <= target_offset and target_offset + size <= target_numel:
            src_numel = readable_numel(src)
            if src_numel is not None and 0 <= src_offset and src_offset + size <= src_numel and \
                    src.dtype == target.dtype:   # the common call: every check below holds
                return target, target_offset, src, src_offset, size
        target = self.tensor(target, "target")
        src = self.tensor(src, "src")
        self.same_dtype(src, "src", target, "target")
        n = self.count(size, "size")
        target_at = self.count(target_offset, "target_offset")
        self.window(target, "target", target_at, n, "target_offset")
        src_at = self.count(src_offset, "src_offset")
        self.window(src, "src", src_at, n, "src_offset")
        return target, target_at, src, src_at, n

    def signal(self, signal: object, signal_offset: object) -> tuple:
        """``(signal, offset)`` of the element ``signal[signal_offset]`` of an int32/int64 tensor.

        Raises:
            TypeError: not a tensor of a signal dtype, a bad offset.
            ValueError: the offset past the tensor's end.
        """
        f = self.facts
        numel = f.readable_numel(signal)
        if numel is not None and type(signal_offset) is int and 0 <= signal_offset < numel and \
                f.is_signal_dtype(signal.dtype):   # the common call: every check below holds
            return signal, signal_offset
        signal = self.tensor(signal, "signal")
        if not self.facts.is_signal_dtype(signal.dtype):
            raise ShmemTypeError(f"`signal` must have dtype {self.facts.signal_dtype_names}, but got {signal.dtype}")
        offset = self.count(signal_offset, "signal_offset")
        self.window(signal, "signal", offset, 1, "signal_offset")
        return signal, offset

    # ------------------------------------------------------------------ collectives
    def reduce_op(self, op: object, dtype: Any) -> str:
        """A reduction's name, checked against the dtype.

        Raises:
            ValueError: an unknown op, or 'avg' on an integer dtype.
            TypeError: a dtype the reduction kernels do not handle.
        """
        f = self.facts
        if op not in REDUCE_OPS:
            raise ShmemValueError(f"`op` must be one of {', '.join(repr(o) for o in REDUCE_OPS)}, but got {op!r}")
        if not f.is_reducible_dtype(dtype):
            raise ShmemTypeError(f"`tensor` must have one of dtypes {', '.join(f.reducible_dtype_names())}, but got "
                                 f"{dtype}")
        if op == "avg" and not f.is_floating_dtype(dtype):
            raise ShmemValueError(f"`op` must be 'sum', 'max' or 'min' for the integer dtype {dtype}, but got 'avg'")
        return op

    @staticmethod
    def differentiable(op: str, name: str) -> None:
        """Raises ValueError unless reduction ``op`` has a gradient (``name``: the input that requires grad)."""
        if op not in DIFFERENTIABLE_OPS:
            raise ShmemValueError(f"`op` must be 'sum' or 'avg' when `{name}` requires grad, but got {op!r}")

    @staticmethod
    def backward_mode(value: object) -> str:
        """``shmem_allreduce``'s ``backward`` argument.

        Raises:
            ValueError: not one of ``BACKWARD_MODES``.
        """
        if value not in BACKWARD_MODES:
            raise ShmemValueError(f"`backward` must be one of {', '.join(map(repr, BACKWARD_MODES))}, but got "
                                  f"{value!r}")
        return value

    def group_multiple(self, whole: Any, whole_name: str, part: Any, part_name: str, n: int) -> None:
        """Raises ValueError unless ``whole`` has ``n`` times the elements of ``part`` (one part per group rank)."""
        whole_numel, part_numel = self.facts.numel(whole), self.facts.numel(part)
        if whole_numel != n * part_numel:
            raise ShmemValueError(f"`{whole_name}.numel()` must be {n} x {part_name}.numel() ({n * part_numel}), "
                                  f"but got {whole_numel}")

    def all_to_all(self, send_tensor_list: object, receive_tensor: object, receive_list: object, n: int) -> tuple:
        """all_to_all's arguments for a group of ``n``: ``(sends, receive, counts)``.

        Raises:
            TypeError: non-tensors, differing dtypes, counts that are not ints (or a 1-D integer tensor).
            ValueError: lists of the wrong length, negative counts, counts past ``receive_tensor``'s end.
        """
        f = self.facts
        receive = self.tensor(receive_tensor, "receive_tensor")
        if f.is_tensor(send_tensor_list) or not isinstance(send_tensor_list, Sequence):
            raise ShmemTypeError(f"`send_tensor_list` must be a sequence of {n} tensors, but got "
                                 f"{type_name(send_tensor_list)}")
        if len(send_tensor_list) != n:
            raise ShmemValueError(f"`send_tensor_list` must have one tensor per rank of the group ({n}), but got "
                                  f"{len(send_tensor_list)}")
        for j, t in enumerate(send_tensor_list):
            self.tensor(t, f"send_tensor_list[{j}]")
            self.same_dtype(t, f"send_tensor_list[{j}]", receive, "receive_tensor")
        counts = self._receive_counts(receive_list, n)
        if sum(counts) > f.numel(receive):
            raise ShmemValueError(f"`sum(receive_list)` must be at most receive_tensor.numel() ({f.numel(receive)}), "
                                  f"but got {sum(counts)}")
        return list(send_tensor_list), receive, counts

    def _receive_counts(self, receive_list: object, n: int) -> list:
        f = self.facts
        if f.is_tensor(receive_list):
            if f.ndim(receive_list) != 1 or not f.is_integer_dtype(receive_list.dtype):
                raise ShmemTypeError(f"`receive_list` must be a sequence of {n} ints or a 1-D integer tensor, but got "
                                     f"a tensor of shape {tuple(receive_list.shape)} and dtype {receive_list.dtype}")
            receive_list = f.tolist(receive_list)
        if isinstance(receive_list, (str, bytes)) or not isinstance(receive_list, Sequence):
            raise ShmemTypeError(f"`receive_list` must be a sequence of {n} ints, but got {type_name(receive_list)}")
        if len(receive_list) != n:
            raise ShmemValueError(f"`receive_list` must have one count per rank of the group ({n}), but got "
                                  f"{len(receive_list)}")
        return [self.count(v, f"receive_list[{i}]") for i, v in enumerate(receive_list)]

    def split_table(self, value: object, name: str, rows: int, n: int, columns: Optional[int] = None) -> Any:
        """A contiguous int64 split table of the MoE calls: 1-D (``rows`` 1) or ``(rows, columns)``, ``columns`` a
        positive multiple of the group size ``n`` (any multiple when None). Its values are never read here.

        Raises:
            TypeError: not a tensor, or not int64.
            ValueError: another shape.
        """
        f = self.facts
        table = self.tensor(value, name)
        if not f.is_integer_dtype(table.dtype) or f.itemsize(table.dtype) != 8:
            raise ShmemTypeError(f"`{name}` must be an int64 tensor, but got {table.dtype}")
        shape = tuple(table.shape)
        width = shape[-1] if shape else 0
        expected = ("(group size x experts,)" if rows == 1 else f"({rows}, group size x experts)")
        right = (len(shape) == 1 if rows == 1 else len(shape) == 2 and shape[0] == rows) and width > 0 and \
            width % n == 0 and (columns is None or width == columns)
        if not right:
            size = f"{columns}" if columns is not None else f"a multiple of {n}"
            raise ShmemValueError(f"`{name}` must have shape {expected} with group size {n} and a last dimension of "
                                  f"{size}, but got {shape}")
        return table

    def moe(self, direction: str, output_tensor: object, input_tensor: object, in_splits: object,
            out_splits_offsets: object, n: int, major_align: object) -> tuple:
        """MoE dispatch's or combine's arguments for a group of ``n``: ``(output, input, in_splits, in_offsets,
        out_table, major_align)``; ``in_splits`` is dispatch's 1-D table, or combine's ``(2, n*experts)`` table of
        splits and offsets (split here into its rows).

        Raises:
            TypeError: non-tensors, differing dtypes, split tables that are not int64, a ``major_align`` that is not
                an int.
            ValueError: tensors without rows (dim 0), rows of different shapes, tables of the wrong shape, a
                ``major_align`` below 1.
        """
        output = self.tensor(output_tensor, "output_tensor")
        data = self.tensor(input_tensor, "input_tensor")
        self.same_dtype(data, "input_tensor", output, "output_tensor")
        if len(data.shape) < 1 or tuple(data.shape[1:]) != tuple(output.shape[1:]):
            raise ShmemValueError(f"`input_tensor` must have rows (dim 0) of the shape of `output_tensor`'s "
                                  f"({tuple(output.shape[1:])}), but got shape {tuple(data.shape)}")
        align = self.integer(major_align, "major_align")
        if align < 1:
            raise ShmemValueError(f"`major_align` must be at least 1, but got {align}")
        if direction == "dispatch":
            splits = self.split_table(in_splits, "in_splits", 1, n)
            width, offsets = int(splits.shape[0]), None
        else:
            table = self.split_table(in_splits, "in_splits_offsets", 2, n)
            width = int(table.shape[1])
            splits, offsets = table[0], table[1]
        out_table = self.split_table(out_splits_offsets, "out_splits_offsets", 2, n, width)
        return output, data, splits, offsets, out_table, align

    # ------------------------------------------------------------------ fused ops
    def matrix(self, value: object, name: str) -> Any:
        """A contiguous 2-D tensor of a dtype the fused matmuls take.

        Raises:
            TypeError: not a tensor, or another dtype.
            ValueError: not contiguous, not 2-D.
        """
        t = self.tensor(value, name)
        if not self.facts.is_matmul_dtype(t.dtype):
            raise ShmemTypeError(f"`{name}` must have one of dtypes {', '.join(self.facts.matmul_dtype_names())}, "
                                 f"but got {t.dtype}")
        if len(t.shape) != 2:
            raise ShmemValueError(f"`{name}` must be 2-D, but got shape {tuple(t.shape)}")
        return t

    @staticmethod
    def _shape(t: Any, name: str, expected: tuple, rule: str) -> None:
        if tuple(t.shape) != expected:
            raise ShmemValueError(f"`{name}` must have shape {expected} ({rule}), but got {tuple(t.shape)}")

    def all_gather_matmul(self, a: object, b: object, c: object, gather_out: object, n: int) -> tuple:
        """``fused_all_gather_matmul``'s matrices for a group of ``n``: ``(m, k, columns)`` of ``a`` (m, k) and
        ``b`` (k, columns). ``c`` may be None where the framework returns a new product.

        Raises:
            TypeError: non-tensors, unsupported or differing dtypes.
            ValueError: shapes that do not fit.
        """
        a_ = self.matrix(a, "a")
        b_ = self.matrix(b, "b")
        c_ = None if c is None else self.matrix(c, "c")
        out = self.matrix(gather_out, "gather_out")
        for t, name in ((b_, "b"), (c_, "c"), (out, "gather_out")):
            if t is not None:
                self.same_dtype(t, name, a_, "a")
        m, k = tuple(a_.shape)
        if b_.shape[0] != k:
            raise ShmemValueError(f"`b.shape[0]` must equal a.shape[1] ({k}), but got {b_.shape[0]}")
        columns = int(b_.shape[1])
        self._shape(out, "gather_out", (n * m, k), "group size x a.shape[0], a.shape[1]")
        if c_ is not None:
            self._shape(c_, "c", (n * m, columns), "group size x a.shape[0], b.shape[1]")
        return m, k, columns

    def matmul_reduce_scatter(self, x1: object, x2: object, symm_tensor: object, reduce_op: object,
                              n: int) -> tuple:
        """``fused_matmul_reduce_scatter``'s arguments for a group of ``n``: ``(rows, k, columns)`` of ``x1``
        (rows, k) and ``x2`` (k, columns).

        Raises:
            TypeError: non-tensors, unsupported or differing dtypes.
            ValueError: shapes that do not fit, an unknown ``reduce_op``.
        """
        x1_ = self.matrix(x1, "x1")
        x2_ = self.matrix(x2, "x2")
        self.same_dtype(x2_, "x2", x1_, "x1")
        scratch = self.tensor(symm_tensor, "symm_tensor")
        self.same_dtype(scratch, "symm_tensor", x1_, "x1")
        if reduce_op not in FUSED_REDUCE_OPS:
            raise ShmemValueError(f"`reduce_op` must be one of {', '.join(map(repr, FUSED_REDUCE_OPS))}, but got "
                                  f"{reduce_op!r}")
        rows, k = tuple(x1_.shape)
        if rows % n:
            raise ShmemValueError(f"`x1.shape[0]` must be a multiple of the group size ({n}), but got {rows}")
        if x2_.shape[0] != k:
            raise ShmemValueError(f"`x2.shape[0]` must equal x1.shape[1] ({k}), but got {x2_.shape[0]}")
        columns = int(x2_.shape[1])
        if self.facts.numel(scratch) != rows * columns:
            raise ShmemValueError(f"`symm_tensor.numel()` must be x1.shape[0] x x2.shape[1] ({rows * columns}), "
                                  f"but got {self.facts.numel(scratch)}")
        return rows, k, columns

    def fused_signal(self, signal: object, n: int) -> Any:
        """A fused op's signal: an int32/int64 tensor with an entry per group rank.

        Raises:
            TypeError: not a tensor of a signal dtype.
            ValueError: fewer entries than the group has ranks.
        """
        signal = self.tensor(signal, "signal")
        if not self.facts.is_signal_dtype(signal.dtype):
            raise ShmemTypeError(f"`signal` must have dtype {self.facts.signal_dtype_names}, but got {signal.dtype}")
        if self.facts.numel(signal) < n:
            raise ShmemValueError(f"`signal.numel()` must be at least the group size ({n}), but got "
                                  f"{self.facts.numel(signal)}")
        return signal
