#include <tide/wire/address.hpp>

#include <charconv>

namespace tide::wire {

namespace {

result<std::uint16_t> parse_port(std::string_view text, std::string_view whole) {
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || value == 0 ||
      value > 65535) {
    return fail(errc::invalid_argument,
                "bad port \"" + std::string(text) + "\" in \"" + std::string(whole) + "\"");
  }
  return static_cast<std::uint16_t>(value);
}

}  // namespace

result<peer_address> parse_peer_address(std::string_view name, std::uint16_t default_port) {
  peer_address out;
  out.port = default_port;
  if (!name.empty() && name.front() == '[') {
    const auto close = name.find(']');
    if (close == std::string_view::npos) {
      return fail(errc::invalid_argument, "unterminated '[' in \"" + std::string(name) + "\"");
    }
    out.host = std::string(name.substr(1, close - 1));
    const std::string_view rest = name.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return fail(errc::invalid_argument, "junk after ']' in \"" + std::string(name) + "\"");
      }
      auto port = parse_port(rest.substr(1), name);
      if (!port) return fail(port.error());
      out.port = *port;
    }
  } else {
    const auto colon = name.rfind(':');
    if (colon != std::string_view::npos && name.find(':') == colon) {
      out.host = std::string(name.substr(0, colon));
      auto port = parse_port(name.substr(colon + 1), name);
      if (!port) return fail(port.error());
      out.port = *port;
    } else {
      // No colon, or several: a bare IPv6 literal without a port.
      out.host = std::string(name);
    }
  }
  if (out.host.empty()) {
    return fail(errc::invalid_argument, "empty host in \"" + std::string(name) + "\"");
  }
  return out;
}

std::string format_peer_address(std::string_view host, std::uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.push_back('[');
    out.append(host);
    out.push_back(']');
  } else {
    out.append(host);
  }
  out.push_back(':');
  out.append(std::to_string(port));
  return out;
}

std::string make_nic_path(std::string_view server, std::string_view device) {
  std::string out(server);
  out.push_back('@');
  out.append(device);
  return out;
}

result<nic_path> split_nic_path(std::string_view path) {
  const auto at = nic_path_split(path);
  if (at == std::string_view::npos) {
    return fail(errc::invalid_argument,
                "NIC path \"" + std::string(path) + "\" is not <server>@<device>");
  }
  return nic_path{std::string(path.substr(0, at)), std::string(path.substr(at + 1))};
}

status check_peer_identity(std::string_view identity, std::string_view path) {
  auto p = split_nic_path(path);
  if (!p) return fail(p.error());
  if (p->server != identity)
    return fail(errc::auth_failed, "NIC path \"" + std::string(path) + "\" is not the authenticated peer \"" +
                                       std::string(identity) + "\"'s (a peer may claim only its own NIC paths)");
  return {};
}

}  // namespace tide::wire
