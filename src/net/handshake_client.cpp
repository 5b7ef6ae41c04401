// Blocking request/reply over Asio, each phase bounded by a deadline: the
// io_context runs until the operation completes or the deadline passes, and
// on a timeout the socket is closed so the operation ends at once.

#include <tide/net/handshake_client.hpp>

#include <tide/net/address.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>

namespace tide::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

class client_session {
 public:
  client_session(std::string_view host, std::uint16_t port, const std::atomic<bool>* abort)
      : host_(host), port_(port), where_(format_peer_address(host, port)), abort_(abort) {}

  status connect(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    error_code ec;
    const auto addr = asio::ip::make_address(host_, ec);
    if (!ec) {
      const tcp::endpoint ep{addr, port_};
      ec = run_until(deadline, [&](auto handler) { sock_.async_connect(ep, handler); });
    } else {
      tcp::resolver resolver{ctx_};
      tcp::resolver::results_type results;
      ec = run_until(deadline, [&](auto handler) {
        resolver.async_resolve(host_, std::to_string(port_),
                               [&results, handler](const error_code& e, tcp::resolver::results_type r) {
                                 results = std::move(r);
                                 handler(e);
                               });
      }, [&] { resolver.cancel(); });
      if (ec == asio::error::operation_aborted) return abandoned("resolving");
      if (ec) {
        return fail(errc::peer_unreachable, "cannot resolve " + where_ + ": " +
                                                (ec == asio::error::timed_out ? "timed out" : ec.message()));
      }
      ec = run_until(deadline, [&](auto handler) {
        asio::async_connect(sock_, results, [handler](const error_code& e, const tcp::endpoint&) { handler(e); });
      });
    }
    if (ec == asio::error::operation_aborted) return abandoned("connecting to");
    if (ec == asio::error::timed_out) {
      return fail(errc::peer_unreachable,
                  "connect to " + where_ + " timed out after " + std::to_string(timeout.count()) + " ms");
    }
    if (ec) return fail(errc::peer_unreachable, "connect to " + where_ + ": " + ec.message());
    sock_.set_option(tcp::no_delay(true), ec);
    return {};
  }

  result<frame> round_trip(const std::string& request, std::size_t max_reply,
                           std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    error_code ec = run_until(deadline, [&](auto handler) {
      asio::async_write(sock_, asio::buffer(request), [handler](const error_code& e, std::size_t) { handler(e); });
    });
    if (ec == asio::error::operation_aborted) return abandoned("sending to");
    if (ec == asio::error::timed_out) {
      return fail(errc::handshake_failed, "sending to " + where_ + " timed out");
    }
    if (ec) return fail(errc::handshake_failed, "sending to " + where_ + ": " + ec.message());

    frame_decoder dec{max_reply};
    std::array<char, 16384> buf;
    std::size_t got_total = 0;
    while (dec.current() == frame_decoder::state::need_more) {
      std::size_t got = 0;
      ec = run_until(deadline, [&](auto handler) {
        sock_.async_read_some(asio::buffer(buf, std::min(buf.size(), dec.bytes_wanted())),
                              [handler, &got](const error_code& e, std::size_t n) {
                                got = n;
                                handler(e);
                              });
      });
      if (ec == asio::error::operation_aborted) return abandoned("waiting for the reply of");
      if (ec == asio::error::timed_out) {
        return fail(errc::handshake_failed, "no complete reply from " + where_ + " within " +
                                                std::to_string(timeout.count()) + " ms (" +
                                                std::to_string(got_total) + " bytes received)");
      }
      if (ec == asio::error::eof) {
        return fail(errc::handshake_failed, where_ + " closed the connection after " +
                                                std::to_string(got_total) + " bytes of the reply");
      }
      if (ec) return fail(errc::handshake_failed, "reading from " + where_ + ": " + ec.message());
      got_total += got;
      dec.feed(buf.data(), got);
    }
    if (dec.current() == frame_decoder::state::failed) {
      error e = dec.failure();
      e.detail = "reply from " + where_ + ": " + e.detail;
      return fail(std::move(e));
    }
    return dec.take();
  }

  const std::string& where() const noexcept { return where_; }

  ~client_session() {
    error_code ignored;
    sock_.close(ignored);
  }

