// The host codec's encoder and decoder (ops/host/codec.h, HostEncode and HostDecode) against a scalar reference
// written from the formats' definitions (codec_reference.h), on every instruction-set variant:
//   * block-scaled fp8: both formats, every source and output dtype, tails, all-zero blocks, subnormal results,
//     ties and values just off them, blocks with inf/NaN, the e4m3fn exponent limit, the exponent clamp at -126;
//   * the plain float16/bfloat16 casts: every source and output dtype, every 16-bit pattern, ties, subnormals,
//     overflow, the rounding to float32 first of float64 sources;
//   * destinations and sources at every alignment (the codes are written with non-temporal stores, which need
//     aligned addresses), nothing written outside them, and what the entries refuse.
#include "ops/host/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
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

const LowFormat kScaledFormats[] = {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2};
const LowFormat kPlainFormats[] = {LowFormat::kFloat16, LowFormat::kBFloat16};
const DataType kDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16};
const std::size_t kCounts[] = {0, 1, 127, kScaleBlock, kScaleBlock + 1, 5 * kScaleBlock + 3, 4096};

float FromBits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

std::string Describe(HostIsa isa, LowFormat format, DataType dtype, std::size_t count) {
  return std::string(HostIsaName(isa)) + " " + LowFormatName(format) + " " + DataTypeName(dtype) +
         " count=" + std::to_string(count);
}

void ExpectEncodes(HostIsa isa, LowFormat format, DataType dtype, const std::vector<unsigned char>& src,
                   std::size_t count) {
  const Encoded expected = ReferenceEncode(format, dtype, src, count);
  std::vector<float> scales(ScaleCount(count) + 1, 12345.0f);   // one more: the kernel writes no further
  std::vector<std::uint8_t> bytes(count + 1, 0xA5);
  ASSERT_TRUE(HostEncode(isa, format, dtype, src.data(), count, {scales.data(), bytes.data()}));
  const std::string what = Describe(isa, format, dtype, count);
  for (std::size_t block = 0; block < ScaleCount(count); ++block) {
    ASSERT_TRUE(SameFloat(expected.scales[block], scales[block]))
        << what << " block " << block << ": expected scale " << expected.scales[block] << ", got " << scales[block];
  }
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(expected.bytes[i], bytes[i]) << what << " element " << i << " value " << ValueAt(dtype, src, i)
                                           << " scale " << scales[i / kScaleBlock];
  }
  EXPECT_EQ(scales.back(), 12345.0f) << what;
  EXPECT_EQ(bytes.back(), 0xA5) << what;
}

// Decodes `encoded` into `out` (of `dtype`) with and without accumulation and checks both against the reference.
void ExpectDecodes(HostIsa isa, LowFormat format, DataType dtype, const Encoded& encoded,
                   const std::vector<unsigned char>& out, std::size_t count) {
  const std::string what = Describe(isa, format, dtype, count);
  for (bool accumulate : {false, true}) {
    std::vector<unsigned char> actual = out;
    actual.resize(out.size() + 8, 0x5A);
    ASSERT_TRUE(HostDecode(isa, format, {encoded.scales.data(), encoded.bytes.data()}, count, dtype, actual.data(),
                           accumulate));
    for (std::size_t i = 0; i < count; ++i) {
      const double expected = ReferenceDecodeOne(format, encoded.bytes[i], encoded.scales[i / kScaleBlock], dtype,
                                                 ValueAt(dtype, out, i), accumulate);
      ASSERT_TRUE(SameFloat(expected, ValueAt(dtype, actual, i)))
          << what << (accumulate ? " accumulate" : " overwrite") << " element " << i << ": expected " << expected
          << ", got " << ValueAt(dtype, actual, i);
    }
    for (std::size_t b = out.size(); b < actual.size(); ++b) ASSERT_EQ(actual[b], 0x5A) << what;
  }
}

// ---------------------------------------------------------------------------------------------------------------

// A slot holds the scales of its capacity, aligned, then the codes; one more block would not fit.
TEST(WireSlotLayoutTest, EverySlotSizeHoldsTheLargestWholeNumberOfBlocksThatFits) {
  for (LowFormat format : {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2, LowFormat::kFloat16, LowFormat::kBFloat16}) {
    const std::size_t code = LowFormatBytes(format);
    auto bytes_for = [&](std::size_t values) {
      const std::size_t scales = LowFormatScaled(format) ? ScaleCount(values) * sizeof(float) : 0;
      const std::size_t aligned = (scales + WireSlotLayout::kSlotAlignment - 1) / WireSlotLayout::kSlotAlignment *
                                  WireSlotLayout::kSlotAlignment;
      return aligned + values * code;
    };
    for (std::size_t slot = 0; slot < (1u << 18); slot += 61) {
      const WireSlotLayout layout = WireSlotLayout::For(format, slot);
      SCOPED_TRACE(std::string(LowFormatName(format)) + " slot_bytes=" + std::to_string(slot));
      ASSERT_EQ(layout.capacity % kScaleBlock, 0u);
      ASSERT_EQ(layout.scale_bytes % WireSlotLayout::kSlotAlignment, 0u);
      ASSERT_GE(layout.scale_bytes, LowFormatScaled(format) ? ScaleCount(layout.capacity) * sizeof(float) : 0);
      ASSERT_LE(layout.scale_bytes + layout.capacity * code, slot);
      ASSERT_GT(bytes_for(layout.capacity + kScaleBlock), slot);
    }
  }
}

TEST(HostCodecTest, EveryFormatAndSourceDtypeEncodesLikeTheReference) {
  std::mt19937_64 rng(20240611);
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kScaledFormats) {
      for (DataType dtype : kDtypes) {
        for (std::size_t count : kCounts) {
          ExpectEncodes(isa, format, dtype, RandomValues(dtype, count, rng), count);
        }
      }
    }
  }
}

TEST(HostCodecTest, EveryFormatAndOutputDtypeDecodesLikeTheReference) {
  std::mt19937_64 rng(7);
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kScaledFormats) {
      for (DataType dtype : kDtypes) {
        for (std::size_t count : kCounts) {
          const Encoded encoded = ReferenceEncode(format, DataType::kFloat32,
                                                  RandomValues(DataType::kFloat32, count, rng), count);
          ExpectDecodes(isa, format, dtype, encoded, RandomValues(dtype, count, rng), count);
        }
      }
    }
  }
}

