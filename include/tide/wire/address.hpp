#pragma once
/// Names on the handshake network, as Mooncake spells them
/// (research/mooncake-wire.md §4):
///   segment / server name  "host:port", IPv6 as "[addr]:port"; no port = 12001
///   NIC path               "<server name>@<device>", split at the last '@'
/// Pure string functions; thread-safe.

#include <tide/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace tide::wire {

/// Mooncake's MC_HANDSHAKE_PORT default, used when a name carries no port.
inline constexpr std::uint16_t kDefaultHandshakePort = 12001;

struct peer_address {
  std::string host;  ///< without brackets
  std::uint16_t port = kDefaultHandshakePort;
  friend bool operator==(const peer_address&, const peer_address&) = default;
};

/// "host:port", "[v6]:port", "host", "[v6]" or a bare IPv6 literal (no port).
/// Errors: errc::invalid_argument (empty host, port not 1..65535, junk after ']').
[[nodiscard]] result<peer_address> parse_peer_address(std::string_view name,
                                                      std::uint16_t default_port = kDefaultHandshakePort);
/// "host:port", with brackets around a host that contains ':'.
[[nodiscard]] std::string format_peer_address(std::string_view host, std::uint16_t port);

/// "<server>@<device>".
[[nodiscard]] std::string make_nic_path(std::string_view server, std::string_view device);
struct nic_path {
  std::string server;
  std::string device;
};

/// Where a NIC path splits: its last '@', or npos when there is none or
/// either side would be empty.  Every reader of a NIC path splits here
/// (the identity check, the passive handshake, the RDMA notification
/// receiver): a device name has no '@', a server name might (tide refuses
/// one in local_server_name, a peer of another make might not), and two
/// readers that split one path differently would name two servers for it.
/// Mooncake splits at the first '@'; the two agree on every name without
/// one.  Hot path; no allocation.
[[nodiscard]] constexpr std::size_t nic_path_split(std::string_view path) noexcept {
  const std::size_t at = path.rfind('@');
  if (at == std::string_view::npos || at == 0 || at + 1 == path.size()) return std::string_view::npos;
  return at;
}
/// The server part of a NIC path (nic_path_split), or empty when it is not one.
[[nodiscard]] constexpr std::string_view nic_path_server(std::string_view path) noexcept {
  const std::size_t at = nic_path_split(path);
  return at == std::string_view::npos ? std::string_view{} : path.substr(0, at);
}
/// The device part of a NIC path (nic_path_split), or empty when it is not one.
[[nodiscard]] constexpr std::string_view nic_path_device(std::string_view path) noexcept {
  const std::size_t at = nic_path_split(path);
  return at == std::string_view::npos ? std::string_view{} : path.substr(at + 1);
}
/// Splits at nic_path_split.  Errors: errc::invalid_argument when there is
/// no '@' or either side is empty.
[[nodiscard]] result<nic_path> split_nic_path(std::string_view path);

/// With a cluster secret, what a peer's authenticated identity (its segment
/// name, bound by the request MAC) may claim: only NIC paths whose server
/// part is that identity, so one member cannot connect, re-handshake or
/// lock out another's endpoints under the other's name.  Errors:
/// errc::auth_failed naming both (a path that is not <server>@<device> is
/// invalid_argument).
[[nodiscard]] status check_peer_identity(std::string_view identity, std::string_view nic_path);

}  // namespace tide::wire
