// The handshake server: one I/O thread drives every connection through
// reading -> handling -> writing -> lingering (handshake_connection.cpp);
// callbacks run on a small worker pool and hand their reply back to the
// I/O thread.  Only the I/O thread touches sockets, timers and the
// connection list.  Here: accepting and admission, the callbacks, start
// (binding, a port range) and stop.

#include "handshake_server_impl.hpp"

#include <tide/detail/log.hpp>
#include <tide/net/address.hpp>
#include <tide/net/local_segments.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <future>
#include <numeric>
#include <random>
#include <vector>

namespace tide::net {

using boost::system::error_code;

void handshake_server::impl::accept_next() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket sock) {
    if (closed) return;
    if (ec) {
      // EMFILE and friends: back off instead of spinning on the error.
      TIDE_LOG_WARN("handshake server " << where << ": accept failed: " << ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](const error_code& e) {
        if (!e && !closed) accept_next();
      });
      return;
    }
    accepted.fetch_add(1, std::memory_order_relaxed);
    std::erase_if(conns, [](const std::weak_ptr<server_connection>& w) { return w.expired(); });
    error_code ep_ec;
    const auto ep = sock.remote_endpoint(ep_ec);
    const std::string address = ep_ec ? std::string("?") : ep.address().to_string();
    std::string peer = ep_ec ? address : format_peer_address(address, ep.port());
    std::string source = source_key(address);
    auto refuse = [&](std::atomic<std::uint64_t>* counter, const std::string& why) {
      dropped.fetch_add(1, std::memory_order_relaxed);
      if (counter != nullptr) counter->fetch_add(1, std::memory_order_relaxed);
      TIDE_LOG_WARN("handshake server " << where << ": refusing a connection from " << peer << ": " << why);
      error_code ignored;
      sock.close(ignored);
    };
    if (active.load(std::memory_order_relaxed) >= cfg.max_connections) {
      refuse(nullptr, std::to_string(cfg.max_connections) + " connections already open");
    } else if (unauthenticated.load(std::memory_order_relaxed) >= unauthenticated_cap()) {
      refuse(&refused_unauthenticated, std::to_string(unauthenticated_cap()) +
                                           " connections not yet authenticated already open (the rest are reserved)");
    } else {
      bool admitted = false;
      {
        std::lock_guard lock(sources_mu);
        std::size_t& n = sources[source];
        if (n < cfg.max_connections_per_source) {
          ++n;
          admitted = true;
        } else if (n == 0) {
          sources.erase(source);
        }
      }
      if (!admitted) {
        refuse(&refused_source, std::to_string(cfg.max_connections_per_source) + " connections from " + source +
                                    " already open");
      } else {
        active.fetch_add(1, std::memory_order_relaxed);
        unauthenticated.fetch_add(1, std::memory_order_relaxed);
        conns.push_back(start_connection(*this, std::move(sock), std::move(source), std::move(peer)));
      }
    }
    accept_next();
  });
}

void handshake_server::impl::run_io() noexcept {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      TIDE_LOG_ERROR("handshake server " << where << ": I/O thread caught: " << e.what());
    } catch (...) {
      TIDE_LOG_ERROR("handshake server " << where << ": I/O thread caught an unknown exception");
    }
  }
}

std::optional<std::string> handshake_server::impl::served_segment() {
  // Served byte for byte: encode_segment's text already ends in '\n' as
  // Mooncake's does, and p2p readers get back exactly what was put.
  return handlers.local_segment ? handlers.local_segment() : local_segment(port);
}