// Every byte with every kind of scale: the largest, the smallest (products down to float32 subnormals), one, NaN.
// Each byte is decoded once in a full block and once among the last 15 values of a short block (the kernels may
// take a block's last values one at a time).
TEST(HostCodecTest, EveryByteDecodesWithExtremeScales) {
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kScaledFormats) {
      for (float scale : {std::ldexp(1.0f, 119), std::ldexp(1.0f, -126), 1.0f, std::nanf("")}) {
        for (std::size_t rotation = 0; rotation < 256 + 15; rotation += 15) {
          std::vector<std::uint8_t> bytes(256);
          for (std::size_t i = 0; i < 256; ++i) bytes[i] = static_cast<std::uint8_t>(i + rotation);
          const std::size_t count = rotation == 0 ? 256 : kScaleBlock + 15;
          bytes.resize(count);
          Encoded encoded{{scale, scale}, bytes};
          for (DataType dtype : kDtypes) {
            std::vector<unsigned char> out(count * DtypeSize(dtype));
            for (std::size_t i = 0; i < count; ++i) Store(dtype, out, i, static_cast<double>(i) - 100.0);
            // The e4m3fn NaN byte with a finite scale reads as 480 (the reference's documented reading).
            ExpectDecodes(isa, format, dtype, encoded, out, count);
          }
        }
      }
    }
  }
}

// Values at, next to and near every tie between two neighbouring fp8 codes (subnormals included), of both signs,
// at several scales: just off a tie must round to the nearer code, however close (a kernel rounding through a
// wider format first, float16 for e5m2, could land on the tie and round to even the wrong way). Encoded in full
// blocks and, for the kernels' one-at-a-time path, in short runs.
TEST(HostCodecTest, ValuesNearTiesRoundOnce) {
  for (LowFormat format : kScaledFormats) {
    const double largest = Fp8Max(format);
    std::vector<double> near_ties;
    for (int code = 0; Fp8Value(format, static_cast<std::uint8_t>(code + 1)) <= largest; ++code) {
      const double low = Fp8Value(format, static_cast<std::uint8_t>(code));
      const double high = Fp8Value(format, static_cast<std::uint8_t>(code + 1));
      const double tie = (low + high) / 2;   // exact in float32
      const auto tie32 = static_cast<float>(tie);
      const double step = high - low;
      for (double value : {tie, static_cast<double>(std::nextafter(tie32, 0.0f)),
                           static_cast<double>(std::nextafter(tie32, 1e9f)), tie + step * 0x1.0p-20,
                           tie - step * 0x1.0p-20, tie + step * 0x1.0p-10, tie - step * 0x1.0p-10,
                           tie + step * 0x1.0p-9, tie - step * 0x1.0p-9, tie + step * 0x1.8p-9,
                           tie - step * 0x1.8p-9, tie + step / 4, low + step * 0x1.0p-12}) {
        near_ties.push_back(value);
        near_ties.push_back(-value);
      }
    }
    for (int shift : {-100, -20, 0, 20, 60}) {
      // Every block starts with 0.75 * the largest value (scale 2**shift), then up to 127 values near ties.
      for (std::size_t per_block : {kScaleBlock - 1, std::size_t{12}}) {
        std::vector<double> run;
        for (std::size_t i = 0; i < near_ties.size(); ++i) {
          if (i % per_block == 0) run.push_back(0.75 * largest);
          run.push_back(near_ties[i]);
        }
        const std::size_t chunk = per_block == kScaleBlock - 1 ? run.size() : per_block + 1;   // short runs
        for (std::size_t start = 0; start < run.size(); start += chunk) {
          const std::size_t count = std::min(chunk, run.size() - start);
          std::vector<unsigned char> src(count * sizeof(float));
          for (std::size_t i = 0; i < count; ++i) {
            Store(DataType::kFloat32, src, i, std::ldexp(run[start + i], shift));
          }
          for (HostIsa isa : AvailableIsas()) ExpectEncodes(isa, format, DataType::kFloat32, src, count);
        }
      }
    }
  }
}

// Hand-picked blocks, one per case, in float32.
TEST(HostCodecTest, EdgeBlocks) {
  const double tiny = std::ldexp(1.0, -149);   // the smallest float32 subnormal
  std::vector<std::vector<double>> blocks = {
      {0.0, -0.0},                                         // all zero: scale 1
      {tiny, -tiny},                                       // absmax / fp8_max subnormal: exponent clamped at -126
      {std::ldexp(1.0, -126), 3 * tiny},                   // the clamp again, with a nonzero remainder
      {448.0, 1.0625, -1.1875, 0.0029296875, 0.0009765625},   // e4m3fn ties (scale 2): to the even code
      {57344.0, 1.125, 0.0000228881835937, 2.5, 3.5},      // e5m2 ties
      {448.0 * std::ldexp(1.0, 119)},                      // e4m3fn: exponent 120, NaN scale; e5m2: finite
      {448.0 * std::ldexp(1.0, 118), -1.0},                // e4m3fn: exponent 119, the largest finite scale
      {std::numeric_limits<float>::max(), 1.0},            // e5m2's largest exponent
      {1.0, kInf, 2.0},                                    // inf: NaN scale, every byte 0x7F
      {-kInf},
      {kNan, 1.0},
      {-kNan},
      {1.0, 2.0, 3.0},                                     // a short block (tail)
  };
  for (int k = -20; k <= 20; ++k) blocks.push_back({448.0 * std::ldexp(1.0, k), 57344.0 * std::ldexp(1.0, k), 1.0});
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kScaledFormats) {
      for (const std::vector<double>& values : blocks) {
        const std::size_t count = values.size();
        std::vector<unsigned char> src(count * sizeof(float));
        for (std::size_t i = 0; i < count; ++i) Store(DataType::kFloat32, src, i, values[i]);
        ExpectEncodes(isa, format, DataType::kFloat32, src, count);
      }
    }
  }
}

TEST(HostCodecTest, ScalesOfEdgeBlocks) {
  float scale = 0.0f;
  std::uint8_t byte = 0;
  const float zero = 0.0f;
  ASSERT_TRUE(HostEncode(LowFormat::kFloat8E4M3Fn, DataType::kFloat32, &zero, 1, {&scale, &byte}));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(byte, 0);
  const float limit = 448.0f * std::ldexp(1.0f, 119);   // absmax / 448 = 2**119: frexp's exponent 120
  ASSERT_TRUE(HostEncode(LowFormat::kFloat8E4M3Fn, DataType::kFloat32, &limit, 1, {&scale, &byte}));
  EXPECT_TRUE(std::isnan(scale));
  EXPECT_EQ(byte, 0x7F);
  ASSERT_TRUE(HostEncode(LowFormat::kFloat8E5M2, DataType::kFloat32, &limit, 1, {&scale, &byte}));
  EXPECT_EQ(scale, std::ldexp(1.0f, 113));   // absmax / 57344 = 2**112
  EXPECT_EQ(byte, 0x77);                     // 2**119 * 448 / 2**113 = 28672 = 1.75 * 2**14
  const float small = std::ldexp(1.0f, -130);   // absmax / 57344 is a float32 subnormal: exponent clamped at -126
  ASSERT_TRUE(HostEncode(LowFormat::kFloat8E5M2, DataType::kFloat32, &small, 1, {&scale, &byte}));
  EXPECT_EQ(scale, std::ldexp(1.0f, -126));
  EXPECT_EQ(byte, 0x2C);   // 2**-4
  const float tiny = FromBits(1);   // absmax / 57344 underflows to zero: frexp's exponent 0, scale 1
  ASSERT_TRUE(HostEncode(LowFormat::kFloat8E5M2, DataType::kFloat32, &tiny, 1, {&scale, &byte}));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(byte, 0);
}

