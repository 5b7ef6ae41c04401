#pragma once
/// tide::policy::p2p — the embedded default: no metadata server.  A segment
/// is named after its owner's handshake server, "host:port" ("[v6]:port");
/// its descriptor is fetched from that port with a Metadata request
/// (research/mooncake-wire.md §2), as a Mooncake peer in P2PHANDSHAKE mode does.
///
///   get_segment("10.0.0.2:16002")  -> Metadata request to 10.0.0.2:16002
///   put_segment("10.0.0.1:15321", json)
///       -> net::publish_local_segment(15321, json): the handshake_server
///          bound to port 15321 in this process serves it from then on
///   remove_segment(name)  -> withdraws it (later requests get "null")
///
/// So the engine starts its net::handshake_server first, names its segment
/// "<its host>:<server.port()>" and publishes through this backend.
/// Connection string: "P2PHANDSHAKE" (Mooncake's), "p2p" or empty.
/// Timeouts: connect and receive each bounded by config.timeout.  Replies up
/// to 128 MiB are read (Mooncake's largest MC_HANDSHAKE_MAX_LENGTH).
/// Errors: errc::segment_not_found (the peer serves none), errc::metadata_unavailable
/// (peer unreachable, timed out, or answered garbage; the detail says which),
/// errc::config_invalid (bad connection string or segment name).
/// Thread-safe: every call opens its own connection.

#include <tide/metadata/backend.hpp>

#include <string>
#include <string_view>

namespace tide::policy {

class p2p {
 public:
  static constexpr std::string_view kName = "p2p";
  /// Peers read a descriptor from its owner's handshake port (no store).
  static constexpr bool kServedByOwner = true;

  explicit p2p(const metadata_config& config);

  [[nodiscard]] result<std::string> get_segment(std::string_view name);
  [[nodiscard]] status put_segment(std::string_view name, std::string_view json);
  [[nodiscard]] status remove_segment(std::string_view name);

 private:
  metadata_config config_;
};

static_assert(metadata_served_by_owner<p2p>);

}  // namespace tide::policy
