// tcp::transport: the facade over the I/O threads, the server and the client.
#include "client.hpp"
#include "server.hpp"

#include <tide/tcp/tcp_transport.hpp>

namespace tide::tcp {

struct transport::impl {
  impl(const config& c, local_memory& m)
      : cfg(c), io(cfg.io_threads), server(cfg, io, counts, m), client(cfg, io, counts) {}
  config cfg;
  detail::counters counts;
  detail::io_pool io;
  detail::server server;
  detail::client client;
  std::uint16_t port = 0;
  bool stopped = false;
};

transport::transport(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

transport::~transport() { shutdown(); }

result<std::unique_ptr<transport>> transport::create(const config& cfg, local_memory& memory) {
  if (cfg.io_threads == 0 || cfg.io_threads > 64) return fail(errc::config_invalid, "tcp_io_threads must be 1..64");
  if (cfg.conns_per_peer == 0 || cfg.conns_per_peer > 64)
    return fail(errc::config_invalid, "tcp_conns_per_peer must be 1..64");
  if (cfg.max_ops_per_conn == 0) return fail(errc::config_invalid, "tcp max_ops_per_conn must be > 0");
  if (cfg.max_connections == 0 || cfg.max_connections_per_source == 0)
    return fail(errc::config_invalid, "tcp connection limits must be > 0");
  if (cfg.secret && (cfg.identity.empty() || cfg.identity.size() > wire::kTcpAuthIdentityMax))
    return fail(errc::config_invalid, "tcp: an identity of 1.." + std::to_string(wire::kTcpAuthIdentityMax) +
                                          " bytes is needed with a cluster secret");
  try {
    auto i = std::make_unique<impl>(cfg, memory);
    auto port = i->server.bind();
    if (!port) return fail(port.error());
    i->port = *port;
    i->server.start();
    i->io.start();
    return std::unique_ptr<transport>(new transport(std::move(i)));
  } catch (const std::system_error& e) {
    return fail(errc::resource_exhausted, std::string("tcp transport: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(errc::out_of_memory, "tcp transport");
  }
}

std::uint16_t transport::port() const noexcept { return impl_->port; }

void transport::submit(const peer& p, op& o) noexcept { impl_->client.submit(p, o); }

void transport::shutdown() noexcept {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  impl_->server.shutdown();
  impl_->client.shutdown();
  impl_->io.stop();
}

tcp::stats transport::stats() const noexcept {
  const auto& c = impl_->counts;
  auto l = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  tcp::stats s;
  s.ops_ok = l(c.ops_ok);
  s.ops_failed = l(c.ops_failed);
  s.bytes_written = l(c.bytes_written);
  s.bytes_read = l(c.bytes_read);
  s.connections_opened = l(c.connections_opened);
  s.connect_failures = l(c.connect_failures);
  s.connections_lost = l(c.connections_lost);
  s.accepted = l(c.accepted);
  s.refused_source = l(c.refused_source);
  s.refused_full = l(c.refused_full);
  s.requests_served = l(c.requests_served);
  s.requests_rejected = l(c.requests_rejected);
  s.auth_failed = l(c.auth_failed);
  s.dropped = l(c.dropped);
  s.bytes_served_in = l(c.bytes_served_in);
  s.bytes_served_out = l(c.bytes_served_out);
  s.bytes_staged = l(c.bytes_staged);
  s.open_connections = l(c.open_connections);
  return s;
}

}  // namespace tide::tcp