TEST(HostCodecTest, RoundTripsEveryCodeBelowTheLargestExactly) {
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kScaledFormats) {
      std::vector<float> src(2 * kScaleBlock, 0.0f);
      std::size_t positive = 0, negative = kScaleBlock;
      for (int b = 0; b < 256; ++b) {
        const double value = Fp8Value(format, static_cast<std::uint8_t>(b));
        if (!(std::fabs(value) < Fp8Max(format))) continue;   // the largest, infinities, NaN
        src[(b & 0x80) ? negative++ : positive++] = static_cast<float>(value);
      }
      ASSERT_LE(positive, kScaleBlock);
      ASSERT_LE(negative, 2 * kScaleBlock);
      std::vector<float> scales(2);
      std::vector<std::uint8_t> bytes(src.size());
      ASSERT_TRUE(HostEncode(isa, format, DataType::kFloat32, src.data(), src.size(), {scales.data(), bytes.data()}));
      EXPECT_EQ(scales[0], 1.0f);
      EXPECT_EQ(scales[1], 1.0f);
      std::vector<float> back(src.size());
      ASSERT_TRUE(HostDecode(isa, format, {scales.data(), bytes.data()}, src.size(), DataType::kFloat32, back.data(),
                             false));
      for (std::size_t i = 0; i < src.size(); ++i) {
        EXPECT_EQ(Bits(src[i]), Bits(back[i])) << HostIsaName(isa) << " " << LowFormatName(format) << " " << src[i];
      }
    }
  }
}

// Refused, with nothing written: a source or out dtype the codec does not take (integers), unknown formats, on
// every variant and through the entries that pick the variant.
TEST(HostCodecTest, RefusesWhatItDoesNotComputeAndWritesNothing) {
  const std::int32_t ints[4] = {1, 2, 3, 4};
  const float floats[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  struct Refused {
    const char* why;
    LowFormat format;
    DataType dtype;   // the source's (encode) or out's (decode)
    const void* src;
  };
  std::vector<Refused> refused;
  for (LowFormat format : {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2, LowFormat::kFloat16,
                           LowFormat::kBFloat16}) {
    for (DataType dtype : {DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64}) {
      refused.push_back({"integer dtype", format, dtype, ints});
    }
  }
  for (int bad : {-1, 4, 9}) refused.push_back({"unknown format", static_cast<LowFormat>(bad), DataType::kFloat32,
                                                floats});
  for (const Refused& r : refused) {
    const std::string what = std::string(r.why) + " format " + std::to_string(static_cast<int>(r.format)) + " " +
                             DataTypeName(r.dtype);
    float scale = 7.0f;
    std::uint8_t codes[8] = {9, 9, 9, 9, 9, 9, 9, 9};   // room for 4 codes of any format
    std::int32_t out[4] = {5, 5, 5, 5};                  // room for 4 values of the dtypes tried
    const std::uint8_t zero_codes[8] = {};
    const float one = 1.0f;
    for (HostIsa isa : AvailableIsas()) {
      EXPECT_FALSE(HostEncode(isa, r.format, r.dtype, r.src, 4, {&scale, codes})) << HostIsaName(isa) << " " << what;
      EXPECT_FALSE(HostDecode(isa, r.format, {&one, zero_codes}, 4, r.dtype, out, true))
          << HostIsaName(isa) << " " << what;
      EXPECT_FALSE(HostDecode(isa, r.format, {&one, zero_codes}, 4, r.dtype, out, false))
          << HostIsaName(isa) << " " << what;
    }
    EXPECT_FALSE(HostEncode(r.format, r.dtype, r.src, 4, {&scale, codes})) << "default variant " << what;
    EXPECT_FALSE(HostDecode(r.format, {&one, zero_codes}, 4, r.dtype, out, true)) << "default variant " << what;
    EXPECT_EQ(scale, 7.0f) << what;
    for (int i = 0; i < 8; ++i) EXPECT_EQ(codes[i], 9) << what;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], 5) << what;
  }
  // The decoders refuse an integer out even with a float source format (the dtype is checked on its own).
  float scale = 7.0f;
  std::uint8_t bytes[4] = {9, 9, 9, 9};
  std::int32_t out[4] = {5, 5, 5, 5};
  EXPECT_FALSE(HostEncode(LowFormat::kFloat8E4M3Fn, DataType::kInt32, ints, 4, {&scale, bytes}));
  EXPECT_FALSE(HostEncode(static_cast<LowFormat>(9), DataType::kFloat32, ints, 4, {&scale, bytes}));
  EXPECT_FALSE(HostDecode(LowFormat::kFloat8E5M2, {&scale, bytes}, 4, DataType::kInt32, out, true));
  EXPECT_FALSE(HostDecode(static_cast<LowFormat>(9), {&scale, bytes}, 4, DataType::kFloat32, out, false));
  EXPECT_EQ(scale, 7.0f);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes[i], 9);
    EXPECT_EQ(out[i], 5);
  }
  EXPECT_STREQ(LowFormatName(LowFormat::kFloat8E4M3Fn), "float8_e4m3fn");
  EXPECT_STREQ(LowFormatName(LowFormat::kFloat8E5M2), "float8_e5m2");
  EXPECT_STREQ(LowFormatName(LowFormat::kFloat16), "float16");
  EXPECT_STREQ(LowFormatName(LowFormat::kBFloat16), "bfloat16");
  EXPECT_TRUE(LowFormatScaled(LowFormat::kFloat8E4M3Fn));
  EXPECT_TRUE(LowFormatScaled(LowFormat::kFloat8E5M2));
  EXPECT_FALSE(LowFormatScaled(LowFormat::kFloat16));
  EXPECT_FALSE(LowFormatScaled(LowFormat::kBFloat16));
  EXPECT_EQ(ScaleCount(0), 0u);
  EXPECT_EQ(ScaleCount(1), 1u);
  EXPECT_EQ(ScaleCount(kScaleBlock), 1u);
  EXPECT_EQ(ScaleCount(kScaleBlock + 1), 2u);
}

// ---------------------------------------------------------------------------------------------------------------
// The plain formats: float16 and bfloat16 codes are the cast of the float32-rounded value, without scales.

const std::size_t kPlainCounts[] = {0, 1, 7, 127, kScaleBlock, kScaleBlock + 1, 1000, 4097};

