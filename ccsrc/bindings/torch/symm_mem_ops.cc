// CPU kernels of torch's symm_mem operators over the host device, each a call into the runtime's team collectives.
//
// Each follows the contract of torch's CUDA kernel of the same name (CUDASymmetricMemoryOps.cu,
// nvshmem_extension.cu): the same argument checks and messages where torch's tests read them, the symmetric
// tensors rendezvoused over `group_name`, and sum as the only reduction of the all-reduce family. What the CPU does
// differently: reductions may be of any dtype the engine reduces (torch's CUDA kernels take float32 and bfloat16), no
// pointer alignment is asked for, and the MoE exchanges refuse a receive buffer too small for what the peers send
// (on every rank, before anything is written) instead of writing past it.
//
// The kernels are registered at run time, for the operators this torch declares (some are declared by
// torch.distributed._symmetric_memory in Python), and a meta kernel is added where torch has none, so that
// torch.compile(fullgraph=True) traces every operator.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "bindings/torch/reduce_dtypes.h"
#include "bindings/torch/symm_mem_backend.h"
#include "runtime/runtime.h"

namespace hp::shmem::torch_binding {
namespace {

Runtime& R() { return Runtime::Instance(); }

std::size_t Bytes(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

DataType ReduceTypeOf(const at::Tensor& t, const char* op) {
  const std::optional<DataType> dtype = ReduceDataTypeOf(t.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": the tensors must have one of dtypes ", kReducibleDtypes, ", but got ",
              t.scalar_type());
  return *dtype;
}

ElementType ElementTypeOf(const at::Tensor& t) {
  ElementType type;
  type.name = std::string(c10::getDtypeNames(t.scalar_type()).first);
  type.bytes = t.element_size();
  return type;
}

// The largest power of two up to 16 that divides `value` (torch's at::native::memory::get_alignment).
std::size_t Alignment(std::size_t value) {
  for (std::size_t a : {16, 8, 4, 2}) {
    if (value % a == 0) return a;
  }
  return 1;
}

void CheckSum(const std::string& reduce_op, const char* op) {
  TORCH_CHECK(reduce_op == "sum", op, ": only sum is supported for now.");
}

// The group an operator runs on, and the handle of its symmetric tensor when it is one. torch's kernels require the
// symmetric tensor; these also take an ordinary one (the engine stages it), which is what torch.compile hands an
// operator once functionalization has cloned a symmetric tensor another operator mutated.
struct OpGroup {
  c10::intrusive_ptr<HostSymmetricMemory> handle;   // null: `tensor` is not symmetric
  SymmMemTeam team;
  int world() const { return static_cast<int>(team.pes.size()); }
  // The heap offset of `tensor` when it is symmetric, else -1.
  std::int64_t HeapOffset(const at::Tensor& tensor) const {
    return handle ? handle->HeapOffsetOf(tensor.data_ptr()) : -1;
  }
};

OpGroup GroupOf(const at::Tensor& tensor, const std::string& group_name, const char* op, const char* what) {
  OpGroup group;
  group.handle = SymmMemHandleIfSymmetric(tensor, group_name, op, what);
  group.team = group.handle ? group.handle->team() : SymmMemTeamOf(group_name);
  return group;
}

// ---- one-shot and two-shot all-reduce -------------------------------------------------------------------------

at::Tensor OneShotAllReduceOutImpl(const at::Tensor& input, const std::optional<at::Tensor>& local_input,
                                   std::string reduce_op, std::string group_name, at::Tensor out) {
  const char* op = "one_shot_all_reduce";
  TORCH_CHECK(input.is_contiguous(), op, ": input must be contiguous.");
  TORCH_CHECK(out.is_contiguous(), op, ": output must be contiguous.");
  TORCH_CHECK(out.sizes() == input.sizes(), op, ": input/output size mismatch, input.sizes(): ", input.sizes(),
              ", output.sizes(): ", out.sizes());
  CheckSum(reduce_op, op);
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), op, ": output must have the dtype of input (",
              input.scalar_type(), "), but got ", out.scalar_type());
  if (local_input.has_value()) {
    TORCH_CHECK(local_input->is_contiguous(), op, ": local input must be contiguous.");
    TORCH_CHECK(local_input->numel() <= input.numel(), op,
                ": local input size must be smaller than symm buffer size.");
    TORCH_CHECK(local_input->scalar_type() == input.scalar_type(), op, ": local input must have the dtype of the "
                "symm buffer (", input.scalar_type(), "), but got ", local_input->scalar_type());
  }
  if (input.numel() == 0) return out;
  const DataType dtype = ReduceTypeOf(input, op);
  const OpGroup group = GroupOf(input, group_name, op, "input");
  // The copy variant first puts the local input into this rank's symmetric buffer, as torch's kernel does.
  if (local_input.has_value()) std::memcpy(input.data_ptr(), local_input->data_ptr(), Bytes(*local_input));
  SymmMemWithoutGil nogil;
  CheckStatus(R().AllReduce(group.team.id, out.data_ptr(), Bytes(out), dtype, ReduceOp::kSum, kDefaultStream,
                            nullptr, std::nullopt, input.data_ptr()));
  return out;
}

at::Tensor OneShotAllReduceOut(const at::Tensor& input, std::string reduce_op, std::string group_name,
                               at::Tensor out) {
  return OneShotAllReduceOutImpl(input, std::nullopt, reduce_op, group_name, std::move(out));
}

at::Tensor OneShotAllReduce(const at::Tensor& input, std::string reduce_op, std::string group_name) {
  return OneShotAllReduceOutImpl(input, std::nullopt, reduce_op, group_name, at::empty_like(input));
}

at::Tensor OneShotAllReduceCopyOut(const at::Tensor& symm_buffer, const at::Tensor& local_input,
                                   std::string reduce_op, std::string group_name, at::Tensor out) {
  return OneShotAllReduceOutImpl(symm_buffer, local_input, reduce_op, group_name, std::move(out));
}

at::Tensor OneShotAllReduceCopy(const at::Tensor& symm_buffer, const at::Tensor& local_input,
                                std::string reduce_op, std::string group_name) {
  return OneShotAllReduceOutImpl(symm_buffer, local_input, reduce_op, group_name, at::empty_like(local_input));
}

at::Tensor TwoShotAllReduceImpl(at::Tensor input, const std::optional<at::Tensor>& output, std::string reduce_op,
                                std::string group_name) {
  const char* op = "two_shot_all_reduce";
  TORCH_CHECK(input.is_contiguous(), op, ": input must be contiguous.");
  CheckSum(reduce_op, op);
  const OpGroup group = GroupOf(input, group_name, op, "input");
  if (output.has_value()) {
    TORCH_CHECK(output->is_contiguous(), op, ": output must be contiguous.");
    TORCH_CHECK(output->sizes() == input.sizes(), op, ": input/output size mismatch, input.sizes(): ", input.sizes(),
                ", output.sizes(): ", output->sizes());
    TORCH_CHECK(output->scalar_type() == input.scalar_type(), op, ": output must have the dtype of input (",
                input.scalar_type(), "), but got ", output->scalar_type());
    if (input.numel() == 0) return *output;
  } else if (input.numel() == 0) {
    return input;
  }
  const DataType dtype = ReduceTypeOf(input, op);
  at::Tensor result = output.has_value() ? *output : input;
  SymmMemWithoutGil nogil;
  CheckStatus(R().AllReduce(group.team.id, result.data_ptr(), Bytes(result), dtype, ReduceOp::kSum,
                            kDefaultStream, nullptr, std::nullopt,
                            output.has_value() ? input.data_ptr() : nullptr));
  return result;
}

at::Tensor TwoShotAllReduceInPlace(at::Tensor input, std::string reduce_op, std::string group_name) {
  return TwoShotAllReduceImpl(std::move(input), std::nullopt, reduce_op, group_name);
}

at::Tensor TwoShotAllReduceOut(at::Tensor input, std::string reduce_op, std::string group_name,
                               at::Tensor output) {
  return TwoShotAllReduceImpl(std::move(input), std::move(output), reduce_op, group_name);
}

// ---- reduce-scatter --------------------------------------------------------------------------------------------

at::Tensor ReduceScatterOut(at::Tensor input, std::string group_name, bool split_last_dim, at::Tensor output) {
  const char* op = "reduce_scatter";
  TORCH_CHECK(input.is_contiguous(), op, ": input must be contiguous.");
  TORCH_CHECK(output.is_contiguous(), op, ": output must be contiguous.");
  const OpGroup group = GroupOf(input, group_name, op, "input");
  const int world = group.world();
  // torch's kernel splits the input in vectors of `alignment` bytes: its divisibility rule is kept, so that code
  // that runs here runs on CUDA.
  const std::size_t alignment = std::min(Alignment(static_cast<std::size_t>(input.storage_offset()) *
                                                   input.element_size()),
                                         Alignment(Bytes(input)));
  const auto per_vector = static_cast<std::int64_t>(std::max<std::size_t>(alignment / input.element_size(), 1));
  TORCH_CHECK(input.numel() % (world * per_vector) == 0,
              "expected number of elements to be divisible by world_size * alignment, number of elements ",
              input.numel(), " world size ", world, "alignment ", alignment);
  if (split_last_dim) {
    TORCH_CHECK(input.dim() == output.dim(), op, ": expected input and output to have the same number of dimensions");
    TORCH_CHECK(std::equal(input.sizes().begin(), input.sizes().end() - 1, output.sizes().begin()),
                "reduce_scatter expected input and output to have same sizes except in the last dimension");
    TORCH_CHECK(output.size(-1) == input.size(-1) / world,
                "reduce_scatter expected output last dim size to be input last dim size / world_size");
    TORCH_CHECK(input.size(-1) % (world * per_vector) == 0,
                "expected last dimension to be divisible by world_size * alignment, last dimension ", input.size(-1),
                " world size ", world, "alignment ", alignment);
  } else {
    TORCH_CHECK(input.dim() == 1, "reduce_scatter expected 1D input");
    TORCH_CHECK(output.dim() == 1, "reduce_scatter expected 1D output");
    TORCH_CHECK(output.numel() == input.numel() / world, op, ": output must have input.numel() / world_size (",
                input.numel() / world, ") elements, but got ", output.numel());
  }
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), op, ": output must have the dtype of input (",
              input.scalar_type(), "), but got ", output.scalar_type());
  if (input.numel() == 0) return output;
  const DataType dtype = ReduceTypeOf(input, op);
  // Split along the last dimension, rank r's part is a column block: the parts are laid out one after the other
  // first (a local copy), so that the engine reduces contiguous parts.
  at::Tensor parts = split_last_dim ? input.view({-1, world, input.size(-1) / world}).transpose(0, 1).contiguous()
                                    : input;
  SymmMemWithoutGil nogil;
  CheckStatus(R().ReduceScatter(group.team.id, output.data_ptr(), Bytes(output), parts.data_ptr(), Bytes(parts),
                                dtype, ReduceOp::kSum, kDefaultStream, nullptr));
  return output;
}

