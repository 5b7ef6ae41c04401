// The plain METH_FASTCALL functions (fast_call.hpp) and their argument
// readers: each failure is a TypeError naming the argument, as pybind11's
// casters give.
#include "fast_call.hpp"

#include "engine.hpp"

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

namespace {

/// py_engine::transfer_one as a METH_FASTCALL function: the path of
/// tide.TransferEngine.transfer_sync_write / _read.  All eight arguments
/// positional; None, or transfer_named's failure tuple.
PyObject* sync_one(PyObject*, PyObject* const* args, Py_ssize_t n) noexcept {
  return fast_call([&]() -> pyb::object {
    if (n != 8)
      throw pyb::type_error("sync_one(engine, target_hostname, opcode, buffer, peer_address, length, base_timeout, "
                            "timeout_per_byte) takes 8 arguments, got " + std::to_string(n));
    py_engine* engine = nullptr;  // one type lookup: None casts to null, another type throws
    try {
      engine = pyb::handle(args[0]).cast<py_engine*>();
    } catch (const pyb::cast_error&) {
    }
    if (engine == nullptr)
      throw pyb::type_error(std::string("sync_one: engine must be a tide._tide.Engine, got ") +
                            Py_TYPE(args[0])->tp_name);
    return engine->transfer_one(
        text_argument(args[1], "target_hostname"), int_argument(args[2], "opcode"), args[3], args[4], args[5],
        float_argument(args[6], "base_timeout"), float_argument(args[7], "timeout_per_byte"));
  });
}

PyMethodDef sync_one_def{"sync_one", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&sync_one)),
                         METH_FASTCALL,
                         "sync_one(engine, target_hostname, opcode, buffer, peer_address, length, base_timeout, "
                         "timeout_per_byte): Engine.transfer_named of one request given as three ints, without "
                         "a notification.  None when it completed; else transfer_named's tuple."};

}  // namespace

void init_fast_calls(pyb::module_& m) {
  PyObject* sync_one_fn = PyCFunction_NewEx(&sync_one_def, nullptr, m.attr("__name__").ptr());
  if (sync_one_fn == nullptr) throw pyb::error_already_set();
  m.add_object("sync_one", pyb::reinterpret_steal<pyb::object>(sync_one_fn));
}

}  // namespace tide::py