constexpr std::uint16_t kCodeGuard16 = 0xA5A5;    // fills around the codes: the kernel writes nothing else
constexpr unsigned char kOutGuard = 0x5A;         // fills around `out`
constexpr std::size_t kGuardElements = 24;        // on each side of every destination

std::uint16_t CodeAt(const std::vector<unsigned char>& bytes, std::size_t i) {
  std::uint16_t code;
  std::memcpy(&code, bytes.data() + 2 * i, sizeof(code));
  return code;
}

std::string Hex(std::uint64_t bits) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(bits));
  return text;
}

// The bits of element i of a buffer of `dtype`.
std::uint64_t RawBits(DataType dtype, const std::vector<unsigned char>& bytes, std::size_t i) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, bytes.data() + i * DtypeSize(dtype), DtypeSize(dtype));   // little-endian
  return bits;
}

// Values for the plain encoders, in `dtype` (stored rounded to it), both signs: random magnitudes over the
// format's whole range and past both ends (subnormals, values that round to zero or overflow), exact ties between
// neighbouring codes, the float32 neighbours of ties, ties nudged by less than half a float32 ulp (float64 sources
// must round to the tie first, then to even), hand-picked edges, and random float32 (float64) bit patterns.
std::vector<unsigned char> PlainSourceValues(LowFormat format, DataType dtype, std::size_t count,
                                             std::mt19937_64& rng) {
  const bool half = format == LowFormat::kFloat16;
  const std::uint16_t largest_finite = half ? 0x7BFF : 0x7F7F;
  const double edges[] = {0.0, kInf, kNan, 65504.0, 65519.0, 65519.99, 65520.0, 65536.0, 1e10,
                          std::ldexp(1.0, -24), std::ldexp(1.0, -25), std::ldexp(1.5, -25), std::ldexp(1.0, -26),
                          std::ldexp(1.0, -14), std::ldexp(1023.0, -24),   // float16's smallest normal, subnormal
                          std::ldexp(1.0, -133), std::ldexp(1.0, -134), std::ldexp(1.0, -149),
                          std::ldexp(1.0, -126), static_cast<double>(std::numeric_limits<float>::max()),
                          0x1.ffp127, 1e300, 1e-300, 1.0};
  std::uniform_int_distribution<int> exponent(half ? -27 : -151, half ? 17 : 129);
  std::uniform_real_distribution<double> mantissa(0.5, 1.0);
  std::uniform_int_distribution<std::uint32_t> code(0, largest_finite - 1u);
  std::vector<unsigned char> bytes(count * DtypeSize(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint16_t low = static_cast<std::uint16_t>(code(rng));
    const double tie = (PlainValue(format, low) + PlainValue(format, static_cast<std::uint16_t>(low + 1))) / 2;
    const auto tie32 = static_cast<float>(tie);   // exact: one bit more than the format's
    double value;
    switch (rng() % 8) {
      case 0:
      case 1:
        value = std::ldexp(mantissa(rng), exponent(rng));
        break;
      case 2:
        value = tie;
        break;
      case 3:
        value = std::nextafter(tie32, (rng() & 1) ? 0.0f : std::numeric_limits<float>::infinity());
        break;
      case 4:
        value = tie * ((rng() & 1) ? 1 + std::ldexp(1.0, -40) : 1 - std::ldexp(1.0, -40));
        break;
      case 5:
        value = edges[rng() % (sizeof(edges) / sizeof(edges[0]))];
        break;
      default: {   // any bit pattern of the source dtype (some NaN, subnormal, huge)
        if (dtype == DataType::kFloat64) {
          const std::uint64_t bits = rng();
          std::memcpy(&value, &bits, sizeof(value));
        } else {
          value = FromBits(static_cast<std::uint32_t>(rng()));
        }
      }
    }
    Store(dtype, bytes, i, (rng() & 1) ? -value : value);
  }
  return bytes;
}

// Encodes `src` into 16-bit codes that start `offset` codes into their buffer (past a guard), and checks every code
// against the reference (NaN as NaN) and the guards on both sides. `scales` is passed as given: unused.
void ExpectPlainEncodes(HostIsa isa, LowFormat format, DataType dtype, const std::vector<unsigned char>& src,
                        std::size_t src_offset, std::size_t count, std::size_t offset = 0, float* scales = nullptr) {
  const std::string what = Describe(isa, format, dtype, count) + " codes offset " + std::to_string(offset) +
                           " src offset " + std::to_string(src_offset);
  std::vector<std::uint16_t> codes(offset + count + kGuardElements, kCodeGuard16);
  const unsigned char* src_at = src.data() + src_offset * DtypeSize(dtype);
  ASSERT_TRUE(HostEncode(isa, format, dtype, src_at, count, {scales, codes.data() + offset})) << what;
  for (std::size_t i = 0; i < count; ++i) {
    const double value = ValueAt(dtype, src, src_offset + i);
    const std::uint16_t expected = ReferenceEncodePlainOne(format, value);
    const std::uint16_t actual = codes[offset + i];
    const bool same = expected == actual || (PlainCodeIsNan(format, expected) && PlainCodeIsNan(format, actual));
    ASSERT_TRUE(same) << what << " element " << i << " value " << std::hexfloat << value << std::defaultfloat
                      << " (bits " << Hex(RawBits(dtype, src, src_offset + i)) << "): expected " << Hex(expected)
                      << ", got " << Hex(actual);
  }
  for (std::size_t k = 0; k < offset; ++k) ASSERT_EQ(codes[k], kCodeGuard16) << what << " before the codes";
  for (std::size_t k = offset + count; k < codes.size(); ++k) {
    ASSERT_EQ(codes[k], kCodeGuard16) << what << " past the codes";
  }
}

// Decodes 16-bit codes (starting `codes_offset` into `codes`) into `out` (of `dtype`, starting `out_offset`
// elements into its buffer), overwriting and accumulating, and checks both against the reference and the guards.
void ExpectPlainDecodes(HostIsa isa, LowFormat format, DataType dtype, const std::vector<unsigned char>& codes,
                        std::size_t codes_offset, const std::vector<unsigned char>& out, std::size_t count,
                        std::size_t out_offset = 0) {
  const std::string what = Describe(isa, format, dtype, count) + " codes offset " + std::to_string(codes_offset) +
                           " out offset " + std::to_string(out_offset);
  const std::size_t size = DtypeSize(dtype);
  for (bool accumulate : {false, true}) {
    std::vector<unsigned char> actual((out_offset + kGuardElements) * size, kOutGuard);
    actual.insert(actual.begin() + static_cast<std::ptrdiff_t>(out_offset * size), out.begin(),
                  out.begin() + static_cast<std::ptrdiff_t>(count * size));
    ASSERT_TRUE(HostDecode(isa, format, {nullptr, codes.data() + 2 * codes_offset}, count, dtype,
                           actual.data() + out_offset * size, accumulate))
        << what;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint16_t code = CodeAt(codes, codes_offset + i);
      const double old = ValueAt(dtype, out, i);
      const double expected = ReferenceDecodePlainOne(format, code, dtype, old, accumulate);
      const double got = ValueAt(dtype, actual, out_offset + i);
      ASSERT_TRUE(SameFloat(expected, got))
          << what << (accumulate ? " accumulate" : " overwrite") << " element " << i << " code " << Hex(code)
          << " old " << std::hexfloat << old << ": expected " << expected << ", got " << got << std::defaultfloat
          << " (bits " << Hex(RawBits(dtype, actual, out_offset + i)) << ")";
    }
    for (std::size_t b = 0; b < out_offset * size; ++b) ASSERT_EQ(actual[b], kOutGuard) << what << " before out";
    for (std::size_t b = (out_offset + count) * size; b < actual.size(); ++b) {
      ASSERT_EQ(actual[b], kOutGuard) << what << " past out";
    }
  }
}

