#pragma once
/// slice_carrier — another transport the RDMA data path hands work requests
/// to (not API).  The engine installs one (the TCP transport, through
/// detail/tcp_route.hpp) so that the data path knows only this interface:
///
///  - at submit, a WR whose target no RDMA rail can reach (no local NIC, a
///    peer without RDMA devices, every rail to it paused) goes here when
///    reaches() says the peer serves it;
///  - after a failure, a slice that no other healthy rail can take goes here
///    instead of waiting for the rail to come back.
///
/// The carrier owns the WR from carry() until it calls back
/// rdma_transport::carried(s, e), once, with the outcome (the transport
/// then retries, refreshes or retires it).  Nothing of the WR but its
/// addresses, length and op is the carrier's to read.

#include <tide/errc.hpp>

namespace tide::rdma {
struct remote_segment;
}

namespace tide::rdma::detail {

struct slice;

struct slice_carrier {
  /// Whether `seg`'s owner serves this transport (its descriptor says so).
  /// Any thread; no allocation.
  [[nodiscard]] virtual bool reaches(const remote_segment& seg) const noexcept = 0;
  /// Takes the WR headed by `s` (riders included).  Any thread; never blocks.
  virtual void carry(slice& s) noexcept = 0;

 protected:
  ~slice_carrier() = default;
};

}  // namespace tide::rdma::detail
