#include "bindings/torch/call_support.h"

#include <limits>
#include <optional>
#include <string>

#include "bindings/torch/arguments.h"
#include "bindings/torch/reduce_dtypes.h"
#include "bindings/torch/status_error.h"
#include "bindings/torch/tensor_device.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {

StreamHandle OnStream(StreamHandle stream) {
  if (stream != kDefaultStream) return stream;
  const TensorDevice& active = ActiveTensorDevice();
  return active.default_stream == nullptr ? kDefaultStream : active.default_stream(active.device);
}

DataType ReduceDtypeArg(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.scalar_type() != src.scalar_type()) {
    throw StatusError(TypeError("`dst` must have the dtype of `src` (" + DtypeName(src.scalar_type()) + "), but got " +
                                DtypeName(dst.scalar_type())));
  }
  if (const std::optional<DataType> dtype = ReduceDataTypeOf(src.scalar_type())) return *dtype;
  throw StatusError(TypeError(std::string("`src` must have one of dtypes ") + kReducibleDtypes + ", but got " +
                              DtypeName(src.scalar_type())));
}

std::vector<int> PesArg(py::handle value, const char* name) {
  if (!PyList_Check(value.ptr()) && !PyTuple_Check(value.ptr())) {
    throw StatusError(TypeError(std::string("`") + name + "` must be a list or tuple of ints, but got " +
                                PyTypeName(value)));
  }
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(value.ptr());
  PyObject** items = PySequence_Fast_ITEMS(value.ptr());
  std::vector<int> pes(static_cast<std::size_t>(size));
  for (Py_ssize_t i = 0; i < size; ++i) {
    // The element's name is built only when IntArg has to explain it: this loop sits on the hot path.
    int overflow = 0;
    const long long pe = PyLong_CheckExact(items[i]) ? PyLong_AsLongLongAndOverflow(items[i], &overflow) : 0;
    if (PyLong_CheckExact(items[i]) && overflow == 0 && pe >= std::numeric_limits<int>::min() &&
        pe <= std::numeric_limits<int>::max()) {
      pes[static_cast<std::size_t>(i)] = static_cast<int>(pe);
      continue;
    }
    const std::string item = std::string(name) + "[" + std::to_string(i) + "]";
    pes[static_cast<std::size_t>(i)] = static_cast<int>(IntArg(items[i], item.c_str(), std::numeric_limits<int>::min(),
                                                               std::numeric_limits<int>::max(), "a C int"));
  }
  return pes;
}

}  // namespace hp::shmem::torch_binding