// Random 16-bit patterns: every kind of code (zeros, subnormals, normals, infinities, NaN) in proportion.
std::vector<unsigned char> RandomCodes(std::size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> codes(2 * count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto code = static_cast<std::uint16_t>(rng());
    std::memcpy(codes.data() + 2 * i, &code, sizeof(code));
  }
  return codes;
}

// Every 16-bit pattern, in order.
std::vector<unsigned char> EveryCode() {
  std::vector<unsigned char> codes(2 * 65536);
  for (std::size_t i = 0; i < 65536; ++i) {
    const auto code = static_cast<std::uint16_t>(i);
    std::memcpy(codes.data() + 2 * i, &code, sizeof(code));
  }
  return codes;
}

TEST(HostCodecPlainTest, EverySourceDtypeEncodesLikeTheCast) {
  std::mt19937_64 rng(20240701);
  for (LowFormat format : kPlainFormats) {
    for (DataType dtype : kDtypes) {
      for (std::size_t count : kPlainCounts) {
        const std::vector<unsigned char> src = PlainSourceValues(format, dtype, count, rng);
        for (HostIsa isa : AvailableIsas()) ASSERT_NO_FATAL_FAILURE(ExpectPlainEncodes(isa, format, dtype, src, 0,
                                                                                       count));
      }
    }
  }
}

TEST(HostCodecPlainTest, EveryOutDtypeDecodesToTheExactValueOverwritingAndAccumulating) {
  std::mt19937_64 rng(17);
  for (LowFormat format : kPlainFormats) {
    for (DataType dtype : kDtypes) {
      for (std::size_t count : kPlainCounts) {
        const std::vector<unsigned char> codes = RandomCodes(count, rng);
        const std::vector<unsigned char> out = RandomValues(dtype, count, rng);
        for (HostIsa isa : AvailableIsas()) {
          ASSERT_NO_FATAL_FAILURE(ExpectPlainDecodes(isa, format, dtype, codes, 0, out, count));
        }
      }
    }
  }
}

// Every 16-bit pattern of both formats: decoded into every out dtype (overwriting, and accumulating onto random
// values of the out's range), and, as a float16 or bfloat16 source, encoded into both formats (its own: the
// identity; the other: a rounding, overflowing to infinity or flushing to zero at the ends of float16's range).
TEST(HostCodecPlainTest, EveryCodeDecodesAndEverySixteenBitSourceEncodesLikeTheReference) {
  const std::vector<unsigned char> every = EveryCode();
  std::mt19937_64 rng(23);
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kPlainFormats) {
      for (DataType dtype : kDtypes) {
        ASSERT_NO_FATAL_FAILURE(ExpectPlainDecodes(isa, format, dtype, every, 0, RandomValues(dtype, 65536, rng),
                                                   65536));
      }
      for (DataType source : {DataType::kFloat16, DataType::kBFloat16}) {
        ASSERT_NO_FATAL_FAILURE(ExpectPlainEncodes(isa, format, source, every, 0, 65536));
      }
    }
  }
}

