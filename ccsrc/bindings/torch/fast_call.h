// Entries on the small-message path, without pybind11's dispatcher.
//
// pybind11's dispatcher (overloads, keywords, type casters) costs as much as the rest of a small collective's
// binding (docs/perf.md, "Figures behind the code's constants"). These entries are plain METH_FASTCALL functions over
// the same bodies: positional arguments only (the runtime face calls them so), ints converted and checked as the data
// plane's are.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

#include "bindings/torch/arguments.h"
#include "bindings/torch/python_errors.h"
#include "bindings/torch/status_error.h"

namespace hp::shmem::torch_binding {

template <typename T>
T FastArg(PyObject* value, const char* name);

template <>
inline pybind11::handle FastArg<pybind11::handle>(PyObject* value, const char* /*name*/) {
  return value;
}

template <>
inline std::uint64_t FastArg<std::uint64_t>(PyObject* value, const char* name) {
  return static_cast<std::uint64_t>(IntArg(value, name, 0, std::numeric_limits<std::int64_t>::max(),
                                           "[0, 9223372036854775807]"));
}

template <>
inline int FastArg<int>(PyObject* value, const char* name) {
  if (value == nullptr) return 0;   // an optional trailing argument the caller left out
  return static_cast<int>(IntArg(value, name, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                                 "a C int"));
}

template <typename... Args, std::size_t... I>
void FastCall(void (*fn)(Args...), PyObject* const* arguments, const char* const* names, std::index_sequence<I...>) {
  // Braces convert left to right: the first bad argument is the one named.
  std::tuple<std::decay_t<Args>...> converted{FastArg<std::decay_t<Args>>(arguments[I], names[I])...};
  std::apply(fn, converted);
}

template <typename... Args>
constexpr std::size_t Arity(void (* /*fn*/)(Args...)) {
  return sizeof...(Args);
}

// `fn` called with Python's positional arguments, named `names` in errors; returns None. The last `optional` ints may
// be left out (0: a call role's forward).
template <auto Fn, const auto& Names, std::size_t Optional = 0>
PyObject* FastEntry(PyObject* /*module*/, PyObject* const* arguments, Py_ssize_t count) {
  constexpr std::size_t arity = Arity(Fn);
  static_assert(std::size(Names) == arity, "one name per argument");
  if (count < static_cast<Py_ssize_t>(arity - Optional) || count > static_cast<Py_ssize_t>(arity)) {
    PyErr_Format(PyExc_TypeError, "takes %zu positional arguments (%s, ...), but got %zd", arity, Names[0], count);
    return nullptr;
  }
  std::array<PyObject*, arity> given{};
  std::copy(arguments, arguments + count, given.begin());
  try {
    FastCall(Fn, given.data(), Names, std::make_index_sequence<arity>{});
  } catch (const StatusError& e) {
    SetPythonError(e);
    return nullptr;
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// A METH_FASTCALL function (Python 3.11 names its type only privately).
using FastFunction = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t);

// Adds `function` to `m` as `name` (the method table lives as long as the process).
void AddFastFunction(pybind11::module_& m, const char* name, FastFunction function, const char* doc);

}  // namespace hp::shmem::torch_binding
