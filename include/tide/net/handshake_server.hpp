#pragma once
/// The handshake server: Mooncake's framed TCP service (research/mooncake-wire.md §1-2).
///
/// API in brief:
///   handshake_handlers h;
///   h.on_connect = [&](const handshake_desc& peer) { ...QPs to RTR/RTS...; return my_desc; };
///   h.on_notify  = [&](const notify_desc& n) { queue.push(n); };
///   auto srv = handshake_server::start({.host = "0.0.0.0", .port = 0}, std::move(h));
///   srv->port();                 // the bound port (when 0 was asked)
///   // Metadata requests are answered with the descriptor published for this
///   // port in the local segment registry (local_segments.hpp), which the p2p
///   // backend's put_segment fills; or with handlers.local_segment() when set.
///
/// Per request: connect -> on_connect (ready-ack messages too: ready_ack == true),
/// reply = its return value; metadata -> the local descriptor JSON or "null";
/// notify -> on_notify, reply {"name":"","notify_msg":"success"} ({"notify_msg":""}
/// when no handler is set: the sender sees a failure, nothing is lost silently);
/// probe -> {"status":"success"}.  Legacy untyped frames are connects, answered
/// untyped.  Bad input (length 0 or over max_frame, unknown type, invalid JSON,
/// a request not complete within receive_timeout) drops that connection with a
/// TIDE_LOG_WARN line; the others are unaffected.
///
/// Threads: one I/O thread runs every socket asynchronously (a slow client
/// holds no thread); callbacks run on `handler_threads` worker threads, so a
/// slow callback delays neither I/O nor probes, and callbacks may run
/// concurrently with each other.  Memory: at most max_connections connections,
/// each buffering at most max_frame bytes of request (with a secret:
/// max_hello_frame for the hello, max_auth_request_frame for the request).
/// Admission: at most max_connections_per_source per source (an IPv4
/// address, or an IPv6 /64: source_key), and, with a secret, slots
/// reserved for connections past authentication (reserved_authenticated).
///
/// Authentication: with config.secret set, every exchange must follow the
/// hello / challenge / request / reply sequence of wire/auth.hpp; anything
/// else is answered {"tide_auth":"required"} or {"tide_auth":"failed"},
/// counted in stats().auth_failed, logged without secret material, and
/// reaches no handler: no descriptor, no QP, no notification.  The
/// handlers' *_from variants receive the identity the peer's MAC bound.
///
/// Asio lives in src/net/handshake_server.cpp only (pimpl).

#include <tide/wire/descriptors.hpp>
#include <tide/net/frame.hpp>
#include <tide/result.hpp>
#include <tide/wire/auth.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tide::net {

struct handshake_server_config {
  /// Address to bind; "0.0.0.0" (Mooncake binds INADDR_ANY), "::", or one interface.
  std::string host = "0.0.0.0";
  /// 0 = let the kernel pick, unless a port range is set below.
  std::uint16_t port = 0;
  /// When port == 0 and both are non-zero: bind a random free port in
  /// [port_range_min, port_range_max], like Mooncake's 15000-17000.
  std::uint16_t port_range_min = 0;
  std::uint16_t port_range_max = 0;
  /// Largest accepted length field; Mooncake's default 1 MiB.
  std::size_t max_frame = kDefaultMaxFrame;
  /// Whole-request bound, from accept to the last byte of the frame; a client
  /// trickling bytes is dropped when it passes.  Also bounds the reply write
  /// and the wait for the client's close.
  std::chrono::milliseconds receive_timeout{5000};
  /// Connections served at once; more are closed on accept with a warning.
  std::size_t max_connections = 256;
  /// Connections open at once from one source; more are closed on accept.
  /// A source is an IPv4 address or an IPv6 /64 (one host may hold a whole
  /// /64; an IPv4-mapped address counts as IPv4): source_key().  One node's
  /// engines share an address, so this is per node: a few handshake threads
  /// per NIC and process, far below the default.
  std::size_t max_connections_per_source = 64;
  /// Of max_connections, the slots (at most a quarter of them) that only a
  /// connection past authentication holds: connections that have not yet
  /// sent a verified request take at most max_connections minus these, so
  /// strangers holding sockets open cannot take the slots of exchanges under
  /// way.  Without a secret nothing is authenticated, so these slots go
  /// unused (set 0 to open every slot to everyone).
  std::size_t reserved_authenticated = 64;
  /// How long a connection that never authenticated (every connection
  /// without a secret; a refused one with a secret) may keep its socket
  /// open after the reply, waiting for the client's close: a client takes
  /// a reply and closes at once, so only a peer holding a slot waits this
  /// out.  Authenticated connections wait up to receive_timeout.
  std::chrono::milliseconds unauthenticated_linger{1000};
  /// With a secret, the hello (the first frame, before anything is proven):
  /// at most max_hello_frame bytes, complete within hello_timeout of accept.
  /// A hello is 32 bytes.
  std::size_t max_hello_frame = 4096;
  std::chrono::milliseconds hello_timeout{1000};
  /// With a secret, the request after the challenge (still unproven until
  /// its MAC is checked): at most this many bytes (and max_frame), complete
  /// within receive_timeout; a longer one is dropped at its length field,
  /// unread.  Decoded without a DOM before its MAC is checked.
  std::size_t max_auth_request_frame = wire::kMaxAuthRequestFrame;
  /// Worker threads for on_connect / on_notify / local_segment.
  unsigned handler_threads = 2;
  /// The cluster secret; null = Mooncake's unauthenticated wire.
  std::shared_ptr<const wire::cluster_secret> secret;
};

