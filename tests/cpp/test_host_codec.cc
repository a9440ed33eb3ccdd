// The block-scaled fp8 codec (ops/host/codec.h) against a scalar reference written from the formats' definitions
// (codec_reference.h): both formats, every source and output dtype, both instruction-set variants, tails, all-zero
// blocks, subnormal results, ties and values just off them, blocks with inf/NaN, the e4m3fn exponent limit, the
// exponent clamp at -126.
#include "ops/host/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

const LowFormat kFormats[] = {LowFormat::kFloat8E4M3Fn, LowFormat::kFloat8E5M2};
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
  ASSERT_TRUE(HostEncodeBlockScaled(isa, format, dtype, src.data(), count, scales.data(), bytes.data()));
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
    ASSERT_TRUE(HostDecodeBlockScaled(isa, format, encoded.scales.data(), encoded.bytes.data(), count, dtype,
                                      actual.data(), accumulate));
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

TEST(HostCodecTest, EveryFormatAndSourceDtypeEncodesLikeTheReference) {
  std::mt19937_64 rng(20240611);
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kFormats) {
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
    for (LowFormat format : kFormats) {
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
    for (LowFormat format : kFormats) {
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
  for (LowFormat format : kFormats) {
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
    for (LowFormat format : kFormats) {
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
  ASSERT_TRUE(HostEncodeBlockScaled(LowFormat::kFloat8E4M3Fn, DataType::kFloat32, &zero, 1, &scale, &byte));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(byte, 0);
  const float limit = 448.0f * std::ldexp(1.0f, 119);   // absmax / 448 = 2**119: frexp's exponent 120
  ASSERT_TRUE(HostEncodeBlockScaled(LowFormat::kFloat8E4M3Fn, DataType::kFloat32, &limit, 1, &scale, &byte));
  EXPECT_TRUE(std::isnan(scale));
  EXPECT_EQ(byte, 0x7F);
  ASSERT_TRUE(HostEncodeBlockScaled(LowFormat::kFloat8E5M2, DataType::kFloat32, &limit, 1, &scale, &byte));
  EXPECT_EQ(scale, std::ldexp(1.0f, 113));   // absmax / 57344 = 2**112
  EXPECT_EQ(byte, 0x77);                     // 2**119 * 448 / 2**113 = 28672 = 1.75 * 2**14
  const float small = std::ldexp(1.0f, -130);   // absmax / 57344 is a float32 subnormal: exponent clamped at -126
  ASSERT_TRUE(HostEncodeBlockScaled(LowFormat::kFloat8E5M2, DataType::kFloat32, &small, 1, &scale, &byte));
  EXPECT_EQ(scale, std::ldexp(1.0f, -126));
  EXPECT_EQ(byte, 0x2C);   // 2**-4
  const float tiny = FromBits(1);   // absmax / 57344 underflows to zero: frexp's exponent 0, scale 1
  ASSERT_TRUE(HostEncodeBlockScaled(LowFormat::kFloat8E5M2, DataType::kFloat32, &tiny, 1, &scale, &byte));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(byte, 0);
}

TEST(HostCodecTest, RoundTripsEveryCodeBelowTheLargestExactly) {
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kFormats) {
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
      ASSERT_TRUE(HostEncodeBlockScaled(isa, format, DataType::kFloat32, src.data(), src.size(), scales.data(),
                                        bytes.data()));
      EXPECT_EQ(scales[0], 1.0f);
      EXPECT_EQ(scales[1], 1.0f);
      std::vector<float> back(src.size());
      ASSERT_TRUE(HostDecodeBlockScaled(isa, format, scales.data(), bytes.data(), src.size(), DataType::kFloat32,
                                        back.data(), false));
      for (std::size_t i = 0; i < src.size(); ++i) {
        EXPECT_EQ(Bits(src[i]), Bits(back[i])) << HostIsaName(isa) << " " << LowFormatName(format) << " " << src[i];
      }
    }
  }
}

TEST(HostCodecTest, RefusesWhatItDoesNotComputeAndWritesNothing) {
  const std::int32_t ints[4] = {1, 2, 3, 4};
  float scale = 7.0f;
  std::uint8_t bytes[4] = {9, 9, 9, 9};
  EXPECT_FALSE(HostEncodeBlockScaled(LowFormat::kFloat8E4M3Fn, DataType::kInt32, ints, 4, &scale, bytes));
  EXPECT_FALSE(HostEncodeBlockScaled(static_cast<LowFormat>(9), DataType::kFloat32, ints, 4, &scale, bytes));
  std::int32_t out[4] = {5, 5, 5, 5};
  EXPECT_FALSE(HostDecodeBlockScaled(LowFormat::kFloat8E5M2, &scale, bytes, 4, DataType::kInt32, out, true));
  EXPECT_FALSE(HostDecodeBlockScaled(static_cast<LowFormat>(9), &scale, bytes, 4, DataType::kFloat32, out, false));
  EXPECT_EQ(scale, 7.0f);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes[i], 9);
    EXPECT_EQ(out[i], 5);
  }
  EXPECT_STREQ(LowFormatName(LowFormat::kFloat8E4M3Fn), "float8_e4m3fn");
  EXPECT_STREQ(LowFormatName(LowFormat::kFloat8E5M2), "float8_e5m2");
  EXPECT_EQ(ScaleCount(0), 0u);
  EXPECT_EQ(ScaleCount(1), 1u);
  EXPECT_EQ(ScaleCount(kScaleBlock), 1u);
  EXPECT_EQ(ScaleCount(kScaleBlock + 1), 2u);
}

}  // namespace
}  // namespace hp::shmem::ops