 private:
  error stopped_error(const char* doing) const {
    return error{errc::canceled, std::string("gave up ") + doing + " " + where_ + ": the engine is stopping"};
  }
  tl::unexpected<error> abandoned(const char* doing) const { return fail(stopped_error(doing)); }

  bool abort_requested() const noexcept { return abort_ != nullptr && abort_->load(std::memory_order_acquire); }

  // Starts an operation whose handler takes (error_code) and runs the
  // io_context until it completes, `deadline` passes or the abort flag is
  // set (looked at every kAbortPoll); then `cancel` (default: close the
  // socket) ends it, and asio::error::timed_out or operation_aborted results.
  template <class Start, class Cancel>
  error_code run_until(clock::time_point deadline, Start start, Cancel cancel) {
    std::optional<error_code> done;
    start([&done](const error_code& e) { done = e; });
    ctx_.restart();
    bool aborted = false;
    for (;;) {
      const auto now = clock::now();
      if (done || now >= deadline) break;
      if (abort_requested()) {
        aborted = true;
        break;
      }
      ctx_.run_until(abort_ == nullptr ? deadline : std::min(deadline, now + kAbortPoll));
    }
    if (!done) {
      cancel();
      ctx_.restart();
      ctx_.run();  // let the aborted operation finish before its buffers go away
      return aborted ? error_code(asio::error::operation_aborted) : error_code(asio::error::timed_out);
    }
    return *done;
  }
  template <class Start>
  error_code run_until(clock::time_point deadline, Start start) {
    return run_until(deadline, start, [this] {
      error_code ignored;
      sock_.close(ignored);
    });
  }

  asio::io_context ctx_{1};
  tcp::socket sock_{ctx_};
  std::string host_;
  std::uint16_t port_;
  std::string where_;
  const std::atomic<bool>* abort_;
};

}  // namespace

namespace {

// The authenticated exchange of wire/auth.hpp on an open session.
result<std::string> authenticated_round_trip(client_session& s, message_type type, std::string_view body,
                                             const request_options& opts) {
  const wire::cluster_secret& secret = *opts.secret;
  auto challenge = s.round_trip(encode_frame(message_type::probe, wire::encode_auth_hello()), opts.max_reply,
                                opts.receive_timeout);
  if (!challenge) return fail(challenge.error());
  auto no_auth = [&] {
    return fail(errc::auth_failed, s.where() + " does not authenticate (it answered tide's hello as a plain " +
                                       "probe): it has no cluster secret, or is not tide");
  };
  if (challenge->legacy || challenge->type != message_type::probe || !wire::is_auth_message(challenge->body))
    return no_auth();
  auto ch = wire::decode_auth_message(challenge->body);
  if (!ch) return fail(errc::auth_failed, s.where() + ": " + ch.error().detail);
  if (ch->kind != "challenge") return no_auth();
  auto client_nonce = wire::fresh_nonce();
  if (!client_nonce) return fail(client_nonce.error());
  auto request = wire::encode_auth_request(secret, type, ch->nonce, *client_nonce, opts.identity, body);
  // The server would drop it at its length field, unread: say why here.
  if (request.size() + 1 > wire::kMaxAuthRequestFrame)
    return fail(errc::invalid_argument, "an authenticated " + std::string(to_string(type)) + " request of " +
                                            std::to_string(request.size() + 1) + " bytes to " + s.where() +
                                            "; a server with a cluster secret reads at most " +
                                            std::to_string(wire::kMaxAuthRequestFrame));
  auto reply = s.round_trip(encode_frame(type, request), opts.max_reply, opts.receive_timeout);
  if (!reply) return fail(reply.error());
  if (reply->legacy || reply->type != type)
    return fail(errc::auth_failed, "reply from " + s.where() + " has the wrong type for an authenticated " +
                                       std::string(to_string(type)) + " request");
  auto m = wire::decode_auth_message(reply->body);
  if (!m) return fail(errc::auth_failed, "reply from " + s.where() + ": " + m.error().detail);
  if (m->kind == "failed" || m->kind == "required")
    return fail(errc::auth_failed, s.where() + " refused our authentication (a different cluster secret?)");
  if (m->kind != "reply" || !wire::verify_auth_mac(secret, wire::auth_direction::reply, type, ch->nonce,
                                                   *client_nonce, opts.identity, *m))
    return fail(errc::auth_failed, "reply from " + s.where() +
                                       ": its MAC does not verify (a different cluster secret, or altered in flight)");
  return std::move(m->body);
}

}  // namespace