// Hand-picked values, each with the code it must become: ties to even, the float16 overflow threshold (65520, half
// an ulp past 65504, rounds to infinity; just below it, to 65504), subnormals rounding to zero or up to the
// smallest, bfloat16 past float32's largest finite value, and float64 values just off a tie, which round to the tie
// in float32 first and then to even (the double rounding the format prescribes, like torch's cast).
TEST(HostCodecPlainTest, HandPickedValuesEncodeToTheirCodes) {
  struct Pick {
    LowFormat format;
    DataType dtype;
    double value;
    std::uint16_t code;
  };
  const double half_tie_up = 1.0 + std::ldexp(1.0, -11);   // between 1 and 1 + 2**-10: to even, 1
  const double bf16_tie_up = 1.0 + std::ldexp(1.0, -8);    // between 1 and 1 + 2**-7
  const Pick picks[] = {
      {LowFormat::kFloat16, DataType::kFloat32, half_tie_up, 0x3C00},
      {LowFormat::kFloat16, DataType::kFloat32, 1.0 + 3 * std::ldexp(1.0, -11), 0x3C02},   // tie to even, up
      {LowFormat::kFloat16, DataType::kFloat32, std::nextafter(static_cast<float>(half_tie_up), 2.0f), 0x3C01},
      {LowFormat::kFloat16, DataType::kFloat64, half_tie_up + std::ldexp(1.0, -40), 0x3C00},   // float32 first
      {LowFormat::kFloat16, DataType::kFloat64, half_tie_up + std::ldexp(1.0, -23), 0x3C01},   // off it in float32
      {LowFormat::kFloat16, DataType::kFloat32, 65504.0, 0x7BFF},
      {LowFormat::kFloat16, DataType::kFloat32, 65519.0, 0x7BFF},
      {LowFormat::kFloat16, DataType::kFloat32, 65520.0, 0x7C00},
      {LowFormat::kFloat16, DataType::kFloat32, -std::ldexp(1.0, 100), 0xFC00},
      {LowFormat::kFloat16, DataType::kFloat64, 1e300, 0x7C00},
      {LowFormat::kFloat16, DataType::kFloat32, std::ldexp(1.0, -24), 0x0001},   // the smallest subnormal
      {LowFormat::kFloat16, DataType::kFloat32, std::ldexp(1.0, -25), 0x0000},   // half of it: to even, zero
      {LowFormat::kFloat16, DataType::kFloat32, -std::ldexp(1.5, -25), 0x8001},
      {LowFormat::kFloat16, DataType::kFloat32, std::ldexp(3.0, -25), 0x0002},   // 1.5 * the smallest: to 2
      {LowFormat::kFloat16, DataType::kFloat32, -0.0, 0x8000},
      {LowFormat::kFloat16, DataType::kBFloat16, 1.0 + std::ldexp(1.0, -7), 0x3C08},   // exact in both
      {LowFormat::kFloat16, DataType::kBFloat16, std::ldexp(1.0, 16), 0x7C00},          // past float16's range
      {LowFormat::kBFloat16, DataType::kFloat32, bf16_tie_up, 0x3F80},
      {LowFormat::kBFloat16, DataType::kFloat32, 1.0 + 3 * std::ldexp(1.0, -8), 0x3F82},
      {LowFormat::kBFloat16, DataType::kFloat64, bf16_tie_up + std::ldexp(1.0, -40), 0x3F80},
      {LowFormat::kBFloat16, DataType::kFloat64, bf16_tie_up + std::ldexp(1.0, -23), 0x3F81},
      {LowFormat::kBFloat16, DataType::kFloat32, std::numeric_limits<float>::max(), 0x7F80},   // rounds past
      {LowFormat::kBFloat16, DataType::kFloat32, 0x1.ffp127, 0x7F80},   // the tie past the largest: to even, inf
      {LowFormat::kBFloat16, DataType::kFloat32, 0x1.fep127, 0x7F7F},                   // bfloat16's largest
      {LowFormat::kBFloat16, DataType::kFloat64, 1e300, 0x7F80},
      {LowFormat::kBFloat16, DataType::kFloat64, -1e-300, 0x8000},
      {LowFormat::kBFloat16, DataType::kFloat32, std::ldexp(1.0, -149), 0x0000},   // float32's smallest: to zero
      {LowFormat::kBFloat16, DataType::kFloat32, std::ldexp(1.0, -133), 0x0001},   // bfloat16's smallest
      {LowFormat::kBFloat16, DataType::kFloat32, std::ldexp(3.0, -134), 0x0002},
      {LowFormat::kBFloat16, DataType::kFloat16, 65504.0, 0x4780},                 // 65504 to 65536
      {LowFormat::kBFloat16, DataType::kFloat16, -kInf, 0xFF80},
  };
  for (const Pick& pick : picks) {
    std::vector<unsigned char> src(DtypeSize(pick.dtype));
    Store(pick.dtype, src, 0, pick.value);
    ASSERT_EQ(ValueAt(pick.dtype, src, 0), pick.value) << "not exact in " << DataTypeName(pick.dtype);
    ASSERT_EQ(ReferenceEncodePlainOne(pick.format, pick.value), pick.code) << "reference " << pick.value;
    for (HostIsa isa : AvailableIsas()) {
      std::uint16_t code = kCodeGuard16;
      ASSERT_TRUE(HostEncode(isa, pick.format, pick.dtype, src.data(), 1, {nullptr, &code}));
      EXPECT_EQ(Hex(code), Hex(pick.code)) << Describe(isa, pick.format, pick.dtype, 1) << " value " << std::hexfloat
                                           << pick.value;
    }
    std::uint16_t code = kCodeGuard16;
    ASSERT_TRUE(HostEncode(pick.format, pick.dtype, src.data(), 1, {nullptr, &code}));
    EXPECT_EQ(Hex(code), Hex(pick.code)) << "default variant " << LowFormatName(pick.format) << " "
                                         << DataTypeName(pick.dtype) << " value " << std::hexfloat << pick.value;
  }
}

// NaN of either sign, quiet or signalling, from every source dtype, stays NaN (its payload is no part of the
// format), and the infinities stay infinities.
TEST(HostCodecPlainTest, NanAndInfinitiesSurviveEncodingFromEveryDtype) {
  const std::uint32_t nan32[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7FA00000u};
  const std::uint64_t nan64[] = {0x7FF8000000000000ull, 0xFFF8000000000000ull, 0x7FF0000000000001ull,
                                 0x7FF0000020000000ull, 0xFFFFFFFFFFFFFFFFull};
  const std::uint16_t nan16[] = {0x7E00, 0xFE00, 0x7C01, 0x7FFF, 0xFD00};
  const std::uint16_t nanb16[] = {0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0xFF81};
  for (LowFormat format : kPlainFormats) {
    const std::uint16_t inf = format == LowFormat::kFloat16 ? 0x7C00 : 0x7F80;
    for (DataType dtype : kDtypes) {
      // The NaN patterns of the source dtype, then +inf and -inf.
      std::vector<unsigned char> src;
      auto append = [&src](const auto& patterns) {
        for (const auto& bits : patterns) {
          const auto* at = reinterpret_cast<const unsigned char*>(&bits);
          src.insert(src.end(), at, at + sizeof(bits));
        }
      };
      if (dtype == DataType::kFloat32) append(nan32);
      if (dtype == DataType::kFloat64) append(nan64);
      if (dtype == DataType::kFloat16) append(nan16);
      if (dtype == DataType::kBFloat16) append(nanb16);
      const std::size_t nans = src.size() / DtypeSize(dtype);
      src.resize((nans + 2) * DtypeSize(dtype));
      Store(dtype, src, nans, kInf);
      Store(dtype, src, nans + 1, -kInf);
      const std::size_t count = nans + 2;
      for (HostIsa isa : AvailableIsas()) {
        std::vector<std::uint16_t> codes(count, 0);
        ASSERT_TRUE(HostEncode(isa, format, dtype, src.data(), count, {nullptr, codes.data()}));
        for (std::size_t i = 0; i < nans; ++i) {
          EXPECT_TRUE(PlainCodeIsNan(format, codes[i])) << Describe(isa, format, dtype, count) << " NaN " << i
                                                        << " got " << Hex(codes[i]);
        }
        EXPECT_EQ(Hex(codes[nans]), Hex(inf)) << Describe(isa, format, dtype, count);
        EXPECT_EQ(Hex(codes[nans + 1]), Hex(inf | 0x8000)) << Describe(isa, format, dtype, count);
      }
    }
  }
}

