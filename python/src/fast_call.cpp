// The argument readers of the plain METH_FASTCALL functions (fast_call.hpp):
// each failure is a TypeError naming the argument, as pybind11's casters give.
#include "fast_call.hpp"

#include <climits>

namespace tide::py {
namespace pyb = pybind11;

std::string text_argument(PyObject* arg, const char* what) {
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &n) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    throw pyb::type_error(std::string(what) + " must be a str, got " + Py_TYPE(arg)->tp_name);
  }
  return {s, static_cast<std::size_t>(n)};
}

double float_argument(PyObject* arg, const char* what) {
  const double v = PyFloat_AsDouble(arg);
  if (v == -1.0 && PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw pyb::type_error(std::string(what) + " must be a float, got " + Py_TYPE(arg)->tp_name);
  }
  return v;
}

int int_argument(PyObject* arg, const char* what) {
  int overflow = 0;
  const long v = PyLong_Check(arg) ? PyLong_AsLongAndOverflow(arg, &overflow) : -1;
  if (!PyLong_Check(arg) || overflow != 0 || v < INT_MIN || v > INT_MAX || (v == -1 && PyErr_Occurred() != nullptr)) {
    PyErr_Clear();
    throw pyb::type_error(std::string(what) + " must be an int, got " + pyb::repr(arg).cast<std::string>());
  }
  return static_cast<int>(v);
}

}  // namespace tide::py
