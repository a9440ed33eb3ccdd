// The host reduction kernels (ops/host/reduce.h) against a scalar reference: every dtype, op, source count and
// instruction-set variant; block boundaries; in place; float16/bfloat16 rounding; NaN; integer wrap-around.
//
// The reference converts half-precision values by its own means (a search for the nearest representable value,
// ties to even), independent of the kernels' bit tricks and of F16C.
#include "ops/host/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host_kernel_support.h"

namespace hp::shmem::ops {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

// The kernels process blocks of this many elements (reduce_kernels.inc); counts around it cross a block edge.
constexpr std::size_t kBlock = 1024;
const std::size_t kCounts[] = {0, 1, 7, kBlock - 1, kBlock, kBlock + 1, 3 * kBlock + 17};
const int kSourceCounts[] = {1, 2, 3, 5};
const DataType kDataTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                               DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};



// ---------------------------------------------------------------------------------------------------------------
// The scalar reference, on raw element bytes.

template <typename T>
T Load(const std::vector<unsigned char>& bytes, std::size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

// NaN wins; otherwise the larger (smaller) one, the later one on a tie (+0 and -0).
template <typename T>
T ReferenceCombine(ReduceOp op, T acc, T value) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return acc + value;
    case ReduceOp::kMax: return (std::isnan(acc) || acc > value) ? acc : value;
    case ReduceOp::kMin: return (std::isnan(acc) || acc < value) ? acc : value;
  }
  return acc;
}

// Floating dtypes: accumulate in Acc in source order, divide for avg, round once with `round`.
template <typename Acc, typename Out>
std::vector<Out> ReferenceFloating(ReduceOp op, const std::vector<std::vector<unsigned char>>& srcs, std::size_t count,
                                   Acc (*load)(const std::vector<unsigned char>&, std::size_t),
                                   Out (*round)(Acc)) {
  std::vector<Out> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    Acc acc = load(srcs[0], i);
    for (std::size_t k = 1; k < srcs.size(); ++k) acc = ReferenceCombine(op, acc, load(srcs[k], i));
    if (op == ReduceOp::kAvg) acc = acc / static_cast<Acc>(srcs.size());
    out[i] = round(acc);
  }
  return out;
}

// Integers: sums modulo 2^bits (computed in uint64), max/min by signed value.
template <typename T>
std::vector<T> ReferenceInteger(ReduceOp op, const std::vector<std::vector<unsigned char>>& srcs, std::size_t count) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t sum = 0;
    T best = Load<T>(srcs[0], i);
    for (const auto& src : srcs) {
      const T value = Load<T>(src, i);
      sum += static_cast<std::uint64_t>(static_cast<std::int64_t>(value));
      if (op == ReduceOp::kMax && value > best) best = value;
      if (op == ReduceOp::kMin && value < best) best = value;
    }
    out[i] = op == ReduceOp::kSum ? static_cast<T>(sum) : best;   // modular conversion (GCC; C++20 guarantees it)
  }
  return out;
}

float LoadHalf(const std::vector<unsigned char>& bytes, std::size_t i) { return static_cast<float>(HalfValue(Load<std::uint16_t>(bytes, i))); }
float LoadBFloat16(const std::vector<unsigned char>& bytes, std::size_t i) { return static_cast<float>(BFloat16Value(Load<std::uint16_t>(bytes, i))); }
float LoadFloat(const std::vector<unsigned char>& bytes, std::size_t i) { return Load<float>(bytes, i); }
double LoadDouble(const std::vector<unsigned char>& bytes, std::size_t i) { return Load<double>(bytes, i); }
float KeepFloat(float value) { return value; }
double KeepDouble(double value) { return value; }

