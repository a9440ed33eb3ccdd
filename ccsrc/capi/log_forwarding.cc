// The C ABI's log forwarding (hp_shmem.h): the runtime's records, one per call, for a handler's logging thread.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>

#include "capi/hp_shmem.h"
#include "runtime/logging.h"

namespace {
// Records taken from the runtime in one batch and not yet handed out: one taker at a time takes them.
std::mutex g_take_mu;
std::deque<hp::shmem::LogRecord> g_taken;
}  // namespace

extern "C" {

void hp_shmem_log_forward(int on) {
  if (on) {
    hp::shmem::Logger::StartForwarding();
  } else {
    hp::shmem::Logger::StopForwarding();
  }
}

int hp_shmem_log_wait(int timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(g_take_mu);
    if (!g_taken.empty()) return 1;
  }
  return hp::shmem::Logger::WaitForwarded(std::chrono::milliseconds(std::max(timeout_ms, 0))) ? 1 : 0;
}

int hp_shmem_log_take(int* level, int* rank, char* message, size_t message_bytes) {
  std::lock_guard<std::mutex> lock(g_take_mu);
  if (g_taken.empty()) {
    auto batch = hp::shmem::Logger::TakeForwarded();
    g_taken.insert(g_taken.end(), std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
  }
  if (g_taken.empty()) return 0;
  const hp::shmem::LogRecord record = std::move(g_taken.front());
  g_taken.pop_front();
  if (level != nullptr) *level = static_cast<int>(record.level);
  if (rank != nullptr) *rank = record.rank;
  if (message != nullptr && message_bytes > 0) {
    const std::size_t length = std::min(record.message.size(), message_bytes - 1);
    std::memcpy(message, record.message.data(), length);
    message[length] = '\0';
  }
  return 1;
}

}  // extern "C"
