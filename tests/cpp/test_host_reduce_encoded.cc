// HostReduceEncoded (ops/host/codec.h) against a scalar reference written from its contract and the formats'
// definitions (codec_reference.h), bit for bit: every instruction-set variant, wire format and output dtype, with
// and without `own` (in place over `out` too), 0 to 3 sources, kSum and kAvg, with and without reencoding, counts
// with tails and many blocks; values across each dtype's whole range, blocks with inf/NaN, sums past float32's
// range; reencoding at every alignment; and what it refuses.
//
// The reference sums in the C++ type of the accumulator (double for a float64 out, float otherwise), so that it
// rounds where the contract says the kernel rounds, and reuses the reference encoder of the fp8 codec's tests.
#include "ops/host/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec_reference.h"
#include "host_kernel_support.h"

namespace hp::shmem::ops {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg};
// Tails, exactly one block, just past it, and many blocks (the kernels may work in blocks of 128 or 1024).
const std::size_t kCounts[] = {1, 127, kScaleBlock, kScaleBlock + 1, 1000, 4097};

constexpr unsigned char kOutGuard = 0x5A;    // fills `out` (past `count`, or all of it where nothing is written)
constexpr unsigned char kCodeGuard = 0xA5;   // fills the reencoded codes
constexpr float kScaleGuard = 12345.0f;      // fills the reencoded scales
constexpr std::size_t kGuardBytes = 16;      // past the end of every output: the kernel writes no further

// How `own` takes part.
enum class Own { kNone, kSeparate, kInPlace };

const char* OwnName(Own own) {
  return own == Own::kNone ? "no own" : own == Own::kSeparate ? "own" : "own in place";
}

// ---------------------------------------------------------------------------------------------------------------
// Encoded runs. An Encoded holds the scales (fp8 only; empty for float16/bfloat16) and the codes: one byte per
// value for fp8, the raw 16-bit patterns for float16/bfloat16.

std::size_t CodeSize(LowFormat format) { return LowFormatScaled(format) ? 1 : 2; }

// The dtype a 16-bit format's codes are.
DataType Dtype16(LowFormat format) {
  return format == LowFormat::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
}

// Encodes float32 values: the reference block-scaled encoder for fp8, the cast (round to nearest even) otherwise.
Encoded EncodeFloat32(LowFormat format, const std::vector<unsigned char>& values, std::size_t count) {
  if (LowFormatScaled(format)) return ReferenceEncode(format, DataType::kFloat32, values, count);
  Encoded run{{}, std::vector<std::uint8_t>(count * 2)};
  for (std::size_t i = 0; i < count; ++i) Store(Dtype16(format), run.bytes, i, ValueAt(DataType::kFloat32, values, i));
  return run;
}

EncodedRun View(const Encoded& run) { return {run.scales.empty() ? nullptr : run.scales.data(), run.bytes.data()}; }

// Values of moderate magnitude (2**-10 to 2**4, both signs, no specials): terms of similar size, so that sums
// round, cancel and carry, averages are inexact, and the 16-bit outputs and the reencoding round non-trivially.
std::vector<unsigned char> ModerateValues(DataType dtype, std::size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> bytes(count * DtypeSize(dtype));
  std::uniform_real_distribution<double> mantissa(0.5, 1.0);
  std::uniform_int_distribution<int> exponent(-10, 4);
  for (std::size_t i = 0; i < count; ++i) {
    const double value = std::ldexp(mantissa(rng), exponent(rng));
    Store(dtype, bytes, i, (rng() & 1) ? -value : value);
  }
  return bytes;
}

enum class Spread { kWide, kModerate };

std::vector<unsigned char> Values(Spread spread, DataType dtype, std::size_t count, std::mt19937_64& rng) {
  return spread == Spread::kWide ? RandomValues(dtype, count, rng) : ModerateValues(dtype, count, rng);
}

// A random source run: fp8 encodes float32 values (whole range: some blocks get NaN scales); float16/bfloat16
// take random values of their own dtype (infinities and NaN included).
Encoded RandomRun(Spread spread, LowFormat format, std::size_t count, std::mt19937_64& rng) {
  if (!LowFormatScaled(format)) {
    const std::vector<unsigned char> codes = Values(spread, Dtype16(format), count, rng);
    return {{}, std::vector<std::uint8_t>(codes.begin(), codes.end())};
  }
  return EncodeFloat32(format, Values(spread, DataType::kFloat32, count, rng), count);
}

std::vector<Encoded> RandomRuns(Spread spread, LowFormat format, int nsources, std::size_t count,
                                std::mt19937_64& rng) {
  std::vector<Encoded> runs;
  for (int s = 0; s < nsources; ++s) runs.push_back(RandomRun(spread, format, count, rng));
  return runs;
}

