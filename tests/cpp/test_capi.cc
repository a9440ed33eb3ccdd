// The C ABI (libhp_shmem_c.so, linked as the shared library: its exported symbols are what runs here).
//
// The C ABI drives the process-wide Runtime, so ranks are processes: each test forks one child per rank. The
// children bootstrap over an anonymous shared mapping made before the fork (a barrier and an all_gather on
// atomics, every spin bounded), report a failure's text through a pipe and their verdict through the exit code;
// the parent waits for them with a deadline and kills them when it passes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "capi/hp_shmem.h"

namespace {

using Clock = std::chrono::steady_clock;

// ---- the bootstrap: groups of ranks in shared memory ----

constexpr int kMaxRanks = 8;
constexpr std::size_t kSlotBytes = 4096;   // the runtime gathers segment names and small records
constexpr auto kSpinTimeout = std::chrono::seconds(30);

// One exchanging group: a sense-reversing barrier (the generation flips once everyone arrived) and a slot per rank.
struct alignas(64) Group {
  std::atomic<int> arrived;
  std::atomic<int> generation;
  char slots[kMaxRanks][kSlotBytes];
};
static_assert(std::atomic<int>::is_always_lock_free, "the barrier's atomics work across processes");

constexpr int kGroups = 4;   // 0: the root; 1, 2: sub-teams; 3: spare
struct Shared {
  Group groups[kGroups];
};

struct Member {
  Group* group;
  int rank;
  int world_size;
};

void WriteError(char* error, std::size_t error_bytes, const std::string& message) {
  if (error_bytes == 0) return;
  std::snprintf(error, error_bytes, "%s", message.c_str());
}

int GroupBarrier(void* context, char* error, std::size_t error_bytes) {
  auto* member = static_cast<Member*>(context);
  Group& g = *member->group;
  const int generation = g.generation.load();
  if (g.arrived.fetch_add(1) + 1 == member->world_size) {
    g.arrived.store(0);
    g.generation.fetch_add(1);
    return HP_SHMEM_OK;
  }
  const auto deadline = Clock::now() + kSpinTimeout;
  while (g.generation.load() == generation) {
    if (Clock::now() > deadline) {
      WriteError(error, error_bytes, "test bootstrap barrier timed out: rank=" + std::to_string(member->rank));
      return HP_SHMEM_TIMEOUT;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return HP_SHMEM_OK;
}

int GroupAllGather(void* context, const void* in, std::size_t bytes, void* out, char* error, std::size_t error_bytes) {
  auto* member = static_cast<Member*>(context);
  if (bytes > kSlotBytes) {
    WriteError(error, error_bytes, "test bootstrap all_gather too large: bytes=" + std::to_string(bytes));
    return HP_SHMEM_DEVICE_ERROR;
  }
  // The previous exchange's trailing barrier let every rank read its slots: they are free to write.
  std::memcpy(member->group->slots[member->rank], in, bytes);
  if (int rc = GroupBarrier(context, error, error_bytes); rc != HP_SHMEM_OK) return rc;
  for (int r = 0; r < member->world_size; ++r) {
    std::memcpy(static_cast<char*>(out) + static_cast<std::size_t>(r) * bytes, member->group->slots[r], bytes);
  }
  return GroupBarrier(context, error, error_bytes);
}

hp_shmem_bootstrap BootstrapOf(Member* member) {
  hp_shmem_bootstrap b{};
  b.context = member;
  b.rank = member->rank;
  b.world_size = member->world_size;
  b.all_gather = &GroupAllGather;
  b.barrier = &GroupBarrier;
  return b;
}

// ---- a child's checks: the first failure ends the child with its text ----

struct ChildFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Where(const char* file, int line) { return std::string(file) + ":" + std::to_string(line) + ": "; }

#define REQUIRE(cond)                                                                                \
  do {                                                                                               \
    if (!(cond)) throw ChildFailure(Where(__FILE__, __LINE__) + "failed: " #cond " (last_error='" + \
                                    hp_shmem_last_error() + "')");                                   \
  } while (0)

#define REQUIRE_RC(expected, call)                                                                           \
  do {                                                                                                       \
    const int rc_ = (call);                                                                                  \
    if (rc_ != (expected)) {                                                                                 \
      throw ChildFailure(Where(__FILE__, __LINE__) + #call " returned " + std::to_string(rc_) + ", expected " + \
                         std::to_string(expected) + " (last_error='" + hp_shmem_last_error() + "')");        \
    }                                                                                                        \
  } while (0)

#define REQUIRE_OK(call)                                                                               \
  do {                                                                                                 \
    REQUIRE_RC(HP_SHMEM_OK, call);                                                                     \
    if (hp_shmem_last_error()[0] != '\0') {                                                            \
      throw ChildFailure(Where(__FILE__, __LINE__) + #call " succeeded but left last_error='" +       \
                         hp_shmem_last_error() + "'");                                                 \
    }                                                                                                  \
  } while (0)

#define REQUIRE_ERROR(code, message, call)                                                               \
  do {                                                                                                   \
    REQUIRE_RC(code, call);                                                                              \
    if (std::string(hp_shmem_last_error()) != (message)) {                                               \
      throw ChildFailure(Where(__FILE__, __LINE__) + #call ": last_error='" + hp_shmem_last_error() +   \
                         "', expected '" + std::string(message) + "'");                                  \
    }                                                                                                    \
  } while (0)

// A collective's bad argument is refused on every member of the team: the message, then who refused it.
#define REQUIRE_REFUSAL(code, message, call)                                                             \
  do {                                                                                                   \
    REQUIRE_RC(code, call);                                                                              \
    const std::string error = hp_shmem_last_error();                                                     \
    if (error.rfind(std::string(message) + " (refused by rank 0: op=", 0) != 0 ||                        \
        error.find("; every member fails this call)") == std::string::npos) {                            \
      throw ChildFailure(Where(__FILE__, __LINE__) + #call ": last_error='" + error + "', expected '" +  \
                         std::string(message) + " (refused by rank 0: op=...; every member fails this call)'"); \
    }                                                                                                    \
  } while (0)

// What a rank runs: its root membership and the shared groups.
struct Rank {
  int rank;
  int world_size;
  Shared* shared;
  Member root;
  hp_shmem_bootstrap bootstrap;
};

using RankBody = std::function<void(Rank&)>;

// Forks `world_size` ranks running `body` and returns every rank's failure text ("" for success). Never hangs:
// past the deadline every child still running is killed and named.
std::vector<std::string> RunRanks(int world_size, const RankBody& body, std::chrono::seconds deadline_after =
                                                                            std::chrono::seconds(120)) {
  void* mapping = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return {std::string("mmap failed: ") + std::strerror(errno)};
  auto* shared = new (mapping) Shared();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int r = 0; r < world_size; ++r) {
    int fds[2];
    if (pipe(fds) != 0) return {std::string("pipe failed: ") + std::strerror(errno)};
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      // A small heap and short waits: tests run beside others on few cores.
      setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "4M", 1);
      setenv("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", "10", 1);
      setenv("HYPER_PARALLEL_SHMEM_DEVICE", "host", 1);
      std::string failure;
      try {
        Rank me{r, world_size, shared, Member{&shared->groups[0], r, world_size}, {}};
        me.bootstrap = BootstrapOf(&me.root);
        body(me);
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "unknown exception";
      }
      if (!failure.empty()) {
        failure = "rank " + std::to_string(r) + ": " + failure;
        ssize_t ignored = write(fds[1], failure.data(), failure.size());
        (void)ignored;
      }
      _exit(failure.empty() ? 0 : 1);   // no atexit handlers, no gtest teardown in a child
    }
    close(fds[1]);
    if (pid < 0) return {std::string("fork failed: ") + std::strerror(errno)};
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<std::string> results(static_cast<std::size_t>(world_size));
  std::vector<bool> done(static_cast<std::size_t>(world_size), false);
  const auto deadline = Clock::now() + deadline_after;
  int running = world_size;
  while (running > 0) {
    for (int r = 0; r < world_size; ++r) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(pipes[static_cast<std::size_t>(r)], buffer, sizeof(buffer))) > 0) {
        results[static_cast<std::size_t>(r)].append(buffer, static_cast<std::size_t>(n));
      }
      if (done[static_cast<std::size_t>(r)]) continue;
      int status = 0;
      if (waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) == pids[static_cast<std::size_t>(r)]) {
        done[static_cast<std::size_t>(r)] = true;
        --running;
        const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!clean && results[static_cast<std::size_t>(r)].empty()) {
          results[static_cast<std::size_t>(r)] =
              "rank " + std::to_string(r) + " ended without a report: status=" + std::to_string(status);
        }
      }
    }
    if (running > 0 && Clock::now() > deadline) {
      for (int r = 0; r < world_size; ++r) {
        if (done[static_cast<std::size_t>(r)]) continue;
        kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
        results[static_cast<std::size_t>(r)] += " rank " + std::to_string(r) + " killed at the test's deadline";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int fd : pipes) close(fd);
  munmap(mapping, sizeof(Shared));
  return results;
}

