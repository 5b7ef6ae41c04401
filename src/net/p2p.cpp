// The p2p metadata backend: lives with the handshake service it rides on.

#include <tide/policy/p2p.hpp>

#include <tide/net/address.hpp>
#include <tide/net/handshake_client.hpp>
#include <tide/net/local_segments.hpp>

namespace tide::policy {

namespace {

status check_connection(const metadata_config& c) {
  if (c.connection.empty() || c.connection == "P2PHANDSHAKE" || c.connection == "p2p") {
    if (c.timeout.count() <= 0) return fail(errc::config_invalid, "metadata timeout must be > 0");
    return {};
  }
  return fail(errc::config_invalid, "p2p metadata expects \"P2PHANDSHAKE\", got \"" + c.connection + "\"");
}

result<net::peer_address> address_of(std::string_view name) {
  auto ep = net::parse_peer_address(name);
  if (!ep) return fail(errc::config_invalid, "p2p segment name must be host:port: " + ep.error().detail);
  return ep;
}

// Mooncake's largest MC_HANDSHAKE_MAX_LENGTH: a descriptor with many buffers
// can pass the default 1 MiB, and we asked this peer for it.
constexpr std::size_t kMaxDescriptor = std::size_t{128} << 20;

}  // namespace

p2p::p2p(const metadata_config& config) : config_(config) {}

result<std::string> p2p::get_segment(std::string_view name) {
  if (auto ok = check_connection(config_); !ok) return fail(ok.error());
  auto ep = address_of(name);
  if (!ep) return fail(ep.error());
  net::request_options opts;
  opts.connect_timeout = config_.timeout;
  opts.receive_timeout = config_.timeout;
  opts.max_reply = kMaxDescriptor;
  opts.secret = config_.secret;
  opts.identity = config_.identity;
  auto json = net::fetch_metadata(ep->host, ep->port, opts);
  if (!json) {
    const error& e = json.error();
    if (e.code == errc::segment_not_found || e.code == errc::out_of_memory || e.code == errc::auth_failed)
      return fail(e);
    return fail(errc::metadata_unavailable, std::string(to_string(e.code)) + ": " + e.detail);
  }
  return json;
}

status p2p::put_segment(std::string_view name, std::string_view json) {
  if (auto ok = check_connection(config_); !ok) return fail(ok.error());
  auto ep = address_of(name);
  if (!ep) return fail(ep.error());
  net::publish_local_segment(ep->port, std::string(json));
  return {};
}

status p2p::remove_segment(std::string_view name) {
  if (auto ok = check_connection(config_); !ok) return fail(ok.error());
  auto ep = address_of(name);
  if (!ep) return fail(ep.error());
  if (!net::withdraw_local_segment(ep->port)) {
    return fail(errc::segment_not_found, "no segment published on port " + std::to_string(ep->port));
  }
  return {};
}

}  // namespace tide::policy
