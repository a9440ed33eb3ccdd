// One logger for the whole runtime. Each line is a record (level, rank, message). By default a record is written to
// stderr as "[hyper_parallel.shmem <LEVEL> rank=<r>] <message>"; while a face forwards records (to its framework's
// logging, e.g. Python's `logging`), they are queued instead and the face takes them on a thread of its own: the
// threads that write records (a call that released the GIL, a tensor's deleter, a stream's worker) may hold the
// runtime's locks, and must never wait for the framework.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace hp::shmem {

struct LogRecord {
  LogLevel level = LogLevel::kWarning;
  int rank = -1;
  std::string message;
};

class Logger {
 public:
  // Records queued and not yet taken, at most; past it the oldest are dropped and counted (a record says how many).
  static constexpr std::size_t kForwardedCapacity = 4096;

  static void SetLevel(LogLevel level);
  static LogLevel Level();
  static bool Enabled(LogLevel level) { return static_cast<int>(level) >= static_cast<int>(Level()); }
  // The rank shown in every line (-1 before a runtime knows it).
  static void SetRank(int rank);
  static void Write(LogLevel level, const std::string& message);

  // From now on records are queued for TakeForwarded instead of written to stderr.
  static void StartForwarding();
  // Records go to stderr again, those still queued first; a TakeForwarded waiting returns at once.
  static void StopForwarding();
  static bool Forwarding();
  // Waits up to `wait` for a record to be queued; true when one is (false on timeout or once forwarding stopped).
  // Takes nothing: a face's thread waits here without holding what its flush takes records under.
  static bool WaitForwarded(std::chrono::milliseconds wait);
  // The queued records, oldest first (and first, a record counting those dropped, if any).
  static std::vector<LogRecord> TakeForwarded();
};

#define HP_LOG(level, message)                                                          \
  do {                                                                                  \
    if (::hp::shmem::Logger::Enabled(::hp::shmem::LogLevel::level))                     \
      ::hp::shmem::Logger::Write(::hp::shmem::LogLevel::level, (message));              \
  } while (0)

// "0x7f00deadbeef"
std::string Hex(unsigned long long value);
// Shortest decimal form: "0.5", "120".
std::string Decimal(double value);

}  // namespace hp::shmem
