// tide._tide's functions that need no engine and no buffer: this host's
// RDMA topology, the policy sets built in.
#include "engine_iface.hpp"
#include "errors.hpp"

#include <tide/memory/memory_kind.hpp>
#include <tide/topology/hca.hpp>
#include <tide/topology/priority_matrix.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace tide::py {
namespace pyb = pybind11;

namespace {

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
  return topology::priority_matrix::from_hcas(hcas, topology::scan_numa_nodes(sysfs_root),
                                              memory::locate_cuda_gpus(sysfs_root))
      .to_json();
}

}  // namespace

void init_module_functions(pyb::module_& m) {
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
      "cuda_status",
      [] {
        const auto& s = memory::cuda();
        return pyb::make_tuple(s.usable, s.devices, s.why_not);
      },
      "(usable, devices, why not): whether GPU memory can be registered here (the CUDA driver, loaded at run "
      "time).");
  m.def(
      "cuda_synchronize",
      [](std::uintptr_t stream) {
        status r;
        {
          pyb::gil_scoped_release nogil;
          r = memory::synchronize_cuda_stream(stream);
        }
        unwrap(std::move(r));
      },
      pyb::arg("stream"), "Waits, without the GIL, for the work queued on a CUDA stream (0: the default stream).");
}

}  // namespace tide::py
