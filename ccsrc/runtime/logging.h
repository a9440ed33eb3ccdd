// One logger for the whole runtime: stderr lines "[hyper_parallel.shmem <LEVEL> rank=<r>] <message>".
#pragma once

#include <string>

#include "runtime/config.h"

namespace hp::shmem {

class Logger {
 public:
  static void SetLevel(LogLevel level);
  static LogLevel Level();
  static bool Enabled(LogLevel level) { return static_cast<int>(level) >= static_cast<int>(Level()); }
  // The rank shown in every line (-1 before a runtime knows it).
  static void SetRank(int rank);
  static void Write(LogLevel level, const std::string& message);
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