template <typename T>
std::vector<unsigned char> Bytes(const std::vector<T>& values) {
  std::vector<unsigned char> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<unsigned char> Reference(DataType dtype, ReduceOp op, const std::vector<std::vector<unsigned char>>& srcs,
                                     std::size_t count) {
  switch (dtype) {
    case DataType::kFloat32: return Bytes(ReferenceFloating<float, float>(op, srcs, count, LoadFloat, KeepFloat));
    case DataType::kFloat64: return Bytes(ReferenceFloating<double, double>(op, srcs, count, LoadDouble, KeepDouble));
    case DataType::kFloat16:
      return Bytes(ReferenceFloating<float, std::uint16_t>(op, srcs, count, LoadHalf,
                                                           +[](float v) { return RoundToHalf(v); }));
    case DataType::kBFloat16:
      return Bytes(ReferenceFloating<float, std::uint16_t>(op, srcs, count, LoadBFloat16,
                                                           +[](float v) { return RoundToBFloat16(v); }));
    case DataType::kInt8: return Bytes(ReferenceInteger<std::int8_t>(op, srcs, count));
    case DataType::kUInt8: return Bytes(ReferenceInteger<std::uint8_t>(op, srcs, count));
    case DataType::kInt32: return Bytes(ReferenceInteger<std::int32_t>(op, srcs, count));
    case DataType::kInt64: return Bytes(ReferenceInteger<std::int64_t>(op, srcs, count));
  }
  return {};
}

bool IsNanAt(DataType dtype, const std::vector<unsigned char>& bytes, std::size_t i) {
  switch (dtype) {
    case DataType::kFloat32: return std::isnan(Load<float>(bytes, i));
    case DataType::kFloat64: return std::isnan(Load<double>(bytes, i));
    case DataType::kFloat16: return std::isnan(HalfValue(Load<std::uint16_t>(bytes, i)));
    case DataType::kBFloat16: return std::isnan(BFloat16Value(Load<std::uint16_t>(bytes, i)));
    default: return false;
  }
}

// Bit-exact, except that any NaN matches any NaN (payloads are not part of the contract).
::testing::AssertionResult SameElements(DataType dtype, const std::vector<unsigned char>& got,
                                        const std::vector<unsigned char>& expected, std::size_t count) {
  const std::size_t size = DataTypeSize(dtype);
  for (std::size_t i = 0; i < count; ++i) {
    const bool nan = IsNanAt(dtype, expected, i);
    if (nan ? IsNanAt(dtype, got, i) : std::memcmp(got.data() + i * size, expected.data() + i * size, size) == 0) continue;
    std::string hex_got, hex_expected;
    char byte[4];
    for (std::size_t b = size; b-- > 0;) {
      std::snprintf(byte, sizeof(byte), "%02x", got[i * size + b]);
      hex_got += byte;
      std::snprintf(byte, sizeof(byte), "%02x", expected[i * size + b]);
      hex_expected += byte;
    }
    return ::testing::AssertionFailure() << "element " << i << " of " << count << ": got 0x" << hex_got
                                         << ", expected 0x" << hex_expected;
  }
  return ::testing::AssertionSuccess();
}

std::vector<unsigned char> RandomBytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<unsigned char> bytes(n);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

std::vector<const void*> Pointers(const std::vector<std::vector<unsigned char>>& srcs) {
  std::vector<const void*> pointers;
  for (const auto& src : srcs) pointers.push_back(src.data());
  return pointers;
}

std::string Describe(HostIsa isa, DataType dtype, ReduceOp op, int nsrc, std::size_t count) {
  return std::string(HostIsaName(isa)) + " " + DataTypeName(dtype) + " " + ReduceOpName(op) +
         " nsrc=" + std::to_string(nsrc) + " count=" + std::to_string(count);
}

// ---------------------------------------------------------------------------------------------------------------

TEST(HostReduceTest, TheBestVariantIsAvailableAndThePortableOneAlways) {
  EXPECT_TRUE(HostIsaAvailable(HostIsa::kPortable));
  EXPECT_TRUE(HostIsaAvailable(BestHostIsa()));
  EXPECT_STREQ(HostIsaName(HostIsa::kPortable), "portable");
  EXPECT_STREQ(HostIsaName(HostIsa::kAvx2F16c), "avx2+f16c");
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  EXPECT_EQ(HostIsaAvailable(HostIsa::kAvx2F16c), has);
  EXPECT_EQ(BestHostIsa(), has ? HostIsa::kAvx2F16c : HostIsa::kPortable);
#endif
}

TEST(HostReduceTest, EveryDtypeOpAndSourceCountMatchesTheReference) {
  std::mt19937_64 rng(20240611);
  for (HostIsa isa : AvailableIsas()) {
    for (DataType dtype : kDataTypes) {
      const std::size_t size = DataTypeSize(dtype);
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;   // refused: see RefusesWhatItDoesNotCompute
        for (int nsrc : kSourceCounts) {
          for (std::size_t count : kCounts) {
            SCOPED_TRACE(Describe(isa, dtype, op, nsrc, count));
            std::vector<std::vector<unsigned char>> srcs;
            for (int k = 0; k < nsrc; ++k) srcs.push_back(RandomBytes(rng, count * size));   // NaN, inf, subnormals
            const std::vector<unsigned char> expected = Reference(dtype, op, srcs, count);
            std::vector<unsigned char> dst(count * size + 16, 0xCD);   // 16 guard bytes past the end
            const std::vector<const void*> pointers = Pointers(srcs);
            ASSERT_TRUE(HostReduce(isa, dtype, op, dst.data(), pointers.data(), nsrc, count));
            EXPECT_TRUE(SameElements(dtype, dst, expected, count));
            EXPECT_EQ(std::vector<unsigned char>(dst.end() - 16, dst.end()), std::vector<unsigned char>(16, 0xCD));
          }
        }
      }
    }
  }
}