// ---- low-contention all-gather and reduce-scatter (torch's Python-level ops) --------------------------------------

at::Tensor LowContentionAllGather(const at::Tensor& tensor, std::string group_name) {
  const char* op = "_low_contention_all_gather";
  TORCH_CHECK(tensor.device().is_cpu(), op, ": tensor must be a CPU tensor, but got ", tensor.device());
  const SymmMemTeam team = SymmMemTeamOf(group_name);
  const auto world = static_cast<std::int64_t>(team.pes.size());
  const at::Tensor input = tensor.contiguous();
  std::vector<std::int64_t> shape = input.sizes().vec();
  if (shape.empty()) {
    shape.push_back(world);
  } else {
    shape[0] *= world;
  }
  at::Tensor output = at::empty(shape, input.options());
  SymmMemWithoutGil nogil;
  CheckStatus(R().AllGather(team.id, output.data_ptr(), Bytes(output), input.data_ptr(), Bytes(input),
                            ElementTypeOf(input), kDefaultStream, nullptr));
  return output;
}

at::Tensor LowContentionReduceScatter(const at::Tensor& tensor, std::string reduce_op,
                                      std::string group_name) {
  const char* op = "_low_contention_reduce_scatter";
  TORCH_CHECK(tensor.device().is_cpu(), op, ": tensor must be a CPU tensor, but got ", tensor.device());
  TORCH_CHECK(reduce_op == "sum" || reduce_op == "avg", op, ": reduce_op must be sum or avg, but got ", reduce_op);
  const SymmMemTeam team = SymmMemTeamOf(group_name);
  const auto world = static_cast<std::int64_t>(team.pes.size());
  TORCH_CHECK(tensor.dim() >= 1 && tensor.size(0) % world == 0, op, ": tensor.shape[0] must be divisible by the group "
              "size (", world, "), but got shape ", tensor.sizes());
  const at::Tensor input = tensor.contiguous();
  std::vector<std::int64_t> shape = input.sizes().vec();
  shape[0] /= world;
  at::Tensor output = at::empty(shape, input.options());
  if (input.numel() == 0) return output;
  const DataType dtype = ReduceTypeOf(input, op);
  SymmMemWithoutGil nogil;
  CheckStatus(R().ReduceScatter(team.id, output.data_ptr(), Bytes(output), input.data_ptr(), Bytes(input), dtype,
                                reduce_op == "sum" ? ReduceOp::kSum : ReduceOp::kAvg, kDefaultStream, nullptr));
  return output;
}

