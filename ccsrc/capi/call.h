// How every function of the C ABI runs: a Status in, a code out, the message kept for hp_shmem_last_error(), and no
// exception across the C boundary.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "capi/hp_shmem.h"
#include "runtime/status.h"

namespace hp::shmem::capi {

// The message of this thread's latest failed call.
inline std::string& LastError() {
  thread_local std::string message;
  return message;
}

constexpr int Code(StatusCode code) { return static_cast<int>(code); }

// Runs `body` (returning a Status) and turns it into the C result: the code, and the message in LastError().
template <typename Body>
int Call(Body&& body) noexcept {
  LastError().clear();
  try {
    const Status status = body();
    if (status.ok()) return HP_SHMEM_OK;
    LastError() = status.message();
    return Code(status.code());
  } catch (const std::bad_alloc&) {
    LastError() = "out of host memory inside the C ABI: what=std::bad_alloc";
    return HP_SHMEM_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    LastError() = std::string("an exception reached the C ABI: what=") + e.what();
    return HP_SHMEM_INTERNAL;
  } catch (...) {
    LastError() = "an exception of unknown type reached the C ABI";
    return HP_SHMEM_INTERNAL;
  }
}

}  // namespace hp::shmem::capi
