// tide._tide: the one extension that includes tide's headers.  Python's
// tide package (tide/*.py) builds the public API over it.
#include "buffers.hpp"
#include "completion.hpp"
#include "errors.hpp"
#include "fast_call.hpp"

#include <pybind11/stl.h>

namespace tide::py {
void init_engine(pybind11::module_& m);
void init_module_functions(pybind11::module_& m);
void init_log(pybind11::module_& m);
}  // namespace tide::py

PYBIND11_MODULE(_tide, m) {
  namespace pyb = pybind11;
  m.doc() = "tide's C++ engine (transfer_engine<P>); use the tide package, not this module.";
  m.attr("__version__") = TIDE_VERSION;
  tide::py::init_errors(m);
  tide::py::init_module_functions(m);
  tide::py::init_log(m);
  tide::py::init_buffers(m);
  tide::py::init_engine(m);
  tide::py::init_fast_calls(m);
  pyb::class_<tide::py::completion_queue, std::shared_ptr<tide::py::completion_queue>>(
      m, "CompletionQueue", "An eventfd that watched batches signal when final (asyncio's add_reader).")
      .def(pyb::init<>())
      .def("fileno", &tide::py::completion_queue::fd)
      .def("drain", &tide::py::completion_queue::drain, "Clears the eventfd; the ids of the batches now final.");
}