std::vector<at::Tensor> GetRemoteTensors(const at::Tensor& x, std::string group_name) {
  auto handle = SymmMemHandle(x, group_name, "get_remote_tensors", "x");
  std::vector<at::Tensor> remote;
  for (int peer = 0; peer < handle->get_world_size(); ++peer) {
    remote.push_back(handle->get_remote_tensor(peer, x.sizes(), x.scalar_type()));
  }
  return remote;
}

// ---- MoE dispatch and combine ------------------------------------------------------------------------------------

void CheckSplitTable(const at::Tensor& t, const char* name, std::int64_t rows, std::int64_t columns, const char* op) {
  TORCH_CHECK(t.scalar_type() == at::kLong, op, ": splits and offsets must be int64, but got ", name, " of dtype ",
              t.scalar_type());
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, but got ", t.device());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  const bool shaped = rows == 0 ? t.dim() == 1 && t.size(0) == columns
                                : t.dim() == 2 && t.size(0) == rows && t.size(1) == columns;
  TORCH_CHECK(shaped, op, ": ", name, " must have shape ",
              rows == 0 ? "(" + std::to_string(columns) + ",)"
                        : "(" + std::to_string(rows) + ", " + std::to_string(columns) + ")",
              ", but got ", t.sizes());
}

void RunExchange(const char* op, const at::Tensor& input, const at::Tensor& out, const std::int64_t* in_splits,
                 const std::int64_t* in_offsets, const at::Tensor& out_splits_offsets, int experts,
                 MoeDirection direction, std::int64_t major_align, const OpGroup& group) {
  TORCH_CHECK(input.is_contiguous() && out.is_contiguous(), op, ": input and out must be contiguous");
  TORCH_CHECK(input.dim() >= 1 && out.dim() >= 1, op, ": input and out must have at least one dimension, but got ",
              input.sizes(), " and ", out.sizes());
  TORCH_CHECK(input.scalar_type() == out.scalar_type() && input.stride(0) == out.stride(0),
              op, ": input and out must have the same dtype and same stride at dim 0");
  TORCH_CHECK(out.device().is_cpu(), op, ": out must be a CPU tensor, but got ", out.device());
  const auto row_bytes = static_cast<std::size_t>(input.stride(0)) * input.element_size();
  const std::size_t n = group.team.pes.size();
  const std::size_t nsplits = n * static_cast<std::size_t>(experts);
  MoeExchangeArgs exchange;
  exchange.op = op;
  exchange.team = group.team.id;
  exchange.direction = direction;
  exchange.experts = experts;
  exchange.input = input.data_ptr();
  exchange.input_rows = input.size(0);
  exchange.output = out.data_ptr();
  exchange.output_rows = out.size(0);
  exchange.row_bytes = row_bytes;
  exchange.in_splits = in_splits;
  exchange.in_offsets = in_offsets;
  exchange.major_align = major_align;
  auto* table = out_splits_offsets.data_ptr<std::int64_t>();
  exchange.out_splits = table;
  exchange.out_offsets = table + nsplits;
  SymmMemWithoutGil nogil;
  CheckStatus(R().MoeExchange(exchange, kDefaultStream, nullptr));
}