TEST(HostReduceTest, InPlaceIntoAnySource) {
  std::mt19937_64 rng(7);
  constexpr int kSources = 4;
  for (HostIsa isa : AvailableIsas()) {
    for (DataType dtype : kDataTypes) {
      const ReduceOp op = IsFloatingPoint(dtype) ? ReduceOp::kAvg : ReduceOp::kSum;
      for (int target = 0; target < kSources; ++target) {
        const std::size_t count = 2 * kBlock + 5;
        SCOPED_TRACE(Describe(isa, dtype, op, kSources, count) + " in place into source " + std::to_string(target));
        std::vector<std::vector<unsigned char>> srcs;
        for (int k = 0; k < kSources; ++k) srcs.push_back(RandomBytes(rng, count * DataTypeSize(dtype)));
        const std::vector<unsigned char> expected = Reference(dtype, op, srcs, count);
        const std::vector<const void*> pointers = Pointers(srcs);
        ASSERT_TRUE(HostReduce(isa, dtype, op, srcs[static_cast<std::size_t>(target)].data(), pointers.data(),
                               kSources, count));
        EXPECT_TRUE(SameElements(dtype, srcs[static_cast<std::size_t>(target)], expected, count));
      }
    }
  }
}

TEST(HostReduceTest, LargeCountsMatchTheReference) {
  std::mt19937_64 rng(99);
  const std::size_t count = (std::size_t{1} << 20) + 3;
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
    SCOPED_TRACE(Describe(BestHostIsa(), dtype, ReduceOp::kSum, 3, count));
    std::vector<std::vector<unsigned char>> srcs;
    for (int k = 0; k < 3; ++k) srcs.push_back(RandomBytes(rng, count * DataTypeSize(dtype)));
    const std::vector<unsigned char> expected = Reference(dtype, ReduceOp::kSum, srcs, count);
    std::vector<unsigned char> dst(count * DataTypeSize(dtype));
    const std::vector<const void*> pointers = Pointers(srcs);
    ASSERT_TRUE(HostReduce(dtype, ReduceOp::kSum, dst.data(), pointers.data(), 3, count));
    EXPECT_TRUE(SameElements(dtype, dst, expected, count));
  }
}

// A single source is a conversion round trip: every float16 and bfloat16 pattern comes back as itself (NaN as NaN).
TEST(HostReduceTest, HalfPrecisionRoundTripsEveryPattern) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  const std::vector<unsigned char> bytes = Bytes(all);
  for (HostIsa isa : AvailableIsas()) {
    for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : kOps) {
        SCOPED_TRACE(Describe(isa, dtype, op, 1, all.size()));
        std::vector<unsigned char> dst(bytes.size());
        const void* src = bytes.data();
        ASSERT_TRUE(HostReduce(isa, dtype, op, dst.data(), &src, 1, all.size()));
        EXPECT_TRUE(SameElements(dtype, dst, bytes, all.size()));
      }
    }
  }
}

