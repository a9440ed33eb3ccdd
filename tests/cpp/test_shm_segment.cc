// POSIX shared-memory segments: naming, permissions, mapping, unlinking, page reservation, capacity checks,
// stale-segment cleanup (the creator's lock, other users' segments, links).
#include "runtime/host/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "private_shm.h"
#include "test_support.h"

namespace hp::shmem::host {
namespace {

using testutil::ChildReport;
using testutil::Contains;
using testutil::InSmallShm;

// The /dev/shm path of a segment name ("/hpshmem-..." -> "/dev/shm/hpshmem-...").
std::string ShmPath(const std::string& name) { return "/dev/shm" + name; }

bool Exists(const std::string& name) {
  struct stat st;
  return stat(ShmPath(name).c_str(), &st) == 0;
}

// Creates a named segment directly through shm_open (as another process would have).
bool CreateRaw(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// A pid that belonged to a process which has exited and been reaped.
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

// A name of our kind whose pid is `pid`.
std::string NameWithPid(pid_t pid, const std::string& tag) { return "/hpshmem-" + std::to_string(pid) + "-" + tag; }

// Takes a lock like a segment's creator does (any flock conflicts with the cleanup's exclusive one); -1 on failure.
int HoldLock(const std::string& name) {
  const int fd = open(ShmPath(name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Entries of the current /dev/shm.
std::vector<std::string> ShmEntries() {
  std::vector<std::string> found;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return found;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") found.push_back(name);
  }
  closedir(dir);
  return found;
}

unsigned long long AvailableShmBytes() {
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs) != 0) return 0;
  return static_cast<unsigned long long>(vfs.f_bavail) * static_cast<unsigned long long>(vfs.f_frsize);
}

TEST(ShmSegmentTest, PrefixConstant) { EXPECT_STREQ(kSegmentPrefix, "hpshmem-"); }

TEST(ShmSegmentTest, CreateNamesMapsAndRestrictsTheSegment) {
  Result<ShmSegment> created = ShmSegment::Create(8192);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ShmSegment segment = std::move(created).value();
  const std::string prefix = "/hpshmem-" + std::to_string(getpid()) + "-";
  ASSERT_EQ(segment.name().rfind(prefix, 0), 0u) << segment.name();
  const std::string suffix = segment.name().substr(prefix.size());
  EXPECT_EQ(suffix.size(), 32u);   // 128 random bits in hex
  EXPECT_EQ(suffix.find_first_not_of("0123456789abcdef"), std::string::npos) << suffix;
  EXPECT_EQ(segment.size(), 8192u);
  ASSERT_NE(segment.data(), nullptr);

  // Mode 0600, a regular file of the requested size.
  struct stat st;
  ASSERT_EQ(stat(ShmPath(segment.name()).c_str(), &st), 0) << std::strerror(errno);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 8192);
  EXPECT_EQ(st.st_uid, geteuid());

  // Fresh pages are zero and writable.
  const auto* bytes = static_cast<const unsigned char*>(segment.data());
  for (std::size_t i = 0; i < 8192; i += 512) EXPECT_EQ(bytes[i], 0) << i;
  std::memset(segment.data(), 0x3C, 8192);

  // Two segments never share a name.
  Result<ShmSegment> other = ShmSegment::Create(4096);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->name(), segment.name());
}

TEST(ShmSegmentTest, OpenMapsTheSameMemory) {
  Result<ShmSegment> created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Result<ShmSegment> opened = ShmSegment::Open(created->name(), 4096);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(opened->name(), created->name());
  EXPECT_EQ(opened->size(), 4096u);
  ASSERT_NE(opened->data(), created->data());
  static_cast<char*>(created->data())[100] = 'x';
  EXPECT_EQ(static_cast<const char*>(opened->data())[100], 'x');
  static_cast<char*>(opened->data())[4095] = 'y';
  EXPECT_EQ(static_cast<const char*>(created->data())[4095], 'y');
}

TEST(ShmSegmentTest, OpenChecksTheSize) {
  Result<ShmSegment> created = ShmSegment::Create(8192);
  ASSERT_TRUE(created.ok());
  Result<ShmSegment> opened = ShmSegment::Open(created->name(), 4096);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kDeviceError);
  EXPECT_EQ(opened.status().message(), "peer segment has an unexpected size: name=" + created->name() +
                                           " expected=4096 observed=8192");
}

