// One POSIX shared-memory segment: created by its owner rank, mapped by every rank of the machine.
//
// Names are unguessable ("/hpshmem-<pid>-<128 random bits>"), mode 0600, and the owner unlinks the name as soon
// as every rank has mapped it, so nothing is left in /dev/shm once initialisation is over, crash or not. A
// process that dies inside that window leaves its segment behind: RemoveStaleSegments() deletes it. A segment is
// live while its creator holds a lock on it (flock, from creation at least until the name is unlinked; the
// creator's mapping keeps the locked open file, so the lock lasts until that mapping goes): the kernel drops the
// lock when the creator dies, and the lock means the same in every PID namespace that shares /dev/shm.
//
// The pages are allocated at creation (posix_fallocate): tmpfs allocates lazily, and a page it cannot allocate
// on first touch is a SIGBUS; reserved at creation, a full /dev/shm is a kOutOfMemory error instead.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/status.h"

namespace hp::shmem::host {

class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();   // unmaps; unlinks the name too if this object created it and has not unlinked it yet

  // Creates a new segment of `bytes` bytes, allocates its pages and maps it; the creator holds the segment's lock
  // from now on (see above). Fails with kOutOfMemory when the shared-memory filesystem cannot hold the pages
  // (nothing is left behind).
  static Result<ShmSegment> Create(std::size_t bytes);
  // Maps an existing segment by name.
  static Result<ShmSegment> Open(const std::string& name, std::size_t bytes);

  // Removes the name from /dev/shm, then closes the creator's locked descriptor; the mapping stays valid.
  Status Unlink();

  // Ends the segment without unmapping its addresses: private zero pages replace the mapping (anonymous,
  // MAP_NORESERVE), so a pointer that escaped into it reads zeros and writes memory no one else sees, instead of
  // faulting. The address range stays reserved (address space only), so no later mapping, a later heap
  // included, can land under such a pointer: until the process exits, or until mapping a new segment runs out
  // of address space, which gives back every retired range first (pointers into them fault again). Unlinks the
  // name first if still linked.
  void Retire();

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void Reset();
  std::string name_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool owner_linked_ = false;
  int lock_fd_ = -1;   // the creator's descriptor holding the segment's lock, open while owner_linked_
};

// Fails with kOutOfMemory, before anything is written, when the shared-memory filesystem cannot hold
// `bytes_needed` more bytes.
Status CheckShmCapacity(std::size_t bytes_needed, const std::string& shm_dir = "/dev/shm");

// Unlinks the stale segments of this library in `shm_dir`; returns how many. A segment is stale when it is a
// regular file owned by this effective uid (never another user's, even as root), no process holds its lock, and
// the pid in its name is no process here. The lock decides across PID namespaces (there every pid looks dead);
// the pid keeps segments without a lock of live processes here (an older version of this library) alive.
// Candidates are opened without following links and never blocking, and a name is unlinked only while it still
// names the very file whose lock was taken.
int RemoveStaleSegments(const std::string& shm_dir = "/dev/shm");

// Every segment is mapped at an address that is a multiple of this (2 MiB, a huge page).
constexpr std::size_t kSegmentAlignment = std::size_t{2} << 20;

// "hpshmem-" — the prefix of every segment name (without the leading slash).
extern const char* const kSegmentPrefix;

}  // namespace hp::shmem::host
