// Helpers shared by the googletest units that drive a Runtime over thread-ranks on the host device.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "runtime/host/host_device.h"
#include "runtime/logging.h"
#include "runtime/runtime.h"
#include "test_support.h"

namespace hp::shmem::testutil {

// Starts `runtime` on the host device with a 1 MiB heap, a 10 s timeout and error-level logs.
inline Status InitHost(Runtime& runtime, Bootstrap& bootstrap) {
  Config config;
  config.heap_size = kMiB;
  config.timeout_sec = 10.0;
  config.log_level = LogLevel::kError;
  return runtime.Init(config, std::make_unique<host::HostDevice>(), bootstrap);
}

// `status` has `code` and exactly `message`, and the runtime recorded it as its latest failure.
inline ::testing::AssertionResult Rejected(const Runtime& runtime, const Status& status, StatusCode code,
                                           const std::string& message) {
  if (status.code() != code || status.message() != message) {
    return ::testing::AssertionFailure() << "got " << status.ToString() << "; expected " << StatusCodeName(code)
                                         << ": " << message;
  }
  if (runtime.Snapshot().latest_failure != status.ToString()) {
    return ::testing::AssertionFailure() << "not recorded: " << runtime.Snapshot().latest_failure;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hp::shmem::testutil