struct handshake_handlers {
  /// Connect requests (and ready acks).  Returns the reply; set reply_msg to
  /// reject.  Unset: every connect is answered with a reply_msg saying so.
  /// An exception becomes reply_msg "internal error: <what>".
  std::function<handshake_desc(const handshake_desc&)> on_connect;
  /// Notify requests.  Unset: the sender is told the message was not taken.
  std::function<void(const notify_desc&)> on_notify;
  /// The descriptor JSON to serve to Metadata requests, nullopt = none.
  /// Unset: local_segment(port()) from the registry (local_segments.hpp).
  std::function<std::optional<std::string>()> local_segment;
  /// Preferred over on_connect when set: also gets the peer's authenticated
  /// identity ("" when the server has no secret).
  std::function<handshake_desc(const handshake_desc&, std::string_view peer_identity)> on_connect_from;
  /// Preferred over on_notify when set; returns whether the message was taken
  /// (false: the sender is told it was not, as when no handler is set).
  std::function<bool(const notify_desc&, std::string_view peer_identity)> on_notify_from;
};

/// Counters since start; read with relaxed loads (monotonic, not a snapshot).
struct handshake_server_stats {
  std::uint64_t accepted = 0;  ///< connections accepted
  std::uint64_t served = 0;    ///< requests answered
  std::uint64_t dropped = 0;   ///< connections dropped for bad input, timeout or overload
  std::uint64_t auth_failed = 0;  ///< requests refused by authentication (secret set)
  /// Connections closed on accept: their source already had
  /// max_connections_per_source open, or the unauthenticated slots were full
  /// (counted in `dropped` too).
  std::uint64_t refused_source = 0;
  std::uint64_t refused_unauthenticated = 0;
};

class handshake_server {
 public:
  /// Binds, listens and starts the threads.  Errors: errc::config_invalid
  /// (bad host, empty range, zero bounds), errc::already_exists (port in use,
  /// or no free port in the range), errc::handshake_failed (other socket errors).
  [[nodiscard]] static result<handshake_server> start(handshake_server_config config,
                                                      handshake_handlers handlers);

  handshake_server(handshake_server&&) noexcept;
  handshake_server& operator=(handshake_server&&) noexcept;
  handshake_server(const handshake_server&) = delete;
  handshake_server& operator=(const handshake_server&) = delete;
  /// stop().
  ~handshake_server();

  /// The bound port.  Thread-safe.
  [[nodiscard]] std::uint16_t port() const noexcept;
  /// The bound address as given in the config.
  [[nodiscard]] const std::string& host() const noexcept;
  [[nodiscard]] handshake_server_stats stats() const noexcept;

  /// Closes the listener and every connection, waits for running callbacks
  /// and joins the threads.  Idempotent; must not be called from a callback.
  void stop() noexcept;

  struct impl;  ///< not API (public only so the .cpp's connection class can name it)

 private:
  explicit handshake_server(std::unique_ptr<impl> p) noexcept;
  std::unique_ptr<impl> impl_;
};

/// The key the per-source cap counts `address` (an IP literal as Asio
/// writes it) under: an IPv4 address as it is ("10.0.0.1"), an
/// IPv4-mapped IPv6 address as its IPv4 address, any other IPv6 address as
/// its /64 ("2001:db8:0:1::/64"); text that is no address, as given.
[[nodiscard]] std::string source_key(std::string_view address);

/// A port in [lo, hi] that was free when probed (random order; bound and
/// released, so another process may take it before you do: prefer the
/// config's port range, which binds directly).  Errors: errc::already_exists
/// when none is free, errc::config_invalid when lo > hi or lo == 0.
[[nodiscard]] result<std::uint16_t> pick_free_port(std::uint16_t lo = 15000, std::uint16_t hi = 17000);

}  // namespace tide::net
