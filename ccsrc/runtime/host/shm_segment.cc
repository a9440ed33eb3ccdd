#include "runtime/host/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/logging.h"

namespace hp::shmem::host {

const char* const kSegmentPrefix = "hpshmem-";

namespace {

std::string ErrnoText(int err) { return std::string(std::strerror(err)) + " (errno=" + std::to_string(err) + ")"; }

// Where glibc's shm_open keeps its names.
constexpr const char* kShmDir = "/dev/shm";
// A cleanup can lock a new name between our shm_open and our flock and unlink it; then we start again under a
// new name. That takes a cleanup opening the name within microseconds of its creation: a few attempts suffice.
constexpr int kCreateAttempts = 4;

// Free bytes of the filesystem at `shm_dir` (for an unprivileged user), or -1 if it cannot be inspected.
long long AvailableBytes(const std::string& shm_dir) {
  struct statvfs vfs;
  if (statvfs(shm_dir.c_str(), &vfs) != 0) return -1;
  return static_cast<long long>(static_cast<unsigned long long>(vfs.f_bavail) *
                                static_cast<unsigned long long>(vfs.f_frsize));
}

// The one message of a shared-memory filesystem that cannot hold a request; `detail` is " key=value ...".
std::string TooSmall(const std::string& what, const std::string& shm_dir, const std::string& detail,
                     std::size_t required, long long available) {
  return "shared-memory filesystem too small for " + what + ": path=" + shm_dir + detail +
         " required=" + std::to_string(required) + " available=" + std::to_string(available) +
         " (lower HYPER_PARALLEL_SHMEM_HEAP_SIZE or enlarge " + shm_dir + ")";
}

bool SameFile(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

Result<std::string> RandomName() {
  unsigned char bytes[16];
  std::size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return DeviceError("getrandom failed: " + ErrnoText(errno));
    }
    filled += static_cast<std::size_t>(n);
  }
  std::string name = std::string("/") + kSegmentPrefix + std::to_string(getpid()) + "-";
  static const char kDigits[] = "0123456789abcdef";
  for (unsigned char b : bytes) {
    name += kDigits[b >> 4];
    name += kDigits[b & 15];
  }
  return name;
}

// The address ranges of retired segments (ShmSegment::Retire), kept reserved until the address space runs out.
// Never destroyed: a device may retire its segments from a static destructor.
struct RetiredRanges {
  std::mutex mu;
  std::vector<std::pair<void*, std::size_t>> ranges;
};
RetiredRanges& Retired() {
  static RetiredRanges* retired = new RetiredRanges;
  return *retired;
}

// Unmaps every retired range (stale pointers into them fault again); returns how many bytes that gave back.
std::size_t ReleaseRetired() {
  RetiredRanges& retired = Retired();
  std::lock_guard<std::mutex> lock(retired.mu);
  std::size_t released = 0;
  for (const auto& [address, bytes] : retired.ranges) {
    munmap(address, bytes);
    released += bytes;
  }
  retired.ranges.clear();
  return released;
}

// One try of MapFd: 0 and the mapping, or the errno and which step failed.
int TryMapFd(int fd, std::size_t bytes, void** data, const char** failed_step) {
  const std::size_t reserve = bytes + kSegmentAlignment;
  void* range = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (range == MAP_FAILED) {
    *failed_step = "reserving address space for a shared-memory segment failed";
    return errno;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(range);
  const std::uintptr_t aligned = (start + kSegmentAlignment - 1) & ~(std::uintptr_t{kSegmentAlignment} - 1);
  *data = mmap(reinterpret_cast<void*>(aligned), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (*data == MAP_FAILED) {
    const int err = errno;
    munmap(range, reserve);
    *failed_step = "mmap of a shared-memory segment failed";
    return err;
  }
  if (aligned > start) munmap(range, aligned - start);
  const std::uintptr_t end = aligned + bytes;
  if (start + reserve > end) munmap(reinterpret_cast<void*>(end), start + reserve - end);
  return 0;
}

// Maps the segment at an address aligned to kSegmentAlignment, so that heap offsets aligned to up to that much
// are aligned addresses too: reserve a larger range, map the segment over its aligned part, return the slack.
// When the address space (or the count of mappings) runs out, the retired segments' ranges go first.
Result<void*> MapFd(int fd, std::size_t bytes, const std::string& name) {
  void* data = nullptr;
  const char* failed_step = "";
  int err = TryMapFd(fd, bytes, &data, &failed_step);
  if (err == ENOMEM) {
    const std::size_t released = ReleaseRetired();
    if (released > 0) {
      HP_LOG(kWarning, "the address space ran out: gave back the ranges of earlier heaps, where stale aliases now "
                       "fault: bytes=" + std::to_string(released) + " name=" + name);
      err = TryMapFd(fd, bytes, &data, &failed_step);
    }
  }
  if (err != 0) {
    return DeviceError(std::string(failed_step) + ": name=" + name + " bytes=" + std::to_string(bytes) +
                       " error=" + ErrnoText(err));
  }
  return data;
}

}  // namespace

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = other.data_;
    size_ = other.size_;
    owner_linked_ = other.owner_linked_;
    lock_fd_ = other.lock_fd_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.owner_linked_ = false;
    other.lock_fd_ = -1;
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  if (owner_linked_) (void)Unlink();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ShmSegment::Retire() {
  if (owner_linked_) (void)Unlink();
  if (data_ != nullptr) {
    void* zeros = mmap(data_, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                       -1, 0);
    if (zeros == MAP_FAILED) {
      HP_LOG(kWarning, "keeping a retired segment's addresses failed, unmapping them: name=" + name_ + " bytes=" +
                           std::to_string(size_) + " error=" + ErrnoText(errno));
      munmap(data_, size_);
    } else {
      RetiredRanges& retired = Retired();
      std::lock_guard<std::mutex> lock(retired.mu);
      retired.ranges.emplace_back(data_, size_);
    }
  }
  data_ = nullptr;
  size_ = 0;
}

Result<ShmSegment> ShmSegment::Create(std::size_t bytes) {
  ShmSegment segment;
  int fd = -1;
  for (int attempt = 1;; ++attempt) {
    HP_ASSIGN_OR_RETURN(std::string name, RandomName());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return DeviceError("shm_open failed: name=" + name + " error=" + ErrnoText(errno));
    segment.name_ = name;
    segment.owner_linked_ = true;   // from here on, the destructor removes the name on any failure
    segment.lock_fd_ = fd;
    // The lock is what tells a live segment from a stale one. A cleanup that locked the new name first unlinks
    // it (we then see no link left) or still holds it (we cannot lock): start again under a new name.
    struct stat st;
    const bool locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (locked && fstat(fd, &st) == 0 && st.st_nlink > 0) break;
    const int err = locked ? 0 : errno;
    (void)segment.Unlink();
    fd = -1;
    if (attempt == kCreateAttempts) {
      return DeviceError("a concurrent stale-segment cleanup took every new shared-memory segment: attempts=" +
                         std::to_string(attempt) + " name=" + name +
                         (locked ? std::string(" error=unlinked") : " error=" + ErrnoText(err)));
    }
  }
  const std::string& name = segment.name_;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return DeviceError("ftruncate of a shared-memory segment failed: name=" + name + " bytes=" + std::to_string(bytes) +
                       " error=" + ErrnoText(errno));
  }
  // Allocate every page now (tmpfs allocates lazily: a page missing on first touch would be a SIGBUS).
  int err = 0;
  do {
    err = bytes == 0 ? 0 : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  if (err == ENOSPC || err == ENOMEM) {
    return OutOfMemory(TooSmall("a symmetric heap", kShmDir, " name=" + name + " error=" + ErrnoText(err), bytes,
                                AvailableBytes(kShmDir)));
  }
  if (err != 0) {
    return DeviceError("posix_fallocate of a shared-memory segment failed: name=" + name +
                       " bytes=" + std::to_string(bytes) + " error=" + ErrnoText(err));
  }
  HP_ASSIGN_OR_RETURN(void* data, MapFd(fd, bytes, name));
  segment.data_ = data;
  segment.size_ = bytes;
  return segment;
}

Result<ShmSegment> ShmSegment::Open(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return DeviceError("shm_open of a peer segment failed: name=" + name + " error=" + ErrnoText(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return DeviceError("fstat of a peer segment failed: name=" + name + " error=" + ErrnoText(err));
  }
  if (static_cast<std::size_t>(st.st_size) != bytes) {
    close(fd);
    return DeviceError("peer segment has an unexpected size: name=" + name + " expected=" + std::to_string(bytes) +
                       " observed=" + std::to_string(static_cast<long long>(st.st_size)));
  }
  auto data = MapFd(fd, bytes, name);
  close(fd);
  if (!data.ok()) return data.status();
  ShmSegment segment;
  segment.name_ = name;
  segment.data_ = data.value();
  segment.size_ = bytes;
  return segment;
}

Status ShmSegment::Unlink() {
  if (!owner_linked_) return Status::Ok();
  owner_linked_ = false;
  const int unlinked = shm_unlink(name_.c_str());
  const int err = errno;
  // The lock goes only after the name: a cleanup never finds the name without it.
  if (lock_fd_ >= 0) close(lock_fd_);
  lock_fd_ = -1;
  if (unlinked != 0 && err != ENOENT) {
    return DeviceError("shm_unlink failed: name=" + name_ + " error=" + ErrnoText(err));
  }
  return Status::Ok();
}

Status CheckShmCapacity(std::size_t bytes_needed, const std::string& shm_dir) {
  struct statvfs vfs;
  if (statvfs(shm_dir.c_str(), &vfs) != 0) {
    return DeviceError("cannot inspect the shared-memory filesystem: path=" + shm_dir + " error=" + ErrnoText(errno));
  }
  const unsigned long long available =
      static_cast<unsigned long long>(vfs.f_bavail) * static_cast<unsigned long long>(vfs.f_frsize);
  if (available < bytes_needed) {
    return OutOfMemory(TooSmall("the symmetric heaps", shm_dir, "", bytes_needed, static_cast<long long>(available)));
  }
  return Status::Ok();
}

int RemoveStaleSegments(const std::string& shm_dir) {
  DIR* dir = opendir(shm_dir.c_str());
  if (dir == nullptr) return 0;
  const int dir_fd = dirfd(dir);
  const uid_t me = geteuid();
  int removed = 0;
  const std::size_t prefix_len = std::strlen(kSegmentPrefix);
  while (dirent* entry = readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, kSegmentPrefix, prefix_len) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name + prefix_len, &end, 10);
    if (end == name + prefix_len || *end != '-' || pid <= 0) continue;
    // Only our own regular files: never another user's (even as root), a link or a device.
    struct stat seen;
    if (fstatat(dir_fd, name, &seen, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(seen.st_mode) || seen.st_uid != me) {
      continue;
    }
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;   // a process of that pid lives here
    const int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat opened;
    struct stat still;
    // Its creator (in whatever PID namespace) holds the lock while it lives; the name must still be that file.
    const bool stale = fstat(fd, &opened) == 0 && SameFile(opened, seen) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
                       fstatat(dir_fd, name, &still, AT_SYMLINK_NOFOLLOW) == 0 && SameFile(still, opened);
    if (stale && unlinkat(dir_fd, name, 0) == 0) {
      ++removed;
      HP_LOG(kWarning, "removed a stale shared-memory segment of a dead process: name=/" + std::string(name) +
                           " pid=" + std::to_string(pid));
    }
    close(fd);
  }
  closedir(dir);
  return removed;
}

}  // namespace hp::shmem::host