void ExpectAllRanksPass(const std::vector<std::string>& results) {
  for (std::size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

void InitRoot(Rank& me) {
  REQUIRE_OK(hp_shmem_init(&me.bootstrap, 0));
  REQUIRE(hp_shmem_state() == 1);
  REQUIRE(hp_shmem_rank() == me.rank);
  REQUIRE(hp_shmem_world_size() == me.world_size);
}

void ShutdownRoot(Rank& me) {
  REQUIRE_OK(hp_shmem_shutdown(&me.bootstrap));
  REQUIRE(hp_shmem_state() == 0);
}

std::uint64_t CreateRootTeam(Rank& me) {
  std::vector<int> pes(static_cast<std::size_t>(me.world_size));
  std::iota(pes.begin(), pes.end(), 0);
  std::uint64_t team = 0;
  REQUIRE_OK(hp_shmem_team_create(pes.data(), me.world_size, &me.bootstrap, &team));
  return team;
}

const hp_shmem_element_type kFloat32{"float32", 4, HP_SHMEM_FLOAT32};
const hp_shmem_element_type kInt32{"int32", 4, HP_SHMEM_INT32};
const hp_shmem_element_type kInt64{"int64", 8, HP_SHMEM_INT64};

// ---- a minimal JSON reader: enough to check the debug state's document round-trips ----

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;
  const Json& operator[](const std::string& key) const {
    auto it = fields.find(key);
    if (kind != kObject || it == fields.end()) throw ChildFailure("JSON key missing: " + key);
    return it->second;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  Json Parse() {
    Json value = Value();
    Space();
    if (at_ != s_.size()) Fail("trailing text");
    return value;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    throw ChildFailure("JSON " + what + " at " + std::to_string(at_) + " in " + s_);
  }
  void Space() {
    while (at_ < s_.size() && std::strchr(" \t\r\n", s_[at_]) != nullptr) ++at_;
  }
  bool Take(char c) {
    Space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void Expect(char c) {
    if (!Take(c)) Fail(std::string("expected '") + c + "'");
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (at_ < s_.size() && s_[at_] != '"') {
      char c = s_[at_++];
      if (static_cast<unsigned char>(c) < 0x20) Fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) Fail("unterminated escape");
      c = s_[at_++];
      switch (c) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (at_ + 4 > s_.size()) Fail("short \\u escape");
          const unsigned long code = std::stoul(s_.substr(at_, 4), nullptr, 16);
          if (code >= 0x80) Fail("non-ASCII \\u escape (not produced for control characters)");
          out += static_cast<char>(code);
          at_ += 4;
          break;
        }
        default: Fail("bad escape");
      }
    }
    Expect('"');
    return out;
  }
  Json Value() {
    Space();
    if (at_ >= s_.size()) Fail("unexpected end");
    Json v;
    const char c = s_[at_];
    if (c == '{') {
      ++at_;
      v.kind = Json::kObject;
      if (Take('}')) return v;
      do {
        std::string key = String();
        Expect(':');
        v.fields[key] = Value();
      } while (Take(','));
      Expect('}');
    } else if (c == '[') {
      ++at_;
      v.kind = Json::kArray;
      if (Take(']')) return v;
      do v.items.push_back(Value());
      while (Take(','));
      Expect(']');
    } else if (c == '"') {
      v.kind = Json::kString;
      v.text = String();
    } else if (s_.compare(at_, 4, "true") == 0 || s_.compare(at_, 5, "false") == 0) {
      v.kind = Json::kBool;
      v.boolean = s_[at_] == 't';
      at_ += v.boolean ? 4 : 5;
    } else {
      std::size_t used = 0;
      v.kind = Json::kNumber;
      try {
        v.number = std::stod(s_.substr(at_), &used);
      } catch (const std::exception&) {
        Fail("bad value");
      }
      at_ += used;
    }
    return v;
  }

  const std::string& s_;
  std::size_t at_ = 0;
};

// A JSON document of the C ABI through the needed/capacity protocol, parsed.
Json ReadJson(int (*read)(char* buffer, size_t capacity, size_t* needed)) {
  std::size_t needed = 0;
  REQUIRE_OK(read(nullptr, 0, &needed));
  REQUIRE(needed > 2);
  std::vector<char> small(needed - 1, 'x');
  std::size_t again = 0;
  REQUIRE_OK(read(small.data(), small.size(), &again));
  REQUIRE(small[0] == '\0');   // too small: no truncated document
  // The state may grow between calls only if something else runs; nothing does here.
  REQUIRE(again == needed);
  std::vector<char> buffer(needed, 'x');
  REQUIRE_OK(read(buffer.data(), buffer.size(), &again));
  REQUIRE(again == needed);
  REQUIRE(std::strlen(buffer.data()) == needed - 1);
  return JsonParser(buffer.data()).Parse();
}

Json DebugState() { return ReadJson(&hp_shmem_debug_state_json); }

class CapiWorld : public ::testing::TestWithParam<int> {};

// ---- tests ----

TEST(Capi, AbiVersionAndNoErrorBeforeAnyCall) {
  EXPECT_EQ(hp_shmem_abi_version(), HP_SHMEM_ABI_VERSION);
  EXPECT_STREQ(hp_shmem_last_error(), "");
}