// ---------------------------------------------------------------------------------------------------------------
// The reference.

// `value` (exact in float32 unless `dtype` is float64) as a `dtype` out stores it: rounded once to nearest even.
double StoredAs(DataType dtype, double value) {
  switch (dtype) {
    case DataType::kFloat32:
      return static_cast<float>(value);
    case DataType::kFloat64:
      return value;
    case DataType::kFloat16:
      return HalfValue(RoundToHalf(value));
    default:
      return BFloat16Value(RoundToBFloat16(value));
  }
}

// Element i of a source: its code's value and its scale (1 for float16/bfloat16), both exact in float32.
struct Term {
  double value;
  double scale;
};

Term SourceTerm(LowFormat format, const Encoded& run, std::size_t i) {
  if (LowFormatScaled(format)) return {Fp8DecodedValue(format, run.bytes[i]), run.scales[i / kScaleBlock]};
  return {ValueAt(Dtype16(format), run.bytes, i), 1.0};
}

// The accumulator of element i, in `Acc` (double for a float64 out, float otherwise): own first (widened exactly),
// then each source in order; without own the first source is decoded as overwriting does (the product in float32,
// infinite past its range, then widened); kAvg divides by the number of terms in the accumulator.
template <class Acc>
Acc ReduceOne(LowFormat format, DataType out_dtype, ReduceOp op, const std::vector<unsigned char>* own,
              const std::vector<Encoded>& sources, std::size_t i) {
  Acc acc = 0;
  int terms = 0;
  if (own != nullptr) {
    acc = static_cast<Acc>(ValueAt(out_dtype, *own, i));
    ++terms;
  }
  for (const Encoded& source : sources) {
    const Term term = SourceTerm(format, source, i);
    if (terms == 0) {
      acc = static_cast<Acc>(static_cast<float>(term.value) * static_cast<float>(term.scale));
    } else {
      acc = acc + static_cast<Acc>(term.value) * static_cast<Acc>(term.scale);   // the product is exact
    }
    ++terms;
  }
  if (op == ReduceOp::kAvg) acc = acc / static_cast<Acc>(terms);
  return acc;
}

struct Expected {
  std::vector<double> out;   // the values `out` holds, as doubles
  Encoded reencoded;         // the codes, when reencoding
};

Expected ReferenceReduce(LowFormat format, DataType out_dtype, ReduceOp op, const std::vector<unsigned char>* own,
                         const std::vector<Encoded>& sources, std::size_t count, bool reencode) {
  Expected expected;
  expected.out.resize(count);
  std::vector<unsigned char> as_float32(count * sizeof(float));
  for (std::size_t i = 0; i < count; ++i) {
    const double acc = out_dtype == DataType::kFloat64 ? ReduceOne<double>(format, out_dtype, op, own, sources, i)
                                                       : ReduceOne<float>(format, out_dtype, op, own, sources, i);
    expected.out[i] = StoredAs(out_dtype, acc);
    Store(DataType::kFloat32, as_float32, i, acc);   // what the encoder sees: a float64 result rounds to float32
  }
  if (!reencode) return expected;
  // Reencoded: `out` holds the decoding of the very codes (fp8: the product in float32, as overwriting decodes).
  expected.reencoded = EncodeFloat32(format, as_float32, count);
  for (std::size_t i = 0; i < count; ++i) {
    if (LowFormatScaled(format)) {
      expected.out[i] = ReferenceDecodeOne(format, expected.reencoded.bytes[i],
                                           expected.reencoded.scales[i / kScaleBlock], out_dtype, 0.0, false);
    } else {
      expected.out[i] = StoredAs(out_dtype, ValueAt(Dtype16(format), expected.reencoded.bytes, i));
    }
  }
  return expected;
}

// ---------------------------------------------------------------------------------------------------------------
// Running the kernel and comparing.

struct Case {
  HostIsa isa;
  LowFormat format;
  DataType out_dtype;
  ReduceOp op;
  Own own;
  std::size_t count;
  bool reencode;

  std::string Describe(int nsources) const {
    return std::string(HostIsaName(isa)) + " " + LowFormatName(format) + " out " + DataTypeName(out_dtype) + " " +
           ReduceOpName(op) + " " + OwnName(own) + " sources=" + std::to_string(nsources) +
           " count=" + std::to_string(count) + (reencode ? " reencode" : " no reencode");
  }
};

// The raw bits of element i of a buffer of `dtype`.
std::uint64_t RawBits(DataType dtype, const std::vector<unsigned char>& bytes, std::size_t i) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, bytes.data() + i * DtypeSize(dtype), DtypeSize(dtype));   // little-endian
  return bits;
}

// A value and its bits (hexfloat, then the stored pattern).
std::string Show(double value, std::uint64_t bits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a (0x%llx)", value, static_cast<unsigned long long>(bits));
  return text;
}