// Hand-picked decodes: the widening is exact (a float16 subnormal into float32, a bfloat16 into float64), and
// rounding happens once, in the out: float16 codes into a bfloat16 out round to nearest, ties (1 + 2**-8,
// accumulated) to even; a bfloat16 code past float16's range is infinite in a float16 out; a float32 out sums in
// float32 (2**25 + 1 is 2**25) but a float64 out in float64.
TEST(HostCodecPlainTest, HandPickedCodesDecodeToTheirValues) {
  struct Pick {
    LowFormat format;
    std::uint16_t code;
    DataType dtype;
    bool accumulate;
    double old;
    double expected;
  };
  const Pick picks[] = {
      {LowFormat::kFloat16, 0x0001, DataType::kFloat32, false, 5.0, std::ldexp(1.0, -24)},
      {LowFormat::kFloat16, 0x83FF, DataType::kFloat64, false, 5.0, -std::ldexp(1023.0, -24)},
      {LowFormat::kFloat16, 0x7BFF, DataType::kBFloat16, false, 5.0, 65536.0},   // 65504 rounds up in bfloat16
      {LowFormat::kFloat16, 0x3C01, DataType::kBFloat16, false, 5.0, 1.0},       // 1 + 2**-10: to 1
      {LowFormat::kFloat16, 0x1800, DataType::kBFloat16, true, 1.0, 1.0},        // 1 + 2**-9: down to 1
      {LowFormat::kFloat16, 0x1C00, DataType::kBFloat16, true, 1.0, 1.0},        // 1 + 2**-8: a tie, to even (1)
      {LowFormat::kFloat16, 0x1C00, DataType::kBFloat16, true, 1.0078125, 1.015625},   // a tie, to even (up)
      {LowFormat::kFloat16, 0x2000, DataType::kBFloat16, true, 1.0, 1.0078125},  // 1 + 2**-7: exact
      {LowFormat::kBFloat16, 0x4780, DataType::kFloat16, false, 5.0, kInf},      // 65536
      {LowFormat::kBFloat16, 0x477F, DataType::kFloat16, false, 5.0, 65280.0},
      {LowFormat::kBFloat16, 0x7F7F, DataType::kFloat64, false, 0.0, 0x1.fep127},
      {LowFormat::kBFloat16, 0x7F7F, DataType::kFloat32, true, 3.4e38, kInf},   // past float32's largest
      {LowFormat::kBFloat16, 0x7F7F, DataType::kFloat64, true, 3.4e38, 3.4e38 + 0x1.fep127},
      {LowFormat::kBFloat16, 0x3F80, DataType::kFloat32, true, std::ldexp(1.0, 25), std::ldexp(1.0, 25)},   // lost
      {LowFormat::kBFloat16, 0x3F80, DataType::kFloat64, true, std::ldexp(1.0, 25), std::ldexp(1.0, 25) + 1},
      {LowFormat::kFloat16, 0x7C00, DataType::kFloat32, true, -kInf, kNan},
      {LowFormat::kBFloat16, 0x7FC0, DataType::kFloat64, true, 1.0, kNan},
      {LowFormat::kFloat16, 0x8000, DataType::kFloat32, true, 0.0, 0.0},   // -0 + +0 is +0
      {LowFormat::kFloat16, 0x8000, DataType::kFloat32, false, 0.0, -0.0},
  };
  for (const Pick& pick : picks) {
    std::vector<unsigned char> old(DtypeSize(pick.dtype));
    Store(pick.dtype, old, 0, pick.old);
    ASSERT_TRUE(SameFloat(ReferenceDecodePlainOne(pick.format, pick.code, pick.dtype, ValueAt(pick.dtype, old, 0),
                                                  pick.accumulate),
                          pick.expected))
        << "reference " << Hex(pick.code);
    for (HostIsa isa : AvailableIsas()) {
      std::vector<unsigned char> out = old;
      ASSERT_TRUE(HostDecode(isa, pick.format, {nullptr, &pick.code}, 1, pick.dtype, out.data(), pick.accumulate));
      EXPECT_TRUE(SameFloat(pick.expected, ValueAt(pick.dtype, out, 0)))
          << Describe(isa, pick.format, pick.dtype, 1) << " code " << Hex(pick.code)
          << (pick.accumulate ? " accumulate onto " : " overwrite ") << pick.old << ": expected " << pick.expected
          << ", got " << ValueAt(pick.dtype, out, 0);
    }
  }
}

// The scales are unused for the plain formats: given anyway, they are not written (nor read: a NaN there changes
// nothing).
TEST(HostCodecPlainTest, ScalesAreNeitherWrittenNorRead) {
  std::mt19937_64 rng(29);
  const std::size_t count = 2 * kScaleBlock + 3;
  for (LowFormat format : kPlainFormats) {
    const std::vector<unsigned char> src = PlainSourceValues(format, DataType::kFloat32, count, rng);
    for (HostIsa isa : AvailableIsas()) {
      std::vector<float> scales(ScaleCount(count) + 1, 12345.0f);
      ASSERT_NO_FATAL_FAILURE(ExpectPlainEncodes(isa, format, DataType::kFloat32, src, 0, count, 0, scales.data()));
      for (float scale : scales) EXPECT_EQ(scale, 12345.0f) << Describe(isa, format, DataType::kFloat32, count);
      const std::vector<unsigned char> codes = RandomCodes(count, rng);
      const std::vector<float> nan_scales(ScaleCount(count), std::nanf(""));
      std::vector<float> out(count, 1.0f), expected(count, 1.0f);
      ASSERT_TRUE(HostDecode(isa, format, {nan_scales.data(), codes.data()}, count, DataType::kFloat32, out.data(),
                             true));
      ASSERT_TRUE(HostDecode(isa, format, {nullptr, codes.data()}, count, DataType::kFloat32, expected.data(), true));
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_TRUE(SameFloat(expected[i], out[i])) << Describe(isa, format, DataType::kFloat32, count) << " " << i;
      }
    }
  }
}