TEST(ShmSegmentTest, UnlinkRemovesTheNameButKeepsTheMapping) {
  Result<ShmSegment> created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok());
  ShmSegment segment = std::move(created).value();
  Result<ShmSegment> opened = ShmSegment::Open(segment.name(), 4096);
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE(Exists(segment.name()));

  ASSERT_TRUE(segment.Unlink().ok());
  EXPECT_FALSE(Exists(segment.name()));
  EXPECT_TRUE(segment.Unlink().ok());   // a second unlink is a no-op
  // Both mappings still work and still share memory.
  static_cast<char*>(segment.data())[7] = 'z';
  EXPECT_EQ(static_cast<const char*>(opened->data())[7], 'z');

  Result<ShmSegment> late = ShmSegment::Open(segment.name(), 4096);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeviceError);
  EXPECT_EQ(late.status().message(), "shm_open of a peer segment failed: name=" + segment.name() +
                                         " error=" + std::strerror(ENOENT) + " (errno=" + std::to_string(ENOENT) + ")");
}

TEST(ShmSegmentTest, OnlyTheOwnerUnlinksOnDestruction) {
  std::string name;
  {
    Result<ShmSegment> created = ShmSegment::Create(4096);
    ASSERT_TRUE(created.ok());
    name = created->name();
    {
      // A peer's mapping going away leaves the name alone.
      Result<ShmSegment> opened = ShmSegment::Open(name, 4096);
      ASSERT_TRUE(opened.ok());
      EXPECT_TRUE(opened->Unlink().ok());   // not the owner: nothing to do
    }
    EXPECT_TRUE(Exists(name));
  }
  EXPECT_FALSE(Exists(name));   // the owner removed it
}

TEST(ShmSegmentTest, MovingTransfersOwnership) {
  Result<ShmSegment> created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok());
  ShmSegment first = std::move(created).value();
  const std::string name = first.name();
  void* data = first.data();
  ShmSegment second(std::move(first));
  EXPECT_EQ(second.data(), data);
  EXPECT_EQ(second.size(), 4096u);
  EXPECT_EQ(second.name(), name);
  EXPECT_EQ(first.data(), nullptr);   // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(first.size(), 0u);
  EXPECT_TRUE(first.Unlink().ok());   // no longer the owner
  EXPECT_TRUE(Exists(name));

  ShmSegment third;
  third = std::move(second);
  EXPECT_EQ(third.data(), data);
  static_cast<char*>(third.data())[0] = 1;
  third = ShmSegment();   // releases: unmaps and unlinks
  EXPECT_EQ(third.data(), nullptr);
  EXPECT_FALSE(Exists(name));
}

TEST(ShmSegmentTest, OpenOfAMissingName) {
  const std::string name = "/hpshmem-" + std::to_string(getpid()) + "-does-not-exist";
  Result<ShmSegment> opened = ShmSegment::Open(name, 4096);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kDeviceError);
  EXPECT_TRUE(Contains(opened.status().message(), "shm_open of a peer segment failed: name=" + name + " error="))
      << opened.status().message();
}

TEST(ShmSegmentTest, CreateAllocatesEveryPage) {
  const std::size_t bytes = std::size_t{4} << 20;
  Result<ShmSegment> created = ShmSegment::Create(bytes);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  struct stat st;
  ASSERT_EQ(stat(ShmPath(created->name()).c_str(), &st), 0) << std::strerror(errno);
  // st_blocks counts 512-byte units: every page exists before anything touched one.
  EXPECT_GE(static_cast<unsigned long long>(st.st_blocks) * 512, bytes);
}

