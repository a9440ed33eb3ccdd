// How ranks find each other at initialisation: the framework's process group, seen from C++.
//
// The runtime never opens sockets of its own: the torch binding implements this over the root ProcessGroup,
// and the C++ unit tests implement it over threads.
#pragma once

#include <cstddef>

#include "runtime/status.h"

namespace hp::shmem {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Every rank contributes `bytes` bytes of `in`; `out` receives world_size() * bytes, in rank order.
  virtual Status AllGather(const void* in, std::size_t bytes, void* out) = 0;
  virtual Status Barrier() = 0;
};

}  // namespace hp::shmem
