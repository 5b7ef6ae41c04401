#pragma once
// How tide's errors reach Python: the one translation point.  unwrap()
// throws native_error (with the GIL held: after the call returned), and the
// module's local translator turns it into tide.errors' class for its errc.

#include <tide/result.hpp>

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

namespace tide::py {

class native_error : public std::runtime_error {
 public:
  explicit native_error(error e) : std::runtime_error(e.message()), err(std::move(e)) {}
  error err;
};

[[noreturn]] inline void raise(error e) { throw native_error(std::move(e)); }

template <class T>
T unwrap(result<T>&& r) {
  if (!r) raise(std::move(r.error()));
  return std::move(*r);
}
inline void unwrap(status&& r) {
  if (!r) raise(std::move(r.error()));
}

/// Sets the Python error of a tide error (tide.errors' class for its errc):
/// the module's translator and fast_call (fast_call.hpp) both call it.
void set_native_error(const native_error& e) noexcept;

void init_errors(pybind11::module_& m);

}  // namespace tide::py
