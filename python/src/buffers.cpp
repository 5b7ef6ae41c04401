// The module's buffer functions: buffer_address (what tide.Engine.register
// registers), copy_in / copy_out (Mooncake's bytes-to-buffer copies; the
// Engine's copy_in / copy_out run the same while holding the engine).
#include "buffers.hpp"

#include "engine_iface.hpp"
#include "errors.hpp"

#include <tide/memory/memory_kind.hpp>

#include <cstring>
#include <string>

namespace tide::py {
namespace pyb = pybind11;

namespace {

/// A buffer export, released on scope exit (with the GIL: callers hold it).
class exported {
 public:
  explicit exported(const pyb::object& obj) {
    // Strided: the layout is checked here, so the error can name it.
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_RECORDS_RO) != 0) throw pyb::error_already_set();
  }
  ~exported() { PyBuffer_Release(&view_); }
  exported(const exported&) = delete;
  exported& operator=(const exported&) = delete;
  [[nodiscard]] const Py_buffer& view() const noexcept { return view_; }

  /// ValueError unless C-contiguous.
  void require_contiguous(const char* what) const {
    if (PyBuffer_IsContiguous(&view_, 'C') != 0) return;
    std::string shape, strides;
    for (int i = 0; i < view_.ndim; ++i) {
      shape += (i ? ", " : "") + std::to_string(view_.shape != nullptr ? view_.shape[i] : 0);
      strides += (i ? ", " : "") + std::to_string(view_.strides != nullptr ? view_.strides[i] : 0);
    }
    throw pyb::value_error(std::string(what) + ": the buffer is not C-contiguous (shape (" + shape + "), strides (" +
                           strides + ")): pass a contiguous copy");
  }

 private:
  Py_buffer view_{};
};

pyb::tuple buffer_address(const pyb::object& obj) {
  exported e(obj);
  e.require_contiguous("buffer_address");
  return pyb::make_tuple(reinterpret_cast<std::uintptr_t>(e.view().buf), static_cast<std::size_t>(e.view().len),
                         e.view().readonly != 0);
}

}  // namespace

void copy_into(std::uintptr_t addr, const pyb::object& data, std::size_t length) {
  exported e(data);
  e.require_contiguous("copy_in");
  if (static_cast<std::size_t>(e.view().len) < length)
    throw pyb::value_error("copy_in: " + std::to_string(length) + " bytes asked, the data has " +
                           std::to_string(e.view().len));
  // GPU memory takes the driver's copy (a memcpy there would fault).
  unwrap(memory::copy_from_host(addr, e.view().buf, length));
}

pyb::bytes copy_from(std::uintptr_t addr, std::size_t length) {
  // Host memory (always, without a CUDA driver) is read where it is.
  if (auto info = memory::classify(as_pointer(addr), length); info && info->kind == memory::kind::host)
    return {static_cast<const char*>(as_pointer(addr)), length};
  std::string out(length, '\0');
  unwrap(memory::copy_to_host(out.data(), addr, length));
  return pyb::bytes(out);
}

void init_buffers(pyb::module_& m) {
  m.def("buffer_address", &buffer_address, pyb::arg("obj"),
        "(address, nbytes, readonly) of a C-contiguous buffer-protocol object.  Raises TypeError (no buffer "
        "protocol), ValueError (not C-contiguous).");
  m.def("copy_in", &copy_into, pyb::arg("addr"), pyb::arg("data"), pyb::arg("length"),
        "memcpy of `length` bytes of `data` (C-contiguous: ValueError otherwise) to `addr` (the caller checked "
        "the range).");
  m.def("copy_out", &copy_from, pyb::arg("addr"), pyb::arg("length"),
        "`length` bytes at `addr` as bytes (the caller checked the range).");
}

}  // namespace tide::py
