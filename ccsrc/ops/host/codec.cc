#include "ops/host/codec.h"

#include "ops/host/codec_variants.h"

namespace hp::shmem::ops {

bool HostEncode(HostIsa isa, LowFormat format, DataType src_dtype, const void* src, std::size_t count,
                MutableEncodedRun dst) {
  if (!HostIsaAvailable(isa)) return false;
#if defined(HP_OPS_HAVE_AVX2_F16C)
  if (isa == HostIsa::kAvx2F16c) return EncodeAvx2F16c(format, src_dtype, src, count, dst);
#endif
  return EncodePortable(format, src_dtype, src, count, dst);
}

bool HostEncode(LowFormat format, DataType src_dtype, const void* src, std::size_t count, MutableEncodedRun dst) {
  return HostEncode(BestHostIsa(), format, src_dtype, src, count, dst);
}

bool HostDecode(HostIsa isa, LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out,
                bool accumulate) {
  if (!HostIsaAvailable(isa)) return false;
#if defined(HP_OPS_HAVE_AVX2_F16C)
  if (isa == HostIsa::kAvx2F16c) return DecodeAvx2F16c(format, src, count, out_dtype, out, accumulate);
#endif
  return DecodePortable(format, src, count, out_dtype, out, accumulate);
}

bool HostDecode(LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out, bool accumulate) {
  return HostDecode(BestHostIsa(), format, src, count, out_dtype, out, accumulate);
}

bool HostReduceEncoded(HostIsa isa, LowFormat format, DataType out_dtype, ReduceOp op, const void* own,
                       const EncodedRun* sources, int nsources, std::size_t count, void* out,
                       MutableEncodedRun reencode) {
  if (!HostIsaAvailable(isa)) return false;
#if defined(HP_OPS_HAVE_AVX2_F16C)
  if (isa == HostIsa::kAvx2F16c) {
    return ReduceEncodedAvx2F16c(format, out_dtype, op, own, sources, nsources, count, out, reencode);
  }
#endif
  return ReduceEncodedPortable(format, out_dtype, op, own, sources, nsources, count, out, reencode);
}

bool HostReduceEncoded(LowFormat format, DataType out_dtype, ReduceOp op, const void* own, const EncodedRun* sources,
                       int nsources, std::size_t count, void* out, MutableEncodedRun reencode) {
  return HostReduceEncoded(BestHostIsa(), format, out_dtype, op, own, sources, nsources, count, out, reencode);
}

bool HostEncodeRows(HostIsa isa, LowFormat format, DataType src_dtype, const void* src, std::size_t rows,
                    std::size_t row_elems, void* dst) {
  if (!HostIsaAvailable(isa)) return false;
#if defined(HP_OPS_HAVE_AVX2_F16C)
  if (isa == HostIsa::kAvx2F16c) return EncodeRowsAvx2F16c(format, src_dtype, src, rows, row_elems, dst);
#endif
  return EncodeRowsPortable(format, src_dtype, src, rows, row_elems, dst);
}

bool HostEncodeRows(LowFormat format, DataType src_dtype, const void* src, std::size_t rows, std::size_t row_elems,
                    void* dst) {
  return HostEncodeRows(BestHostIsa(), format, src_dtype, src, rows, row_elems, dst);
}

bool HostDecodeRows(HostIsa isa, LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                    DataType out_dtype, void* out) {
  if (!HostIsaAvailable(isa)) return false;
#if defined(HP_OPS_HAVE_AVX2_F16C)
  if (isa == HostIsa::kAvx2F16c) return DecodeRowsAvx2F16c(format, src, rows, row_elems, out_dtype, out);
#endif
  return DecodeRowsPortable(format, src, rows, row_elems, out_dtype, out);
}

bool HostDecodeRows(LowFormat format, const void* src, std::size_t rows, std::size_t row_elems, DataType out_dtype,
                    void* out) {
  return HostDecodeRows(BestHostIsa(), format, src, rows, row_elems, out_dtype, out);
}

}  // namespace hp::shmem::ops
