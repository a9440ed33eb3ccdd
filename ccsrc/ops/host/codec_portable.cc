// The portable variant of the codec kernels: plain C++, vectorised for the baseline instruction set.
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
#include "ops/host/codec_kernels.inc"

}  // namespace

bool EncodePortable(LowFormat format, DataType src_dtype, const void* src, std::size_t count, MutableEncodedRun dst) {
  return Encode<PortableHalf>(format, src_dtype, src, count, dst);
}

bool DecodePortable(LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out,
                    bool accumulate) {
  return Decode<PortableHalf>(format, src, count, out_dtype, out, accumulate);
}

bool ReduceEncodedPortable(LowFormat format, DataType out_dtype, ReduceOp op, const void* own,
                           const EncodedRun* sources, int nsources, std::size_t count, void* out,
                           MutableEncodedRun reencode) {
  return ReduceEncoded<PortableHalf>(format, out_dtype, op, own, sources, nsources, count, out, reencode);
}

bool EncodeRowsPortable(LowFormat format, DataType src_dtype, const void* src, std::size_t rows,
                        std::size_t row_elems, void* dst) {
  return EncodeRows<PortableHalf>(format, src_dtype, src, rows, row_elems, dst);
}

bool DecodeRowsPortable(LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                        DataType out_dtype, void* out) {
  return DecodeRows<PortableHalf>(format, src, rows, row_elems, out_dtype, out);
}

}  // namespace hp::shmem::ops