// Sums that land exactly halfway between two float16 (bfloat16) values round to the even one, once.
TEST(HostReduceTest, HalfPrecisionSumsRoundOnceToNearestEven) {
  // float16: 2048 + 1 = 2049 is halfway between 2048 and 2050 -> 2048 (even); 2050 + 1 -> 2052 (even).
  // Rounding after each addition would give 2048 + 1 + 1 = 2048; once, the exact 2050.
  const std::uint16_t h2048 = 0x6800, h2050 = 0x6801, h1 = 0x3C00;
  // bfloat16: 256 + 1 = 257 is halfway between 256 and 258 -> 256; 258 + 1 -> 260.
  const std::uint16_t b256 = 0x4380, b258 = 0x4381, b1 = 0x3F80;
  struct Case {
    DataType dtype;
    std::vector<std::uint16_t> sources;
    std::uint16_t expected;
  };
  const Case cases[] = {
      {DataType::kFloat16, {h2048, h1}, 0x6800},        {DataType::kFloat16, {h2050, h1}, 0x6802},
      {DataType::kFloat16, {h2048, h1, h1}, 0x6801},    {DataType::kBFloat16, {b256, b1}, 0x4380},
      {DataType::kBFloat16, {b258, b1}, 0x4382},        {DataType::kBFloat16, {b256, b1, b1}, 0x4381},
      {DataType::kFloat16, {0x7BFF, 0x5000}, 0x7C00},   // 65504 + 32 = 65536: halfway past the largest -> inf
      {DataType::kFloat16, {0x0001, 0x0001}, 0x0002},   // subnormals add exactly
  };
  for (HostIsa isa : AvailableIsas()) {
    for (const Case& c : cases) {
      // Enough elements for the vector path and a scalar tail.
      const std::size_t count = 19;
      std::vector<std::vector<std::uint16_t>> srcs;
      for (std::uint16_t value : c.sources) srcs.emplace_back(count, value);
      std::vector<const void*> pointers;
      for (const auto& src : srcs) pointers.push_back(src.data());
      std::vector<std::uint16_t> dst(count);
      ASSERT_TRUE(HostReduce(isa, c.dtype, ReduceOp::kSum, dst.data(), pointers.data(), static_cast<int>(srcs.size()),
                             count));
      EXPECT_EQ(dst, std::vector<std::uint16_t>(count, c.expected))
          << HostIsaName(isa) << " " << DataTypeName(c.dtype) << " sources=" << srcs.size();
    }
  }
}

TEST(HostReduceTest, MaxAndMinPropagateNan) {
  const std::size_t count = kBlock + 9;
  for (HostIsa isa : AvailableIsas()) {
    for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum}) {
      // float32: a NaN in the first, a middle or the last of three sources wins against every number, infinities
      // included.
      std::vector<std::vector<float>> srcs(3, std::vector<float>(count));
      for (std::size_t i = 0; i < count; ++i) {
        srcs[0][i] = static_cast<float>(i);
        srcs[1][i] = i % 2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
        srcs[2][i] = -static_cast<float>(i);
      }
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = 0; i < count; i += 5) srcs[i % 3][i] = nan;
      const void* pointers[3] = {srcs[0].data(), srcs[1].data(), srcs[2].data()};
      std::vector<float> dst(count);
      ASSERT_TRUE(HostReduce(isa, DataType::kFloat32, op, dst.data(), pointers, 3, count));
      for (std::size_t i = 0; i < count; ++i) {
        if (i % 5 == 0) {
          EXPECT_TRUE(std::isnan(dst[i])) << HostIsaName(isa) << " " << ReduceOpName(op) << " element " << i;
        } else if (op != ReduceOp::kSum) {
          EXPECT_EQ(dst[i], op == ReduceOp::kMax ? srcs[1][i] == -std::numeric_limits<float>::infinity()
                                                       ? static_cast<float>(i)
                                                       : std::numeric_limits<float>::infinity()
                                                 : srcs[1][i] == std::numeric_limits<float>::infinity()
                                                       ? -static_cast<float>(i)
                                                       : -std::numeric_limits<float>::infinity())
              << HostIsaName(isa) << " " << ReduceOpName(op) << " element " << i;
        }
      }
      // The half-precision and double kernels too: NaN from either side.
      const std::uint16_t half_nan = 0x7E00, half_one = 0x3C00, bf16_nan = 0x7FC0, bf16_one = 0x3F80;
      for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
        const std::uint16_t nan16 = dtype == DataType::kFloat16 ? half_nan : bf16_nan;
        const std::uint16_t one16 = dtype == DataType::kFloat16 ? half_one : bf16_one;
        const std::vector<std::uint16_t> a = {nan16, one16, one16, nan16}, b = {one16, nan16, one16, nan16};
        const void* half_pointers[2] = {a.data(), b.data()};
        std::vector<std::uint16_t> out(4);
        ASSERT_TRUE(HostReduce(isa, dtype, op, out.data(), half_pointers, 2, out.size()));
        std::vector<unsigned char> out_bytes = Bytes(out);
        for (std::size_t i : {0, 1, 3}) EXPECT_TRUE(IsNanAt(dtype, out_bytes, i)) << DataTypeName(dtype) << " " << i;
        EXPECT_FALSE(IsNanAt(dtype, out_bytes, 2));
      }
      const std::vector<double> a = {nan, 1.0}, b = {2.0, nan};
      const void* double_pointers[2] = {a.data(), b.data()};
      std::vector<double> out(2);
      ASSERT_TRUE(HostReduce(isa, DataType::kFloat64, op, out.data(), double_pointers, 2, out.size()));
      EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
    }
  }
}