TEST(ShmSegmentTest, CreateFailsWithOutOfMemoryWhenDevShmCannotHoldThePages) {
  constexpr std::size_t kTmpfs = std::size_t{8} << 20;
  const ChildReport report = InSmallShm(kTmpfs, []() -> std::string {
    std::string failures;
    const auto check = [&failures](bool ok, const std::string& what) {
      if (!ok) failures += what + "; ";
    };
    // 1. More than the filesystem can hold: refused at creation, with nothing left behind.
    Result<ShmSegment> large = ShmSegment::Create(std::size_t{16} << 20);
    check(large.status().code() == StatusCode::kOutOfMemory, "16 MiB in 8 MiB: " + large.status().ToString());
    const std::string& message = large.status().message();
    const std::string head = "shared-memory filesystem too small for a symmetric heap: path=/dev/shm name=/hpshmem-" +
                             std::to_string(getpid()) + "-";
    const std::string tail = " required=16777216 available=" + std::to_string(kTmpfs) +
                             " (lower HYPER_PARALLEL_SHMEM_HEAP_SIZE or enlarge /dev/shm)";
    check(message.rfind(head, 0) == 0 && message.size() > tail.size() &&
              message.compare(message.size() - tail.size(), tail.size(), tail) == 0 &&
              Contains(message, std::string(" error=") + std::strerror(ENOSPC)),
          "message: " + message);
    check(ShmEntries().empty(), "a failed creation left a name behind");
    check(AvailableShmBytes() == kTmpfs, "a failed creation kept pages: available=" +
                                             std::to_string(AvailableShmBytes()));
    // 2. A segment that fits owns its pages: whoever fills /dev/shm afterwards cannot take them (pages allocated on
    //    first touch would be a SIGBUS in the memset below).
    Result<ShmSegment> fits = ShmSegment::Create(std::size_t{6} << 20);
    if (!fits.ok()) return failures + "6 MiB in 8 MiB: " + fits.status().ToString();
    const int filler = open("/dev/shm/filler", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (filler < 0) return failures + "cannot create the filler: " + std::strerror(errno);
    const std::vector<char> chunk(64 << 10, 'f');
    std::size_t filled = 0;
    int err = 0;
    for (;;) {
      const ssize_t n = write(filler, chunk.data(), chunk.size());
      if (n <= 0) {
        err = n < 0 ? errno : ENOSPC;
        break;
      }
      filled += static_cast<std::size_t>(n);
    }
    close(filler);
    check(err == ENOSPC && filled <= kTmpfs - fits->size(),
          "the filler got " + std::to_string(filled) + " bytes, error=" + std::strerror(err));
    std::memset(fits->data(), 0x5A, fits->size());
    check(static_cast<const unsigned char*>(fits->data())[fits->size() - 1] == 0x5A, "the last byte was not written");
    // 3. With /dev/shm full, the next segment fails at creation too.
    Result<ShmSegment> more = ShmSegment::Create(std::size_t{1} << 20);
    check(more.status().code() == StatusCode::kOutOfMemory, "1 MiB in a full /dev/shm: " + more.status().ToString());
    unlink("/dev/shm/filler");
    return failures;
  });
  if (report.skipped) GTEST_SKIP() << report.text;
  EXPECT_EQ(report.text, "");
}

TEST(ShmSegmentTest, CreatorHoldsTheLockWhileItHasTheSegment) {
  Result<ShmSegment> created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ShmSegment segment = std::move(created).value();
  const int fd = open(ShmPath(segment.name()).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_NE(flock(fd, LOCK_SH | LOCK_NB), 0);
  EXPECT_EQ(errno, EWOULDBLOCK);
  ASSERT_TRUE(segment.Unlink().ok());
  EXPECT_NE(flock(fd, LOCK_SH | LOCK_NB), 0) << "the creator's mapping keeps the locked file";
  segment.Retire();
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0) << "the lock goes with the creator's segment";
  close(fd);
}

TEST(ShmSegmentTest, RetiredSegmentsKeepTheirAddressesHarmless) {
  Result<ShmSegment> created = ShmSegment::Create(8192);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const std::string name = created->name();
  auto* data = static_cast<volatile unsigned char*>(created->data());
  data[100] = 0x3C;
  created->Retire();
  EXPECT_EQ(created->data(), nullptr);
  EXPECT_FALSE(Exists(name));   // the name went first
  EXPECT_EQ(data[100], 0);      // private zero pages now, not the segment
  data[8191] = 0x7E;            // no fault
  EXPECT_EQ(data[8191], 0x7E);
}

TEST(ShmSegmentTest, RetiredRangesGoBackWhenTheAddressSpaceRunsOut) {
  constexpr std::size_t kSegment = std::size_t{16} << 20;
  const ChildReport report = InSmallShm(4 * kSegment, []() -> std::string {
    // Let this process map 96 MiB more than it has: five retired 16 MiB segments, not a dozen.
    std::ifstream status("/proc/self/status");
    std::string line;
    unsigned long long mapped_kib = 0;
    while (std::getline(status, line)) {
      if (line.rfind("VmSize:", 0) == 0) mapped_kib = std::stoull(line.substr(7));
    }
    if (mapped_kib == 0) return "no VmSize in /proc/self/status";
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) != 0) return std::string("getrlimit: ") + std::strerror(errno);
    limit.rlim_cur = static_cast<rlim_t>(mapped_kib * 1024 + (std::size_t{96} << 20));
    if (setrlimit(RLIMIT_AS, &limit) != 0) return std::string("setrlimit: ") + std::strerror(errno);
    for (int i = 0; i < 12; ++i) {
      Result<ShmSegment> created = ShmSegment::Create(kSegment);
      if (!created.ok()) return "segment " + std::to_string(i) + ": " + created.status().ToString();
      auto* data = static_cast<volatile unsigned char*>(created->data());
      data[kSegment - 1] = 1;
      created->Retire();
      data[kSegment - 1] = 2;   // the latest retired range is still reserved
    }
    return "";
  });
  if (report.skipped) GTEST_SKIP() << report.text;
  EXPECT_EQ(report.text, "");
}

