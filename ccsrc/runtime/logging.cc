#include "runtime/logging.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iterator>
#include <mutex>

namespace hp::shmem {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};

// One lock for both sinks: stderr lines are whole, never interleaved between threads, and a record is either
// queued or printed, never both.
std::mutex g_mu;
std::condition_variable g_queued;
bool g_forwarding = false;
std::deque<LogRecord> g_queue;
std::size_t g_dropped = 0;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}

void PrintLocked(const LogRecord& record) {
  std::fprintf(stderr, "[hyper_parallel.shmem %s rank=%d] %s\n", LevelName(record.level), record.rank,
               record.message.c_str());
  std::fflush(stderr);
}

// The count of records the queue had no room for, as a record of its own.
LogRecord DroppedRecord(std::size_t dropped) {
  return LogRecord{LogLevel::kWarning, g_rank.load(),
                   "log records dropped: count=" + std::to_string(dropped) +
                       " capacity=" + std::to_string(Logger::kForwardedCapacity) + " (nothing took them in time)"};
}
}  // namespace

void Logger::SetLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel Logger::Level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void Logger::SetRank(int rank) { g_rank.store(rank); }

void Logger::Write(LogLevel level, const std::string& message) {
  LogRecord record{level, g_rank.load(), message};
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_forwarding) {
    PrintLocked(record);
    return;
  }
  if (g_queue.size() >= kForwardedCapacity) {
    g_queue.pop_front();
    ++g_dropped;
  }
  g_queue.push_back(std::move(record));
  g_queued.notify_one();
}

void Logger::StartForwarding() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_forwarding = true;
}

void Logger::StopForwarding() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_dropped > 0) PrintLocked(DroppedRecord(g_dropped));
  for (const LogRecord& record : g_queue) PrintLocked(record);
  g_queue.clear();
  g_dropped = 0;
  g_forwarding = false;
  g_queued.notify_all();
}

bool Logger::Forwarding() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_forwarding;
}

bool Logger::WaitForwarded(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(g_mu);
  g_queued.wait_for(lock, wait, [] { return !g_forwarding || !g_queue.empty() || g_dropped > 0; });
  return g_forwarding && (!g_queue.empty() || g_dropped > 0);
}

std::vector<LogRecord> Logger::TakeForwarded() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<LogRecord> taken;
  if (g_dropped > 0) {
    taken.push_back(DroppedRecord(g_dropped));
    g_dropped = 0;
  }
  taken.insert(taken.end(), std::make_move_iterator(g_queue.begin()), std::make_move_iterator(g_queue.end()));
  g_queue.clear();
  return taken;
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
