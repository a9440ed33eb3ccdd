// The runtime's Bootstrap over two Python callables that the Python layer builds on the root ProcessGroup.
#pragma once

#include <pybind11/pybind11.h>

#include <cstring>
#include <string>

#include "runtime/bootstrap.h"

namespace hp::shmem::torch_binding {

class __attribute__((visibility("hidden"))) PyBootstrap final : public Bootstrap {
 public:
  // all_gather(bytes) -> bytes: every rank's payload concatenated in rank order, or (str) the message of its
  // timeout. barrier() -> None, or the message of its timeout.
  PyBootstrap(int rank, int world_size, pybind11::object all_gather, pybind11::object barrier)
      : rank_(rank), world_size_(world_size), all_gather_(std::move(all_gather)), barrier_(std::move(barrier)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Status AllGather(const void* in, std::size_t bytes, void* out) override {
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::object gathered = all_gather_(pybind11::bytes(static_cast<const char*>(in), bytes));
      if (pybind11::isinstance<pybind11::str>(gathered)) return Timeout(gathered.cast<std::string>());
      std::string joined = gathered.cast<pybind11::bytes>();
      if (joined.size() != bytes * static_cast<std::size_t>(world_size_)) {
        return Internal("bootstrap all_gather returned an unexpected size: expected=" +
                        std::to_string(bytes * static_cast<std::size_t>(world_size_)) +
                        " observed=" + std::to_string(joined.size()));
      }
      std::memcpy(out, joined.data(), joined.size());
      return Status::Ok();
    } catch (pybind11::error_already_set& e) {
      return DeviceError("bootstrap all_gather over the root ProcessGroup failed: " + Describe(e));
    }
  }

  Status Barrier() override {
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::object timed_out = barrier_();
      if (!timed_out.is_none()) return Timeout(pybind11::str(timed_out));
      return Status::Ok();
    } catch (pybind11::error_already_set& e) {
      return DeviceError("bootstrap barrier over the root ProcessGroup failed: " + Describe(e));
    }
  }

 private:
  // "Type: first line of the message": what failed, without the Python traceback that e.what() appends.
  static std::string Describe(const pybind11::error_already_set& e) {
    std::string text = pybind11::str(e.value());
    const std::size_t newline = text.find('\n');
    if (newline != std::string::npos) text.resize(newline);
    return pybind11::str(e.type().attr("__name__")).cast<std::string>() + ": " + text;
  }

  int rank_;
  int world_size_;
  pybind11::object all_gather_;
  pybind11::object barrier_;
};

}  // namespace hp::shmem::torch_binding
