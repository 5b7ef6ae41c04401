#include "batch_run.hpp"

#include <pybind11/pybind11.h>

namespace tide::py {
using namespace std::chrono;

bool signal_raised() {
  pybind11::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

namespace {

/// After a cancel: waits until `b` is final, for at most c.drain_bound
/// (a slice when a signal already came), checking for signals.  true when
/// final.
bool drain(core& c, batch_id b, batch_outcome& out) {
  engine_iface& e = *c.engine;
  (void)e.cancel(b);
  const auto until = steady_clock::now() + (out.interrupted ? kWaitSlice : c.drain_bound);
  for (;;) {
    auto r = e.wait(b, next_slice(until));
    if (r) return true;
    if (r.error().code != errc::timed_out || steady_clock::now() >= until) return false;
    if (!out.interrupted && signal_raised()) {
      out.interrupted = true;  // the caller asked to stop: give up now, the batch is parked
      return false;
    }
  }
}

}  // namespace

owned_status own(const engine_iface& e, const transfer_status& s) {
  owned_status o;
  o.state = s.state;
  o.bytes = s.transferred_bytes;
  o.reason = s.reason;
  if (s.failed_local_device != kNoDevice) o.device = e.device_name(s.failed_local_device);
  o.path = std::string(s.failed_peer_path);
  return o;
}

batch_outcome finish_batch(core& c, batch_id b, steady_clock::time_point deadline) {
  engine_iface& e = *c.engine;
  batch_outcome out;
  bool final = false;
  for (;;) {
    auto r = e.wait(b, next_slice(deadline));
    if (r) {
      final = true;
      break;
    }
    if (r.error().code != errc::timed_out) {  // unknown_batch: nothing of it to finish
      out.failure = std::move(r.error());
      return out;
    }
    if (steady_clock::now() >= deadline) {
      out.timed_out = true;
      break;
    }
    if (c.closing.load(std::memory_order_acquire)) {
      out.closed = true;
      break;
    }
    if (signal_raised()) {
      out.interrupted = true;
      break;
    }
  }
  if (!final) final = drain(c, b, out);
  // Copied now: the view in the engine's status dies with the batch.
  if (auto s = e.batch_status(b)) out.status = own(e, *s);
  if (final) {
    // Final: none of its DMA can touch memory any more.  A free refused
    // (slices still leaving the batch's books) is retried by a later reap.
    if (auto r = e.free_batch(b); !r && r.error().code == errc::batch_busy) c.orphans.park(b);
  } else {
    c.orphans.park(b);
    out.leaked = true;
  }
  return out;
}

void finish_all(core& c, std::span<const batch_id> ids) {
  engine_iface& e = *c.engine;
  std::vector<batch_id> all(ids.begin(), ids.end());
  for (const batch_id b : c.orphans.take_all()) all.push_back(b);
  for (const batch_id b : all) (void)e.cancel(b);
  const auto until = steady_clock::now() + c.drain_bound;
  for (const batch_id b : all) {
    for (;;) {
      auto r = e.wait(b, next_slice(until));
      if (r) {
        (void)e.free_batch(b);
        break;
      }
      if (r.error().code != errc::timed_out || steady_clock::now() >= until) break;
    }
  }
}

bool release_batch(core& c, batch_id b) {
  engine_iface& e = *c.engine;
  if (!c.orphans.empty()) (void)c.orphans.reap(e);
  if (auto r = e.wait(b, milliseconds(0)); !r) {
    if (r.error().code != errc::timed_out) return true;  // unknown: nothing to free
    (void)e.cancel(b);
    c.orphans.park(b);
    return false;
  }
  if (auto r = e.free_batch(b); !r && r.error().code == errc::batch_busy) {
    c.orphans.park(b);
    return false;
  }
  return true;
}

status submit_with(engine_iface& e, batch_id b, std::span<const transfer_request> reqs,
                   const std::optional<note_tuple>& notify) {
  if (!notify) return e.submit(b, reqs);
  return e.submit(b, reqs, notification{notify->first, notify->second});
}

batch_outcome run_batch(core& c, std::span<const transfer_request> reqs, steady_clock::time_point deadline,
                        const std::optional<note_tuple>& notify) {
  engine_iface& e = *c.engine;
  if (!c.orphans.empty()) (void)c.orphans.reap(e);
  auto b = e.allocate_batch(reqs.size());
  if (!b) {
    batch_outcome out;
    out.failure = std::move(b.error());
    return out;
  }
  if (auto r = submit_with(e, *b, reqs, notify); !r) {
    // Nothing was submitted (the engine's rule); finish_batch frees it, and
    // would cancel and drain it were that rule ever broken.
    batch_outcome out = finish_batch(c, *b, steady_clock::now());
    out.timed_out = false;
    out.failure = std::move(r.error());
    return out;
  }
  return finish_batch(c, *b, deadline);
}

}  // namespace tide::py