TEST(Capi, StatusNamesAreTheRuntimes) {
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_OK), "OK");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_TYPE_ERROR), "TYPE_ERROR");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_STATE_ERROR), "STATE_ERROR");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_TIMEOUT), "TIMEOUT");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_OUT_OF_MEMORY), "OUT_OF_MEMORY");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_MISMATCH), "MISMATCH");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_DEVICE_ERROR), "DEVICE_ERROR");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_INTERNAL), "INTERNAL");
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_INTERRUPTED), "INTERRUPTED");
  EXPECT_STREQ(hp_shmem_status_name(-1), "UNKNOWN");
  EXPECT_STREQ(hp_shmem_status_name(10), "UNKNOWN");
  // It keeps the failed call's message readable.
  ASSERT_EQ(hp_shmem_init(nullptr, 0), HP_SHMEM_INVALID_ARGUMENT);
  EXPECT_STREQ(hp_shmem_status_name(HP_SHMEM_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(hp_shmem_last_error(), "`bootstrap` must be a non-null pointer, but got NULL");
}

// The data plane over the root: put, get, signal and wait, barrier, reduce, then free and shut down.
TEST_P(CapiWorld, DataPlaneFromInitToShutdown) {
  ExpectAllRanksPass(RunRanks(GetParam(), [](Rank& me) {
    InitRoot(me);
    const int n = me.world_size;
    const int next = (me.rank + 1) % n;
    const int prev = (me.rank + n - 1) % n;
    constexpr int kCount = 64;
    hp_shmem_allocation data{};
    REQUIRE_OK(hp_shmem_allocate(kCount * sizeof(float), 64, "test_capi data", &data));
    REQUIRE(data.address != nullptr && data.bytes == kCount * sizeof(float) && data.id > 0);
    hp_shmem_allocation signal{};
    REQUIRE_OK(hp_shmem_allocate(sizeof(std::int64_t), 8, "test_capi signal", &signal));
    auto* values = static_cast<float*>(data.address);
    std::fill(values, values + kCount, 0.0f);
    *static_cast<std::int64_t*>(signal.address) = 0;
    REQUIRE_OK(hp_shmem_barrier());

    // Put into the next rank's copy, then tell it so: the signal is ordered after the put.
    std::vector<float> mine(kCount);
    for (int i = 0; i < kCount; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>(me.rank * 1000 + i);
    REQUIRE_OK(hp_shmem_put(data.address, mine.data(), data.bytes, data.bytes, next));
    REQUIRE_OK(hp_shmem_signal(signal.address, 8, me.rank + 1, /*add*/ 1, next));
    REQUIRE_OK(hp_shmem_wait_signal(signal.address, 8, /*eq*/ 0, prev + 1));
    for (int i = 0; i < kCount; ++i) REQUIRE(values[i] == static_cast<float>(prev * 1000 + i));
    REQUIRE_OK(hp_shmem_barrier());

    // Get the previous rank's copy back (it holds what its own previous rank put).
    std::vector<float> got(kCount);
    REQUIRE_OK(hp_shmem_get(got.data(), data.address, data.bytes, data.bytes, prev));
    const int prev2 = (prev + n - 1) % n;
    for (int i = 0; i < kCount; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == static_cast<float>(prev2 * 1000 + i));
    void* peer = nullptr;
    REQUIRE_OK(hp_shmem_peer_address(data.address, data.bytes, prev, &peer));
    REQUIRE(peer != nullptr && std::memcmp(peer, got.data(), data.bytes) == 0);
    // Zero bytes: a checked no-op, NULL allowed.
    REQUIRE_OK(hp_shmem_put(data.address, nullptr, 0, 0, next));
    REQUIRE_OK(hp_shmem_barrier());

    // put_with_signal: both as one call, the data visible once the signal is.
    for (int i = 0; i < kCount; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>(me.rank * 1000 - i);
    REQUIRE_OK(hp_shmem_put_with_signal(data.address, mine.data(), data.bytes, data.bytes, signal.address, 8,
                                        -(me.rank + 1), /*set*/ 0, next));
    REQUIRE_OK(hp_shmem_wait_signal(signal.address, 8, /*eq*/ 0, -(prev + 1)));
    for (int i = 0; i < kCount; ++i) REQUIRE(values[i] == static_cast<float>(prev * 1000 - i));
    REQUIRE_OK(hp_shmem_barrier());

    // Reduce every rank's copy into local memory, in the order of `pes`.
    for (int i = 0; i < kCount; ++i) values[i] = static_cast<float>(me.rank + 1);
    REQUIRE_OK(hp_shmem_barrier());
    std::vector<int> pes(static_cast<std::size_t>(n));
    std::iota(pes.begin(), pes.end(), 0);
    std::vector<float> sum(kCount);
    REQUIRE_OK(hp_shmem_reduce(sum.data(), data.bytes, data.address, data.bytes, HP_SHMEM_FLOAT32, /*sum*/ 0,
                               pes.data(), n));
    for (float v : sum) REQUIRE(v == static_cast<float>(n * (n + 1) / 2));
    REQUIRE_OK(hp_shmem_barrier());   // nobody frees memory a peer still reduces from

    REQUIRE_OK(hp_shmem_free(signal.id, "test_capi signal"));
    REQUIRE_OK(hp_shmem_free(data.id, "test_capi data"));
    ShutdownRoot(me);
    // A second lifecycle starts on the same process.
    InitRoot(me);
    ShutdownRoot(me);
  }));
}

// Teams on every rank and on two halves, and every collective of the engine.
TEST_P(CapiWorld, TeamsAndCollectives) {
  ExpectAllRanksPass(RunRanks(GetParam(), [](Rank& me) {
    InitRoot(me);
    const int n = me.world_size;
    const std::uint64_t team = CreateRootTeam(me);
    REQUIRE_OK(hp_shmem_team_barrier(team, HP_SHMEM_ROLE_FORWARD));

    // all_gather: 3 floats from each rank, in rank order.
    std::vector<float> in(3), out(static_cast<std::size_t>(3 * n));
    for (int i = 0; i < 3; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(10 * me.rank + i);
    REQUIRE_OK(hp_shmem_all_gather(team, out.data(), out.size() * 4, in.data(), in.size() * 4, &kFloat32, HP_SHMEM_ROLE_FORWARD));
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 3; ++i) REQUIRE(out[static_cast<std::size_t>(3 * r + i)] == static_cast<float>(10 * r + i));
    }

    // all_reduce in place (int32 sum), out of place (float32 max), and on a low-precision wire (bfloat16 carries
    // these small integers and their sums exactly).
    std::vector<std::int32_t> ints(17, me.rank + 1);
    REQUIRE_OK(hp_shmem_all_reduce(team, ints.data(), nullptr, ints.size() * 4, HP_SHMEM_INT32, 0, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    for (auto v : ints) REQUIRE(v == n * (n + 1) / 2);
    std::vector<float> source(33), result(33, -1.0f);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>((me.rank * 7 + i) % 11);
    REQUIRE_OK(hp_shmem_all_reduce(team, result.data(), source.data(), source.size() * 4, HP_SHMEM_FLOAT32,
                                   /*max*/ 2, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    for (std::size_t i = 0; i < result.size(); ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected = std::max(expected, static_cast<float>((r * 7 + i) % 11));
      REQUIRE(result[i] == expected);
    }
    std::vector<float> low(300);
    for (std::size_t i = 0; i < low.size(); ++i) low[i] = static_cast<float>(me.rank + i % 5);
    REQUIRE_OK(hp_shmem_all_reduce(team, low.data(), nullptr, low.size() * 4, HP_SHMEM_FLOAT32, 0,
                                   HP_SHMEM_WIRE_BFLOAT16, HP_SHMEM_ROLE_FORWARD));
    for (std::size_t i = 0; i < low.size(); ++i) {
      REQUIRE(low[i] == static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 5)));
    }

    // reduce_scatter: n parts of 5 doubles; this rank gets its part summed.
    std::vector<double> parts(static_cast<std::size_t>(5 * n)), mine(5);
    for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = static_cast<double>(me.rank) + 0.5 * static_cast<double>(i);
    REQUIRE_OK(hp_shmem_reduce_scatter(team, mine.data(), mine.size() * 8, parts.data(), parts.size() * 8,
                                       HP_SHMEM_FLOAT64, 0, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    for (int i = 0; i < 5; ++i) {
      const double index = 5.0 * me.rank + i;
      REQUIRE(mine[static_cast<std::size_t>(i)] == n * (n - 1) / 2.0 + n * 0.5 * index);
    }

    // all_to_all with unequal counts: rank r sends r + j + 1 ints to rank j.
    std::vector<std::vector<std::int32_t>> sends(static_cast<std::size_t>(n));
    std::vector<const void*> send_ptrs;
    std::vector<std::size_t> send_bytes;
    for (int j = 0; j < n; ++j) {
      sends[static_cast<std::size_t>(j)].assign(static_cast<std::size_t>(me.rank + j + 1), 100 * me.rank + j);
      send_ptrs.push_back(sends[static_cast<std::size_t>(j)].data());
      send_bytes.push_back(sends[static_cast<std::size_t>(j)].size() * 4);
    }
    std::vector<std::uint64_t> counts;
    std::size_t total = 0;
    for (int i = 0; i < n; ++i) {
      counts.push_back(static_cast<std::uint64_t>(i + me.rank + 1));
      total += counts.back();
    }
    std::vector<std::int32_t> received(total, -1);
    REQUIRE_OK(hp_shmem_all_to_all(team, send_ptrs.data(), send_bytes.data(), n, received.data(), total * 4,
                                   counts.data(), n, &kInt32, HP_SHMEM_ROLE_FORWARD));
    std::size_t at = 0;
    for (int i = 0; i < n; ++i) {
      for (std::uint64_t k = 0; k < counts[static_cast<std::size_t>(i)]; ++k) REQUIRE(received[at++] == 100 * i + me.rank);
    }

    // MoE dispatch of 2 experts per rank then combine (its backward), on ordinary buffers: rank r sends r + e + 1
    // rows of 2 floats to expert e of every rank; combine brings every row back. Then an `output` one row short on
    // the last rank fails on every rank, naming it, with nothing written.
    {
      const int ne = 2;
      const auto nsplits = static_cast<std::size_t>(n * ne);
      std::vector<std::int64_t> splits(nsplits), dispatched(2 * nsplits, -1), restored(2 * nsplits, -1);
      std::vector<float> rows;
      for (int peer = 0; peer < n; ++peer) {
        for (int e = 0; e < ne; ++e) {
          splits[static_cast<std::size_t>(peer * ne + e)] = me.rank + e + 1;
          for (int k = 0; k < me.rank + e + 1; ++k) {
            rows.push_back(static_cast<float>(1000 * me.rank + 100 * peer + 10 * e + k));
            rows.push_back(-rows.back());
          }
        }
      }
      const std::int64_t sent = static_cast<std::int64_t>(rows.size() / 2);
      std::int64_t expected = 0;
      for (int s = 0; s < n; ++s) expected += ne * (s + 1) + 1;   // what every rank receives
      std::vector<float> experts(static_cast<std::size_t>(2 * expected), 0.0F), back(rows.size(), 0.0F);
      REQUIRE_OK(hp_shmem_moe_exchange(team, 0, ne, rows.data(), sent, experts.data(), expected, 8, splits.data(),
                                       nullptr, 0, dispatched.data(), dispatched.data() + nsplits,
                                       HP_SHMEM_ROLE_FORWARD));
      REQUIRE(dispatched[0] == 1 && dispatched[nsplits] == 0);   // expert 0's chunk from rank 0 comes first
      REQUIRE(experts[0] == static_cast<float>(100 * me.rank));
      REQUIRE_OK(hp_shmem_moe_exchange(team, 1, ne, experts.data(), expected, back.data(), sent, 8, dispatched.data(),
                                       dispatched.data() + nsplits, 0, restored.data(), restored.data() + nsplits,
                                       HP_SHMEM_ROLE_BACKWARD));
      REQUIRE(back == rows);
      REQUIRE(std::equal(splits.begin(), splits.end(), restored.begin()));
      std::vector<float> short_output(experts.size(), -5.0F);
      std::vector<std::int64_t> untouched(2 * nsplits, -9);
      const bool last = me.rank == n - 1;
      REQUIRE_RC(HP_SHMEM_INVALID_ARGUMENT,
                 hp_shmem_moe_exchange(team, 0, ne, rows.data(), sent, short_output.data(),
                                       last ? expected - 1 : expected, 8, splits.data(), nullptr, 0, untouched.data(),
                                       untouched.data() + nsplits, HP_SHMEM_ROLE_FORWARD));
      const std::string why = hp_shmem_last_error();
      REQUIRE(why.find("`out` of rank " + std::to_string(n - 1) + " must hold the " + std::to_string(expected) +
                       " rows its peers send") != std::string::npos);
      REQUIRE(why.find("but got " + std::to_string(expected - 1) + " rows") != std::string::npos);
      REQUIRE(std::all_of(untouched.begin(), untouched.end(), [](std::int64_t v) { return v == -9; }));
      REQUIRE(std::all_of(short_output.begin(), short_output.end(), [](float v) { return v == -5.0F; }));
    }

    // send/recv in pairs (0->1, 2->3), then back.
    std::vector<std::int64_t> message(40);
    const int partner = me.rank ^ 1;
    for (int round = 0; round < 2; ++round) {
      const bool sender = (me.rank % 2 == 0) == (round == 0);
      if (sender) {
        std::iota(message.begin(), message.end(), std::int64_t{1000} * me.rank + round);
        REQUIRE_OK(hp_shmem_send(team, message.data(), message.size() * 8, &kInt64, partner));
      } else {
        std::fill(message.begin(), message.end(), -1);
        REQUIRE_OK(hp_shmem_recv(team, message.data(), message.size() * 8, &kInt64, partner));
        for (std::size_t i = 0; i < message.size(); ++i) {
          REQUIRE(message[i] == std::int64_t{1000} * partner + round + static_cast<std::int64_t>(i));
        }
      }
    }

    // Two halves, each a team of its own over its own exchanging group; group rank = position in `pes`.
    const int half = n / 2;
    const bool low_half = me.rank < half;
    std::vector<int> pes;
    for (int pe = low_half ? 0 : half; pe < (low_half ? half : n); ++pe) pes.push_back(pe);
    Member sub_member{&me.shared->groups[low_half ? 1 : 2], me.rank - (low_half ? 0 : half),
                      static_cast<int>(pes.size())};
    const hp_shmem_bootstrap sub_bootstrap = BootstrapOf(&sub_member);
    std::uint64_t sub = 0;
    REQUIRE_OK(hp_shmem_team_create(pes.data(), static_cast<int>(pes.size()), &sub_bootstrap, &sub));
    REQUIRE(sub != team);
    std::vector<std::int64_t> sub_values(9, me.rank);
    REQUIRE_OK(hp_shmem_all_reduce(sub, sub_values.data(), nullptr, sub_values.size() * 8, HP_SHMEM_INT64, 0, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    std::int64_t sub_sum = 0;
    for (int pe : pes) sub_sum += pe;
    for (auto v : sub_values) REQUIRE(v == sub_sum);
    REQUIRE_OK(hp_shmem_team_release(sub));
    REQUIRE_RC(HP_SHMEM_STATE_ERROR, hp_shmem_team_barrier(sub, HP_SHMEM_ROLE_FORWARD));   // released: refused

    // The same halves as node teams of the whole world (as the phases of a team that spans nodes make them): a
    // refusal by a half's first member names the whole team, then the half's own ranks.
    std::vector<int> every(static_cast<std::size_t>(n));
    std::iota(every.begin(), every.end(), 0);
    std::uint64_t node = 0;
    REQUIRE_OK(hp_shmem_node_team_create(pes.data(), static_cast<int>(pes.size()), every.data(), n, &sub_bootstrap,
                                         &node));
    const int barrier = 1;   // Collective::kBarrier
    const int refused = me.rank == pes[0]
                            ? hp_shmem_refuse(node, barrier, HP_SHMEM_STATE_ERROR, "this half says no", HP_SHMEM_ROLE_FORWARD)
                            : hp_shmem_team_barrier(node, HP_SHMEM_ROLE_FORWARD);
    REQUIRE(refused == HP_SHMEM_STATE_ERROR);
    std::string node_ranks;
    for (int pe : pes) node_ranks += (node_ranks.empty() ? "" : ",") + std::to_string(pe);
    std::string whole;
    for (int pe : every) whole += (whole.empty() ? "" : ",") + std::to_string(pe);
    REQUIRE(std::string(hp_shmem_last_error()) ==
            "this half says no (refused by rank " + std::to_string(pes[0]) + ": op=barrier team_ranks=[" + whole +
                "] node_team_ranks=[" + node_ranks + "]; every member fails this call)");
    REQUIRE_OK(hp_shmem_team_barrier(node, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_OK(hp_shmem_team_release(node));

    REQUIRE_OK(hp_shmem_team_barrier(team, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_OK(hp_shmem_team_release(team));
    ShutdownRoot(me);
  }));
}

// Ranks that disagree on a collective all find out, and the team still works afterwards.
TEST_P(CapiWorld, MismatchIsSeenByEveryRankAndTheTeamRecovers) {
  ExpectAllRanksPass(RunRanks(GetParam(), [](Rank& me) {
    InitRoot(me);
    const int n = me.world_size;
    const std::uint64_t team = CreateRootTeam(me);
    std::vector<float> values(me.rank == 0 ? 4 : 8, 1.0f);
    REQUIRE_RC(HP_SHMEM_MISMATCH, hp_shmem_all_reduce(team, values.data(), nullptr, values.size() * 4,
                                                      HP_SHMEM_FLOAT32, 0, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    REQUIRE(hp_shmem_last_error()[0] != '\0');
    for (float v : values) REQUIRE(v == 1.0f);   // nothing was written
    std::vector<float> agreed(8, static_cast<float>(me.rank));
    REQUIRE_OK(hp_shmem_all_reduce(team, agreed.data(), nullptr, agreed.size() * 4, HP_SHMEM_FLOAT32, 0, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    for (float v : agreed) REQUIRE(v == static_cast<float>(n * (n - 1) / 2));
    REQUIRE_OK(hp_shmem_team_release(team));
    ShutdownRoot(me);
  }));
}

// hp_shmem_agree: every member's values in group-rank order; members whose calls differ all fail, each naming both
// calls, and the team stays usable; too little room for the rows is refused before the sync.
TEST_P(CapiWorld, AgreePublishesEveryMembersValuesAndEveryMemberSeesADifferentCall) {
  ExpectAllRanksPass(RunRanks(GetParam(), [](Rank& me) {
    InitRoot(me);
    const std::size_t n = static_cast<std::size_t>(me.world_size);
    const std::uint64_t team = CreateRootTeam(me);
    constexpr int kAllReduce = 3;   // the Collective numbering's all_reduce (hp_shmem_numberings_json)
    constexpr int kSumPlusOne = 1;  // ReduceOp sum + 1
    const std::int64_t mine[2] = {me.rank, 100 + me.rank};
    std::vector<std::int64_t> rows(2 * n, -1);
    std::vector<std::size_t> lengths(n, 0);
    REQUIRE_OK(hp_shmem_agree(team, kAllReduce, "float32", 4, 8, kSumPlusOne, HP_SHMEM_WIRE_FULL, -1, mine, 2,
                              HP_SHMEM_ROLE_FORWARD, rows.data(), rows.size(), lengths.data(), n));
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(lengths[i] == 2);
      REQUIRE(rows[2 * i] == static_cast<std::int64_t>(i) && rows[2 * i + 1] == 100 + static_cast<std::int64_t>(i));
    }
    // Rank 0 says 4 elements, the others 8: every rank fails, naming both counts.
    REQUIRE_RC(HP_SHMEM_MISMATCH,
               hp_shmem_agree(team, kAllReduce, "float32", 4, me.rank == 0 ? 4 : 8, kSumPlusOne, HP_SHMEM_WIRE_FULL,
                              -1, nullptr, 0, HP_SHMEM_ROLE_FORWARD, nullptr, 0, lengths.data(), n));
    const std::string mismatch = hp_shmem_last_error();
    REQUIRE(mismatch.find("count=4") != std::string::npos && mismatch.find("count=8") != std::string::npos);
    // No values: a plain fingerprinted sync, which the team still makes.
    REQUIRE_OK(hp_shmem_agree(team, kAllReduce, "float32", 4, 8, kSumPlusOne, HP_SHMEM_WIRE_FULL, -1, nullptr, 0,
                              HP_SHMEM_ROLE_FORWARD, nullptr, 0, lengths.data(), n));
    REQUIRE_RC(HP_SHMEM_INVALID_ARGUMENT,
               hp_shmem_agree(team, kAllReduce, "float32", 4, 8, kSumPlusOne, HP_SHMEM_WIRE_FULL, -1, mine, 2,
                              HP_SHMEM_ROLE_FORWARD, rows.data(), 2 * n - 1, lengths.data(), n));
    REQUIRE(std::string(hp_shmem_last_error()) == "`rows_capacity` must hold members x value_count = " +
                                                      std::to_string(2 * n) + " values, but got " +
                                                      std::to_string(2 * n - 1));
    REQUIRE_OK(hp_shmem_team_release(team));
    ShutdownRoot(me);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, CapiWorld, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "Ranks"; });

// The checks of the C layer: exact messages, and the runtime left as it was.
TEST(Capi, ArgumentErrorsHaveExactMessagesAndChangeNothing) {
  ExpectAllRanksPass(RunRanks(2, [](Rank& me) {
    // Before init: the runtime's own state check.
    int dummy = 0;
    REQUIRE_RC(HP_SHMEM_STATE_ERROR, hp_shmem_put(&dummy, &dummy, 4, 4, 0));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`bootstrap` must be a non-null pointer, but got NULL",
                  hp_shmem_init(nullptr, 0));
    hp_shmem_bootstrap broken = me.bootstrap;
    broken.barrier = nullptr;
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`bootstrap->barrier` must be a non-null function pointer, but got NULL",
                  hp_shmem_init(&broken, 0));
    REQUIRE(hp_shmem_state() == 0);
    InitRoot(me);
    const std::uint64_t team = CreateRootTeam(me);
    hp_shmem_allocation a{};
    REQUIRE_OK(hp_shmem_allocate(256, 64, "args", &a));
    const Json before = DebugState();

    int pes[2] = {0, 1};
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`team` must be a non-null pointer, but got NULL",
                  hp_shmem_team_create(pes, 2, &me.bootstrap, nullptr));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`npes` must be >= 0, but got -1",
                  hp_shmem_team_create(pes, -1, &me.bootstrap, nullptr));
    std::uint64_t node = 0;
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`nserves` must be at least 1, but got 0",
                  hp_shmem_node_team_create(pes, 2, pes, 0, &me.bootstrap, &node));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`serves` must be a non-null pointer, but got NULL",
                  hp_shmem_node_team_create(pes, 2, nullptr, 2, &me.bootstrap, &node));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`team` must be a non-null pointer, but got NULL",
                  hp_shmem_node_team_create(pes, 2, pes, 2, &me.bootstrap, nullptr));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`pes` must be a non-null pointer, but got NULL",
                  hp_shmem_reduce(a.address, 4, a.address, 4, HP_SHMEM_FLOAT32, 0, nullptr, 2));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`out` must be a non-null pointer, but got NULL",
                  hp_shmem_allocate(64, 64, "args", nullptr));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`src` must be a non-null pointer, but got NULL",
                  hp_shmem_put(a.address, nullptr, 4, 4, 1));
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT,
                  "`reduce_op` must be one of 0 (sum), 1 (avg), 2 (max), 3 (min), but got 7",
                  hp_shmem_all_reduce(team, a.address, nullptr, 16, HP_SHMEM_FLOAT32, 7, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_REFUSAL(HP_SHMEM_TYPE_ERROR,
                  "`dtype` must be one of 0 (float32), 1 (float64), 2 (float16), 3 (bfloat16), 4 (int8), 5 (uint8), "
                  "6 (int32), 7 (int64), but got 8",
                  hp_shmem_all_reduce(team, a.address, nullptr, 16, 8, 0, HP_SHMEM_WIRE_FULL, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT,
                  "`wire` must be one of 0 (full), 1 (float8_e4m3fn), 2 (float8_e5m2), 3 (float16), 4 (bfloat16), but "
                  "got 5",
                  hp_shmem_reduce_scatter(team, a.address, 8, a.address, 16, HP_SHMEM_FLOAT32, 0, 5, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`signal_bytes` must be 4 (int32) or 8 (int64), but got 2",
                  hp_shmem_signal(a.address, 2, 1, 0, 1));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`signal_op` must be one of 0 (set), 1 (add), but got 2",
                  hp_shmem_signal(a.address, 8, 1, 2, 1));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`signal_bytes` must be 4 (int32) or 8 (int64), but got 2",
                  hp_shmem_put_with_signal(a.address, a.address, 4, 4, a.address, 2, 1, 0, 1));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`symmetric_signal` must be a non-null pointer, but got NULL",
                  hp_shmem_put_with_signal(a.address, a.address, 4, 4, nullptr, 8, 1, 0, 1));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT,
                  "`compare_op` must be one of 0 (eq), 1 (ne), 2 (gt), 3 (ge), 4 (lt), 5 (le), but got 6",
                  hp_shmem_wait_signal(a.address, 8, 6, 1));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`signal_bytes` must be 4 (int32) or 8 (int64), but got 16",
                  hp_shmem_wait_signal(a.address, 16, 0, 1));
    const hp_shmem_element_type long_name{"a_type_name_of_24_chars_", 4, -1};
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT, "`type->name` must have 1 to 23 characters, but got more",
                  hp_shmem_all_gather(team, a.address, 8, a.address, 4, &long_name, HP_SHMEM_ROLE_FORWARD));
    const hp_shmem_element_type no_bytes{"float32", 0, -1};
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT, "`type->bytes` must be > 0, but got 0",
                  hp_shmem_all_gather(team, a.address, 8, a.address, 4, &no_bytes, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT, "`type` must be a non-null pointer, but got NULL",
                  hp_shmem_all_gather(team, a.address, 8, a.address, 4, nullptr, HP_SHMEM_ROLE_FORWARD));
    const void* sends[2] = {a.address, nullptr};
    const std::size_t send_bytes[2] = {4, 4};
    const std::uint64_t counts[2] = {1, 1};
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT, "`sends[1]` must be a non-null pointer, but got NULL",
                  hp_shmem_all_to_all(team, sends, send_bytes, 2, a.address, 8, counts, 2, &kInt32, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_REFUSAL(HP_SHMEM_INVALID_ARGUMENT, "`ncounts` must be >= 0, but got -2",
                  hp_shmem_all_to_all(team, sends, send_bytes, 2, a.address, 8, counts, -2, &kInt32, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`needed` must be a non-null pointer, but got NULL",
                  hp_shmem_debug_state_json(nullptr, 0, nullptr));
    // The exchange across nodes: both ranks share this node, which no transport across nodes serves.
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`exchanges` must be a non-null pointer, but got NULL",
                  hp_shmem_exchange_messages(1, nullptr, 1));
    hp_shmem_message_exchange exchange{1 - me.rank, &dummy, 4, nullptr, 0, 7, 5};
    REQUIRE_ERROR(HP_SHMEM_STATE_ERROR,
                  "`pe` must lie on another node and be reached by a remote transport, but got pe=" +
                      std::to_string(1 - me.rank) + " (op=exchange_messages transport=none)",
                  hp_shmem_exchange_messages(1, &exchange, 1));
    REQUIRE(exchange.received == 7 && exchange.status == 5);   // refused whole: nothing written back
    REQUIRE_OK(hp_shmem_exchange_messages(1, nullptr, 0));

    // Nothing changed: same state, same allocations, and the next collective still agrees on every rank (the
    // collectives' refusals went through the team's first sync, where every member failed alike).
    REQUIRE(hp_shmem_state() == 1);
    const Json after = DebugState();
    REQUIRE(after["active_allocations"].items.size() == before["active_allocations"].items.size());
    REQUIRE(after["allocated"].number == before["allocated"].number);
    REQUIRE_OK(hp_shmem_team_barrier(team, HP_SHMEM_ROLE_FORWARD));
    REQUIRE_OK(hp_shmem_free(a.id, "args"));
    REQUIRE_OK(hp_shmem_team_release(team));
    ShutdownRoot(me);
  }));
}

// A bootstrap callback's failure is the init's: its code and message; the runtime stays uninitialised, and a
// working bootstrap starts it afterwards.
int FailingAllGather(void*, const void*, std::size_t, void*, char* error, std::size_t error_bytes) {
  WriteError(error, error_bytes, "test bootstrap all_gather timed out: group=root waited_sec=0");
  return HP_SHMEM_TIMEOUT;
}

int UnknownCodeAllGather(void*, const void*, std::size_t, void*, char* error, std::size_t error_bytes) {
  WriteError(error, error_bytes, "framework said no");
  return 42;
}

TEST(Capi, FailingBootstrapCallbackFailsInitWithItsCodeAndMessage) {
  ExpectAllRanksPass(RunRanks(2, [](Rank& me) {
    hp_shmem_bootstrap failing = me.bootstrap;
    failing.all_gather = &FailingAllGather;
    REQUIRE_ERROR(HP_SHMEM_TIMEOUT, "test bootstrap all_gather timed out: group=root waited_sec=0",
                  hp_shmem_init(&failing, 0));
    REQUIRE(hp_shmem_state() == 0);
    failing.all_gather = &UnknownCodeAllGather;
    REQUIRE_ERROR(HP_SHMEM_DEVICE_ERROR, "framework said no (bootstrap all_gather returned unknown code=42)",
                  hp_shmem_init(&failing, 0));
    REQUIRE(hp_shmem_state() == 0);
    InitRoot(me);
    ShutdownRoot(me);
  }));
}

// The debug state: the torch binding's keys, values that match the lifecycle, and strings escaped.
TEST(Capi, DebugStateJsonRoundTrips) {
  {
    // In this (parent) process the runtime never started.
    std::size_t needed = 0;
    ASSERT_EQ(hp_shmem_debug_state_json(nullptr, 0, &needed), HP_SHMEM_OK);
    std::vector<char> buffer(needed);
    ASSERT_EQ(hp_shmem_debug_state_json(buffer.data(), buffer.size(), &needed), HP_SHMEM_OK);
    EXPECT_STREQ(hp_shmem_last_error(), "");
    const std::string text(buffer.data());
    EXPECT_NE(text.find("\"state\":\"uninitialized\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"active_allocations\":[]"), std::string::npos) << text;
  }
  ExpectAllRanksPass(RunRanks(2, [](Rank& me) {
    InitRoot(me);
    const std::string call_site = "site \"quoted\" back\\slash\nnew line\x01";
    hp_shmem_allocation a{};
    REQUIRE_OK(hp_shmem_allocate(1000, 256, call_site.c_str(), &a));
    const Json state = DebugState();
    for (const char* key : {"state", "lifecycle", "rank", "world_size", "device", "config", "heap_base", "heap_size",
                            "allocated", "max_allocated", "remaining", "active_allocations", "leaked_allocations",
                            "latest_failure", "calls_in_flight", "live_teams", "reaches_peer_memory", "nodes",
                            "transports"}) {
      (void)state[key];   // throws when missing
    }
    REQUIRE(state.fields.size() == 19);
    REQUIRE(state["state"].text == "initialized");
    REQUIRE(state["rank"].number == me.rank);
    REQUIRE(state["world_size"].number == 2);
    REQUIRE(state["device"].text == "host");
    REQUIRE(state["config"]["heap_size"].number == 4 * 1024 * 1024);
    REQUIRE(state["config"]["timeout_sec"].number == 10);
    REQUIRE(state["config"]["device"].text == "host");
    REQUIRE(state["heap_size"].number >= 4 * 1024 * 1024);
    REQUIRE(state["nodes"].kind == Json::kArray && state["nodes"].items.size() == 2);
    REQUIRE(state["transports"].items.size() == 2);
    const auto& transports = state["transports"].items;
    REQUIRE(transports[static_cast<std::size_t>(me.rank)].text == "self");
    REQUIRE(transports[static_cast<std::size_t>(1 - me.rank)].text == "node");
    REQUIRE(state["reaches_peer_memory"].kind == Json::kBool);
    const auto& active = state["active_allocations"].items;
    REQUIRE(active.size() == 1);
    REQUIRE(active[0]["allocation_id"].number == static_cast<double>(a.id));
    REQUIRE(active[0]["bytes"].number == 1000);
    REQUIRE(active[0]["reserved"].number >= 1000);
    REQUIRE(active[0]["offset"].number == static_cast<double>(a.heap_offset));
    REQUIRE(active[0]["base"].number == static_cast<double>(reinterpret_cast<std::uintptr_t>(a.address)));
    REQUIRE(active[0]["state"].text == "active");
    REQUIRE(active[0]["call_site"].text == call_site);
    REQUIRE(state["allocated"].number >= 1000);
    REQUIRE(state["latest_failure"].text.empty());
    // A failure shows up as the latest one.
    REQUIRE_RC(HP_SHMEM_INVALID_ARGUMENT, hp_shmem_put(a.address, &me, 4, 8, 1 - me.rank));
    const std::string failure = hp_shmem_last_error();
    REQUIRE(DebugState()["latest_failure"].text.find(failure) != std::string::npos);
    REQUIRE_OK(hp_shmem_barrier());
    REQUIRE_OK(hp_shmem_free(a.id, "debug"));
    REQUIRE(DebugState()["active_allocations"].items.empty());
    ShutdownRoot(me);
    REQUIRE(DebugState()["state"].text == "uninitialized");
  }));
}

// Forwarded log records: the runtime's lines reach the taker (a handler's logging thread) instead of stderr.
TEST(Capi, ForwardedLogRecordsReachTheTaker) {
  ExpectAllRanksPass(RunRanks(2, [](Rank& me) {
    setenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "INFO", 1);
    hp_shmem_log_forward(1);
    InitRoot(me);
    int level = -1;
    int rank = -2;
    char message[256];
    bool seen = false;
    while (!seen && hp_shmem_log_wait(5000) == 1 && hp_shmem_log_take(&level, &rank, message, sizeof(message)) == 1) {
      seen = std::string(message).rfind("shmem runtime initialised: lifecycle=", 0) == 0;
    }
    REQUIRE(seen);
    REQUIRE(level == 1);
    REQUIRE(rank == me.rank);
    // A message longer than the buffer is cut, NUL-terminated.
    ShutdownRoot(me);
    char small[8];
    REQUIRE(hp_shmem_log_wait(5000) == 1);
    REQUIRE(hp_shmem_log_take(&level, &rank, small, sizeof(small)) == 1);
    REQUIRE(std::string(small) == "shmem r");
    hp_shmem_log_forward(0);
    REQUIRE(hp_shmem_log_wait(60000) == 0);   // at once: forwarding is off
    REQUIRE(hp_shmem_log_take(&level, &rank, message, sizeof(message)) == 0);
  }));
}

// Every numbering the header spells is the runtime's, and the C ABI exports them all.
TEST(Capi, NumberingsAreTheRuntimesOne) {
  ExpectAllRanksPass(RunRanks(1, [](Rank&) {
    const Json numberings = ReadJson(&hp_shmem_numberings_json);
    REQUIRE(numberings["status_codes"]["INVALID_ARGUMENT"].number == HP_SHMEM_INVALID_ARGUMENT);
    REQUIRE(numberings["status_codes"]["INTERRUPTED"].number == HP_SHMEM_INTERRUPTED);
    REQUIRE(numberings["dtypes"]["bfloat16"].number == HP_SHMEM_BFLOAT16);
    REQUIRE(numberings["dtypes"]["int64"].number == HP_SHMEM_INT64);
    REQUIRE(numberings["reduce_ops"]["max"].number == 2);
    REQUIRE(numberings["signal_ops"]["add"].number == 1);
    REQUIRE(numberings["compare_ops"]["le"].number == 5);
    REQUIRE(numberings["wire_formats"]["full"].number == HP_SHMEM_WIRE_FULL);
    REQUIRE(numberings["wire_formats"]["float8_e4m3fn"].number == HP_SHMEM_WIRE_FLOAT8_E4M3FN);
    REQUIRE(numberings["wire_formats"]["bfloat16"].number == HP_SHMEM_WIRE_BFLOAT16);
    REQUIRE(numberings["call_roles"]["fused_scatter"].number == HP_SHMEM_ROLE_FUSED_SCATTER);
    REQUIRE(numberings["collectives"]["all_to_all"].number == 5);
    REQUIRE(numberings["collectives"]["moe_combine"].number == 10);
    REQUIRE(numberings["lifecycle_states"]["failed"].number == 2);
    REQUIRE(numberings.fields.size() == 9);
  }));
}

// The runtime reads every variable, the user API's alias and low-precision default included: read_config before a
// lifecycle, the lifecycle's own afterwards (read once, at init), and an init's explicit heap size over the
// environment's. Nothing of it touches the environment.
TEST(Capi, ConfigurationIsReadByTheRuntime) {
  ExpectAllRanksPass(RunRanks(1, [](Rank& me) {
    REQUIRE(::setenv("SYMMETRIC_MEMORY_HEAP_SIZE", "6M", 1) == 0);
    REQUIRE(::unsetenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE") == 0);
    REQUIRE(::setenv("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", " BFloat16 ", 1) == 0);
    const Json config = ReadJson(&hp_shmem_read_config_json);
    REQUIRE(config["heap_size"].number == 6 * 1024 * 1024);
    REQUIRE(config["heap_size_source"].text == "SYMMETRIC_MEMORY_HEAP_SIZE");
    REQUIRE(config["low_precision_dtype"].text == " BFloat16 ");
    int wire = -7;
    REQUIRE_OK(hp_shmem_low_precision_default(&wire));
    REQUIRE(wire == HP_SHMEM_WIRE_BFLOAT16);

    REQUIRE_OK(hp_shmem_init(&me.bootstrap, 5 * 1024 * 1024));   // the caller's heap over the alias's
    REQUIRE(std::getenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE") == nullptr);
    REQUIRE(std::string(std::getenv("SYMMETRIC_MEMORY_HEAP_SIZE")) == "6M");
    REQUIRE(DebugState()["config"]["heap_size"].number == 5 * 1024 * 1024);
    REQUIRE(DebugState()["config"]["heap_size_source"].text == "heap_size_bytes");
    REQUIRE(DebugState()["config"]["low_precision_dtype"].text == " BFloat16 ");
    // The lifecycle's default was read at init: a later change of the variable is not seen until the next one.
    REQUIRE(::setenv("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "float7", 1) == 0);
    REQUIRE_OK(hp_shmem_low_precision_default(&wire));
    REQUIRE(wire == HP_SHMEM_WIRE_BFLOAT16);
    ShutdownRoot(me);
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT,
                  "`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` must be one of float16, bfloat16, float8_e4m3fn, "
                  "float8_e5m2 or 'none', but got 'float7'",
                  hp_shmem_low_precision_default(&wire));

    REQUIRE(::setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "8M", 1) == 0);
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT,
                  "`SYMMETRIC_MEMORY_HEAP_SIZE` must equal `HYPER_PARALLEL_SHMEM_HEAP_SIZE` when both are set, but got "
                  "'6M' and '8M'",
                  hp_shmem_init(&me.bootstrap, 0));
    REQUIRE(hp_shmem_state() == 0);
    REQUIRE(::unsetenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE") == 0);
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`heap_size_bytes` must be at least 1 MiB, but got 4096",
                  hp_shmem_init(&me.bootstrap, 4096));
  }));
}

// The MoE row codec through the C ABI, without a lifecycle: an fp8 row is its scale then its codes, a bfloat16 row
// the cast; bad wires and dtypes are refused with their messages and nothing is written.
TEST(Capi, RowCodecEncodesAndDecodesWithoutALifecycle) {
  ExpectAllRanksPass(RunRanks(1, [](Rank&) {
    std::size_t row_bytes = 0;
    REQUIRE_OK(hp_shmem_wire_row_bytes(HP_SHMEM_WIRE_FLOAT8_E4M3FN, 3, &row_bytes));
    REQUIRE(row_bytes == 7);
    REQUIRE_OK(hp_shmem_wire_row_bytes(HP_SHMEM_WIRE_BFLOAT16, 3, &row_bytes));
    REQUIRE(row_bytes == 6);
    const float rows[6] = {1.0f, -2.0f, 448.0f, 0.0f, 0.0f, 0.0f};
    unsigned char wire[14];
    REQUIRE_OK(hp_shmem_encode_rows(HP_SHMEM_WIRE_FLOAT8_E4M3FN, HP_SHMEM_FLOAT32, rows, 2, 3, wire));
    float scale = 0.0f;
    std::memcpy(&scale, wire, sizeof(scale));
    REQUIRE(scale == 2.0f);   // frexp(448 / 448) = 0.5 * 2**1
    std::memcpy(&scale, wire + 7, sizeof(scale));
    REQUIRE(scale == 1.0f);   // an all-zero row
    double back[6] = {};
    REQUIRE_OK(hp_shmem_decode_rows(HP_SHMEM_WIRE_FLOAT8_E4M3FN, wire, 2, 3, HP_SHMEM_FLOAT64, back));
    for (int i = 0; i < 6; ++i) REQUIRE(back[i] == static_cast<double>(rows[i]));
    unsigned char untouched[14];
    std::memset(untouched, 0xA5, sizeof(untouched));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT,
                  "`wire` must be one of 1 (float8_e4m3fn), 2 (float8_e5m2), 3 (float16), 4 (bfloat16), but got 0",
                  hp_shmem_encode_rows(HP_SHMEM_WIRE_FULL, HP_SHMEM_FLOAT32, rows, 2, 3, untouched));
    REQUIRE_ERROR(HP_SHMEM_TYPE_ERROR,
                  "`dtype` must be one of 0 (float32), 1 (float64), 2 (float16), 3 (bfloat16), but got 6 (int32)",
                  hp_shmem_encode_rows(HP_SHMEM_WIRE_FLOAT16, HP_SHMEM_INT32, rows, 2, 3, untouched));
    for (unsigned char byte : untouched) REQUIRE(byte == 0xA5);
    REQUIRE_OK(hp_shmem_encode_rows(HP_SHMEM_WIRE_FLOAT16, HP_SHMEM_FLOAT32, nullptr, 0, 3, nullptr));
  }));
}

// The MoE exchange's two local steps through the C ABI (what the phases of a team that spans nodes run): two members,
// two experts each. Member 0 sends 1 and 2 rows to member 1's experts 0 and 1; member 1 sends 3 and 0 rows to member
// 0's. Dispatch lays member 1's output out expert-major with regions aligned to 4 rows: expert 0 gets member 0's row
// at row 0 (member 1's own chunk is empty), expert 1 member 0's 2 rows at row 4. A member's output too small fails
// every member alike, naming the rank, the expert and both sizes.
TEST(Capi, MoeRowAndPlanAreTheEnginesSteps) {
  ExpectAllRanksPass(RunRanks(1, [](Rank&) {
    const int n = 2, experts = 2;
    const std::int64_t splits[2][4] = {{0, 0, 1, 2}, {3, 0, 0, 0}};
    const std::size_t length = HP_SHMEM_MOE_ROW_HEADER + 2 * 4;
    std::vector<std::int64_t> rows(n * length, -1);
    REQUIRE_OK(hp_shmem_moe_row(0, experts, n, splits[0], nullptr, 3, 8, rows.data(), length));
    REQUIRE_OK(hp_shmem_moe_row(0, experts, n, splits[1], nullptr, 3, 8, rows.data() + length, length));
    REQUIRE(rows[0] == 0 && rows[4] == 8 && rows[5] == -1);           // no finding, its output's rows, no heap offset
    REQUIRE(rows[HP_SHMEM_MOE_ROW_HEADER + 4 + 3] == 1);                // chunk 3 starts after chunk 2's row
    std::int64_t out_splits[4], out_offsets[4], from[4];
    REQUIRE_OK(hp_shmem_moe_plan(0, experts, 4, n, rows.data(), length, 1, out_splits, out_offsets, from));
    const std::int64_t want_splits[4] = {1, 0, 2, 0}, want_offsets[4] = {0, 1, 4, 6}, want_from[4] = {0, 3, 1, 3};
    for (int i = 0; i < 4; ++i) {
      REQUIRE(out_splits[i] == want_splits[i] && out_offsets[i] == want_offsets[i] && from[i] == want_from[i]);
    }
    // Member 1's output holds 5 rows: expert 1's region (rows 4-5) overflows it.
    REQUIRE_OK(hp_shmem_moe_row(0, experts, n, splits[1], nullptr, 3, 5, rows.data() + length, length));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT,
                  "moe_dispatch: `out` of rank 1 must hold the 6 rows its peers send (the overflow starts at expert 3, "
                  "local expert 1 of rank 1), but got 5 rows (every rank raises; nothing was written)",
                  hp_shmem_moe_plan(0, experts, 4, n, rows.data(), length, 0, out_splits, out_offsets, from));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`direction` must be 0 (dispatch) or 1 (combine), but got 2",
                  hp_shmem_moe_row(2, experts, n, splits[0], nullptr, 3, 8, rows.data(), length));
    REQUIRE_ERROR(HP_SHMEM_INVALID_ARGUMENT, "`row_capacity` must be at least 14 values, but got 13",
                  hp_shmem_moe_row(0, experts, n, splits[0], nullptr, 3, 8, rows.data(), length - 1));
  }));
}

}  // namespace