result<std::string> handshake_server::impl::handle(message_type type, const std::string& body,
                                                   const std::string& identity) {
  // Mooncake closes without replying when the body is not JSON.
  if (auto ok = validate_json(body); !ok) {
    return fail(errc::protocol_error,
                "invalid JSON in a " + std::string(to_string(type)) + " request: " + ok.error().detail);
  }
  try {
    switch (type) {
      case message_type::connect: {
        auto peer = decode_handshake(body);
        handshake_desc reply;
        if (!peer) {
          reply.reply_msg = "Invalid argument: malformed handshake: " + peer.error().detail;
        } else if (!handlers.on_connect && !handlers.on_connect_from) {
          reply.reply_msg = "this server does not accept RDMA connections";
        } else {
          try {
            reply = handlers.on_connect_from ? handlers.on_connect_from(*peer, identity) : handlers.on_connect(*peer);
          } catch (const std::exception& e) {
            reply = handshake_desc{};
            reply.reply_msg = std::string("internal error: ") + e.what();
          }
        }
        return encode_handshake(reply);
      }
      case message_type::notify: {
        notify_desc reply;
        auto msg = decode_notify(body);
        if (!msg) {
          TIDE_LOG_WARN("handshake server " << where << ": rejecting a notify: " << msg.error().detail);
        } else if (handlers.on_notify_from) {
          try {
            if (handlers.on_notify_from(*msg, identity)) reply.notify_msg = "success";
          } catch (const std::exception& e) {
            TIDE_LOG_WARN("handshake server " << where << ": on_notify threw: " << e.what());
          }
        } else if (handlers.on_notify) {
          try {
            handlers.on_notify(*msg);
            reply.notify_msg = "success";
          } catch (const std::exception& e) {
            TIDE_LOG_WARN("handshake server " << where << ": on_notify threw: " << e.what());
          }
        }
        return encode_notify(reply);
      }
      case message_type::metadata:
        return served_segment().value_or(std::string(kNullReply));
      case message_type::probe:
        return std::string(kProbeReply);
    }
  } catch (const std::exception& e) {
    return fail(errc::protocol_error, std::string("handler failed: ") + e.what());
  }
  return fail(errc::protocol_error, "unknown message type");
}

// ---------------------------------------------------------------- handshake_server

handshake_server::handshake_server(std::unique_ptr<impl> p) noexcept : impl_(std::move(p)) {}
handshake_server::handshake_server(handshake_server&&) noexcept = default;
handshake_server& handshake_server::operator=(handshake_server&& other) noexcept {
  if (this != &other) {
    stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
handshake_server::~handshake_server() { stop(); }

std::uint16_t handshake_server::port() const noexcept { return impl_ ? impl_->port : 0; }

const std::string& handshake_server::host() const noexcept {
  static const std::string kNone;
  return impl_ ? impl_->cfg.host : kNone;
}

handshake_server_stats handshake_server::stats() const noexcept {
  if (!impl_) return {};
  return {impl_->accepted.load(std::memory_order_relaxed),         impl_->served.load(std::memory_order_relaxed),
          impl_->dropped.load(std::memory_order_relaxed),          impl_->auth_failed.load(std::memory_order_relaxed),
          impl_->refused_source.load(std::memory_order_relaxed),
          impl_->refused_unauthenticated.load(std::memory_order_relaxed)};
}

void handshake_server::stop() noexcept {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  impl* s = impl_.get();
  try {
    // 1. On the I/O thread: no more accepts, every connection closed.  Once
    //    this has run, `closed` keeps the I/O thread from posting new work
    //    to the pool, so joining the pool below waits only for work already
    //    posted.
    std::promise<void> closed_all;
    asio::post(s->io, [s, &closed_all] {
      s->closed = true;
      error_code ignored;
      s->acceptor.close(ignored);
      s->accept_retry.cancel();
      for (auto& w : s->conns) {
        if (auto c = w.lock()) abort_connection(*c);
      }
      s->conns.clear();
      closed_all.set_value();
    });
    closed_all.get_future().wait();
  } catch (const std::exception& e) {
    TIDE_LOG_ERROR("handshake server " << s->where << ": stop: " << e.what());
  }
  // 2. Running callbacks finish; their replies find their connections closed.
  s->pool.join();
  // 3. The I/O thread drains the aborted operations and returns.
  s->work.reset();
  if (s->io_thread.joinable()) s->io_thread.join();
}

namespace {

result<tcp::endpoint> bind_endpoint(const std::string& host, std::uint16_t port) {
  error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) return fail(errc::config_invalid, "handshake server host \"" + host + "\" is not an IP address");
  return tcp::endpoint{addr, port};
}

// Opens, binds and listens; address_in_use is reported as such so that a
// range scan can move on.
error_code try_bind(tcp::acceptor& acc, const tcp::endpoint& ep) {
  error_code ec;
  if (acc.is_open()) acc.close(ec);
  acc.open(ep.protocol(), ec);
  if (ec) return ec;
  acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) return ec;
  acc.bind(ep, ec);
  if (ec) return ec;
  acc.listen(asio::socket_base::max_listen_connections, ec);
  return ec;
}

std::vector<std::uint16_t> shuffled_range(std::uint16_t lo, std::uint16_t hi) {
  std::vector<std::uint16_t> ports(static_cast<std::size_t>(hi - lo) + 1);
  std::iota(ports.begin(), ports.end(), lo);
  std::mt19937 rng{std::random_device{}()};
  std::shuffle(ports.begin(), ports.end(), rng);
  return ports;
}

}  // namespace

