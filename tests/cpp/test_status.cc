#include "runtime/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace hp::shmem {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status.ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, CodeNames) {
  EXPECT_STREQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_STREQ(StatusCodeName(StatusCode::kTypeError), "TYPE_ERROR");
  EXPECT_STREQ(StatusCodeName(StatusCode::kStateError), "STATE_ERROR");
  EXPECT_STREQ(StatusCodeName(StatusCode::kTimeout), "TIMEOUT");
  EXPECT_STREQ(StatusCodeName(StatusCode::kOutOfMemory), "OUT_OF_MEMORY");
  EXPECT_STREQ(StatusCodeName(StatusCode::kMismatch), "MISMATCH");
  EXPECT_STREQ(StatusCodeName(StatusCode::kDeviceError), "DEVICE_ERROR");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInternal), "INTERNAL");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInterrupted), "INTERRUPTED");
  EXPECT_STREQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN");
}

TEST(StatusTest, HelpersSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    const char* text;
  };
  const Case cases[] = {
      {InvalidArgument("a"), StatusCode::kInvalidArgument, "INVALID_ARGUMENT: a"},
      {TypeError("b"), StatusCode::kTypeError, "TYPE_ERROR: b"},
      {StateError("c"), StatusCode::kStateError, "STATE_ERROR: c"},
      {Timeout("d"), StatusCode::kTimeout, "TIMEOUT: d"},
      {OutOfMemory("e"), StatusCode::kOutOfMemory, "OUT_OF_MEMORY: e"},
      {Mismatch("f"), StatusCode::kMismatch, "MISMATCH: f"},
      {DeviceError("g"), StatusCode::kDeviceError, "DEVICE_ERROR: g"},
      {Internal("h"), StatusCode::kInternal, "INTERNAL: h"},
      {Interrupted("i"), StatusCode::kInterrupted, "INTERRUPTED: i"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.ToString(), c.text);
  }
}

TEST(ResultTest, HoldsValueOrStatus) {
  Result<int> good(7);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(good.status().ok());
  EXPECT_EQ(good.value(), 7);
  EXPECT_EQ(*good, 7);

  Result<int> bad(StateError("runtime is not initialized: state=uninitialized"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kStateError);
  EXPECT_EQ(bad.status().message(), "runtime is not initialized: state=uninitialized");
}

TEST(ResultTest, MoveOnlyValue) {
  Result<std::unique_ptr<int>> result(std::make_unique<int>(5));
  ASSERT_TRUE(result.ok());
  std::unique_ptr<int> taken = std::move(result).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 5);
}

Status FailIf(bool fail, int* calls) {
  ++*calls;
  if (fail) return Timeout("barrier timed out: waited_sec=1");
  return Status::Ok();
}

Status TwoSteps(bool fail_first, bool fail_second, int* calls) {
  HP_RETURN_IF_ERROR(FailIf(fail_first, calls));
  HP_RETURN_IF_ERROR(FailIf(fail_second, calls));
  return Status::Ok();
}

TEST(MacroTest, ReturnIfErrorStopsAtFirstError) {
  int calls = 0;
  EXPECT_TRUE(TwoSteps(false, false, &calls).ok());
  EXPECT_EQ(calls, 2);

  calls = 0;
  Status first = TwoSteps(true, false, &calls);
  EXPECT_EQ(first.code(), StatusCode::kTimeout);
  EXPECT_EQ(first.message(), "barrier timed out: waited_sec=1");
  EXPECT_EQ(calls, 1);

  calls = 0;
  EXPECT_EQ(TwoSteps(false, true, &calls).code(), StatusCode::kTimeout);
  EXPECT_EQ(calls, 2);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("`x` must be even, but got " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x, int* reached) {
  HP_ASSIGN_OR_RETURN(int half, Half(x));
  ++*reached;
  HP_ASSIGN_OR_RETURN(auto quarter, Half(half));   // two uses in one function need distinct temporaries
  ++*reached;
  return quarter;
}

TEST(MacroTest, AssignOrReturn) {
  int reached = 0;
  Result<int> ok = Quarter(12, &reached);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), 3);
  EXPECT_EQ(reached, 2);

  reached = 0;
  Result<int> odd = Quarter(7, &reached);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(odd.status().message(), "`x` must be even, but got 7");
  EXPECT_EQ(reached, 0);

  reached = 0;
  Result<int> second = Quarter(6, &reached);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), "`x` must be even, but got 3");
  EXPECT_EQ(reached, 1);
}

Status AssignIntoStatusFunction(int x, int* out) {
  HP_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::Ok();
}

TEST(MacroTest, AssignOrReturnInStatusFunction) {
  int out = -1;
  EXPECT_TRUE(AssignIntoStatusFunction(10, &out).ok());
  EXPECT_EQ(out, 5);
  out = -1;
  Status status = AssignIntoStatusFunction(5, &out);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
}

}  // namespace
}  // namespace hp::shmem
