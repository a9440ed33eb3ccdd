// The C ABI's checks of what the runtime cannot check itself: null pointers, and the C enums' values.
#pragma once

#include <cstddef>

#include "capi/hp_shmem.h"
#include "ops/reduce_op.h"
#include "ops/wire_format.h"
#include "runtime/collectives/engine.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/team.h"

namespace hp::shmem::capi {

Status NonNull(const void* pointer, const char* name);
// A data buffer: NULL only with zero bytes (an empty framework tensor has no data pointer).
Status NonNullData(const void* pointer, std::size_t bytes, const char* name);
Status NonNegative(int value, const char* name);
Result<DataType> DtypeArg(int dtype, const char* name = "dtype");
Result<ReduceOp> ReduceOpArg(int op);
Result<SignalOp> SignalOpArg(int op);
Result<CompareOp> CompareOpArg(int op);
Result<SignalWidth> SignalWidthArg(int signal_bytes);
Result<ElementType> ElementTypeArg(const hp_shmem_element_type* type);
// A low-precision wire format (an hp_shmem_wire other than HP_SHMEM_WIRE_FULL).
Result<ops::LowFormat> LowWireArg(int wire);
// A dtype the codec encodes from and decodes into: float32, float64, float16 or bfloat16.
Result<DataType> CodecDtypeArg(int dtype);

}  // namespace hp::shmem::capi
