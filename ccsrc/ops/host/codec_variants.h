// The entries of each compiled variant of the codec kernels (see codec_kernels.inc). Internal to ops/.
#pragma once

#include <cstddef>

#include "ops/host/codec.h"

namespace hp::shmem::ops {

bool EncodePortable(LowFormat format, DataType src_dtype, const void* src, std::size_t count, MutableEncodedRun dst);
bool DecodePortable(LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out,
                    bool accumulate);
bool ReduceEncodedPortable(LowFormat format, DataType out_dtype, ReduceOp op, const void* own,
                           const EncodedRun* sources, int nsources, std::size_t count, void* out,
                           MutableEncodedRun reencode);
bool EncodeRowsPortable(LowFormat format, DataType src_dtype, const void* src, std::size_t rows,
                        std::size_t row_elems, void* dst);
bool DecodeRowsPortable(LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                        DataType out_dtype, void* out);
#if defined(HP_OPS_HAVE_AVX2_F16C)
bool EncodeAvx2F16c(LowFormat format, DataType src_dtype, const void* src, std::size_t count, MutableEncodedRun dst);
bool DecodeAvx2F16c(LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out,
                    bool accumulate);
bool ReduceEncodedAvx2F16c(LowFormat format, DataType out_dtype, ReduceOp op, const void* own,
                           const EncodedRun* sources, int nsources, std::size_t count, void* out,
                           MutableEncodedRun reencode);
bool EncodeRowsAvx2F16c(LowFormat format, DataType src_dtype, const void* src, std::size_t rows,
                        std::size_t row_elems, void* dst);
bool DecodeRowsAvx2F16c(LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                        DataType out_dtype, void* out);
#endif

}  // namespace hp::shmem::ops
