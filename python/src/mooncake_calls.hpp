#pragma once
// What tide.TransferEngine's transfers need natively, so that one Mooncake
// call is one pybind11 call: segments looked up by name and kept open, the
// requests built from the caller's address lists without a Python tuple per
// request, and a synchronous batch run (allocate, submit, wait, free) with
// the GIL released.  engine.cpp binds them; nothing here is API.

#include "engine_iface.hpp"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
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

using note_tuple = std::pair<std::string, std::string>;  ///< (sender, message)

/// Waits from Python run in slices of at most this, with a signal check
/// (Ctrl-C) between them.
constexpr std::chrono::milliseconds kWaitSlice{100};

/// The time `seconds` from now (0 .. 1e9 s).
inline std::chrono::steady_clock::time_point deadline_in(double seconds) {
  using namespace std::chrono;
  return steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(std::clamp(seconds, 0.0, 1e9)));
}

/// The next slice of a wait until `deadline`: 0 .. kWaitSlice.
inline std::chrono::milliseconds next_slice(std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  return std::clamp(duration_cast<milliseconds>(deadline - steady_clock::now()), milliseconds(0), kWaitSlice);
}

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

[[nodiscard]] status submit_with(engine_iface& e, batch_id b, std::span<const transfer_request> reqs,
                                 const std::optional<note_tuple>& notify);

/// Cancels batch `b` and waits until its posted WRs complete or flush
/// (bounded by the QPs' retry timeout).  Without the GIL.
void drain(engine_iface& e, batch_id b);

/// What run_batch saw.
struct batch_outcome {
  transfer_status status;
  std::string device;        ///< name of status.failed_local_device, if any
  bool timed_out = false;    ///< past the deadline: canceled and drained
  bool interrupted = false;  ///< a signal handler raised (the Python error is set): canceled and drained
  error failure;             ///< errc::ok unless allocate, submit, wait or free failed
};

/// A whole synchronous batch: allocate, submit, wait until every task is
/// final, free.  Called without the GIL; takes it only for a signal check
/// every kWaitSlice.  Past `deadline` (or on a signal) the batch is
/// canceled and drained first, so none of its DMA touches the caller's
/// memory once this returns.
[[nodiscard]] batch_outcome run_batch(engine_iface& e, std::span<const transfer_request> reqs,
                                      std::chrono::steady_clock::time_point deadline,
                                      const std::optional<note_tuple>& notify);

}  // namespace tide::py