void AllToAllVdev(at::Tensor& input, at::Tensor& out, at::Tensor& in_splits,
                  at::Tensor& out_splits_offsets, std::string group_name) {
  const char* op = "all_to_all_vdev";
  const OpGroup group = GroupOf(input, group_name, op, "input");
  const int world = group.world();
  CheckSplitTable(in_splits, "in_splits", 0, world, op);
  CheckSplitTable(out_splits_offsets, "out_splits_offsets", 2, world, op);
  RunExchange(op, input, out, in_splits.data_ptr<std::int64_t>(), nullptr, out_splits_offsets, 1,
              MoeDirection::kDispatch, 0, group);
}

void AllToAllVdev2d(at::Tensor& input, at::Tensor& out, at::Tensor& in_splits,
                    at::Tensor& out_splits_offsets, std::string group_name, std::optional<int64_t> major_align) {
  const char* op = "all_to_all_vdev_2d";
  const OpGroup group = GroupOf(input, group_name, op, "input");
  const int world = group.world();
  const std::int64_t align = major_align.value_or(1);
  TORCH_CHECK(align > 0, op, ": major_align must be positive, but got ", align);
  TORCH_CHECK(in_splits.dim() == 1 && in_splits.size(0) % world == 0, op, ": in_splits must be 1D with a multiple of "
              "world_size (", world, ") entries, but got shape ", in_splits.sizes());
  const std::int64_t nsplits = in_splits.size(0);
  CheckSplitTable(in_splits, "in_splits", 0, nsplits, op);
  CheckSplitTable(out_splits_offsets, "out_splits_offsets", 2, nsplits, op);
  RunExchange(op, input, out, in_splits.data_ptr<std::int64_t>(), nullptr, out_splits_offsets,
              static_cast<int>(nsplits / world), MoeDirection::kDispatch, align, group);
}

