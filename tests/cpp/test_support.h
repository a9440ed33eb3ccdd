// Small helpers shared by the googletest units: sizes and checks of a Status.
//
//   EXPECT_TRUE(IsOk(device.Init(args, bootstrap)));
//   EXPECT_TRUE(HasError(runtime.Free(id, "test"), StatusCode::kInvalidArgument, "double free"));
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "runtime/status.h"

namespace hp::shmem::testutil {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// `text` contains `part`.
inline bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `status` is Ok; otherwise the failure shows the status.
inline ::testing::AssertionResult IsOk(const Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status.ToString();
}

// `status` has `code` and its message contains `part`.
inline ::testing::AssertionResult HasError(const Status& status, StatusCode code, const std::string& part) {
  if (status.code() == code && Contains(status.message(), part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << status.ToString() << "; expected " << StatusCodeName(code)
                                       << " containing '" << part << "'";
}

}  // namespace hp::shmem::testutil
