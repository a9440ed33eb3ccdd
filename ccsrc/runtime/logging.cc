#include "runtime/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace hp::shmem {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
std::mutex g_write_mu;   // whole lines, never interleaved between threads

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}
}  // namespace

void Logger::SetLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel Logger::Level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void Logger::SetRank(int rank) { g_rank.store(rank); }

void Logger::Write(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fprintf(stderr, "[hyper_parallel.shmem %s rank=%d] %s\n", LevelName(level), g_rank.load(), message.c_str());
  std::fflush(stderr);
}

std::string Hex(unsigned long long value) {
  char buffer[24];
  std::snprintf(buffer, sizeof(buffer), "0x%llx", value);
  return buffer;
}

std::string Decimal(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

}  // namespace hp::shmem