void AllToAllVdev2dOffset(at::Tensor& input, at::Tensor& out, at::Tensor& in_splits_offsets,
                          at::Tensor& out_splits_offsets, std::string group_name) {
  const char* op = "all_to_all_vdev_2d_offset";
  const OpGroup group = GroupOf(input, group_name, op, "input");
  const int world = group.world();
  TORCH_CHECK(in_splits_offsets.dim() == 2 && in_splits_offsets.size(0) == 2 &&
                  in_splits_offsets.size(1) % world == 0,
              op, ": in_splits_offsets must be 2D with 2 rows, each row must be a multiple of world_size, but got "
              "shape ", in_splits_offsets.sizes());
  const std::int64_t nsplits = in_splits_offsets.size(1);
  CheckSplitTable(in_splits_offsets, "in_splits_offsets", 2, nsplits, op);
  CheckSplitTable(out_splits_offsets, "out_splits_offsets", 2, nsplits, op);
  const auto* splits = in_splits_offsets.data_ptr<std::int64_t>();
  RunExchange(op, input, out, splits, splits + nsplits, out_splits_offsets, static_cast<int>(nsplits / world),
              MoeDirection::kCombine, 0, group);
}

// ---- tile reductions -------------------------------------------------------------------------------------------

void CheckTile(const at::Tensor& tile, const at::Tensor& like, const char* name, const char* op) {
  TORCH_CHECK(tile.dim() == 2 && tile.stride(1) == 1, op, ": ", name, " must be a 2D tensor with contiguous rows, "
              "but got shape ", tile.sizes(), " and strides ", tile.strides());
  TORCH_CHECK(tile.sizes() == like.sizes() && tile.scalar_type() == like.scalar_type(), op, ": ", name,
              " must have the shape and dtype of out_tile (", like.sizes(), ", ", like.scalar_type(), "), but got ",
              tile.sizes(), ", ", tile.scalar_type());
}

