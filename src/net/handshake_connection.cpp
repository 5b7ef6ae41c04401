// One handshake connection's state machine on the server's I/O thread:
// reading -> handling (the callback on a pool thread) -> writing ->
// lingering, with the secret's hello and challenge in front.

#include "handshake_server_impl.hpp"

#include <tide/detail/log.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <chrono>

namespace tide::net {

using boost::system::error_code;

class server_connection : public std::enable_shared_from_this<server_connection> {
 public:
  // The caller has counted it in srv.active, srv.unauthenticated and srv.sources[source].
  server_connection(handshake_server::impl& srv, tcp::socket sock, std::string source, std::string peer)
      : srv_(srv),
        sock_(std::move(sock)),
        timer_(srv.io),
        dec_(srv.cfg.secret ? std::min(srv.cfg.max_frame, srv.cfg.max_hello_frame) : srv.cfg.max_frame),
        source_(std::move(source)),
        peer_(std::move(peer)) {}
  server_connection(const server_connection&) = delete;
  server_connection& operator=(const server_connection&) = delete;
  ~server_connection() {
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

std::shared_ptr<server_connection> start_connection(handshake_server::impl& srv, tcp::socket sock, std::string source,
                                                    std::string peer) {
  auto c = std::make_shared<server_connection>(srv, std::move(sock), std::move(source), std::move(peer));
  c->start();
  return c;
}

void abort_connection(server_connection& c) { c.abort(); }

}  // namespace tide::net
