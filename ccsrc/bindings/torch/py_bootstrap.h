// The runtime's Bootstrap over two Python callables that the Python layer builds on the root ProcessGroup.
#pragma once

#include <pybind11/pybind11.h>

#include <cstring>
#include <string>

#include "runtime/bootstrap.h"

namespace hp::shmem::torch_binding {

class __attribute__((visibility("hidden"))) PyBootstrap final : public Bootstrap {
 public:
  // all_gather(bytes) -> bytes: every rank's payload concatenated in rank order. barrier() -> None, or the
  // message of its timeout.
  PyBootstrap(int rank, int world_size, pybind11::object all_gather, pybind11::object barrier)
      : rank_(rank), world_size_(world_size), all_gather_(std::move(all_gather)), barrier_(std::move(barrier)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Status AllGather(const void* in, std::size_t bytes, void* out) override {
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::bytes gathered = all_gather_(pybind11::bytes(static_cast<const char*>(in), bytes));
      std::string joined = gathered;
      if (joined.size() != bytes * static_cast<std::size_t>(world_size_)) {
        return Internal("bootstrap all_gather returned an unexpected size: expected=" +
                        std::to_string(bytes * static_cast<std::size_t>(world_size_)) +
                        " observed=" + std::to_string(joined.size()));
      }
      std::memcpy(out, joined.data(), joined.size());
      return Status::Ok();
    } catch (pybind11::error_already_set& e) {
      return DeviceError(std::string("bootstrap all_gather over the root ProcessGroup failed: ") + e.what());
    }
  }

  Status Barrier() override {
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::object timed_out = barrier_();
      if (!timed_out.is_none()) return Timeout(pybind11::str(timed_out));
      return Status::Ok();
    } catch (pybind11::error_already_set& e) {
      return DeviceError(std::string("bootstrap barrier over the root ProcessGroup failed: ") + e.what());
    }
  }

 private:
  int rank_;
  int world_size_;
  pybind11::object all_gather_;
  pybind11::object barrier_;
};

}  // namespace hp::shmem::torch_binding