// Reduces `in_tile` of every member into `out_tile` of this rank, row by row (a tile is a strided view).
void ReduceTile(const at::Tensor& in_tile, const at::Tensor& out_tile, const SymmMemTeam& team, DataType dtype) {
  const auto row_bytes = static_cast<std::size_t>(in_tile.size(1)) * in_tile.element_size();
  const bool whole = in_tile.is_contiguous() && out_tile.is_contiguous();
  const std::int64_t rows = whole ? 1 : in_tile.size(0);
  const std::size_t bytes = whole ? Bytes(in_tile) : row_bytes;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto* src = static_cast<const char*>(in_tile.data_ptr()) + r * in_tile.stride(0) * in_tile.element_size();
    auto* dst = static_cast<char*>(out_tile.data_ptr()) + r * out_tile.stride(0) * out_tile.element_size();
    CheckStatus(R().Reduce(dst, bytes, src, bytes, dtype, ReduceOp::kSum, team.pes, kDefaultStream, nullptr));
  }
}

void TileReduce(at::Tensor& in_tile, at::Tensor& out_tile, int64_t root, std::string group_name,
                std::string reduce_op) {
  const char* op = "tile_reduce";
  CheckSum(reduce_op, op);
  CheckTile(out_tile, out_tile, "out_tile", op);
  CheckTile(in_tile, out_tile, "in_tile", op);
  auto handle = SymmMemHandle(in_tile, group_name, op, "in_tile");
  const SymmMemTeam& team = handle->team();
  const auto world = static_cast<std::int64_t>(team.pes.size());
  TORCH_CHECK(root >= 0 && root < world, op, ": root must be in [0, ", world, ") (got ", root, ")");
  const DataType dtype = ReduceTypeOf(in_tile, op);
  SymmMemWithoutGil nogil;
  CheckStatus(R().TeamBarrier(team.id, kDefaultStream));   // every member's tile is written
  if (root == team.me && in_tile.numel() > 0) ReduceTile(in_tile, out_tile, team, dtype);
  CheckStatus(R().TeamBarrier(team.id, kDefaultStream));   // the root has read every tile
}