// A value stored as `dtype`.
std::string Show(DataType dtype, double value) {
  std::vector<unsigned char> bytes(DtypeSize(dtype));
  Store(dtype, bytes, 0, value);
  return Show(value, RawBits(dtype, bytes, 0));
}

// Runs the kernel on `own` (ignored for Own::kNone) and `sources` and checks `out` and the reencoded codes against
// the reference, and that nothing past them is written and `own` is left alone. `actual`, if given, receives `out`.
void ExpectReducesLikeReference(const Case& c, const std::vector<unsigned char>& own,
                                const std::vector<Encoded>& sources, std::vector<unsigned char>* actual = nullptr) {
  const int nsources = static_cast<int>(sources.size());
  const std::string what = c.Describe(nsources);
  const Expected expected = ReferenceReduce(c.format, c.out_dtype, c.op, c.own == Own::kNone ? nullptr : &own,
                                            sources, c.count, c.reencode);

  const std::size_t out_size = c.count * DtypeSize(c.out_dtype);
  std::vector<unsigned char> out(out_size + kGuardBytes, kOutGuard);
  std::vector<unsigned char> own_copy = own;
  const void* own_arg = nullptr;
  if (c.own == Own::kSeparate) own_arg = own_copy.data();
  if (c.own == Own::kInPlace) {
    std::memcpy(out.data(), own.data(), out_size);
    own_arg = out.data();
  }
  std::vector<EncodedRun> runs;
  for (const Encoded& source : sources) runs.push_back(View(source));
  const bool scaled = LowFormatScaled(c.format);
  std::vector<float> scales(ScaleCount(c.count) + 1, kScaleGuard);
  std::vector<unsigned char> codes(c.count * CodeSize(c.format) + kGuardBytes, kCodeGuard);
  MutableEncodedRun reencode{nullptr, nullptr};
  if (c.reencode) reencode = {scaled ? scales.data() : nullptr, codes.data()};

  ASSERT_TRUE(HostReduceEncoded(c.isa, c.format, c.out_dtype, c.op, own_arg, runs.data(), nsources, c.count,
                                out.data(), reencode))
      << what;

  for (std::size_t i = 0; i < c.count; ++i) {
    const double got = ValueAt(c.out_dtype, out, i);
    ASSERT_TRUE(SameFloat(expected.out[i], got))
        << what << " element " << i << ": expected " << Show(c.out_dtype, expected.out[i]) << ", got "
        << Show(got, RawBits(c.out_dtype, out, i));
  }
  for (std::size_t b = out_size; b < out.size(); ++b) ASSERT_EQ(out[b], kOutGuard) << what << " past out";
  if (actual != nullptr) *actual = out;
  EXPECT_EQ(own_copy, own) << what << ": own changed";
  if (!c.reencode) return;

  if (scaled) {
    for (std::size_t block = 0; block < ScaleCount(c.count); ++block) {
      ASSERT_TRUE(SameFloat(expected.reencoded.scales[block], scales[block]))
          << what << " block " << block << ": expected scale " << expected.reencoded.scales[block] << ", got "
          << scales[block];
    }
    EXPECT_EQ(scales.back(), kScaleGuard) << what << " past the scales";
    for (std::size_t i = 0; i < c.count; ++i) {
      ASSERT_EQ(int{expected.reencoded.bytes[i]}, int{codes[i]})
          << what << " code " << i << " (scale " << scales[i / kScaleBlock] << ")";
    }
  } else {
    const DataType dtype = Dtype16(c.format);
    for (std::size_t i = 0; i < c.count; ++i) {
      ASSERT_TRUE(SameFloat(ValueAt(dtype, expected.reencoded.bytes, i), ValueAt(dtype, codes, i)))
          << what << " code " << i << ": expected 0x" << std::hex << RawBits(dtype, expected.reencoded.bytes, i)
          << ", got 0x" << RawBits(dtype, codes, i) << std::dec;
    }
  }
  const std::size_t codes_size = c.count * CodeSize(c.format);
  for (std::size_t b = codes_size; b < codes.size(); ++b) ASSERT_EQ(codes[b], kCodeGuard) << what << " past codes";
}

