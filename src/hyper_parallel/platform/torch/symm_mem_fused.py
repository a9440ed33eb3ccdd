"""CPU kernels of torch's fused symm_mem operators, over the symmetric-memory handle of the host device.

torch registers ``fused_all_gather_matmul``, ``fused_all_gather_scaled_matmul``, ``fused_matmul_reduce_scatter`` and
``fused_scaled_matmul_reduce_scatter`` for CUDA and Meta only (``torch.distributed._symmetric_memory``). Here they run
on CPU tensors through a symmetric workspace per group (``symm_mem.empty`` and ``symm_mem.rendezvous``: collective
over the root the first time a group needs more room) and its handle's barriers:

- all-gather then matmul: each rank copies its shard into its workspace; after a barrier every rank multiplies the
  peers' shards where they lie (``get_buffer`` of each peer, no copy), rank after rank starting with its own, and
  copies them into the gathered output when it is asked for;
- matmul then reduce-scatter: each rank computes its product, lays out the part of every rank in its workspace; after
  a barrier each rank reduces its part out of every peer's workspace ('sum' or 'avg').

The results have the values and the strides of torch's reference implementations (the ``_fallback`` functions),
which the kernels call themselves under ``symm_mem._test_mode()`` as torch's CUDA kernels do.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed._symmetric_memory as symm_mem
from torch.distributed import distributed_c10d as c10d

_ALIGN = 16  # bytes between the tensors of one workspace
_workspaces: dict = {}  # group name -> (workspace tensor, handle)
_lib = torch.library.Library("symm_mem", "IMPL")  # kept for the process: torch drops the kernels with it


def _padded(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def _workspace(group_name: str, nbytes: int):
    """The group's workspace handle, of at least ``nbytes`` bytes (collective over the root when it grows)."""
    held = _workspaces.get(group_name)
    if held is None or held[0].numel() < nbytes:
        _workspaces.pop(group_name, None)
        tensor = symm_mem.empty(max(nbytes, 1), dtype=torch.uint8, device="cpu")
        held = (tensor, symm_mem.rendezvous(tensor, group_name))
        _workspaces[group_name] = held
    return held[1]


