// The MoE row codec (ops/host/codec.h, HostEncodeRows and HostDecodeRows) against the scalar reference
// (codec_reference.h, one block per row), on every instruction-set variant, every wire format and every source and
// output dtype, over a table of edge rows: zeros, one repeated value, the fp8 maximum and its powers of two,
// subnormal results, a tiny value beside a large one, inf and NaN rows, rows longer than a block, empty rows; and
// nothing written past the last row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec_reference.h"
#include "host_kernel_support.h"
#include "ops/host/codec.h"

namespace hp::shmem::ops {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

struct EdgeRow {
  const char* name;
  double (*value)(std::size_t i, std::size_t row_elems);   // element i of a row
};

// Each row of a table case is made of these, one after the other (row r: kEdgeRows[r % size]).
const EdgeRow kEdgeRows[] = {
    {"zeros", [](std::size_t, std::size_t) { return 0.0; }},
    {"signed zeros", [](std::size_t i, std::size_t) { return i % 2 ? -0.0 : 0.0; }},
    {"one value", [](std::size_t, std::size_t) { return 1.0 / 7.0; }},
    {"e4m3fn max", [](std::size_t i, std::size_t) { return i % 3 ? 448.0 : -448.0 / 3.0; }},
    {"e5m2 max", [](std::size_t i, std::size_t) { return i % 3 ? -57344.0 : 57344.0 / 5.0; }},
    {"power of two", [](std::size_t i, std::size_t) { return std::ldexp(1.0, -static_cast<int>(i % 20)); }},
    {"tiny beside large", [](std::size_t i, std::size_t n) { return i + 1 == n ? 1000.0 : 1e-3 * (i + 1); }},
    {"subnormal only", [](std::size_t i, std::size_t) { return std::ldexp(1.0 + i % 4, -140); }},
    {"wide range",
     [](std::size_t i, std::size_t) { return std::ldexp(i % 2 ? -1.3 : 1.7, static_cast<int>(i % 60) - 30); }},
    {"one inf", [](std::size_t i, std::size_t n) { return i == n / 2 ? -kInf : 1.0; }},
    {"one nan", [](std::size_t i, std::size_t) { return i == 0 ? kNan : 2.5; }},
    {"float16 overflow", [](std::size_t i, std::size_t) { return i % 2 ? 70000.0 : 65504.0; }},
};
constexpr std::size_t kEdgeCount = sizeof(kEdgeRows) / sizeof(kEdgeRows[0]);

std::string Describe(HostIsa isa, LowFormat format, DataType dtype, std::size_t rows, std::size_t row_elems) {
  return std::string(HostIsaName(isa)) + " " + LowFormatName(format) + " " + DataTypeName(dtype) +
         " rows=" + std::to_string(rows) + " row_elems=" + std::to_string(row_elems);
}

// The expected wire rows of `src` (rows x row_elems values of `dtype`), from the reference.
std::vector<std::uint8_t> ReferenceRows(LowFormat format, DataType dtype, const std::vector<unsigned char>& src,
                                        std::size_t rows, std::size_t row_elems) {
  const std::size_t row_bytes = WireRowBytes(format, row_elems);
  std::vector<std::uint8_t> wire(rows * row_bytes);
  for (std::size_t r = 0; r < rows; ++r) {
    std::uint8_t* row = wire.data() + r * row_bytes;
    if (LowFormatScaled(format)) {
      const std::size_t row_size = row_elems * DtypeSize(dtype);
      const std::vector<unsigned char> values(src.begin() + static_cast<std::ptrdiff_t>(r * row_size),
                                              src.begin() + static_cast<std::ptrdiff_t>((r + 1) * row_size));
      // An empty row has the scale of an all-zero block.
      const Encoded encoded = row_elems == 0 ? Encoded{{1.0f}, {}}
                                             : ReferenceEncode(format, dtype, values, row_elems, row_elems);
      std::memcpy(row, encoded.scales.data(), sizeof(float));
      if (row_elems > 0) std::memcpy(row + sizeof(float), encoded.bytes.data(), row_elems);   // no null source
    } else {
      for (std::size_t i = 0; i < row_elems; ++i) {
        const std::uint16_t code = ReferenceEncodePlainOne(format, ValueAt(dtype, src, r * row_elems + i));
        std::memcpy(row + 2 * i, &code, sizeof(code));
      }
    }
  }
  return wire;
}

// The value element i of row r decodes to, as a `dtype` out stores it.
double ReferenceDecoded(LowFormat format, const std::vector<std::uint8_t>& wire, std::size_t r, std::size_t i,
                        std::size_t row_elems, DataType dtype) {
  const std::uint8_t* row = wire.data() + r * WireRowBytes(format, row_elems);
  if (LowFormatScaled(format)) {
    float scale;
    std::memcpy(&scale, row, sizeof(scale));
    return ReferenceDecodeOne(format, row[sizeof(float) + i], scale, dtype, 0.0, false);
  }
  std::uint16_t code;
  std::memcpy(&code, row + 2 * i, sizeof(code));
  return ReferenceDecodePlainOne(format, code, dtype, 0.0, false);
}

void ExpectRows(HostIsa isa, LowFormat format, DataType dtype, std::size_t rows, std::size_t row_elems) {
  const std::string what = Describe(isa, format, dtype, rows, row_elems);
  std::vector<unsigned char> src(rows * row_elems * DtypeSize(dtype));
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < row_elems; ++i) {
      Store(dtype, src, r * row_elems + i, kEdgeRows[r % kEdgeCount].value(i, row_elems));
    }
  }
  const std::vector<std::uint8_t> expected = ReferenceRows(format, dtype, src, rows, row_elems);
  std::vector<std::uint8_t> wire(expected.size() + 1, 0xA5);   // one more byte: nothing is written past the rows
  ASSERT_TRUE(HostEncodeRows(isa, format, dtype, src.data(), rows, row_elems, wire.data())) << what;
  const std::size_t row_bytes = WireRowBytes(format, row_elems);
  const std::size_t code_bytes = LowFormatBytes(format);
  for (std::size_t b = 0; b < expected.size(); b += code_bytes) {
    if (code_bytes == 2) {   // a 16-bit code: any NaN stands for NaN (payloads are not part of the format)
      std::uint16_t want, got;
      std::memcpy(&want, &expected[b], sizeof(want));
      std::memcpy(&got, &wire[b], sizeof(got));
      if (PlainCodeIsNan(format, want) && PlainCodeIsNan(format, got)) continue;
    }
    ASSERT_EQ(expected[b], wire[b]) << what << " row " << b / row_bytes << " ("
                                    << kEdgeRows[b / row_bytes % kEdgeCount].name << ") byte " << b % row_bytes;
    if (code_bytes == 2) {
      ASSERT_EQ(expected[b + 1], wire[b + 1]) << what << " byte " << b + 1;
    }
  }
  ASSERT_EQ(wire.back(), 0xA5) << what;
  for (DataType out_dtype : kCodecDtypes) {
    std::vector<unsigned char> out(rows * row_elems * DtypeSize(out_dtype) + 8, 0x5A);
    ASSERT_TRUE(HostDecodeRows(isa, format, wire.data(), rows, row_elems, out_dtype, out.data())) << what;
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t i = 0; i < row_elems; ++i) {
        const double want = ReferenceDecoded(format, expected, r, i, row_elems, out_dtype);
        ASSERT_TRUE(SameFloat(want, ValueAt(out_dtype, out, r * row_elems + i)))
            << what << " into " << DataTypeName(out_dtype) << " row " << r << " (" << kEdgeRows[r % kEdgeCount].name
            << ") element " << i << ": expected " << want << ", got " << ValueAt(out_dtype, out, r * row_elems + i);
      }
    }
    for (std::size_t b = rows * row_elems * DtypeSize(out_dtype); b < out.size(); ++b) {
      ASSERT_EQ(out[b], 0x5A) << what;
    }
  }
}

