// The handshake server: one I/O thread drives every connection through
// reading -> handling -> writing -> lingering; callbacks run on a small worker
// pool and hand their reply back to the I/O thread.  Only the I/O thread
// touches sockets, timers and the connection list.

#include <tide/net/handshake_server.hpp>

#include <tide/detail/log.hpp>
#include <tide/net/address.hpp>
#include <tide/net/local_segments.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <future>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace tide::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

class connection;

constexpr std::string_view kProbeReply = "{\"status\":\"success\"}\n";
constexpr std::string_view kNullReply = "null\n";

}  // namespace

struct handshake_server::impl {
  impl(handshake_server_config c, handshake_handlers h)
      : cfg(std::move(c)), handlers(std::move(h)), pool(std::max(1u, cfg.handler_threads)) {}

  // Declared first so it is destroyed last: sockets and timers below refer to it.
  asio::io_context io{1};
  handshake_server_config cfg;
  handshake_handlers handlers;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  asio::thread_pool pool;
  std::thread io_thread;
  std::string where;
  std::uint16_t port = 0;

  // I/O thread only.
  std::vector<std::weak_ptr<connection>> conns;
  bool closed = false;

  std::atomic<std::size_t> active{0};
  std::atomic<std::size_t> unauthenticated{0};  // connections not yet past authentication
  // Open connections by source address.  A connection is destroyed on
  // whichever thread drops its last reference (a pool thread too): locked.
  std::mutex sources_mu;
  std::unordered_map<std::string, std::size_t> sources;
  std::atomic<std::uint64_t> refused_source{0};
  std::atomic<std::uint64_t> refused_unauthenticated{0};
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> served{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<std::uint64_t> auth_failed{0};
  std::atomic<bool> stopped{false};

  void accept_next();
  void run_io() noexcept;
  // Runs on a pool thread: the reply body, or why to drop the connection.
  result<std::string> handle(message_type type, const std::string& body, const std::string& identity);
  std::optional<std::string> served_segment();
  // The most connections that have not yet authenticated.
  // Without a secret no connection ever authenticates, so the reserved
  // slots stay empty (set reserved_authenticated = 0 to open them).
  [[nodiscard]] std::size_t unauthenticated_cap() const noexcept {
    return cfg.max_connections - std::min(cfg.reserved_authenticated, cfg.max_connections / 4);
  }
  void release_source(const std::string& source) {
    std::lock_guard lock(sources_mu);
    if (auto it = sources.find(source); it != sources.end() && --it->second == 0) sources.erase(it);
  }
};

namespace {

class connection : public std::enable_shared_from_this<connection> {
 public:
  // The caller has counted it in srv.active, srv.unauthenticated and srv.sources[source].
  connection(handshake_server::impl& srv, tcp::socket sock, std::string source, std::string peer)
      : srv_(srv),
        sock_(std::move(sock)),
        timer_(srv.io),
        dec_(srv.cfg.secret ? std::min(srv.cfg.max_frame, srv.cfg.max_hello_frame) : srv.cfg.max_frame),
        source_(std::move(source)),
        peer_(std::move(peer)) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() {
    past_authentication();
    srv_.release_source(source_);
    srv_.active.fetch_sub(1, std::memory_order_relaxed);
  }

  void start() {
    // With a secret the first frame is the hello: small, and sent at once.
    arm_timer(srv_.cfg.secret ? srv_.cfg.hello_timeout : srv_.cfg.receive_timeout);
    read_request();
  }

  // stop(): close without a word.
  void abort() {
    phase_ = phase::done;
    close();
  }

 private:
  enum class phase : std::uint8_t { reading, handling, writing, lingering, done };

  void arm_timer() { arm_timer(srv_.cfg.receive_timeout); }
  void arm_timer(std::chrono::milliseconds after) {
    const unsigned gen = ++timer_gen_;
    armed_for_ = after;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
      // A stale wait (re-armed or cancelled since) must not fire.
      if (!ec && gen == self->timer_gen_) self->on_timeout();
    });
  }
  void disarm_timer() {
    ++timer_gen_;
    timer_.cancel();
  }

  void read_request() {
    sock_.async_read_some(asio::buffer(buf_, std::min(buf_.size(), dec_.bytes_wanted())),
                          [self = shared_from_this()](const error_code& ec, std::size_t n) {
                            self->on_read(ec, n);
                          });
  }

