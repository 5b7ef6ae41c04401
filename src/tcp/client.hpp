#pragma once
// The TCP transport's client (not API): per peer a pool of connections, each
// a pipeline of requests on one socket (see tcp_transport.hpp).

#include "common.hpp"

#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

namespace tide::tcp::detail {

class peer_pool;

/// The client half of the transport.  Owned by the transport, which stops
/// the I/O threads only after shutdown().
class client {
 public:
  client(const config& cfg, io_pool& io, counters& c);
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client();

  /// Any thread.  After shutdown(): o.done(endpoint_closed) at once.
  void submit(const peer& p, op& o) noexcept;
  /// Refuses new ops and closes every connection (on its own thread): their
  /// ops end with endpoint_closed as the I/O threads run out.  Once.
  void shutdown() noexcept;

  [[nodiscard]] const config& cfg() const noexcept { return cfg_; }
  [[nodiscard]] io_pool& io() noexcept { return io_; }
  [[nodiscard]] counters& count() noexcept { return counters_; }

 private:
  peer_pool* pool_for(const peer& p);

  const config& cfg_;
  io_pool& io_;
  counters& counters_;
  std::atomic<bool> stopping_{false};
  /// Pools by "host|port|version"; created on first use, kept until the
  /// client goes (a pool with no connection is a few words).
  std::shared_mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<peer_pool>> pools_;
};

}  // namespace tide::tcp::detail
