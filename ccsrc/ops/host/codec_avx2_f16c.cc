// The AVX2 + F16C variant of the codec kernels. This file alone is compiled with -mavx2 -mf16c;
// codec.cc calls it only on a CPU that has both.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>   // the codes' non-temporal stores
#endif

#include "ops/host/codec_variants.h"

namespace hp::shmem::ops {
namespace {

#include "ops/host/float_formats.inc"
#include "ops/host/half_f16c.inc"
#include "ops/host/codec_kernels.inc"

}  // namespace

bool EncodeAvx2F16c(LowFormat format, DataType src_dtype, const void* src, std::size_t count, MutableEncodedRun dst) {
  return Encode<F16cHalf>(format, src_dtype, src, count, dst);
}

bool DecodeAvx2F16c(LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out,
                    bool accumulate) {
  return Decode<F16cHalf>(format, src, count, out_dtype, out, accumulate);
}

bool ReduceEncodedAvx2F16c(LowFormat format, DataType out_dtype, ReduceOp op, const void* own,
                           const EncodedRun* sources, int nsources, std::size_t count, void* out,
                           MutableEncodedRun reencode) {
  return ReduceEncoded<F16cHalf>(format, out_dtype, op, own, sources, nsources, count, out, reencode);
}

bool EncodeRowsAvx2F16c(LowFormat format, DataType src_dtype, const void* src, std::size_t rows,
                        std::size_t row_elems, void* dst) {
  return EncodeRows<F16cHalf>(format, src_dtype, src, rows, row_elems, dst);
}

bool DecodeRowsAvx2F16c(LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                        DataType out_dtype, void* out) {
  return DecodeRows<F16cHalf>(format, src, rows, row_elems, out_dtype, out);
}

}  // namespace hp::shmem::ops
