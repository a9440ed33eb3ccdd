// Runtime::EncodeRows and DecodeRows (MoE's wire rows on the rank's device) on the host device: the host codec's
// rows on a stream of the runtime, in that stream's order, and every contract by its message with nothing written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/host/codec.h"
#include "ops/wire_format.h"
#include "runtime_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

constexpr std::size_t kRows = 5;
constexpr std::size_t kRowElems = 300;   // longer than a scale block: an fp8 row still has one scale

std::vector<float> Rows() {
  std::vector<float> values(kRows * kRowElems);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(static_cast<int>(i % 97) - 48) * 0.37f * static_cast<float>(1 + i / kRowElems);
  }
  return values;
}

TEST(RuntimeRowCodecTest, EveryFormatIsTheHostCodecsRowsOnTheRuntimesStream) {
  RunRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    Result<StreamHandle> stream = runtime.CreateStream();
    ASSERT_TRUE(stream.ok());
    const std::vector<float> values = Rows();
    for (int f = 0; f < ops::kLowFormats; ++f) {
      const auto format = static_cast<ops::LowFormat>(f);
      SCOPED_TRACE(ops::LowFormatName(format));
      const std::size_t wire_bytes = kRows * ops::WireRowBytes(format, kRowElems);
      std::vector<std::uint8_t> expected(wire_bytes), wire(wire_bytes, 0xAB);
      ASSERT_TRUE(ops::HostEncodeRows(format, DataType::kFloat32, values.data(), kRows, kRowElems, expected.data()));
      std::vector<float> expected_back(values.size()), back(values.size(), -1.0f);
      ASSERT_TRUE(ops::HostDecodeRows(format, expected.data(), kRows, kRowElems, DataType::kFloat32,
                                      expected_back.data()));
      ASSERT_TRUE(IsOk(runtime.EncodeRows(format, DataType::kFloat32, values.data(), kRows, kRowElems, wire.data(),
                                          stream.value(), nullptr)));
      ASSERT_TRUE(IsOk(runtime.DecodeRows(format, wire.data(), kRows, kRowElems, DataType::kFloat32, back.data(),
                                          stream.value(), nullptr)));
      ASSERT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
      EXPECT_EQ(wire, expected);
      EXPECT_EQ(0, std::memcmp(back.data(), expected_back.data(), back.size() * sizeof(float)));
    }
    ASSERT_TRUE(IsOk(runtime.DestroyStream(stream.value())));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeRowCodecTest, ContractsAreRefusedByTheirMessageWithNothingWritten) {
  float values[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  std::uint8_t wire[16] = {};
  Runtime closed;
  EXPECT_TRUE(HasError(closed.EncodeRows(ops::LowFormat::kFloat16, DataType::kFloat32, values, 2, 2, wire,
                                        kDefaultStream, nullptr),
                      StatusCode::kStateError, "shmem runtime is not initialised: op=encode_rows"));
  RunRanks(1, [&](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    std::int32_t ints[4] = {1, 2, 3, 4};
    EXPECT_TRUE(HasError(runtime.EncodeRows(ops::LowFormat::kFloat16, DataType::kInt32, ints, 2, 2, wire,
                                           kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`dtype` must be a floating-point dtype wider than float16, but got int32"));
    EXPECT_TRUE(HasError(runtime.DecodeRows(ops::LowFormat::kBFloat16, wire, 2, 2, DataType::kBFloat16, values,
                                           kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`dtype` must be a floating-point dtype wider than bfloat16, but got bfloat16"));
    EXPECT_TRUE(HasError(runtime.EncodeRows(static_cast<ops::LowFormat>(9), DataType::kFloat32, values, 2, 2, wire,
                                           kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`format` must be a wire format, but got 9"));
    EXPECT_TRUE(HasError(runtime.EncodeRows(ops::LowFormat::kFloat16, DataType::kFloat32, values, 2, 2, nullptr,
                                           kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`dst` must be memory of 2 rows, but got a null pointer"));
    for (std::uint8_t byte : wire) EXPECT_EQ(byte, 0);
    EXPECT_EQ(values[0], 1.0f);
    // No rows: nothing to do, whatever the pointers.
    EXPECT_TRUE(IsOk(runtime.EncodeRows(ops::LowFormat::kFloat16, DataType::kFloat32, nullptr, 0, 2, nullptr,
                                        kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

}  // namespace
}  // namespace hp::shmem