TEST(HostCodecRowsTest, EdgeRowsEncodeAndDecodeLikeTheReference) {
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kEveryLowFormat) {
      for (DataType dtype : kCodecDtypes) {
        for (std::size_t row_elems : {std::size_t{1}, std::size_t{7}, kScaleBlock, kScaleBlock + 1,
                                      std::size_t{300}}) {
          ASSERT_NO_FATAL_FAILURE(ExpectRows(isa, format, dtype, kEdgeCount, row_elems));
        }
      }
    }
  }
}

TEST(HostCodecRowsTest, EmptyRowsAndNoRows) {
  for (HostIsa isa : AvailableIsas()) {
    for (LowFormat format : kEveryLowFormat) {
      ASSERT_NO_FATAL_FAILURE(ExpectRows(isa, format, DataType::kFloat32, 3, 0));   // fp8: the scale 1 alone
      ASSERT_NO_FATAL_FAILURE(ExpectRows(isa, format, DataType::kFloat32, 0, 5));
    }
  }
}

TEST(HostCodecRowsTest, ARowsScaleIsTheBlockScaleOfTheWholeRow) {
  // 448 * 2**-3 at the end of a 300-value row of ones: the row's scale is 2**-2 (frexp of 2**-3 is 0.5 * 2**-2),
  // though the first block alone would have 2**-8.
  std::vector<float> row(300, 1.0f);
  row.back() = 56.0f;
  std::vector<std::uint8_t> wire(WireRowBytes(LowFormat::kFloat8E4M3Fn, row.size()));
  ASSERT_TRUE(HostEncodeRows(LowFormat::kFloat8E4M3Fn, DataType::kFloat32, row.data(), 1, row.size(), wire.data()));
  float scale;
  std::memcpy(&scale, wire.data(), sizeof(scale));
  EXPECT_EQ(scale, 0.25f);
  std::vector<float> back(row.size());
  ASSERT_TRUE(HostDecodeRows(LowFormat::kFloat8E4M3Fn, wire.data(), 1, row.size(), DataType::kFloat32, back.data()));
  EXPECT_EQ(back, row);   // every value is a code times 2**-2
}

TEST(HostCodecRowsTest, RefusesWhatItDoesNotComputeAndWritesNothing) {
  const std::vector<std::int32_t> src(4, 1);
  std::vector<std::uint8_t> wire(64, 0xA5);
  for (HostIsa isa : AvailableIsas()) {
    EXPECT_FALSE(HostEncodeRows(isa, LowFormat::kFloat8E4M3Fn, DataType::kInt32, src.data(), 1, 4, wire.data()));
    EXPECT_FALSE(HostEncodeRows(isa, static_cast<LowFormat>(9), DataType::kFloat32, src.data(), 1, 4, wire.data()));
    std::vector<std::int32_t> out(4, 7);
    EXPECT_FALSE(HostDecodeRows(isa, LowFormat::kFloat16, wire.data(), 1, 4, DataType::kInt32, out.data()));
    EXPECT_EQ(out, std::vector<std::int32_t>(4, 7));
  }
  EXPECT_EQ(wire, std::vector<std::uint8_t>(64, 0xA5));
  EXPECT_EQ(WireRowBytes(LowFormat::kFloat8E5M2, 10), 14u);
  EXPECT_EQ(WireRowBytes(LowFormat::kBFloat16, 10), 20u);
}

}  // namespace
}  // namespace hp::shmem::ops
