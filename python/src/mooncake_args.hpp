#pragma once
// Mooncake's call arguments as tide.TransferEngine passes them, read
// natively so that one Mooncake call is one pybind11 call: segments looked
// up by name and kept open, and requests built from the caller's address
// lists without a Python tuple per request.  Nothing here is API.

#include "engine_iface.hpp"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tide::py {

/// Segment handles by name, opened on first use and kept open for the
/// engine's life (Mooncake keeps a segment it has transferred to).  One
/// open per name at a time; a slow open does not hold up other names.
class named_segments {
 public:
  /// Without the GIL: an open may wait for the metadata service.
  [[nodiscard]] result<segment_id> open(engine_iface& e, const std::string& name);

 private:
  struct entry {
    std::mutex opening;              ///< held across the engine's open_segment
    std::optional<segment_id> id;    ///< guarded by named_segments::mu_
  };
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<entry>> by_name_;
};

/// Three equal-length lists of integers (anything with __index__, as
/// pybind11 takes them) from Python sequences.  With the GIL.  Raises
/// ValueError for unequal lengths, TypeError for a non-integer or a
/// negative value.
struct address_lists {
  std::vector<std::uintptr_t> local, remote;
  std::vector<std::size_t> length;
  [[nodiscard]] std::size_t size() const noexcept { return local.size(); }
  [[nodiscard]] std::uint64_t total_bytes() const noexcept;
  /// Raw-address requests of `op` to `target` (no GIL needed).
  [[nodiscard]] std::vector<transfer_request> requests(transfer_op op, segment_id target) const;
};
[[nodiscard]] address_lists read_address_lists(pybind11::handle locals, pybind11::handle remotes,
                                               pybind11::handle lengths);

/// One request's integers as they come (transfer_sync_write / _read's
/// scalars): no lists to read or build.  With the GIL; read_address_lists'
/// TypeErrors ("buffer", "peer address", "length").
struct one_address {
  std::uintptr_t local = 0;
  std::uint64_t remote = 0;
  std::size_t length = 0;
  /// The raw-address request of `op` to `target`.
  [[nodiscard]] transfer_request request(transfer_op op, segment_id target) const noexcept;
};
[[nodiscard]] one_address read_one_address(pybind11::handle local, pybind11::handle remote, pybind11::handle length);

/// 0 (read) or 1 (write) as transfer_op; ValueError otherwise.
[[nodiscard]] transfer_op opcode_of(int op);

}  // namespace tide::py