result<handshake_server> handshake_server::start(handshake_server_config config, handshake_handlers handlers) {
  if (config.max_frame == 0) return fail(errc::config_invalid, "handshake server max_frame must be > 0");
  if (config.receive_timeout.count() <= 0) {
    return fail(errc::config_invalid, "handshake server receive_timeout must be > 0");
  }
  if (config.max_connections == 0) return fail(errc::config_invalid, "handshake server max_connections must be > 0");
  if (config.max_connections_per_source == 0)
    return fail(errc::config_invalid, "handshake server max_connections_per_source must be > 0");
  if (config.max_hello_frame == 0) return fail(errc::config_invalid, "handshake server max_hello_frame must be > 0");
  if (config.max_auth_request_frame == 0)
    return fail(errc::config_invalid, "handshake server max_auth_request_frame must be > 0");
  if (config.hello_timeout.count() <= 0)
    return fail(errc::config_invalid, "handshake server hello_timeout must be > 0");
  if (config.unauthenticated_linger.count() <= 0)
    return fail(errc::config_invalid, "handshake server unauthenticated_linger must be > 0");
  const bool use_range = config.port == 0 && (config.port_range_min != 0 || config.port_range_max != 0);
  if (use_range && (config.port_range_min == 0 || config.port_range_min > config.port_range_max)) {
    return fail(errc::config_invalid, "handshake server port range [" + std::to_string(config.port_range_min) +
                                          ", " + std::to_string(config.port_range_max) + "] is empty");
  }
  auto ep = bind_endpoint(config.host, config.port);
  if (!ep) return fail(ep.error());
  try {
    auto p = std::make_unique<impl>(std::move(config), std::move(handlers));
    error_code ec;
    if (use_range) {
      ec = asio::error::address_in_use;
      for (const auto port : shuffled_range(p->cfg.port_range_min, p->cfg.port_range_max)) {
        ep->port(port);
        ec = try_bind(p->acceptor, *ep);
        if (ec != asio::error::address_in_use) break;
      }
    } else {
      ec = try_bind(p->acceptor, *ep);
    }
    if (ec == asio::error::address_in_use) {
      return fail(errc::already_exists,
                  use_range ? "no free port in [" + std::to_string(p->cfg.port_range_min) + ", " +
                                  std::to_string(p->cfg.port_range_max) + "] on " + p->cfg.host
                            : "handshake port " + format_peer_address(p->cfg.host, p->cfg.port) + " is in use");
    }
    if (ec) {
      return fail(errc::handshake_failed,
                  "cannot listen on " + format_peer_address(p->cfg.host, ep->port()) + ": " + ec.message());
    }
    p->port = p->acceptor.local_endpoint().port();
    p->where = format_peer_address(p->cfg.host, p->port);
    p->accept_next();
    impl* raw = p.get();
    p->io_thread = std::thread([raw] { raw->run_io(); });
    return handshake_server{std::move(p)};
  } catch (const std::system_error& e) {
    return fail(errc::handshake_failed, std::string("handshake server: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(errc::out_of_memory, "handshake server");
  }
}

std::string source_key(std::string_view address) {
  error_code ec;
  const auto a = asio::ip::make_address(std::string(address), ec);
  if (ec) return std::string(address);
  if (a.is_v4()) return a.to_v4().to_string();
  const auto v6 = a.to_v6();
  if (v6.is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, v6).to_string();
  auto bytes = v6.to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), std::uint8_t{0});
  return asio::ip::address_v6(bytes).to_string() + "/64";
}

result<std::uint16_t> pick_free_port(std::uint16_t lo, std::uint16_t hi) {
  if (lo == 0 || lo > hi) {
    return fail(errc::config_invalid, "port range [" + std::to_string(lo) + ", " + std::to_string(hi) + "] is empty");
  }
  asio::io_context io{1};
  tcp::acceptor acc{io};
  for (const auto port : shuffled_range(lo, hi)) {
    const error_code ec = try_bind(acc, tcp::endpoint{tcp::v4(), port});
    if (!ec) {
      error_code ignored;
      acc.close(ignored);
      return port;
    }
  }
  return fail(errc::already_exists, "no free TCP port in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace tide::net