TEST(ShmCapacityTest, EnoughRoom) {
  EXPECT_TRUE(CheckShmCapacity(0).ok());
  EXPECT_TRUE(CheckShmCapacity(4096).ok());
}

TEST(ShmCapacityTest, TooSmallNamesRequiredAndAvailable) {
  const unsigned long long available = AvailableShmBytes();
  ASSERT_GT(available, 0u);
  const unsigned long long required = available + (1ull << 30);
  const Status status = CheckShmCapacity(static_cast<std::size_t>(required));
  ASSERT_EQ(status.code(), StatusCode::kOutOfMemory) << status.ToString();
  const std::string head = "shared-memory filesystem too small for the symmetric heaps: path=/dev/shm required=" +
                           std::to_string(required) + " available=";
  EXPECT_EQ(status.message().rfind(head, 0), 0u) << status.message();
  // The available figure is a number (it may move by the time we compare), then the advice.
  const std::string rest = status.message().substr(head.size());
  const std::size_t digits = rest.find_first_not_of("0123456789");
  ASSERT_NE(digits, std::string::npos);
  EXPECT_GT(digits, 0u);
  EXPECT_EQ(rest.substr(digits), " (lower HYPER_PARALLEL_SHMEM_HEAP_SIZE or enlarge /dev/shm)");
}

TEST(ShmCapacityTest, UnreadableDirectory) {
  const Status status = CheckShmCapacity(1, "/nonexistent-hpshmem-dir");
  EXPECT_EQ(status.code(), StatusCode::kDeviceError);
  EXPECT_EQ(status.message(), std::string("cannot inspect the shared-memory filesystem: path=/nonexistent-hpshmem-dir ") +
                                  "error=" + std::strerror(ENOENT) + " (errno=" + std::to_string(ENOENT) + ")");
}

TEST(RemoveStaleSegmentsTest, RemovesOnlySegmentsOfDeadProcesses) {
  const pid_t dead = DeadPid();
  ASSERT_GT(dead, 0);
  const std::string stale = "/hpshmem-" + std::to_string(dead) + "-test";
  const std::string live = "/hpshmem-" + std::to_string(getpid()) + "-livetest";
  // Names that merely look similar are never touched.
  const std::string no_pid = "/hpshmem-x" + std::to_string(dead) + "-test";
  const std::string no_dash = "/hpshmem-" + std::to_string(dead) + "test";
  for (const std::string& name : {stale, live, no_pid, no_dash}) {
    shm_unlink(name.c_str());   // leftovers of an interrupted earlier run
    ASSERT_TRUE(CreateRaw(name)) << name << ": " << std::strerror(errno);
  }

  const int removed = RemoveStaleSegments();
  EXPECT_GE(removed, 1);
  EXPECT_FALSE(Exists(stale));
  EXPECT_TRUE(Exists(live));
  EXPECT_TRUE(Exists(no_pid));
  EXPECT_TRUE(Exists(no_dash));
  EXPECT_EQ(RemoveStaleSegments("/nonexistent-hpshmem-dir"), 0);

  for (const std::string& name : {live, no_pid, no_dash}) EXPECT_EQ(shm_unlink(name.c_str()), 0) << name;
}

