#pragma once
/// tide::result<T> — the return type of every setup-path call.
///
/// An `error` carries the errc (what kind of failure, and its blast radius)
/// and a detail string (which field, which device, what the OS said), so a
/// user sees "metadata_malformed: buffers[2].rkey: expected 2 keys (one per
/// device), got 1" rather than a bare number.

#include <tide/errc.hpp>

#include <tl/expected.hpp>

#include <ostream>
#include <string>
#include <utility>

namespace tide {

struct error {
  errc code = errc::ok;
  std::string detail;

  error() = default;
  error(errc c) : code(c) {}  // NOLINT(google-explicit-constructor): errc converts freely
  error(errc c, std::string d) : code(c), detail(std::move(d)) {}

  [[nodiscard]] errc_group group() const noexcept { return group_of(code); }
  /// "<code name>: <detail>", or the code's description when there is no detail.
  [[nodiscard]] std::string message() const;

  friend bool operator==(const error& a, errc b) noexcept { return a.code == b; }
  friend std::ostream& operator<<(std::ostream& os, const error& e) { return os << e.message(); }
};

template <class T>
using result = tl::expected<T, error>;

using status = result<void>;

/// `return tide::fail(errc::zero_length, "length must be > 0");`
[[nodiscard]] inline tl::unexpected<error> fail(errc c, std::string detail = {}) {
  return tl::unexpected<error>(error{c, std::move(detail)});
}
[[nodiscard]] inline tl::unexpected<error> fail(error e) { return tl::unexpected<error>(std::move(e)); }

inline std::ostream& operator<<(std::ostream& os, errc e) { return os << to_string(e); }

}  // namespace tide
