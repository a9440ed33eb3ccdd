#include "runtime/host/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/logging.h"

namespace hp::shmem::host {

const char* const kSegmentPrefix = "hpshmem-";

namespace {

std::string ErrnoText(int err) { return std::string(std::strerror(err)) + " (errno=" + std::to_string(err) + ")"; }

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

// Maps the segment at an address aligned to kSegmentAlignment, so that heap offsets aligned to up to that much
// are aligned addresses too: reserve a larger range, map the segment over its aligned part, return the slack.
Result<void*> MapFd(int fd, std::size_t bytes, const std::string& name) {
  const std::size_t reserve = bytes + kSegmentAlignment;
  void* range = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (range == MAP_FAILED) {
    return DeviceError("reserving address space for a shared-memory segment failed: name=" + name +
                       " bytes=" + std::to_string(reserve) + " error=" + ErrnoText(errno));
  }
  const auto start = reinterpret_cast<std::uintptr_t>(range);
  const std::uintptr_t aligned = (start + kSegmentAlignment - 1) & ~(std::uintptr_t{kSegmentAlignment} - 1);
  void* data = mmap(reinterpret_cast<void*>(aligned), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    munmap(range, reserve);
    return DeviceError("mmap of a shared-memory segment failed: name=" + name + " bytes=" + std::to_string(bytes) +
                       " error=" + ErrnoText(err));
  }
  if (aligned > start) munmap(range, aligned - start);
  const std::uintptr_t end = aligned + bytes;
  if (start + reserve > end) munmap(reinterpret_cast<void*>(end), start + reserve - end);
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
    other.data_ = nullptr;
    other.size_ = 0;
    other.owner_linked_ = false;
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

Result<ShmSegment> ShmSegment::Create(std::size_t bytes) {
  HP_ASSIGN_OR_RETURN(std::string name, RandomName());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return DeviceError("shm_open failed: name=" + name + " error=" + ErrnoText(errno));
  ShmSegment segment;
  segment.name_ = name;
  segment.owner_linked_ = true;   // from here on, the destructor removes the name on any failure
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return DeviceError("ftruncate of a shared-memory segment failed: name=" + name + " bytes=" + std::to_string(bytes) +
                       " error=" + ErrnoText(err));
  }
  auto data = MapFd(fd, bytes, name);
  close(fd);
  if (!data.ok()) return data.status();
  segment.data_ = data.value();
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
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return DeviceError("shm_unlink failed: name=" + name_ + " error=" + ErrnoText(errno));
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
    return OutOfMemory("shared-memory filesystem too small for the symmetric heaps: path=" + shm_dir +
                       " required=" + std::to_string(bytes_needed) + " available=" + std::to_string(available) +
                       " (lower HYPER_PARALLEL_SHMEM_HEAP_SIZE or enlarge " + shm_dir + ")");
  }
  return Status::Ok();
}

int RemoveStaleSegments(const std::string& shm_dir) {
  DIR* dir = opendir(shm_dir.c_str());
  if (dir == nullptr) return 0;
  int removed = 0;
  const std::size_t prefix_len = std::strlen(kSegmentPrefix);
  while (dirent* entry = readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, kSegmentPrefix, prefix_len) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name + prefix_len, &end, 10);
    if (end == name + prefix_len || *end != '-' || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;   // alive, or not ours to judge
    const std::string shm_name = std::string("/") + name;
    if (shm_unlink(shm_name.c_str()) == 0) {
      ++removed;
      HP_LOG(kWarning, "removed a stale shared-memory segment of a dead process: name=" + shm_name +
                           " pid=" + std::to_string(pid));
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace hp::shmem::host