// The entries without a HostIsa (the best variant) encode and decode like the reference.
TEST(HostCodecPlainTest, DefaultVariantMatchesTheReference) {
  std::mt19937_64 rng(31);
  const std::size_t count = 1000;
  for (LowFormat format : kPlainFormats) {
    for (DataType dtype : kDtypes) {
      const std::vector<unsigned char> src = PlainSourceValues(format, dtype, count, rng);
      std::vector<std::uint16_t> codes(count);
      ASSERT_TRUE(HostEncode(format, dtype, src.data(), count, {nullptr, codes.data()}));
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint16_t expected = ReferenceEncodePlainOne(format, ValueAt(dtype, src, i));
        ASSERT_TRUE(expected == codes[i] || (PlainCodeIsNan(format, expected) && PlainCodeIsNan(format, codes[i])))
            << LowFormatName(format) << " " << DataTypeName(dtype) << " element " << i;
      }
      const std::vector<unsigned char> old = RandomValues(dtype, count, rng);
      for (bool accumulate : {false, true}) {
        std::vector<unsigned char> out = old;
        ASSERT_TRUE(HostDecode(format, {nullptr, codes.data()}, count, dtype, out.data(), accumulate));
        for (std::size_t i = 0; i < count; ++i) {
          const double expected = ReferenceDecodePlainOne(format, codes[i], dtype, ValueAt(dtype, old, i), accumulate);
          ASSERT_TRUE(SameFloat(expected, ValueAt(dtype, out, i)))
              << LowFormatName(format) << " " << DataTypeName(dtype) << " element " << i;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Alignment: the encoders write codes with non-temporal stores, which need aligned addresses; a destination (and a
// source) at any offset from a cache line must still be written whole, exactly, and nothing around it.

const std::size_t kAlignmentCounts[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 65, 127, kScaleBlock, kScaleBlock + 1,
                                        1000, 4097};

// 16-bit codes at every element offset within 64 bytes (and one more), from sources at offsets too.
TEST(HostCodecAlignmentTest, PlainCodesAtEveryOffsetAreEncodedExactly) {
  std::mt19937_64 rng(37);
  for (LowFormat format : kPlainFormats) {
    for (DataType dtype : kDtypes) {
      for (std::size_t count : kAlignmentCounts) {
        const std::vector<unsigned char> src = PlainSourceValues(format, dtype, count + 3, rng);
        for (std::size_t offset = 0; offset <= 33; ++offset) {
          const std::size_t src_offset = offset % 4;
          for (HostIsa isa : AvailableIsas()) {
            ASSERT_NO_FATAL_FAILURE(ExpectPlainEncodes(isa, format, dtype, src, src_offset, count, offset));
          }
        }
      }
    }
  }
}

TEST(HostCodecAlignmentTest, PlainCodesAtEveryOffsetAreDecodedExactly) {
  std::mt19937_64 rng(41);
  for (LowFormat format : kPlainFormats) {
    for (DataType dtype : kDtypes) {
      for (std::size_t count : kAlignmentCounts) {
        const std::vector<unsigned char> codes = RandomCodes(count + 17, rng);
        const std::vector<unsigned char> out = RandomValues(dtype, count, rng);
        for (std::size_t offset = 0; offset <= 17; ++offset) {
          for (HostIsa isa : AvailableIsas()) {
            ASSERT_NO_FATAL_FAILURE(ExpectPlainDecodes(isa, format, dtype, codes, offset, out, count, offset % 5));
          }
        }
      }
    }
  }
}

// fp8 codes at every byte offset within 32 bytes and around 64 (a cache line), their scales at float offsets, from
// sources at element offsets: bytes and scales as the reference's, and nothing written around them.
const std::size_t kFp8Offsets[] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17,
                                   18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 63, 64, 65};

TEST(HostCodecAlignmentTest, Fp8CodesAtEveryOffsetAreEncodedExactly) {
  std::mt19937_64 rng(43);
  constexpr std::uint8_t kByteGuard = 0xA5;
  constexpr float kScaleGuard = 12345.0f;
  for (LowFormat format : kScaledFormats) {
    for (DataType dtype : kDtypes) {
      for (std::size_t count : kAlignmentCounts) {
        const std::vector<unsigned char> values = RandomValues(dtype, count + 3, rng);
        for (std::size_t offset : kFp8Offsets) {
          const std::size_t src_offset = offset % 4, scale_offset = offset % 3;
          const std::vector<unsigned char> src(values.begin() + static_cast<std::ptrdiff_t>(src_offset *
                                                                                             DtypeSize(dtype)),
                                               values.end());
          const Encoded expected = ReferenceEncode(format, dtype, src, count);
          for (HostIsa isa : AvailableIsas()) {
            const std::string what = Describe(isa, format, dtype, count) + " codes offset " + std::to_string(offset);
            std::vector<std::uint8_t> bytes(offset + count + kGuardElements, kByteGuard);
            std::vector<float> scales(scale_offset + ScaleCount(count) + 2, kScaleGuard);
            ASSERT_TRUE(HostEncode(isa, format, dtype, values.data() + src_offset * DtypeSize(dtype), count,
                                   {scales.data() + scale_offset, bytes.data() + offset}))
                << what;
            for (std::size_t block = 0; block < ScaleCount(count); ++block) {
              ASSERT_TRUE(SameFloat(expected.scales[block], scales[scale_offset + block])) << what << " block "
                                                                                           << block;
            }
            for (std::size_t i = 0; i < count; ++i) {
              ASSERT_EQ(int{expected.bytes[i]}, int{bytes[offset + i]}) << what << " element " << i;
            }
            for (std::size_t k = 0; k < offset; ++k) ASSERT_EQ(bytes[k], kByteGuard) << what << " before the codes";
            for (std::size_t k = offset + count; k < bytes.size(); ++k) {
              ASSERT_EQ(bytes[k], kByteGuard) << what << " past the codes";
            }
            for (std::size_t k = 0; k < scale_offset; ++k) ASSERT_EQ(scales[k], kScaleGuard) << what;
            for (std::size_t k = scale_offset + ScaleCount(count); k < scales.size(); ++k) {
              ASSERT_EQ(scales[k], kScaleGuard) << what << " past the scales";
            }
          }
        }
      }
    }
  }
}

// fp8 codes read from every byte offset, decoded into outs at element offsets.
TEST(HostCodecAlignmentTest, Fp8CodesAtEveryOffsetAreDecodedExactly) {
  std::mt19937_64 rng(47);
  for (LowFormat format : kScaledFormats) {
    for (std::size_t count : {std::size_t{1}, std::size_t{17}, kScaleBlock + 1, std::size_t{1000}}) {
      const Encoded encoded = ReferenceEncode(format, DataType::kFloat32, RandomValues(DataType::kFloat32, count, rng),
                                              count);
      for (DataType dtype : kDtypes) {
        const std::vector<unsigned char> out = RandomValues(dtype, count, rng);
        for (std::size_t offset = 0; offset <= 33; ++offset) {
          std::vector<std::uint8_t> shifted(offset, 0x3C);
          shifted.insert(shifted.end(), encoded.bytes.begin(), encoded.bytes.end());
          const std::size_t out_offset = offset % 5;
          for (HostIsa isa : AvailableIsas()) {
            const std::string what = Describe(isa, format, dtype, count) + " codes offset " + std::to_string(offset);
            for (bool accumulate : {false, true}) {
              const std::size_t size = DtypeSize(dtype);
              std::vector<unsigned char> actual((out_offset + kGuardElements) * size, kOutGuard);
              actual.insert(actual.begin() + static_cast<std::ptrdiff_t>(out_offset * size), out.begin(), out.end());
              ASSERT_TRUE(HostDecode(isa, format, {encoded.scales.data(), shifted.data() + offset}, count, dtype,
                                     actual.data() + out_offset * size, accumulate))
                  << what;
              for (std::size_t i = 0; i < count; ++i) {
                const double expected = ReferenceDecodeOne(format, encoded.bytes[i], encoded.scales[i / kScaleBlock],
                                                           dtype, ValueAt(dtype, out, i), accumulate);
                ASSERT_TRUE(SameFloat(expected, ValueAt(dtype, actual, out_offset + i)))
                    << what << (accumulate ? " accumulate" : " overwrite") << " element " << i;
              }
              for (std::size_t b = 0; b < out_offset * size; ++b) ASSERT_EQ(actual[b], kOutGuard) << what;
              for (std::size_t b = (out_offset + count) * size; b < actual.size(); ++b) {
                ASSERT_EQ(actual[b], kOutGuard) << what;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace hp::shmem::ops
