// One POSIX shared-memory segment: created by its owner rank, mapped by every rank of the machine.
//
// Names are unguessable ("/hpshmem-<pid>-<128 random bits>"), mode 0600, and the owner unlinks the name as soon
// as every rank has mapped it, so nothing is left in /dev/shm once initialisation is over, crash or not. A
// process that dies inside that window leaves a segment whose name carries its pid: RemoveStaleSegments()
// deletes those of dead processes.
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

  // Creates and maps a new segment of `bytes` bytes.
  static Result<ShmSegment> Create(std::size_t bytes);
  // Maps an existing segment by name.
  static Result<ShmSegment> Open(const std::string& name, std::size_t bytes);

  // Removes the name from /dev/shm; the mapping stays valid.
  Status Unlink();

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void Reset();
  std::string name_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool owner_linked_ = false;
};

// Fails with kOutOfMemory, before anything is written, when the shared-memory filesystem cannot hold
// `bytes_needed` more bytes.
Status CheckShmCapacity(std::size_t bytes_needed, const std::string& shm_dir = "/dev/shm");

// Unlinks the segments of this library whose creating process no longer exists; returns how many.
int RemoveStaleSegments(const std::string& shm_dir = "/dev/shm");

// Every segment is mapped at an address that is a multiple of this (2 MiB, a huge page).
constexpr std::size_t kSegmentAlignment = std::size_t{2} << 20;

// "hpshmem-" — the prefix of every segment name (without the leading slash).
extern const char* const kSegmentPrefix;

}  // namespace hp::shmem::host
