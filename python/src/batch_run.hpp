#pragma once
// How the binding finishes a batch: one routine (finish_batch) for every
// path that ends one — tide.Engine.transfer, Batch.finish / leaving `with`,
// a dropped Batch, Engine.close, and Mooncake's sync calls,
// get_batch_transfer_status and transfer_check_status.  It waits until the
// batch is final or its deadline passes, cancels, drains within a bound,
// copies the status out and frees; a batch that does not become final in
// time is parked (core::orphans), not waited for without end.  All of it
// without the GIL, which is taken back only for a signal check per slice.

#include "core.hpp"
#include "deadline.hpp"

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace tide::py {

using note_tuple = std::pair<std::string, std::string>;  ///< (sender, message)

/// Runs Python's signal handlers (Ctrl-C); true when one raised, its error
/// then set.  Takes the GIL for it: call it holding neither the GIL nor a
/// tide lock.
[[nodiscard]] bool signal_raised();

/// A batch's roll-up with its strings copied: valid after the batch is
/// freed (transfer_status::failed_peer_path is a view that is not).
struct owned_status {
  transfer_state state = transfer_state::waiting;
  std::uint64_t bytes = 0;
  errc reason = errc::ok;
  std::string device;  ///< the failed local device's name, "" if none
  std::string path;    ///< the failed peer NIC path, "" if none
};

/// s with its device index named and its path copied.  Call it while the
/// batch is alive.
[[nodiscard]] owned_status own(const engine_iface& e, const transfer_status& s);

/// What finishing (or running) a batch did.
struct batch_outcome {
  owned_status status;
  bool timed_out = false;    ///< past the deadline: canceled, then drained
  bool interrupted = false;  ///< a signal handler raised (its Python error is set): canceled
  bool closed = false;       ///< the engine began closing meanwhile: canceled
  bool leaked = false;       ///< not final within core::drain_bound of the cancel (or a signal came): parked
  error failure;             ///< errc::ok unless allocate, submit or wait failed
  /// Every task COMPLETED, within the deadline.
  [[nodiscard]] bool completed() const noexcept {
    return status.state == transfer_state::completed && !timed_out && !interrupted && !closed && !leaked &&
           failure.code == errc::ok;
  }
};

/// Waits until batch `b` is final or `deadline` passes (or the engine
/// closes, or a signal handler raises), then cancels it and drains it for
/// at most c.drain_bound (one slice after a signal), reads its status and
/// frees it.  A batch still not final is parked (c.orphans) and reported
/// leaked.  Once this returns the caller's memory is safe from the batch
/// unless `leaked`.  Without the GIL.
[[nodiscard]] batch_outcome finish_batch(core& c, batch_id b, std::chrono::steady_clock::time_point deadline);

/// Cancels every batch of `ids` and every parked one, waits for them with
/// one deadline (c.drain_bound from now), frees those final.  For close():
/// the engine's teardown ends the rest.  Without the GIL.
void finish_all(core& c, std::span<const batch_id> ids);

/// Frees `b` when it is final; else cancels and parks it.  true when freed.
/// For a dropped Batch: never waits.  Without the GIL.
[[nodiscard]] bool release_batch(core& c, batch_id b);

[[nodiscard]] status submit_with(engine_iface& e, batch_id b, std::span<const transfer_request> reqs,
                                 const std::optional<note_tuple>& notify);

/// A whole synchronous batch: allocate, submit, finish_batch.  Nothing stays
/// allocated when the submit fails.  Without the GIL.
[[nodiscard]] batch_outcome run_batch(core& c, std::span<const transfer_request> reqs,
                                      std::chrono::steady_clock::time_point deadline,
                                      const std::optional<note_tuple>& notify);

}  // namespace tide::py
