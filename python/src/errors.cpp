// errc → tide.errors: the classes live in Python (tide/errors.py), which
// picks the class from the code, so a new errc needs no change here.
#include "errors.hpp"

namespace tide::py {
namespace pyb = pybind11;

void set_native_error(const native_error& e) noexcept {
  try {
    pyb::object exc =
        pyb::module_::import("tide.errors").attr("from_native")(static_cast<int>(e.err.code), e.err.detail, e.err.message());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (pyb::error_already_set& inner) {
    inner.restore();  // tide.errors itself failed to import: its error says why
  } catch (const std::exception& other) {
    PyErr_SetString(PyExc_RuntimeError, other.what());
  }
}

void init_errors(pyb::module_& m) {
  m.def(
      "errc_table",
      [] {
        pyb::list out;
        // The codes are dense within each group (errc.hpp): walk each range
        // until the name runs out.
        for (int base : {100, 200, 300, 400}) {
          for (int v = base;; ++v) {
            const auto name = to_string(static_cast<errc>(v));
            if (name.empty() || name == "?" || name == "unknown") break;
            out.append(pyb::make_tuple(v, std::string(name), std::string(describe(static_cast<errc>(v)))));
          }
        }
        return out;
      },
      "Every tide::errc as (code, name, description); code // 100 is its group.");

  pyb::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const native_error& e) {
      set_native_error(e);
    }
  });
}

}  // namespace tide::py