void MultiRootTileReduce(at::TensorList in_tiles, at::Tensor& out_tile, at::IntArrayRef roots,
                         std::string group_name, std::string reduce_op) {
  const char* op = "multi_root_tile_reduce";
  CheckSum(reduce_op, op);
  TORCH_CHECK(in_tiles.size() == roots.size(), op, ": in_tiles and roots must have the same length, but got ",
              in_tiles.size(), " and ", roots.size());
  TORCH_CHECK(!in_tiles.empty(), op, ": in_tiles must hold at least one tile");
  CheckTile(out_tile, out_tile, "out_tile", op);
  for (const at::Tensor& tile : in_tiles) CheckTile(tile, out_tile, "in_tiles[i]", op);
  auto handle = SymmMemHandle(in_tiles[0], group_name, op, "in_tiles[0]");
  const SymmMemTeam& team = handle->team();
  const auto world = static_cast<std::int64_t>(team.pes.size());
  std::set<std::int64_t> seen;
  for (std::int64_t root : roots) {
    TORCH_CHECK(root >= 0 && root < world, op, ": roots must be in [0, ", world, ") (got ", root, ")");
    TORCH_CHECK(seen.insert(root).second, op, ": a rank cannot be a root more than once, but got ", roots);
  }
  for (std::size_t k = 1; k < in_tiles.size(); ++k) {
    (void)SymmMemHandle(in_tiles[k], group_name, op, "in_tiles[k]");
  }
  const DataType dtype = ReduceTypeOf(out_tile, op);
  SymmMemWithoutGil nogil;
  CheckStatus(R().TeamBarrier(team.id, kDefaultStream));
  for (std::size_t k = 0; k < in_tiles.size(); ++k) {
    if (roots[k] == team.me && out_tile.numel() > 0) ReduceTile(in_tiles[k], out_tile, team, dtype);
  }
  CheckStatus(R().TeamBarrier(team.id, kDefaultStream));
}

// ---- memset32_ and stream_write_value32_ (local) ----------------------------------------------------------------

void CheckUint32Flat(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.dim() == 1 && input.is_contiguous() && input.scalar_type() == c10::ScalarType::UInt32,
              "symm_mem::", op, ": input must be a flat, contiguous uint32 tensor.");
}

void CheckUint32Value(int64_t val, const char* op) {
  TORCH_CHECK(val >= 0 && static_cast<std::uint64_t>(val) <= std::numeric_limits<std::uint32_t>::max(),
              "symm_mem::", op, ": val must be in the range of [0, 4294967295] (uint32_t).");
}

at::Tensor Memset32(at::Tensor& input, int64_t offset, int64_t val, int64_t count) {
  const char* op = "memset32_";
  CheckUint32Flat(input, op);
  TORCH_CHECK(offset >= 0, "symm_mem::", op, ": offset must be greater than or equal to 0 (got ", offset, ")");
  TORCH_CHECK(count > 0, "symm_mem::", op, ": count must be a positive integer (got ", count, ")");
  CheckUint32Value(val, op);
  TORCH_CHECK(offset <= input.numel() - count, "symm_mem::", op, ": offset + count (", offset + count,
              ") exceeded the numel of the input (", input.numel(), ")");
  auto* words = static_cast<std::uint32_t*>(input.data_ptr()) + offset;
  std::fill_n(words, count, static_cast<std::uint32_t>(val));
  return input;
}

at::Tensor StreamWriteValue32(at::Tensor& input, int64_t offset, int64_t val) {
  const char* op = "stream_write_value32_";
  CheckUint32Flat(input, op);
  TORCH_CHECK(offset >= 0, "symm_mem::", op, ": offset must be greater than or equal to 0 (got ", offset, ")");
  CheckUint32Value(val, op);
  TORCH_CHECK(offset < input.numel(), "symm_mem::", op, ": offset (", offset, ") exceeded the numel of the input (",
              input.numel(), ")");
  // A release store, as cuStreamWriteValue32 fences the writes before it: a peer that reads the value sees them.
  std::atomic_ref<std::uint32_t>(static_cast<std::uint32_t*>(input.data_ptr())[offset])
      .store(static_cast<std::uint32_t>(val), std::memory_order_release);
  return input;
}

// ---- meta kernels where torch has none ---------------------------------------------------------------------------

