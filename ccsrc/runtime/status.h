// Status and Result: how every layer of the runtime reports failure without exceptions.
//
// Messages follow the project's two forms:
//   a broken contract: "`x` must be y, but got z"      (kInvalidArgument, kTypeError)
//   a state fact:      "<fact>: key=value key=value"    (every other code)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace hp::shmem {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // a value breaks the contract (Python ValueError)
  kTypeError = 2,         // a type or dtype breaks the contract (Python TypeError)
  kStateError = 3,        // the call is not valid in the current lifecycle state
  kTimeout = 4,           // a wait, barrier or bootstrap step ran out of time
  kOutOfMemory = 5,       // the symmetric heap or /dev/shm cannot hold the request
  kMismatch = 6,          // ranks disagree on a collective (allocation order, sizes)
  kDeviceError = 7,       // the device or the operating system failed a call
  kInternal = 8,          // a bug in this library
  kInterrupted = 9,       // a wait gave up because the process was signalled (Ctrl-C)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", for logs.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
inline Status TypeError(std::string m) { return Status(StatusCode::kTypeError, std::move(m)); }
inline Status StateError(std::string m) { return Status(StatusCode::kStateError, std::move(m)); }
inline Status Timeout(std::string m) { return Status(StatusCode::kTimeout, std::move(m)); }
inline Status OutOfMemory(std::string m) { return Status(StatusCode::kOutOfMemory, std::move(m)); }
inline Status Mismatch(std::string m) { return Status(StatusCode::kMismatch, std::move(m)); }
inline Status DeviceError(std::string m) { return Status(StatusCode::kDeviceError, std::move(m)); }
inline Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status Interrupted(std::string m) { return Status(StatusCode::kInterrupted, std::move(m)); }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}          // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace hp::shmem

#define HP_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::hp::shmem::Status hp_status_ = (expr);  \
    if (!hp_status_.ok()) return hp_status_;  \
  } while (0)

#define HP_CONCAT_INNER(a, b) a##b
#define HP_CONCAT(a, b) HP_CONCAT_INNER(a, b)
#define HP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
// HP_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status when MakeX() failed.
#define HP_ASSIGN_OR_RETURN(lhs, expr) HP_ASSIGN_OR_RETURN_IMPL(HP_CONCAT(hp_result_, __LINE__), lhs, expr)
