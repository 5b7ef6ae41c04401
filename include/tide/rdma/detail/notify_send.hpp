#pragma once
/// notify_send and notify_sink: a notification on its way to lane 0 of a
/// context, to go out as a SEND on QP 0 (notify_port.hpp posts it,
/// notify_qp.hpp has the wire side).  Not API.

#include <tide/wire/descriptors.hpp>

#include <atomic>
#include <cstdint>
#include <string>

namespace tide::rdma::detail {

struct notify_send;

/// Where a notification goes to become a SEND: lane 0 of a context
/// (rdma/lane.hpp).  take_notify is a lock-free push and a wake, so the
/// thread that retires a notification's last task may call it; false once
/// the lane has stopped (the caller keeps the notification).  The lane
/// outlives every task that can still turn final (the transport stops its
/// lanes last).
struct notify_sink {
  [[nodiscard]] virtual bool take_notify(notify_send* n) noexcept = 0;

 protected:
  ~notify_sink() = default;
};

/// A notification handed to a lane to go out as a SEND (the engine's outbox
/// item derives from it; rdma/detail/notify_port.hpp posts it).  The
/// submitting thread fills it; the thread that retires its last task hands
/// it to `sink` (picked at submit when an endpoint to the target was
/// connected then), or else the outbox thread picks a lane; from then until
/// sent() the lane owns it; sent() hands it back.
///
/// Riding: when a submit is one RDMA WRITE (task_group::message, the WR's
/// slice::then_notify), lane 0 may post the SEND right behind that WRITE on
/// QP 0 at once, so the message reaches the target with the data instead
/// of a completion and a post later.  RC ordering makes the target's
/// receive complete only after the WRITE's bytes are placed, and a WRITE
/// that fails flushes the SEND behind it.  Lane 0 sets `rides` before that
/// post; from then on the notification has two events, its tasks' done()
/// and the SEND's sent(), on lane threads in either order, and the second
/// one to arrive settles it: delivered, or (flushed, the WRITE retried
/// elsewhere) the usual path as though it never rode.
struct notify_send {
  notify_send* next_send = nullptr;  ///< the lane's queue and waiting list
  std::string peer_path;             ///< the endpoint whose QP 0 carries it
  notify_desc wire_msg;              ///< name and text as the target records them
  std::int64_t waiting_since_ns = 0;  ///< lane: first time it found no credit
  notify_sink* sink = nullptr;       ///< set at submit (null: the outbox thread picks one)
  std::atomic<bool> rides{false};    ///< its SEND was posted behind the data (see above)
  /// Lane 0, once per hand-over (and once for a riding SEND): `delivered` =
  /// the SEND completed (the target's receive buffer holds it); false = it
  /// never went out, or its fate is unknown (flushed, QP error): the caller
  /// sends it over TCP (a riding one: as though it never rode).
  virtual void sent(bool delivered) noexcept = 0;

 protected:
  ~notify_send() = default;
};

}  // namespace tide::rdma::detail
