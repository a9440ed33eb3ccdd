// Configuration read from the environment once per lifecycle (a new lifecycle re-reads it): the one reader of every
// variable the project takes, the user API's aliases and defaults included. The faces read it from here (the torch
// binding, the C ABI), never from the environment themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ops/wire_format.h"
#include "runtime/status.h"

namespace hp::shmem {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

struct Config {
  static constexpr std::size_t kDefaultHeapSize = std::size_t{1} << 30;  // 1 GiB
  static constexpr double kDefaultTimeoutSec = 120.0;

  std::size_t heap_size = kDefaultHeapSize;   // HYPER_PARALLEL_SHMEM_HEAP_SIZE, or its alias SYMMETRIC_MEMORY_HEAP_SIZE
  // Where heap_size came from: "default", the variable that set it, or "heap_size_bytes" (an init's argument). A tool
  // that sizes the heap for its own use leaves a size the user chose alone.
  std::string heap_size_source = "default";
  double timeout_sec = kDefaultTimeoutSec;    // HYPER_PARALLEL_SHMEM_TIMEOUT_SEC
  LogLevel log_level = LogLevel::kWarning;    // HYPER_PARALLEL_SHMEM_LOG_LEVEL (0 debug .. 3 error)
  std::string device = "host";                // HYPER_PARALLEL_SHMEM_DEVICE
  // HYPER_PARALLEL_SHMEM_CHECKS: "deferred" (default) or "strict". On a device that does not arbitrate (ascend), strict
  // checks every collective before its data moves, synchronizing the stream at each call's first sync (for
  // debugging); deferred checks afterwards, never synchronizing (docs/engine.md, "Deferred checks").
  bool strict_checks = false;
  // HYPER_PARALLEL_SHMEM_TLS_INFO: TLS settings of CANN SHMEM's config store (ascend device). CANN SHMEM v1.5.1 runs
  // that store without TLS whatever it is told, so the ascend device refuses any non-empty value.
  // Not in ToString: it names key material.
  std::string tls_info;
  // SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE as set ("" when unset): the default wire format of the user API's reductions.
  // Read with the rest, checked only by the calls that take the default (LowPrecisionDefault): a bad value fails the
  // reductions that would use it, not the lifecycle.
  std::string low_precision_dtype;

  // One "key=value" per field, space separated (for logs and debug_state).
  std::string ToString() const;
};

// Looks an environment variable up; std::nullopt when unset. Injected so that tests need no real environment.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup ProcessEnv();

// Parses every HYPER_PARALLEL_SHMEM_* variable and the user API's SYMMETRIC_MEMORY_* ones.
// Unset variables keep their defaults; a bad value fails with
// "`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be ..., but got '...'".
//
//   HEAP_SIZE:   a positive byte count, optionally with a binary suffix K/KB/KiB, M/MB/MiB, G/GB/GiB
//                (case-insensitive; all mean powers of 1024), e.g. "1073741824", "512M", "2GiB". Also read from
//                SYMMETRIC_MEMORY_HEAP_SIZE, its alias: both set and different is an error.
//                At least 1 MiB, at most 1 TiB.
//   TIMEOUT_SEC: a positive decimal number of seconds (fractions allowed), at most 86400.
//   LOG_LEVEL:   one of 0, 1, 2, 3, or DEBUG, INFO, WARNING, ERROR (case-insensitive).
//   DEVICE:      "host" (built into every wheel) or "ascend" (CANN SHMEM; needs a build with CANN).
//   TLS_INFO:    any text; the ascend device refuses a non-empty one (v1.5.1 cannot turn the config store's TLS on).
//   CHECKS:      "deferred" or "strict" (case-insensitive).
//   SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE: kept as set, checked by LowPrecisionDefault.
Result<Config> ParseConfig(const EnvLookup& env);

// The configuration a lifecycle starting now uses: the environment's (ParseConfig(ProcessEnv())), with the heap of
// `heap_size_override` bytes instead when it is not 0 (an acquire's explicit heap size, named `heap_size_bytes` in
// errors; the same limits apply).
Result<Config> ConfigForInit(std::size_t heap_size_override);

// The default wire format `config.low_precision_dtype` names (std::nullopt: off, for "", "none"), as the user API
// spells the names (case-insensitive, surrounding spaces and a "torch."/"mindspore." prefix ignored).
Result<std::optional<ops::LowFormat>> LowPrecisionDefault(const Config& config);

// Parses a byte count with the suffixes above; `name` is used in the error message.
Result<std::size_t> ParseByteSize(const std::string& name, const std::string& text);

}  // namespace hp::shmem