  void on_read(const error_code& ec, std::size_t n) {
    if (phase_ != phase::reading) return;
    if (ec) {
      if (ec == asio::error::eof) {
        drop("client closed the connection after " + std::to_string(received_) + " bytes");
      } else {
        drop("read failed: " + ec.message());
      }
      return;
    }
    received_ += n;
    dec_.feed(buf_.data(), n);
    switch (dec_.current()) {
      case frame_decoder::state::need_more:
        read_request();
        return;
      case frame_decoder::state::failed:
        drop(dec_.failure().message());
        return;
      case frame_decoder::state::complete:
        disarm_timer();
        dispatch(dec_.take());
        return;
    }
  }

  void on_timeout() {
    switch (phase_) {
      case phase::reading:
        drop(std::string(srv_.cfg.secret && !challenged_ ? "no complete hello" : "no complete request") +
             " within " + std::to_string(armed_for_.count()) + " ms (" + std::to_string(received_) +
             " bytes received)");
        return;
      case phase::writing:
        drop("the client did not take the reply within " +
             std::to_string(srv_.cfg.receive_timeout.count()) + " ms");
        return;
      case phase::lingering:  // the reply is out; the client just did not close
        finish();
        return;
      case phase::handling:
      case phase::done:
        return;
    }
  }

  void dispatch(frame f) {
    phase_ = phase::handling;
    type_ = f.type;
    legacy_ = f.legacy;
    if (srv_.closed) {
      abort();
      return;
    }
    if (srv_.cfg.secret) {
      if (!authenticate(f)) return;
      // Past authentication: the reserved slots are this connection's to use
      // now.  Without a secret a complete first frame proves nothing (anyone
      // can send a probe and then hold the socket), so it stays counted.
      past_authentication();
    }
    const bool inline_reply =
        type_ == message_type::probe || (type_ == message_type::metadata && !srv_.handlers.local_segment);
    if (inline_reply) {
      // Cheap enough for the I/O thread: a syntax check and a registry copy.
      if (auto ok = validate_json(f.body); !ok) {
        drop("invalid JSON in a " + std::string(to_string(type_)) + " request: " + ok.error().detail);
        return;
      }
      if (type_ == message_type::probe) {
        send_reply(std::string(kProbeReply));
      } else {
        send_reply(srv_.served_segment().value_or(std::string(kNullReply)));
      }
      return;
    }
    asio::post(srv_.pool, [self = shared_from_this(), body = std::move(f.body)]() mutable {
      auto outcome = self->srv_.handle(self->type_, body, self->identity_);
      auto& io = self->srv_.io;
      asio::post(io, [self = std::move(self), outcome = std::move(outcome)]() mutable {
        if (self->phase_ != phase::handling) return;  // aborted by stop()
        if (!outcome) {
          self->drop(outcome.error().detail);
        } else {
          self->send_reply(std::move(*outcome));
        }
      });
    });
  }

  // With a secret: the hello gets a challenge, the request after it must
  // carry a MAC over both nonces; f.body becomes the inner body.  False when
  // the connection has been answered (challenge or refusal) instead.
  bool authenticate(frame& f) {
    const wire::cluster_secret& secret = *srv_.cfg.secret;
    if (!challenged_) {
      if (!f.legacy && f.type == message_type::probe && wire::is_auth_message(f.body)) {
        auto m = wire::decode_auth_message(f.body);
        auto n = wire::fresh_nonce();
        if (m && m->kind == "hello" && n) {
          challenged_ = true;
          server_nonce_ = *n;
          send_challenge(wire::encode_auth_challenge(server_nonce_));
          return false;
        }
      }
      refuse("required", "a " + std::string(f.legacy ? "legacy" : to_string(f.type)) +
                             " request without authentication (no cluster secret on the client?)");
      return false;
    }
    auto m = f.legacy ? result<wire::auth_message>(fail(errc::auth_failed, "a legacy frame"))
                      : wire::decode_auth_message(f.body);
    if (!m) {
      refuse("failed", m.error().detail);
      return false;
    }
    if (m->kind != "request") {
      refuse("failed", "expected an authenticated request, got \"" + m->kind + "\"");
      return false;
    }
    if (!wire::verify_auth_mac(secret, wire::auth_direction::request, f.type, server_nonce_, m->nonce, m->identity,
                               *m)) {
      refuse("failed", "the request's MAC does not verify (another secret, an altered body, or a replay)");
      return false;
    }
    authenticated_ = true;
    client_nonce_ = m->nonce;
    identity_ = std::move(m->identity);
    f.body = std::move(m->body);
    return true;
  }

