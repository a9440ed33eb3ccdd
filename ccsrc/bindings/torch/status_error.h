// A runtime Status carried across the binding as a C++ exception; module.cc turns it into the Python exception
// class that the Python layer registered for its code.
#pragma once

#include <stdexcept>

#include "runtime/status.h"

namespace hp::shmem::torch_binding {

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status) : std::runtime_error(status.message()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void ThrowIfError(Status status) {
  if (!status.ok()) throw StatusError(std::move(status));
}

template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

}  // namespace hp::shmem::torch_binding
