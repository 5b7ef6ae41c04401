#pragma once
/// tcp::transport — bytes between registered memories over TCP, on
/// Mooncake's data-port protocol (wire/tcp_data.hpp), both ways: a server
/// on this engine's data port serves peers' READs and WRITEs against the
/// local buffers (through local_memory, which checks the range and the
/// buffer's access mode and holds the buffer while bytes move), and a
/// client moves this engine's requests to peers' data ports.
///
/// It knows nothing of RDMA: the engine routes requests to it (a peer that
/// serves only TCP, no RDMA device here, every RDMA rail to the peer down)
/// and owns the task roll-up; here a request is an `op` with a completion.
///
/// Memory the sockets cannot touch (GPU memory) is staged: a payload goes
/// through a 1 MiB bounce buffer per connection and direction, copied in
/// and out by the buffer's copy engine (memory/memory_kind.hpp), on both
/// the initiating and the serving side.
///
/// Client: per peer a pool of at most conns_per_peer persistent connections
/// (version-2 peers; a version-1 peer gets one request per connection, as
/// Mooncake's v1 server closes after one), each pipelining up to
/// max_ops_per_conn requests; an op goes to the connection with the fewest
/// bytes queued, so the slices of a large request spread over the pool.
/// Payloads are written with one gathered send (header + payload) and read
/// straight into the destination: no staging copy.  Connects (and, with a
/// secret, the authentication of wire/tcp_data.hpp) run on the I/O threads,
/// never on the submitting thread.  A WRITE to a version-2 peer completes
/// when the peer's status says its last byte landed.
///
/// Final means final: done() is called once per op, on an I/O thread, after
/// the last system call that touches its local memory; a canceled or timed
/// out op (stop_reason) that was not sent yet is dropped, one in flight
/// finishes, unless its connection makes no progress for kStalledStopMs,
/// when the connection is closed (its other ops end with connection_lost,
/// which the engine retries).  A connection that moves no byte for
/// progress_timeout while ops wait is closed the same way.
///
/// Server: at most max_connections connections and max_connections_per_source
/// from one source (an IPv4 address, an IPv6 /64); more are closed on accept
/// and counted.  A request's range must lie inside one registered buffer
/// that grants the operation; otherwise a version-2 peer gets the status
/// that says why and the connection closes (as Mooncake's server does).
/// With a secret nothing is read but the authentication exchange until it
/// succeeds.  A header must arrive within request_timeout of its first
/// byte; a payload that stops for progress_timeout drops the connection;
/// an idle connection closes after idle_timeout.
///
/// Threads: io_threads I/O threads run every socket (a connection's state
/// is touched only by its thread); submit() from any thread, never
/// blocking; done() and local_memory's calls on I/O threads.  Boost.Asio
/// lives in src/tcp/ only: this header pulls in none of it.

#include <tide/result.hpp>
#include <tide/transfer.hpp>
#include <tide/wire/tcp_data.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tide::wire {
class cluster_secret;
}
namespace tide::memory {
class copy_engine;
}

namespace tide::tcp {

/// A peer's data port, as its descriptor publishes it.
struct peer {
  std::string host;
  std::uint16_t port = 0;
  std::uint32_t version = 2;  ///< its tcp_proto_version: 1 = no status frames, one request per connection
  friend bool operator==(const peer&, const peer&) = default;
};

/// One request.  The caller owns it; the transport holds it from submit()
/// until it calls done(), exactly once.
class op {
 public:
  transfer_op kind = transfer_op::write;
  std::uint64_t local_addr = 0;   ///< inside registered memory of this process
  std::uint64_t remote_addr = 0;  ///< the peer's virtual address
  std::uint64_t length = 0;
  /// Null: local_addr is host memory the sockets read and write directly.
  /// Otherwise (GPU memory; host memory with the staging switch) the
  /// payload moves through a bounce buffer, one chunk at a time, by this
  /// engine's copies, the last of them before done().
  const memory::copy_engine* stager = nullptr;

  /// The transport is done with the op: `e` is ok, connection_lost (the
  /// connection closed or stalled with it in flight: another connection may
  /// succeed), peer_unreachable (connect refused or timed out),
  /// auth_failed, protocol_error, the peer's refusal (wire::tcp_status_errc),
  /// or stop_reason() for an op dropped before it was sent.  No byte of its
  /// local memory is touched afterwards.  I/O thread (or the submitting
  /// thread after shutdown); must not block.
  virtual void done(errc e) noexcept = 0;
  /// ok while the caller still wants the op; otherwise why not (canceled,
  /// timed_out).  Polled by the I/O threads; any thread may change it.
  [[nodiscard]] virtual errc stop_reason() const noexcept { return errc::ok; }

  op* next_ = nullptr;      ///< the transport's queues (intrusive)
  std::uint8_t requeued_ = 0;  ///< the transport's: times moved to another connection unsent