  void past_authentication() {
    if (counted_unauthenticated_) {
      counted_unauthenticated_ = false;
      srv_.unauthenticated.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  void refuse(std::string_view kind, const std::string& why) {
    srv_.auth_failed.fetch_add(1, std::memory_order_relaxed);
    TIDE_LOG_WARN("handshake server " << srv_.where << ": refused " << peer_ << ": " << why);
    send_reply(wire::encode_auth_refusal(kind));
  }

  void send_challenge(std::string body) {
    phase_ = phase::writing;
    out_ = encode_frame(message_type::probe, body);
    arm_timer();
    asio::async_write(sock_, asio::buffer(out_), [self = shared_from_this()](const error_code& ec, std::size_t) {
      if (self->phase_ != phase::writing) return;
      if (ec) {
        self->drop("writing the challenge failed: " + ec.message());
        return;
      }
      // The authenticated request follows on this connection, bounded by
      // what a real request needs: it is still a stranger's until its MAC
      // verifies, so a longer one is dropped at its length field, unread.
      self->dec_ = frame_decoder(std::min(self->srv_.cfg.max_frame, self->srv_.cfg.max_auth_request_frame));
      self->phase_ = phase::reading;
      self->arm_timer();
      self->read_request();
    });
  }

  void send_reply(std::string body) {
    phase_ = phase::writing;
    if (authenticated_)
      body = wire::encode_auth_reply(*srv_.cfg.secret, type_, server_nonce_, client_nonce_, identity_, body);
    out_ = legacy_ ? encode_legacy_frame(body) : encode_frame(type_, body);
    arm_timer();
    asio::async_write(sock_, asio::buffer(out_), [self = shared_from_this()](const error_code& ec, std::size_t) {
      if (self->phase_ != phase::writing) return;
      if (ec) {
        self->drop("writing the reply failed: " + ec.message());
        return;
      }
      self->srv_.served.fetch_add(1, std::memory_order_relaxed);
      self->linger();
    });
  }

  // Mooncake's server half-closes and waits for the client's EOF so that its
  // reply is not lost to a reset; tide does the same, bounded by the timeout.
  void linger() {
    phase_ = phase::lingering;
    error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_send, ignored);
    // An honest client closes as soon as it has the reply; only a peer
    // holding a slot waits a timer out, so strangers get a short one.
    arm_timer(authenticated_ ? srv_.cfg.receive_timeout
                             : std::min(srv_.cfg.unauthenticated_linger, srv_.cfg.receive_timeout));
    sock_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](const error_code& ec, std::size_t n) {
      if (self->phase_ != phase::lingering) return;
      if (!ec && n > 0) {
        TIDE_LOG_DEBUG("handshake server " << self->srv_.where << ": " << n << " unexpected bytes from "
                                           << self->peer_ << " after the reply");
      }
      self->finish();
    });
  }

  void drop(const std::string& reason) {
    if (phase_ == phase::done) return;
    srv_.dropped.fetch_add(1, std::memory_order_relaxed);
    TIDE_LOG_WARN("handshake server " << srv_.where << ": dropped connection from " << peer_ << ": "
                                      << reason);
    finish();
  }

  void finish() {
    phase_ = phase::done;
    close();
  }

  void close() {
    disarm_timer();
    error_code ignored;
    sock_.close(ignored);
  }

  handshake_server::impl& srv_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  unsigned timer_gen_ = 0;
  frame_decoder dec_;
  std::array<char, 4096> buf_{};
  std::string out_;
  std::string source_;  // the key in srv_.sources
  std::string peer_;
  std::chrono::milliseconds armed_for_{0};
  bool counted_unauthenticated_ = true;
  std::size_t received_ = 0;
  phase phase_ = phase::reading;
  message_type type_ = message_type::connect;
  bool legacy_ = false;
  // Authentication state (secret set only).
  bool challenged_ = false;
  bool authenticated_ = false;
  wire::auth_nonce server_nonce_{};
  wire::auth_nonce client_nonce_{};
  std::string identity_;
};

}  // namespace

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
    std::erase_if(conns, [](const std::weak_ptr<connection>& w) { return w.expired(); });
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
        auto c = std::make_shared<connection>(*this, std::move(sock), std::move(source), std::move(peer));
        conns.push_back(c);
        c->start();
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
        if (auto c = w.lock()) c->abort();
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