// Every format, out dtype, count and layout of terms (no own with 1 to 3 sources; own, separate or in place over
// `out`, with 0 to 3), both ops, with and without reencoding, on every variant: the same inputs for each variant.
void ExpectEveryLayoutMatchesTheReference(Spread spread, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (LowFormat format : kEveryLowFormat) {
    for (DataType out_dtype : kCodecDtypes) {
      for (std::size_t count : kCounts) {
        for (Own own_mode : {Own::kNone, Own::kSeparate, Own::kInPlace}) {
          for (int nsources = own_mode == Own::kNone ? 1 : 0; nsources <= 3; ++nsources) {
            const std::vector<unsigned char> own = Values(spread, out_dtype, count, rng);
            const std::vector<Encoded> sources = RandomRuns(spread, format, nsources, count, rng);
            for (ReduceOp op : kOps) {
              for (bool reencode : {false, true}) {
                for (HostIsa isa : AvailableIsas()) {
                  ASSERT_NO_FATAL_FAILURE(ExpectReducesLikeReference(
                      {isa, format, out_dtype, op, own_mode, count, reencode}, own, sources));
                }
              }
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------

// Values across each dtype's whole range: subnormals, terms of very different sizes, zero/inf/NaN blocks (NaN fp8
// scales), float64 values past float32's range, fp8 blocks on e4m3fn's exponent limit.
TEST(HostReduceEncodedTest, WideValuesMatchTheReferenceInEveryLayout) {
  ExpectEveryLayoutMatchesTheReference(Spread::kWide, 20240612);
}

// Terms of similar size: sums that round, cancel and carry, inexact averages, non-trivial 16-bit and fp8 rounding
// of the results.
TEST(HostReduceEncodedTest, ModerateValuesMatchTheReferenceInEveryLayout) {
  ExpectEveryLayoutMatchesTheReference(Spread::kModerate, 99);
}

// count 0 is a reduction of nothing: true, and not one byte written (no scale either), whatever the layout.
TEST(HostReduceEncodedTest, CountZeroReturnsTrueAndWritesNothing) {
  const float scale = 1.0f;
  const std::uint8_t codes[kGuardBytes] = {};   // valid pointers, never read
  const EncodedRun sources[3] = {{&scale, codes}, {&scale, codes}, {&scale, codes}};
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kEveryLowFormat) {
      for (DataType out_dtype : kCodecDtypes) {
        for (Own own_mode : {Own::kNone, Own::kSeparate, Own::kInPlace}) {
          for (int nsources = own_mode == Own::kNone ? 1 : 0; nsources <= 3; ++nsources) {
            for (ReduceOp op : kOps) {
              for (bool reencode : {false, true}) {
                const Case c{isa, format, out_dtype, op, own_mode, 0, reencode};
                std::vector<unsigned char> out(kGuardBytes, kOutGuard);
                const std::vector<unsigned char> own(kGuardBytes, kOutGuard);
                const void* own_arg = own_mode == Own::kNone      ? nullptr
                                      : own_mode == Own::kInPlace ? out.data()
                                                                  : static_cast<const void*>(own.data());
                float scales[2] = {kScaleGuard, kScaleGuard};
                std::vector<unsigned char> reencoded(kGuardBytes, kCodeGuard);
                MutableEncodedRun target{nullptr, nullptr};
                if (reencode) target = {scales, reencoded.data()};
                EXPECT_TRUE(HostReduceEncoded(isa, format, out_dtype, op, own_arg, sources, nsources, 0, out.data(),
                                              target))
                    << c.Describe(nsources);
                EXPECT_EQ(out, std::vector<unsigned char>(kGuardBytes, kOutGuard)) << c.Describe(nsources);
                EXPECT_EQ(scales[0], kScaleGuard) << c.Describe(nsources);
                EXPECT_EQ(reencoded, std::vector<unsigned char>(kGuardBytes, kCodeGuard)) << c.Describe(nsources);
              }
            }
          }
        }
      }
    }
  }
}

// An fp8 source block holding inf or NaN has a NaN scale: every result of that block is NaN whatever the other
// terms, as the first term (overwritten) or a later one (accumulated); the neighbouring blocks are not.
TEST(HostReduceEncodedTest, InfOrNanInAnFp8SourceBlockMakesThatWholeBlockNan) {
  const std::size_t count = 4 * kScaleBlock + 5;   // blocks 0 to 4, the last one short
  const std::size_t specials[] = {kScaleBlock + 7, 2 * kScaleBlock + 100, 4 * kScaleBlock + 4};
  const double special_values[] = {kInf, kNan, -kInf};
  std::mt19937_64 rng(5);
  for (LowFormat format : {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2}) {
    std::vector<unsigned char> values = ModerateValues(DataType::kFloat32, count, rng);
    for (int k = 0; k < 3; ++k) Store(DataType::kFloat32, values, specials[k], special_values[k]);
    const Encoded with_specials = EncodeFloat32(format, values, count);
    const Encoded finite = RandomRun(Spread::kModerate, format, count, rng);
    ASSERT_TRUE(std::isnan(with_specials.scales[1]) && std::isnan(with_specials.scales[2]) &&
                std::isnan(with_specials.scales[4]) && !std::isnan(with_specials.scales[0]) &&
                !std::isnan(with_specials.scales[3]));
    for (DataType out_dtype : kCodecDtypes) {
      const std::vector<unsigned char> own = ModerateValues(out_dtype, count, rng);
      for (const std::vector<Encoded>& sources : {std::vector<Encoded>{with_specials, finite},
                                                  std::vector<Encoded>{finite, with_specials}}) {
        for (Own own_mode : {Own::kNone, Own::kSeparate}) {
          for (ReduceOp op : kOps) {
            for (bool reencode : {false, true}) {
              for (HostIsa isa : AvailableIsas()) {
                const Case c{isa, format, out_dtype, op, own_mode, count, reencode};
                std::vector<unsigned char> out;
                ASSERT_NO_FATAL_FAILURE(ExpectReducesLikeReference(c, own, sources, &out));
                for (std::size_t i = 0; i < count; ++i) {
                  const std::size_t block = i / kScaleBlock;
                  const bool nan_block = block == 1 || block == 2 || block == 4;
                  ASSERT_EQ(std::isnan(ValueAt(out_dtype, out, i)), nan_block)
                      << c.Describe(2) << " element " << i;
                }
              }
            }
          }
        }
      }
    }
  }
}

// Terms of 1.5 * 2**127: their sum overflows a float32 accumulator (an infinite out; kAvg divides the infinity)
// but not a float64 one. Reencoding a result past float32's range: an fp8 NaN block, a bfloat16 infinity.
TEST(HostReduceEncodedTest, SumPastFloat32RangeIsInfiniteInFloat32AndFiniteInFloat64) {
  const double big = std::ldexp(1.5, 127);   // a float32, bfloat16 and fp8 code times a power of two
  const std::size_t count = 2 * kScaleBlock + 44;
  auto sign = [](std::size_t i) { return (i / kScaleBlock) % 2 == 0 ? 1.0 : -1.0; };   // a sign per block
  std::vector<unsigned char> values(count * sizeof(float));
  for (std::size_t i = 0; i < count; ++i) Store(DataType::kFloat32, values, i, sign(i) * big);
  for (LowFormat format : {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2, LowFormat::kBFloat16}) {
    const Encoded run = EncodeFloat32(format, values, count);
    const Term term = SourceTerm(format, run, 0);
    ASSERT_EQ(term.value * term.scale, big) << LowFormatName(format);   // encoded exactly
    for (DataType out_dtype : {DataType::kFloat32, DataType::kFloat64}) {
      std::vector<unsigned char> own(count * DtypeSize(out_dtype));
      for (std::size_t i = 0; i < count; ++i) Store(out_dtype, own, i, sign(i) * big);
      for (Own own_mode : {Own::kNone, Own::kSeparate, Own::kInPlace}) {
        // Two terms either way.
        const std::vector<Encoded> sources = own_mode == Own::kNone ? std::vector<Encoded>{run, run}
                                                                    : std::vector<Encoded>{run};
        for (ReduceOp op : kOps) {
          for (bool reencode : {false, true}) {
            // What element 0 holds (the others: with their block's sign).
            const double exact = op == ReduceOp::kSum ? 2 * big : big;
            const bool overflows = out_dtype == DataType::kFloat32 || static_cast<float>(exact) == kInf;
            double want = out_dtype == DataType::kFloat32 ? kInf : exact;
            if (reencode && overflows) want = LowFormatScaled(format) ? kNan : kInf;
            for (HostIsa isa : AvailableIsas()) {
              const Case c{isa, format, out_dtype, op, own_mode, count, reencode};
              std::vector<unsigned char> out;
              ASSERT_NO_FATAL_FAILURE(ExpectReducesLikeReference(c, own, sources, &out));
              for (std::size_t i = 0; i < count; ++i) {
                ASSERT_TRUE(SameFloat(sign(i) * want, ValueAt(out_dtype, out, i)))
                    << c.Describe(static_cast<int>(sources.size())) << " element " << i << ": expected "
                    << sign(i) * want << ", got " << ValueAt(out_dtype, out, i);
              }
            }
          }
        }
      }
    }
  }
}

// Without own the first source is decoded as overwriting decodes it: the product in float32, so that a code times a
// scale past float32's range is infinite even in a float64 out. With own (+0) the same term is added in float64.
TEST(HostReduceEncodedTest, FirstSourceWithoutOwnIsTheFloat32Product) {
  const std::size_t count = kScaleBlock + 2;
  const double product = std::ldexp(1.75, 128);   // past float32's largest, 0x1.fffffep127
  for (LowFormat format : {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2}) {
    // 448 * 2**120 and 57344 * 2**113: both 1.75 * 2**128.
    const bool e4m3 = format == LowFormat::kFloat8E4M3Fn;
    const float scale = std::ldexp(1.0f, e4m3 ? 120 : 113);
    const Encoded run{{scale, scale}, std::vector<std::uint8_t>(count, e4m3 ? 0x7E : 0x7B)};
    ASSERT_EQ(Fp8Value(format, run.bytes[0]) * scale, product);
    const std::vector<unsigned char> zeros(count * sizeof(double), 0);   // +0.0
    for (HostIsa isa : AvailableIsas()) {
      for (Own own_mode : {Own::kNone, Own::kSeparate}) {
        const Case c{isa, format, DataType::kFloat64, ReduceOp::kSum, own_mode, count, false};
        std::vector<unsigned char> out;
        ASSERT_NO_FATAL_FAILURE(ExpectReducesLikeReference(c, zeros, {run}, &out));
        const double want = own_mode == Own::kNone ? kInf : product;
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(ValueAt(DataType::kFloat64, out, i), want) << c.Describe(1) << " element " << i;
        }
      }
    }
  }
}

// Every fp8 byte (e4m3fn's NaN byte reads as 480) under the extreme scales (the largest e4m3fn one, the smallest,
// one, NaN), as the first term and as a later one.
TEST(HostReduceEncodedTest, EveryFp8CodeWithExtremeScalesMatchesTheReference) {
  const float kScales[] = {std::ldexp(1.0f, 119), std::ldexp(1.0f, -126), 1.0f, std::nanf("")};
  const std::size_t count = 256;   // two blocks
  std::mt19937_64 rng(11);
  for (LowFormat format : {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2}) {
    for (float first_scale : kScales) {
      for (float second_scale : kScales) {
        Encoded every{{first_scale, second_scale}, std::vector<std::uint8_t>(count)};
        Encoded shuffled{{second_scale, first_scale}, std::vector<std::uint8_t>(count)};
        for (std::size_t i = 0; i < count; ++i) {
          every.bytes[i] = static_cast<std::uint8_t>(i);
          shuffled.bytes[i] = static_cast<std::uint8_t>(i * 7 + 3);   // every byte again, in another order
        }
        for (DataType out_dtype : kCodecDtypes) {
          const std::vector<unsigned char> own = ModerateValues(out_dtype, count, rng);
          for (Own own_mode : {Own::kNone, Own::kSeparate}) {
            for (const std::vector<Encoded>& sources : {std::vector<Encoded>{every},
                                                        std::vector<Encoded>{every, shuffled}}) {
              for (ReduceOp op : kOps) {
                for (bool reencode : {false, true}) {
                  for (HostIsa isa : AvailableIsas()) {
                    ASSERT_NO_FATAL_FAILURE(ExpectReducesLikeReference(
                        {isa, format, out_dtype, op, own_mode, count, reencode}, own, sources));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// Every float16 and bfloat16 pattern (subnormals, infinities, NaN) as the first term and as a later one.
TEST(HostReduceEncodedTest, EveryFloat16AndBFloat16PatternMatchesTheReference) {
  const std::size_t count = 65536;
  Encoded every{{}, std::vector<std::uint8_t>(count * 2)};
  for (std::size_t i = 0; i < count; ++i) {
    const auto bits = static_cast<std::uint16_t>(i);
    std::memcpy(every.bytes.data() + 2 * i, &bits, sizeof(bits));
  }
  std::mt19937_64 rng(13);
  for (LowFormat format : {LowFormat::kFloat16, LowFormat::kBFloat16}) {
    for (DataType out_dtype : {DataType::kFloat32, DataType::kFloat64}) {
      const std::vector<unsigned char> own = ModerateValues(out_dtype, count, rng);
      for (Own own_mode : {Own::kNone, Own::kSeparate}) {
        for (bool reencode : {false, true}) {
          for (HostIsa isa : AvailableIsas()) {
            ASSERT_NO_FATAL_FAILURE(ExpectReducesLikeReference(
                {isa, format, out_dtype, ReduceOp::kSum, own_mode, count, reencode}, own, {every}));
          }
        }
      }
    }
  }
}

// kAvg divides the sum by the number of terms, own included, once, in the accumulator: (1 + 2 + 4) / 3, and
// (2 + 4) / 2 without own. Also through the entry that picks the variant itself.
TEST(HostReduceEncodedTest, AverageDividesTheSumByTheNumberOfTerms) {
  const std::uint16_t two = 0x4000, four = 0x4400;   // float16
  const EncodedRun sources[2] = {{nullptr, &two}, {nullptr, &four}};
  const float own32 = 1.0f;
  const double own64 = 1.0;
  for (HostIsa isa : AvailableIsas()) {
    float out32 = 0.0f;
    ASSERT_TRUE(HostReduceEncoded(isa, LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kAvg, &own32, sources, 2,
                                  1, &out32, {nullptr, nullptr}));
    EXPECT_EQ(Bits(out32), Bits(7.0f / 3.0f)) << HostIsaName(isa);
    double out64 = 0.0;
    ASSERT_TRUE(HostReduceEncoded(isa, LowFormat::kFloat16, DataType::kFloat64, ReduceOp::kAvg, &own64, sources, 2,
                                  1, &out64, {nullptr, nullptr}));
    EXPECT_EQ(Bits(out64), Bits(7.0 / 3.0)) << HostIsaName(isa);
    ASSERT_TRUE(HostReduceEncoded(isa, LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kAvg, nullptr, sources, 2,
                                  1, &out32, {nullptr, nullptr}));
    EXPECT_EQ(out32, 3.0f) << HostIsaName(isa);
  }
  float out32 = 0.0f;
  ASSERT_TRUE(HostReduceEncoded(LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kSum, &own32, sources, 2, 1,
                                &out32, {nullptr, nullptr}));
  EXPECT_EQ(out32, 7.0f);
}

// Reencoding a float64 result into float16/bfloat16 rounds it to float32 first, then casts (torch's double-to-half
// cast, and what HostEncode does with float64): 1 + half a 16-bit ulp + 2**-40 becomes the tie 1 + half
// an ulp in float32, which rounds to even (1), where rounding the double directly would give 1 + an ulp.
TEST(HostReduceEncodedTest, Float64ResultRoundsToFloat32BeforeTheSixteenBitCast) {
  for (LowFormat format : {LowFormat::kFloat16, LowFormat::kBFloat16}) {
    const int mantissa_bits = format == LowFormat::kFloat16 ? 10 : 7;
    const double own = 1.0 + std::ldexp(1.0, -mantissa_bits - 1) + std::ldexp(1.0, -40);
    const std::uint16_t zero = 0;
    const EncodedRun source{nullptr, &zero};
    for (HostIsa isa : AvailableIsas()) {
      double out = 0.0;
      std::uint16_t code = 0xFFFF;
      ASSERT_TRUE(HostReduceEncoded(isa, format, DataType::kFloat64, ReduceOp::kSum, &own, &source, 1, 1, &out,
                                    {nullptr, &code}));
      EXPECT_EQ(code, format == LowFormat::kFloat16 ? 0x3C00 : 0x3F80) << HostIsaName(isa) << " "
                                                                        << LowFormatName(format);
      EXPECT_EQ(out, 1.0) << HostIsaName(isa) << " " << LowFormatName(format);
    }
  }
}

// The reencoded codes are written with non-temporal stores like HostEncode's, which need aligned addresses: at every
// offset within 64 bytes (bytes for fp8, elements for float16/bfloat16; the scales at float offsets), the codes and
// scales are the reference's, `out` holds their decoding, and nothing around them is written.
TEST(HostReduceEncodedTest, ReencodingAtEveryOffsetWritesTheCodesWholeAndAlone) {
  std::mt19937_64 rng(53);
  for (LowFormat format : kEveryLowFormat) {
    const bool scaled = LowFormatScaled(format);
    const std::size_t code_size = CodeSize(format);
    for (std::size_t count : {std::size_t{1}, std::size_t{17}, kScaleBlock + 1, std::size_t{1000}}) {
      const std::vector<Encoded> sources = RandomRuns(Spread::kModerate, format, 2, count, rng);
      std::vector<EncodedRun> runs;
      for (const Encoded& source : sources) runs.push_back(View(source));
      const Expected expected =
          ReferenceReduce(format, DataType::kFloat32, ReduceOp::kSum, nullptr, sources, count, true);
      for (std::size_t offset = 0; offset * code_size <= 65; ++offset) {
        const std::size_t scale_offset = offset % 3;
        for (HostIsa isa : AvailableIsas()) {
          const std::string what = std::string(HostIsaName(isa)) + " " + LowFormatName(format) +
                                   " count=" + std::to_string(count) + " offset=" + std::to_string(offset);
          std::vector<unsigned char> codes((offset + count) * code_size + kGuardBytes, kCodeGuard);
          std::vector<float> scales(scale_offset + ScaleCount(count) + 1, kScaleGuard);
          std::vector<float> out(count, 0.0f);
          const MutableEncodedRun target{scaled ? scales.data() + scale_offset : nullptr,
                                         codes.data() + offset * code_size};
          ASSERT_TRUE(HostReduceEncoded(isa, format, DataType::kFloat32, ReduceOp::kSum, nullptr, runs.data(), 2,
                                        count, out.data(), target))
              << what;
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_TRUE(SameFloat(expected.out[i], out[i])) << what << " element " << i;
          }
          const std::vector<unsigned char> written(codes.begin() + static_cast<std::ptrdiff_t>(offset * code_size),
                                                   codes.begin() +
                                                       static_cast<std::ptrdiff_t>((offset + count) * code_size));
          for (std::size_t i = 0; i < count; ++i) {
            if (scaled) {
              ASSERT_EQ(int{expected.reencoded.bytes[i]}, int{written[i]}) << what << " code " << i;
            } else {
              ASSERT_TRUE(SameFloat(ValueAt(Dtype16(format), expected.reencoded.bytes, i),
                                    ValueAt(Dtype16(format), written, i)))
                  << what << " code " << i;
            }
          }
          for (std::size_t b = 0; b < offset * code_size; ++b) ASSERT_EQ(codes[b], kCodeGuard) << what << " before";
          for (std::size_t b = (offset + count) * code_size; b < codes.size(); ++b) {
            ASSERT_EQ(codes[b], kCodeGuard) << what << " past the codes";
          }
          for (std::size_t k = 0; k < scales.size(); ++k) {
            const bool inside = scaled && k >= scale_offset && k < scale_offset + ScaleCount(count);
            if (inside) {
              ASSERT_TRUE(SameFloat(expected.reencoded.scales[k - scale_offset], scales[k])) << what << " scale " << k;
            } else {
              ASSERT_EQ(scales[k], kScaleGuard) << what << " scale " << k;
            }
          }
        }
      }
    }
  }
}

// Refused, with nothing written to `out` or the reencoding: no term at all, ops other than kSum and kAvg, integer
// out dtypes, unknown formats.
TEST(HostReduceEncodedTest, RefusesWhatItDoesNotComputeAndWritesNothing) {
  const std::size_t count = 4;
  const float own[count] = {1.0f, 2.0f, 3.0f, 4.0f};   // big enough for every dtype below as own
  const double own_wide[count] = {1.0, 2.0, 3.0, 4.0};
  const float scale = 1.0f;
  const std::uint8_t codes[2 * count] = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
  const EncodedRun sources[1] = {{&scale, codes}};
  struct Refused {
    const char* why;
    LowFormat format;
    DataType out_dtype;
    ReduceOp op;
    const void* own;
    int nsources;
  };
  std::vector<Refused> refused;
  for (LowFormat format : kEveryLowFormat) {
    refused.push_back({"no term", format, DataType::kFloat32, ReduceOp::kSum, nullptr, 0});
    refused.push_back({"no term (avg)", format, DataType::kFloat64, ReduceOp::kAvg, nullptr, 0});
    refused.push_back({"max", format, DataType::kFloat32, ReduceOp::kMax, own, 1});
    refused.push_back({"min", format, DataType::kFloat32, ReduceOp::kMin, nullptr, 1});
    for (DataType dtype : {DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64}) {
      refused.push_back({"integer out", format, dtype, ReduceOp::kSum, own_wide, 1});
      refused.push_back({"integer out, no own", format, dtype, ReduceOp::kSum, nullptr, 1});
    }
  }
  for (int bad : {-1, 4, 9}) {
    refused.push_back({"unknown format", static_cast<LowFormat>(bad), DataType::kFloat32, ReduceOp::kSum, own, 1});
    refused.push_back({"unknown format, no own", static_cast<LowFormat>(bad), DataType::kFloat64, ReduceOp::kSum,
                       nullptr, 1});
  }
  for (const Refused& r : refused) {
    for (bool reencode : {false, true}) {
      std::vector<unsigned char> out(count * 8 + kGuardBytes, kOutGuard);
      float scales[2] = {kScaleGuard, kScaleGuard};
      std::vector<unsigned char> reencoded(2 * count + kGuardBytes, kCodeGuard);
      const MutableEncodedRun target = reencode ? MutableEncodedRun{scales, reencoded.data()}
                                                : MutableEncodedRun{nullptr, nullptr};
      const std::string what = std::string(r.why) + " format " + std::to_string(static_cast<int>(r.format)) +
                               " out " + DataTypeName(r.out_dtype) + " " + ReduceOpName(r.op) +
                               (reencode ? " reencode" : "");
      for (HostIsa isa : AvailableIsas()) {
        EXPECT_FALSE(HostReduceEncoded(isa, r.format, r.out_dtype, r.op, r.own, sources, r.nsources, count,
                                       out.data(), target))
            << HostIsaName(isa) << " " << what;
      }
      EXPECT_FALSE(HostReduceEncoded(r.format, r.out_dtype, r.op, r.own, sources, r.nsources, count, out.data(),
                                     target))
          << "default variant " << what;
      EXPECT_EQ(out, std::vector<unsigned char>(out.size(), kOutGuard)) << what;
      EXPECT_EQ(scales[0], kScaleGuard) << what;
      EXPECT_EQ(scales[1], kScaleGuard) << what;
      EXPECT_EQ(reencoded, std::vector<unsigned char>(reencoded.size(), kCodeGuard)) << what;
    }
  }
}

}  // namespace
}  // namespace hp::shmem::ops