 protected:
  op() = default;
  op(const op&) = default;
  op& operator=(const op&) = default;
  ~op() = default;
};

/// The local buffers as the server sees them.
class local_memory {
 public:
  /// Opens [addr, addr + length) for a peer's `kind`: ok and a handle
  /// when one registered buffer holds the range and grants the operation
  /// (the buffer then stays registered until close_range), else the status
  /// that says why (addr_rejected, access_denied, unavailable).  `stager`:
  /// as op::stager, for the buffer's memory.  I/O threads.
  [[nodiscard]] virtual wire::tcp_status open_range(std::uint64_t addr, std::uint64_t length, transfer_op kind,
                                                    void*& handle, const memory::copy_engine*& stager) noexcept = 0;
  virtual void close_range(void* handle) noexcept = 0;

 protected:
  ~local_memory() = default;
};

struct config {
  /// The data port's bind address (Mooncake's MC_TCP_BIND_ADDRESS).
  std::string bind_host = "0.0.0.0";
  /// 0: a random free port in [port_range_min, port_range_max].
  std::uint16_t port = 0;
  std::uint16_t port_range_min = 15000;
  std::uint16_t port_range_max = 17000;
  unsigned io_threads = 2;
  unsigned conns_per_peer = 4;
  std::uint32_t max_ops_per_conn = 32;  ///< requests pipelined on one connection
  bool force_v1 = false;                ///< Mooncake's MC_TCP_PROTO=1: no status frames
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds progress_timeout{10000};
  std::chrono::milliseconds request_timeout{5000};
  std::chrono::milliseconds idle_timeout{300000};
  std::chrono::milliseconds client_idle_timeout{60000};  ///< shorter than a server's, so the client closes first
  /// A version-1 client (Mooncake's default before its connection pool)
  /// opens a connection per request in flight, so one busy peer may hold
  /// hundreds: the per-source bound is set for that, and bounds a flood.
  std::size_t max_connections = 4096;
  std::size_t max_connections_per_source = 1024;
  /// The cluster secret (null: Mooncake's unauthenticated protocol) and
  /// this engine's identity (its segment name) for the authentication.
  std::shared_ptr<const wire::cluster_secret> secret;
  std::string identity;
};

/// Counters since start (relaxed loads: monotonic, not a snapshot).
struct stats {
  // client
  std::uint64_t ops_ok = 0;
  std::uint64_t ops_failed = 0;
  std::uint64_t bytes_written = 0;  ///< payload sent by WRITEs
  std::uint64_t bytes_read = 0;     ///< payload received by READs
  std::uint64_t connections_opened = 0;
  std::uint64_t connect_failures = 0;
  std::uint64_t connections_lost = 0;  ///< closed with ops in flight (error, stall, stop)
  // server
  std::uint64_t accepted = 0;
  std::uint64_t refused_source = 0;  ///< closed on accept: the source had max_connections_per_source
  std::uint64_t refused_full = 0;    ///< closed on accept: max_connections open
  std::uint64_t requests_served = 0;
  std::uint64_t requests_rejected = 0;  ///< a range, access or availability refusal
  std::uint64_t auth_failed = 0;
  std::uint64_t dropped = 0;  ///< closed for a timeout, a stall or bad input
  std::uint64_t bytes_served_in = 0;   ///< payload peers wrote here
  std::uint64_t bytes_served_out = 0;  ///< payload peers read from here
  // both
  std::uint64_t bytes_staged = 0;  ///< payload copied through staging buffers (GPU memory; the staging switch)
  std::uint64_t open_connections = 0;  ///< the server's, now
};

class transport {
 public:
  /// How long a connection with a stopped op in flight may go without
  /// progress before it is closed.
  static constexpr int kStalledStopMs = 100;

  /// Binds the data port and starts the I/O threads.  Errors:
  /// config_invalid (0 threads, 0 connections per peer, a bad bind host or
  /// range), peer_unreachable / resource_exhausted when no port can be bound.
  [[nodiscard]] static result<std::unique_ptr<transport>> create(const config& cfg, local_memory& memory);
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  /// shutdown().
  ~transport();

  [[nodiscard]] std::uint16_t port() const noexcept;
  /// Queues `o` for peer `p`.  Any thread; never blocks, never calls
  /// done() inline except after shutdown (endpoint_closed).
  void submit(const peer& p, op& o) noexcept;
  /// Closes the data port and every connection, ends every op not done
  /// (endpoint_closed) and joins the I/O threads: afterwards no byte moves
  /// and local_memory is not called.  Idempotent; the owner's thread.
  void shutdown() noexcept;
  [[nodiscard]] tcp::stats stats() const noexcept;

 private:
  struct impl;
  explicit transport(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace tide::tcp
