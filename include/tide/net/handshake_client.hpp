#pragma once
/// The client side of the handshake protocol: one request, one reply, one TCP
/// connection (Mooncake's lifecycle; research/mooncake-wire.md §1).
///
/// API in brief (all blocking, all bounded in time, callable from any thread):
///   send_request(host, port, message_type::probe, "{}\n", opts) -> result<std::string> (reply body)
///   exchange_handshake(host, port, local_desc, opts)  -> result<handshake_desc> (the peer's reply)
///   fetch_segment(host, port, opts)                   -> result<segment_desc>   (p2p metadata)
///   send_notify(host, port, notify_desc, opts)        -> status
///   probe(host, port, opts)                           -> status
/// Hosts are names or IP literals (IPv6 without brackets); see address.hpp to
/// split "host:port" segment names.  No Asio in this header.
///
/// Errors: errc::peer_unreachable (resolve or connect failed or timed out),
/// errc::handshake_failed (write/read failed, receive timeout, peer closed),
/// errc::protocol_error (reply not a frame, or of another type than the
/// request), errc::frame_too_large (reply above opts.max_reply); typed helpers
/// add errc::metadata_malformed (reply JSON) and errc::handshake_rejected.
/// errc::auth_failed: with opts.secret, the peer does not authenticate, its
/// reply's MAC does not verify, or it refused ours; without, the peer
/// requires a secret.  (wire/auth.hpp describes the exchange.)
/// errc::canceled: opts.abort was set while the request was under way.
/// errc::invalid_argument: with opts.secret, a request too large for a
/// server to read before authentication (wire::kMaxAuthRequestFrame).

#include <tide/wire/descriptors.hpp>
#include <tide/net/frame.hpp>
#include <tide/result.hpp>
#include <tide/wire/auth.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tide::net {

struct request_options {
  /// Resolve + TCP connect.  Mooncake's default (MC_HANDSHAKE_CONNECT_TIMEOUT).
  std::chrono::milliseconds connect_timeout{5000};
  /// Writing the request and reading the whole reply.  Mooncake waits 60 s;
  /// tide's default is shorter because a passive side that takes longer has
  /// hung (a QP transition takes milliseconds, even under rxe).
  std::chrono::milliseconds receive_timeout{30000};
  /// Largest reply length field accepted (raise it for big Metadata replies).
  std::size_t max_reply = kDefaultMaxFrame;
  /// The cluster secret: authenticate the exchange (wire/auth.hpp).  Null =
  /// Mooncake's plain wire.
  std::shared_ptr<const wire::cluster_secret> secret;
  /// Who we are, bound into the MAC (the engine's segment name).
  std::string identity;
  /// When it becomes true, a request under way gives up within kAbortPoll
  /// (errc::canceled): an engine going away must not wait out the timeouts
  /// above for a dead or hung peer.  Null = never.
  /// The owner keeps it alive across every request that uses it.
  const std::atomic<bool>* abort = nullptr;
};

/// How often a request looks at request_options::abort.
inline constexpr std::chrono::milliseconds kAbortPoll{50};

/// Sends one typed frame and returns the body of the reply, which must carry
/// the same type.  Thread-safe; each call owns its socket.  Cost: one TCP
/// connection (plus a resolver thread when `host` is not an IP literal).
[[nodiscard]] result<std::string> send_request(std::string_view host, std::uint16_t port,
                                               message_type type, std::string_view body,
                                               const request_options& opts = {});

/// Connect message.  A reply whose reply_msg is non-empty is returned as
/// errc::handshake_rejected with reply_msg as the detail.  Path consistency
/// (reply.local_nic_path == what we targeted) is the caller's check.
[[nodiscard]] result<handshake_desc> exchange_handshake(std::string_view host, std::uint16_t port,
                                                        const handshake_desc& local,
                                                        const request_options& opts = {});

/// Metadata message (body "{}\n"): the raw descriptor JSON the peer serves.
/// A peer that serves none answers "null": errc::segment_not_found.
[[nodiscard]] result<std::string> fetch_metadata(std::string_view host, std::uint16_t port,
                                                 const request_options& opts = {});
/// fetch_metadata + decode_segment.
[[nodiscard]] result<segment_desc> fetch_segment(std::string_view host, std::uint16_t port,
                                                 const request_options& opts = {});

/// Notify message.  A reply with an empty notify_msg (the peer did not take
/// it) is errc::handshake_rejected.
[[nodiscard]] status send_notify(std::string_view host, std::uint16_t port, const notify_desc& msg,
                                 const request_options& opts = {});

/// Probe message: succeeds when the peer answers a probe frame.
[[nodiscard]] status probe(std::string_view host, std::uint16_t port, const request_options& opts = {});

}  // namespace tide::net
