// tide._tide's functions that need no engine: a buffer-protocol object's
// address, copies in and out of registered memory, this host's RDMA
// topology, the policy sets built in.
#include "engine_iface.hpp"
#include "errors.hpp"

#include <tide/topology/hca.hpp>
#include <tide/topology/priority_matrix.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tide::py {
namespace pyb = pybind11;

namespace {

/// The address, size and writability of a C-contiguous buffer-protocol object
/// (tide.Engine.register keeps a memoryview of it exported while registered).
pyb::tuple buffer_address(const pyb::object& obj) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_RECORDS_RO) != 0) throw pyb::error_already_set();
  const bool contiguous = PyBuffer_IsContiguous(&view, 'C') != 0;
  const auto addr = reinterpret_cast<std::uintptr_t>(view.buf);
  const auto len = static_cast<std::size_t>(view.len);
  const bool readonly = view.readonly != 0;
  PyBuffer_Release(&view);
  if (!contiguous) throw pyb::value_error("the buffer is not C-contiguous: register a contiguous copy");
  return pyb::make_tuple(addr, len, readonly);
}

std::string local_topology(const std::vector<std::string>& devices, const std::string& sysfs_root) {
  std::vector<topology::hca_info> hcas;
  {
    pyb::gil_scoped_release nogil;
    auto all = topology::scan_hcas(sysfs_root);
    if (!all) {
      pyb::gil_scoped_acquire gil;
      raise(std::move(all.error()));
    }
    for (auto& h : *all)
      if (devices.empty() || std::find(devices.begin(), devices.end(), h.name) != devices.end())
        hcas.push_back(std::move(h));
  }
  return topology::priority_matrix::from_hcas(hcas, topology::scan_numa_nodes(sysfs_root)).to_json();
}

}  // namespace

void init_module_functions(pyb::module_& m) {
  m.def("buffer_address", &buffer_address, pyb::arg("obj"),
        "(address, nbytes, readonly) of a C-contiguous buffer-protocol object.  Raises TypeError (no buffer "
        "protocol), ValueError (not C-contiguous).");
  m.def("local_topology", &local_topology, pyb::arg("devices"), pyb::arg("sysfs_root") = "/sys",
        "The priority matrix of this host's RDMA devices (Mooncake's JSON), limited to `devices` when not empty.");
  m.def(
      "policy_sets",
      [] {
        pyb::list out;
        for (const auto& s : policy_sets()) {
          pyb::list backends;
          backends.append("p2p");
          if (s.etcd != nullptr) backends.append("etcd");
          if (s.http != nullptr) backends.append("http");
          out.append(pyb::make_tuple(s.name, s.description, backends));
        }
        return out;
      },
      "The policy sets this module is built with: (name, 'eviction / shard hash / idle / path', backends).");
  m.def(
      "copy_in",
      [](std::uintptr_t addr, const pyb::buffer& data, std::size_t length) {
        pyb::buffer_info info = data.request();
        if (static_cast<std::size_t>(info.size * info.itemsize) < length)
          throw pyb::value_error("copy_in: " + std::to_string(length) + " bytes asked, the data has " +
                                 std::to_string(info.size * info.itemsize));
        std::memcpy(as_pointer(addr), info.ptr, length);
      },
      pyb::arg("addr"), pyb::arg("data"), pyb::arg("length"),
      "memcpy of `length` bytes of `data` to `addr` (the caller checked the range).");
  m.def(
      "copy_out",
      [](std::uintptr_t addr, std::size_t length) {
        return pyb::bytes(static_cast<const char*>(as_pointer(addr)), length);
      },
      pyb::arg("addr"), pyb::arg("length"), "`length` bytes at `addr` as bytes (the caller checked the range).");
}

}  // namespace tide::py