TEST(RemoveStaleSegmentsTest, KeepsALockedSegmentWhosePidIsNoProcessHere) {
  // A live job in another PID namespace sharing /dev/shm: its pid names no process here, but it holds its lock.
  const std::string name = NameWithPid(DeadPid(), "locked");
  shm_unlink(name.c_str());
  ASSERT_TRUE(CreateRaw(name)) << std::strerror(errno);
  const int lock = HoldLock(name);
  ASSERT_GE(lock, 0) << std::strerror(errno);
  RemoveStaleSegments();
  EXPECT_TRUE(Exists(name)) << "a segment whose lock is held is live, whatever its pid says here";
  close(lock);   // its creator dies: the kernel drops the lock
  EXPECT_GE(RemoveStaleSegments(), 1);
  EXPECT_FALSE(Exists(name));
}

TEST(RemoveStaleSegmentsTest, KeepsALiveSegmentOfThisLibraryUnderAnyPid) {
  Result<ShmSegment> created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  // The same file under a name whose pid is no process here: how a job in another PID namespace sees ours.
  const std::string alias = NameWithPid(DeadPid(), "alias");
  shm_unlink(alias.c_str());
  ASSERT_EQ(link(ShmPath(created->name()).c_str(), ShmPath(alias).c_str()), 0) << std::strerror(errno);
  RemoveStaleSegments();
  EXPECT_TRUE(Exists(alias)) << "the creator of a live segment holds its lock";
  *created = ShmSegment();   // the creator lets go of the segment, and of its lock with it
  EXPECT_GE(RemoveStaleSegments(), 1);
  EXPECT_FALSE(Exists(alias));
  shm_unlink(alias.c_str());
}

TEST(RemoveStaleSegmentsTest, NeverTouchesAnotherUsersSegment) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "giving a test segment to another user needs root (chown); running as uid " << geteuid();
  }
  const std::string name = NameWithPid(DeadPid(), "otheruser");
  shm_unlink(name.c_str());
  ASSERT_TRUE(CreateRaw(name)) << std::strerror(errno);
  constexpr uid_t kNobody = 65534;
  ASSERT_EQ(chown(ShmPath(name).c_str(), kNobody, kNobody), 0) << std::strerror(errno);
  RemoveStaleSegments();
  EXPECT_TRUE(Exists(name)) << "another user's segment, stale or not, is never ours to remove (not even as root)";
  EXPECT_EQ(shm_unlink(name.c_str()), 0);
}

TEST(RemoveStaleSegmentsTest, LeavesLinksAndSpecialFilesAlone) {
  const pid_t dead = DeadPid();
  const std::string target = "/hpshmemtest-target-" + std::to_string(getpid());   // not a name of ours
  const std::string symlink_name = NameWithPid(dead, "symlink");
  const std::string fifo_name = NameWithPid(dead, "fifo");
  for (const std::string& name : {target, symlink_name, fifo_name}) unlink(ShmPath(name).c_str());
  ASSERT_TRUE(CreateRaw(target)) << std::strerror(errno);
  ASSERT_EQ(symlink(ShmPath(target).c_str(), ShmPath(symlink_name).c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(mkfifo(ShmPath(fifo_name).c_str(), 0600), 0) << std::strerror(errno);
  RemoveStaleSegments();   // returns: a FIFO is never opened (opening one would block)
  struct stat st;
  EXPECT_EQ(lstat(ShmPath(symlink_name).c_str(), &st), 0) << "a link is not a segment";
  EXPECT_EQ(lstat(ShmPath(fifo_name).c_str(), &st), 0) << "a FIFO is not a segment";
  EXPECT_TRUE(Exists(target));
  for (const std::string& name : {target, symlink_name, fifo_name}) EXPECT_EQ(unlink(ShmPath(name).c_str()), 0) << name;
}

}  // namespace
}  // namespace hp::shmem::host