def _views(handle, rank: int, like: list) -> list:
    """Views of ``rank``'s workspace holding tensors shaped and typed as ``like``, one after the other."""
    views, offset = [], 0
    for t in like:
        views.append(handle.get_buffer(rank, tuple(t.shape), t.dtype, offset // t.element_size()))
        offset += _padded(t.numel() * t.element_size())
    return views


def _gather_and_consume(shards: list, consume: Callable[[list, int], None], gathered: Optional[list],
                        group_name: str) -> None:
    """Every rank's ``shards`` (the same shapes on every rank) handed to ``consume(views, rank)`` rank after rank, read
    in place from the peers' workspaces; ``gathered[i].chunk(world)[r]`` receives rank r's ``shards[i]``."""
    handle = _workspace(group_name, sum(_padded(s.numel() * s.element_size()) for s in shards))
    world, rank = handle.world_size, handle.rank
    handle.barrier(channel=0)  # no peer still reads this workspace
    for view, shard in zip(_views(handle, rank, shards), shards):
        view.copy_(shard)
    handle.barrier(channel=1)  # every shard is in place
    for step in range(world):
        source = (rank + step) % world
        views = shards if source == rank else _views(handle, source, shards)
        consume(views, source)
        if gathered is not None:
            for out, view in zip(gathered, views):
                out.chunk(world)[source].copy_(view)
    handle.barrier(channel=0)  # every peer has read this rank's shards


def _reduce_scatter(partial: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str) -> torch.Tensor:
    """``partial`` of every rank reduced ('sum' or 'avg'), this rank's part along ``scatter_dim`` (contiguous)."""
    parts = partial.chunk(_group_size(group_name), dim=scatter_dim)
    like = [parts[0]] * len(parts)
    handle = _workspace(group_name, sum(_padded(p.numel() * p.element_size()) for p in parts))
    handle.barrier(channel=0)
    for view, part in zip(_views(handle, handle.rank, like), parts):
        view.copy_(part)
    handle.barrier(channel=1)
    stacked = torch.stack([_views(handle, source, like)[handle.rank] for source in range(handle.world_size)])
    handle.barrier(channel=0)
    return stacked.sum(dim=0) if reduce_op == "sum" else stacked.mean(dim=0)


def _group_size(group_name: str) -> int:
    return c10d._resolve_process_group(group_name).size()


def _check_matrices(a: torch.Tensor, bs: list, dim: int, what: str) -> None:
    if a.dim() < 2:
        raise ValueError(f"`A` must have at least 2 dimensions, but got shape {tuple(a.shape)}")
    for b in bs:
        if b.dim() != 2:
            raise ValueError(f"`B` must be a matrix, but got shape {tuple(b.shape)}")
    if not 0 <= dim < a.dim():
        raise ValueError(f"`{what}` must be in [0, {a.dim()}), but got {dim}")


def _check_reduce_op(reduce_op: str) -> None:
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"`reduce_op` must be 'sum' or 'avg', but got {reduce_op!r}")


def _scale_mode(shard: torch.Tensor, scale: Optional[torch.Tensor], gather_dim: int, world: int) -> str:
    """How ``scale`` scales the rows of the gathered operand: 'none', 'tensor' (one value), 'sharded' (this shard's
    rows, gathered with them) or 'replicated' (every rank's rows)."""
    if scale is None:
        return "none"
    if tuple(scale.shape[:-1]) == tuple(shard.shape[:-1]) and scale.shape[-1] == 1:
        return "sharded"  # also when both have one row: sharded is the safe reading
    if scale.numel() == 1:
        return "tensor"
    full = list(shard.shape)
    full[gather_dim] *= world
    if list(scale.shape[:-1]) == full[:-1]:
        return "replicated"
    raise ValueError("`A_scale` must be one value, or one per row of the shard or of the gathered operand, but got "
                     f"shape {tuple(scale.shape)} for a shard of shape {tuple(shard.shape)}")


def _all_gather_then(a_shard: torch.Tensor, mms: list, out_dtypes: list, gather_dim: int, group_name: str,
                     return_a: bool, a_scale: Optional[torch.Tensor] = None) -> tuple:
    """all_gather(a_shard, gather_dim) then ``mms[i](rows, scale, out)`` for each i, consumed rank by rank."""
    world = _group_size(group_name)
    mode = _scale_mode(a_shard, a_scale, gather_dim, world)
    if gather_dim == a_shard.dim() - 1:
        # The gathered dimension is the one the matmul contracts: gather the whole operand, then multiply once.
        gathered = a_shard.new_empty(world, *a_shard.shape)
        _gather_and_consume([a_shard.contiguous()], lambda views, source: None, [gathered], group_name)
        a = gathered.movedim(0, -2).flatten(-2)
        flat = a.flatten(0, -2)
        scale = a_scale.flatten(0, -2) if mode in ("sharded", "replicated") else a_scale
        outputs = []
        for mm, dtype in zip(mms, out_dtypes):
            out = flat.new_empty(flat.shape[0], mm.columns, dtype=dtype)
            mm(flat, scale, out)
            outputs.append(out.view(*a.shape[:-1], -1))
        return (a if return_a else None), outputs
    moved = a_shard.movedim(gather_dim, 0)
    leading = [world, *moved.shape[:-1]]
    rows = moved.flatten(0, -2)
    a_flat = rows.new_empty(rows.shape[0] * world, rows.shape[1])
    outputs = [a_flat.new_empty(a_flat.shape[0], mm.columns, dtype=dtype) for mm, dtype in zip(mms, out_dtypes)]
    shards = [rows.contiguous()]
    scale_rows = None
    if mode == "sharded":
        shards.append(a_scale.movedim(gather_dim, 0).flatten(0, -2).contiguous())
    elif mode == "replicated":
        scale_rows = a_scale.movedim(gather_dim, 0).flatten(0, -2).chunk(world)

    def consume(views: list, source: int) -> None:
        scale = views[1] if mode == "sharded" else (scale_rows[source] if mode == "replicated" else a_scale)
        for mm, out in zip(mms, outputs):
            mm(views[0], scale, out.chunk(world)[source])

    _gather_and_consume(shards, consume, [a_flat] if return_a else None, group_name)

    def unflatten(t: torch.Tensor) -> torch.Tensor:
        return t.view(*leading, -1).flatten(0, 1).movedim(0, gather_dim)

    return (unflatten(a_flat) if return_a else None), [unflatten(out) for out in outputs]


class _Matmul:
    """``out = rows @ b``, optionally scaled (torch._scaled_mm's arguments)."""

    def __init__(self, b: torch.Tensor, scaled: Optional[dict] = None) -> None:
        self.b = b
        self.columns = b.shape[1]
        self.scaled = scaled

    def __call__(self, rows: torch.Tensor, scale: Optional[torch.Tensor], out: torch.Tensor) -> None:
        if self.scaled is None:
            torch.mm(rows, self.b, out=out)
        else:
            torch.ops.aten._scaled_mm.out(rows, self.b, scale, **self.scaled, out=out)


def _fused_all_gather_matmul_cpu(A_shard: torch.Tensor, Bs: list, gather_dim: int, group_name: str, *,
                                 return_A: bool = True) -> tuple:
    if symm_mem._is_test_mode:
        return symm_mem._fused_all_gather_matmul_fallback(A_shard, Bs, gather_dim, group_name, return_A=return_A)
    gather_dim = gather_dim + A_shard.dim() if gather_dim < 0 else gather_dim
    _check_matrices(A_shard, Bs, gather_dim, "gather_dim")
    return _all_gather_then(A_shard, [_Matmul(b) for b in Bs], [b.dtype for b in Bs], gather_dim, group_name,
                            return_A)


def _fused_all_gather_scaled_matmul_cpu(A_shard: torch.Tensor, Bs: list, A_scale: torch.Tensor, B_scales: list,
                                        gather_dim: int, group_name: str, biases: list, result_scales: list,
                                        out_dtypes: list, use_fast_accum: list) -> tuple:
    out_dtypes = symm_mem._maybe_convert_scalar_types_to_dtypes(out_dtypes)
    for name, values in (("biases", biases), ("result_scales", result_scales), ("out_dtypes", out_dtypes),
                         ("use_fast_accum", use_fast_accum)):
        if len(values) != len(Bs):
            raise ValueError(f"`{name}` must have one entry per B ({len(Bs)}), but got {len(values)}")
    if symm_mem._is_test_mode:
        return symm_mem._fused_all_gather_scaled_matmul_fallback(
            A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales, out_dtypes, use_fast_accum)
    _check_matrices(A_shard, Bs, gather_dim, "gather_dim")
    mms = [_Matmul(b, dict(scale_b=scale_b, bias=bias, scale_result=result_scale, out_dtype=dtype,
                           use_fast_accum=bool(fast)))
           for b, scale_b, bias, result_scale, dtype, fast in zip(Bs, B_scales, biases, result_scales, out_dtypes,
                                                                    use_fast_accum)]
    a, outputs = _all_gather_then(A_shard, mms, [dtype or b.dtype for b, dtype in zip(Bs, out_dtypes)], gather_dim,
                                  group_name, True, a_scale=A_scale)
    return a, outputs


def _fused_matmul_reduce_scatter_cpu(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                     group_name: str) -> torch.Tensor:
    if symm_mem._is_test_mode:
        return symm_mem._fused_matmul_reduce_scatter_fallback(A, B, reduce_op, scatter_dim, group_name)
    _check_matrices(A, [B], scatter_dim, "scatter_dim")
    _check_reduce_op(reduce_op)
    return _reduce_scatter(torch.matmul(A, B), reduce_op, scatter_dim, group_name)


def _fused_scaled_matmul_reduce_scatter_cpu(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor,
                                            B_scale: torch.Tensor, reduce_op: str, orig_scatter_dim: int,
                                            scatter_dim_after_maybe_reshape: int, group_name: str,
                                            output_shape: Optional[list], bias: Optional[torch.Tensor] = None,
                                            result_scale: Optional[torch.Tensor] = None,
                                            out_dtype: Optional[torch.dtype] = None,
                                            use_fast_accum: bool = False) -> torch.Tensor:
    if symm_mem._is_test_mode:
        return symm_mem._fused_scaled_matmul_reduce_scatter_fallback(
            A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape, group_name,
            output_shape, bias, result_scale, out_dtype, use_fast_accum)
    _check_matrices(A, [B], scatter_dim_after_maybe_reshape, "scatter_dim_after_maybe_reshape")
    _check_reduce_op(reduce_op)
    shape = list(output_shape) if output_shape is not None else [*A.shape[:-1], B.shape[1]]
    if not 0 <= orig_scatter_dim < len(shape):
        raise ValueError(f"`orig_scatter_dim` must be in [0, {len(shape)}), but got {orig_scatter_dim}")
    if A_scale.numel() > 1:
        if tuple(A_scale.shape[:-1]) != tuple(A.shape[:-1]):
            raise ValueError("`A_scale` must have the leading dimensions of `A` for row-wise scaling, but got "
                             f"{tuple(A_scale.shape)} for A of shape {tuple(A.shape)}")
        A_scale = A_scale.flatten(0, -2).contiguous()
    partial = torch._scaled_mm(A.flatten(0, -2).contiguous(), B, A_scale, B_scale, bias, result_scale, out_dtype,
                               use_fast_accum)
    return _reduce_scatter(partial.view(*shape[:-1], B.shape[1]), reduce_op, orig_scatter_dim, group_name)


_KERNELS = {
    "fused_all_gather_matmul": _fused_all_gather_matmul_cpu,
    "fused_all_gather_scaled_matmul": _fused_all_gather_scaled_matmul_cpu,
    "fused_matmul_reduce_scatter": _fused_matmul_reduce_scatter_cpu,
    "fused_scaled_matmul_reduce_scatter": _fused_scaled_matmul_reduce_scatter_cpu,
}

for _name, _kernel in _KERNELS.items():
    _qualname = f"symm_mem::{_name}"
    if torch._C._dispatch_has_kernel(_qualname) and not torch._C._dispatch_has_kernel_for_dispatch_key(
            _qualname, "CPU"):
        _lib.impl(_name, _kernel, "CPU")