TEST(HostReduceTest, IntegerSumsWrapAround) {
  for (HostIsa isa : AvailableIsas()) {
    const std::vector<std::int8_t> i8a(37, 127), i8b(37, 1);
    const std::vector<std::uint8_t> u8a(37, 255), u8b(37, 2);
    const std::vector<std::int32_t> i32a(37, std::numeric_limits<std::int32_t>::max()), i32b(37, 1);
    const std::vector<std::int64_t> i64a(37, std::numeric_limits<std::int64_t>::min()), i64b(37, -1);
    std::vector<std::int8_t> i8(37);
    std::vector<std::uint8_t> u8(37);
    std::vector<std::int32_t> i32(37);
    std::vector<std::int64_t> i64(37);
    const void* p8[2] = {i8a.data(), i8b.data()};
    const void* pu8[2] = {u8a.data(), u8b.data()};
    const void* p32[2] = {i32a.data(), i32b.data()};
    const void* p64[2] = {i64a.data(), i64b.data()};
    ASSERT_TRUE(HostReduce(isa, DataType::kInt8, ReduceOp::kSum, i8.data(), p8, 2, 37));
    ASSERT_TRUE(HostReduce(isa, DataType::kUInt8, ReduceOp::kSum, u8.data(), pu8, 2, 37));
    ASSERT_TRUE(HostReduce(isa, DataType::kInt32, ReduceOp::kSum, i32.data(), p32, 2, 37));
    ASSERT_TRUE(HostReduce(isa, DataType::kInt64, ReduceOp::kSum, i64.data(), p64, 2, 37));
    EXPECT_EQ(i8, std::vector<std::int8_t>(37, -128)) << HostIsaName(isa);
    EXPECT_EQ(u8, std::vector<std::uint8_t>(37, 1)) << HostIsaName(isa);
    EXPECT_EQ(i32, std::vector<std::int32_t>(37, std::numeric_limits<std::int32_t>::min())) << HostIsaName(isa);
    EXPECT_EQ(i64, std::vector<std::int64_t>(37, std::numeric_limits<std::int64_t>::max())) << HostIsaName(isa);
    // max and min compare signed values for signed dtypes, unsigned ones for uint8.
    ASSERT_TRUE(HostReduce(isa, DataType::kInt8, ReduceOp::kMax, i8.data(), p8, 2, 37));
    ASSERT_TRUE(HostReduce(isa, DataType::kUInt8, ReduceOp::kMin, u8.data(), pu8, 2, 37));
    EXPECT_EQ(i8, std::vector<std::int8_t>(37, 127));
    EXPECT_EQ(u8, std::vector<std::uint8_t>(37, 2));
  }
}

TEST(HostReduceTest, RefusesWhatItDoesNotComputeAndWritesNothing) {
  const std::vector<std::int32_t> a(10, 3), b(10, 4);
  const void* pointers[2] = {a.data(), b.data()};
  for (HostIsa isa : AvailableIsas()) {
    for (DataType dtype : {DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64}) {
      std::vector<std::int64_t> dst(10, -9);
      EXPECT_FALSE(HostReduce(isa, dtype, ReduceOp::kAvg, dst.data(), pointers, 2, 5)) << DataTypeName(dtype);
      EXPECT_EQ(dst, std::vector<std::int64_t>(10, -9));
    }
    std::vector<float> dst(10, -9.0f);
    EXPECT_FALSE(HostReduce(isa, DataType::kFloat32, ReduceOp::kSum, dst.data(), pointers, 0, 10));
    EXPECT_EQ(dst, std::vector<float>(10, -9.0f));
  }
  if (!HostIsaAvailable(HostIsa::kAvx2F16c)) {
    std::vector<std::int32_t> dst(10, -9);
    EXPECT_FALSE(HostReduce(HostIsa::kAvx2F16c, DataType::kInt32, ReduceOp::kSum, dst.data(), pointers, 2, 10));
    EXPECT_EQ(dst, std::vector<std::int32_t>(10, -9));
  }
}

TEST(ReduceOpTest, NamesSizesAndKinds) {
  const char* names[] = {"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"};
  const std::size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 8};
  for (int i = 0; i < 8; ++i) {
    const DataType dtype = kDataTypes[i];
    EXPECT_STREQ(DataTypeName(dtype), names[i]);
    EXPECT_EQ(DataTypeSize(dtype), sizes[i]);
    EXPECT_EQ(IsFloatingPoint(dtype), i < 4);
  }
  EXPECT_STREQ(ReduceOpName(ReduceOp::kSum), "sum");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kAvg), "avg");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kMax), "max");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kMin), "min");
}

}  // namespace
}  // namespace hp::shmem::ops
