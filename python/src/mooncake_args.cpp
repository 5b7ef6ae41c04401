#include "mooncake_args.hpp"

#include <numeric>
#include <string>

namespace tide::py {
namespace pyb = pybind11;

result<segment_id> named_segments::open(engine_iface& e, const std::string& name) {
  std::shared_ptr<entry> slot;
  {
    std::lock_guard lock(mu_);
    auto& s = by_name_[name];
    if (!s) s = std::make_shared<entry>();
    if (s->id) return *s->id;
    slot = s;
  }
  std::lock_guard opening(slot->opening);
  {
    std::lock_guard lock(mu_);
    if (slot->id) return *slot->id;  // opened by the thread this one queued behind
  }
  auto id = e.open_segment(name);
  if (!id) return fail(id.error());  // not cached: the next call tries again
  std::lock_guard lock(mu_);
  slot->id = *id;
  return *id;
}

namespace {

/// `item` as an unsigned 64-bit integer; `what` (with `[i]` when i >= 0)
/// names it in the TypeError.
unsigned long long index_value(PyObject* item, const char* what, Py_ssize_t i) {
  // PyNumber_Index, not int(): a float or a str is a mistake here, as in pybind11's (and Mooncake's) conversion.
  PyObject* index = PyNumber_Index(item);
  unsigned long long v = 0;
  if (index != nullptr) {
    v = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
  }
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw pyb::type_error(std::string(what) + (i >= 0 ? "[" + std::to_string(i) + "]" : "") +
                          " must be an int in 0 .. 2**64-1, got " + pyb::repr(item).cast<std::string>());
  }
  return v;
}

/// The integers of one sequence; `what` names it in errors.
template <class T>
std::vector<T> integers(pyb::handle seq, const char* what) {
  PyObject* fast = PySequence_Fast(seq.ptr(), what);
  if (fast == nullptr) {
    PyErr_Clear();
    throw pyb::type_error(std::string(what) + " must be a sequence of int, got " +
                          std::string(Py_TYPE(seq.ptr())->tp_name));
  }
  const pyb::object owner = pyb::reinterpret_steal<pyb::object>(fast);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  std::vector<T> out(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<T>(index_value(items[i], what, i));
  return out;
}

}  // namespace

address_lists read_address_lists(pyb::handle locals, pyb::handle remotes, pyb::handle lengths) {
  address_lists a{integers<std::uintptr_t>(locals, "buffers"), integers<std::uintptr_t>(remotes, "peer addresses"),
                  integers<std::size_t>(lengths, "lengths")};
  if (a.remote.size() != a.local.size() || a.length.size() != a.local.size())
    throw pyb::value_error("lists of unequal length (" + std::to_string(a.local.size()) + ", " +
                           std::to_string(a.remote.size()) + ", " + std::to_string(a.length.size()) + ")");
  return a;
}

one_address read_one_address(pyb::handle local, pyb::handle remote, pyb::handle length) {
  return {static_cast<std::uintptr_t>(index_value(local.ptr(), "buffer", -1)),
          static_cast<std::uint64_t>(index_value(remote.ptr(), "peer address", -1)),
          static_cast<std::size_t>(index_value(length.ptr(), "length", -1))};
}

transfer_request one_address::request(transfer_op op, segment_id target) const noexcept {
  return transfer_request::at_address(op, as_pointer(local), target, remote, length);
}

std::uint64_t address_lists::total_bytes() const noexcept {
  return std::accumulate(length.begin(), length.end(), std::uint64_t{0});
}

std::vector<transfer_request> address_lists::requests(transfer_op op, segment_id target) const {
  std::vector<transfer_request> reqs;
  reqs.reserve(size());
  for (std::size_t i = 0; i < size(); ++i)
    reqs.push_back(one_address{local[i], remote[i], length[i]}.request(op, target));
  return reqs;
}

transfer_op opcode_of(int op) {
  if (op != 0 && op != 1) throw pyb::value_error("opcode must be 0 (read) or 1 (write), got " + std::to_string(op));
  return op == 0 ? transfer_op::read : transfer_op::write;
}

}  // namespace tide::py