result<std::string> send_request(std::string_view host, std::uint16_t port, message_type type,
                                 std::string_view body, const request_options& opts) {
  if (host.empty()) return fail(errc::invalid_argument, "empty host");
  try {
    client_session s{host, port, opts.abort};
    if (auto ok = s.connect(opts.connect_timeout); !ok) return fail(ok.error());
    if (opts.secret) return authenticated_round_trip(s, type, body, opts);
    auto reply = s.round_trip(encode_frame(type, body), opts.max_reply, opts.receive_timeout);
    if (!reply) return fail(reply.error());
    if (wire::is_auth_message(reply->body)) {
      auto m = wire::decode_auth_message(reply->body);
      if (m && m->kind == "required")
        return fail(errc::auth_failed, s.where() + " requires authentication; configure the cluster secret "
                                                   "(engine_config::auth_secret_file, TIDE_AUTH_SECRET_FILE)");
    }
    if (reply->legacy || reply->type != type) {
      return fail(errc::protocol_error,
                  "reply from " + s.where() + " has type " +
                      (reply->legacy ? std::string("legacy (untyped)") : std::string(to_string(reply->type))) +
                      ", expected " + std::string(to_string(type)));
    }
    return std::move(reply->body);
  } catch (const std::bad_alloc&) {
    return fail(errc::out_of_memory, "handshake request to " + format_peer_address(host, port));
  } catch (const std::exception& e) {
    return fail(errc::handshake_failed, format_peer_address(host, port) + ": " + e.what());
  }
}

result<handshake_desc> exchange_handshake(std::string_view host, std::uint16_t port,
                                          const handshake_desc& local, const request_options& opts) {
  auto body = send_request(host, port, message_type::connect, encode_handshake(local), opts);
  if (!body) return fail(body.error());
  auto reply = decode_handshake(*body);
  if (!reply) {
    return fail(reply.error().code,
                "handshake reply from " + format_peer_address(host, port) + ": " + reply.error().detail);
  }
  if (!reply->reply_msg.empty()) {
    return fail(errc::handshake_rejected, format_peer_address(host, port) + ": " + reply->reply_msg);
  }
  return reply;
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\r' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

result<std::string> fetch_metadata(std::string_view host, std::uint16_t port, const request_options& opts) {
  // Mooncake sends its own descriptor and the server ignores it; "{}" is
  // valid JSON and accepted by both.
  auto body = send_request(host, port, message_type::metadata, "{}\n", opts);
  if (!body) return fail(body.error());
  const std::string_view t = trim(*body);
  if (t.empty() || t == "null") {
    return fail(errc::segment_not_found, format_peer_address(host, port) + " serves no segment descriptor");
  }
  return body;
}

result<segment_desc> fetch_segment(std::string_view host, std::uint16_t port, const request_options& opts) {
  auto body = fetch_metadata(host, port, opts);
  if (!body) return fail(body.error());
  auto desc = decode_segment(*body);
  if (!desc) {
    return fail(desc.error().code,
                "segment served by " + format_peer_address(host, port) + ": " + desc.error().detail);
  }
  return desc;
}

status send_notify(std::string_view host, std::uint16_t port, const notify_desc& msg,
                   const request_options& opts) {
  auto body = send_request(host, port, message_type::notify, encode_notify(msg), opts);
  if (!body) return fail(body.error());
  auto reply = decode_notify(*body);
  if (!reply) {
    return fail(reply.error().code,
                "notify reply from " + format_peer_address(host, port) + ": " + reply.error().detail);
  }
  if (reply->notify_msg.empty()) {
    return fail(errc::handshake_rejected, format_peer_address(host, port) + " did not accept the notification");
  }
  return {};
}

status probe(std::string_view host, std::uint16_t port, const request_options& opts) {
  auto body = send_request(host, port, message_type::probe, "{}\n", opts);
  if (!body) return fail(body.error());
  return {};
}

}  // namespace tide::net