at::Tensor MetaOneShotAllReduceOut(const at::Tensor&, std::string, std::string, at::Tensor out) { return out; }
at::Tensor MetaOneShotAllReduceCopyOut(const at::Tensor&, const at::Tensor&, std::string, std::string,
                                       at::Tensor out) {
  return out;
}
at::Tensor MetaTwoShotAllReduceInPlace(at::Tensor input, std::string, std::string) { return input; }
at::Tensor MetaTwoShotAllReduceOut(at::Tensor, std::string, std::string, at::Tensor output) {
  return output;
}
at::Tensor MetaReduceScatterOut(at::Tensor, std::string, bool, at::Tensor output) { return output; }
void MetaAllToAllVdev(at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, std::string) {}
void MetaTileReduce(at::Tensor&, at::Tensor&, int64_t, std::string, std::string) {}
void MetaMultiRootTileReduce(at::TensorList, at::Tensor&, at::IntArrayRef, std::string, std::string) {}
at::Tensor MetaMemset32(at::Tensor& input, int64_t, int64_t, int64_t) { return input; }
at::Tensor MetaStreamWriteValue32(at::Tensor& input, int64_t, int64_t) { return input; }

// The operator `name` if this torch declares it.
std::optional<c10::OperatorHandle> Declared(const char* name) {
  return c10::Dispatcher::singleton().findSchema({std::string("symm_mem::") + name, ""});
}

}  // namespace

void RegisterSymmMemOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the process: torch unregisters a library's kernels when it is destroyed.
    auto* cpu = new torch::Library(torch::Library::IMPL, "symm_mem", c10::DispatchKey::CPU, __FILE__, __LINE__);
    auto* meta = new torch::Library(torch::Library::IMPL, "symm_mem", c10::DispatchKey::Meta, __FILE__, __LINE__);
    auto add = [&](const char* name, auto cpu_kernel, auto meta_kernel) {
      auto op = Declared(name);
      if (!op.has_value()) return;   // not declared by this torch
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) cpu->impl(name, cpu_kernel);
      if constexpr (!std::is_same_v<decltype(meta_kernel), std::nullptr_t>) {
        if (!op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) meta->impl(name, meta_kernel);
      }
    };
    add("one_shot_all_reduce", TORCH_FN(OneShotAllReduce), nullptr);
    add("one_shot_all_reduce_out", TORCH_FN(OneShotAllReduceOut), TORCH_FN(MetaOneShotAllReduceOut));
    add("one_shot_all_reduce_copy", TORCH_FN(OneShotAllReduceCopy), nullptr);
    add("one_shot_all_reduce_copy_out", TORCH_FN(OneShotAllReduceCopyOut), TORCH_FN(MetaOneShotAllReduceCopyOut));
    add("two_shot_all_reduce_", TORCH_FN(TwoShotAllReduceInPlace), TORCH_FN(MetaTwoShotAllReduceInPlace));
    add("two_shot_all_reduce_out", TORCH_FN(TwoShotAllReduceOut), TORCH_FN(MetaTwoShotAllReduceOut));
    add("reduce_scatter_out", TORCH_FN(ReduceScatterOut), TORCH_FN(MetaReduceScatterOut));
    add("all_to_all_vdev", TORCH_FN(AllToAllVdev), TORCH_FN(MetaAllToAllVdev));
    add("all_to_all_vdev_2d", TORCH_FN(AllToAllVdev2d), nullptr);
    add("all_to_all_vdev_2d_offset", TORCH_FN(AllToAllVdev2dOffset), nullptr);
    add("tile_reduce", TORCH_FN(TileReduce), TORCH_FN(MetaTileReduce));
    add("multi_root_tile_reduce", TORCH_FN(MultiRootTileReduce), TORCH_FN(MetaMultiRootTileReduce));
    add("memset32_", TORCH_FN(Memset32), TORCH_FN(MetaMemset32));
    add("stream_write_value32_", TORCH_FN(StreamWriteValue32), TORCH_FN(MetaStreamWriteValue32));
    add("_low_contention_all_gather", TORCH_FN(LowContentionAllGather), nullptr);
    add("_low_contention_reduce_scatter", TORCH_FN(LowContentionReduceScatter), nullptr);
    add("get_remote_tensors", TORCH_FN(GetRemoteTensors), nullptr);
  });
}

}  // namespace hp::shmem::torch_binding
