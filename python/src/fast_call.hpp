#pragma once
// A few calls are made once per transfer (Mooncake's transfer_sync_write /
// _read, one 4 KiB request at a time): pybind11's dispatcher (overload
// walk, a type caster per argument, keep-alive frame) costs more there
// than the rest of the Python side.  Those calls are plain METH_FASTCALL
// functions instead; fast_call gives them pybind11's error behaviour.

#include "errors.hpp"

#include <pybind11/pybind11.h>

#include <new>
#include <string>

namespace tide::py {

/// Runs `body` (returning a pybind11::object) and hands its result to
/// CPython; an exception becomes the Python error pybind11 would raise.
template <class Body>
PyObject* fast_call(Body&& body) noexcept {
  try {
    return body().release().ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
  } catch (const pybind11::builtin_exception& e) {
    e.set_error();
  } catch (const native_error& e) {
    set_native_error(e);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

/// Argument `what` as a str's UTF-8 text.
std::string text_argument(PyObject* arg, const char* what);
/// Argument `what` as a float (an int is taken too, as pybind11 does).
double float_argument(PyObject* arg, const char* what);
/// Argument `what` as a C int.
int int_argument(PyObject* arg, const char* what);

/// Adds the module's METH_FASTCALL functions (sync_one).
void init_fast_calls(pybind11::module_& m);

}  // namespace tide::py
