// The one TU that instantiates Beast's server side.

#include <tide/metadata/http_metadata_server.hpp>

#include "http_client.hpp"

#include <tide/detail/log.hpp>
#include <tide/wire/address.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <array>
#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace tide {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {
class http_session;
}

struct http_metadata_server::impl {
  explicit impl(http_metadata_server_config c) : cfg(std::move(c)) {}

  asio::io_context io{1};  // first: destroyed last
  http_metadata_server_config cfg;
  tcp::acceptor acceptor{io};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread;
  std::uint16_t port = 0;
  std::atomic<bool> stopped{false};
  std::atomic<std::size_t> active{0};

  // I/O thread only.
  bool closed = false;
  std::vector<std::weak_ptr<http_session>> sessions;

  // SHA-256 of the whole "Bearer <token>" header value; compared in
  // constant time.  Set before the thread starts, read-only after.
  bool token_required = false;
  std::array<unsigned char, SHA256_DIGEST_LENGTH> bearer_digest{};

  mutable std::mutex kv_mu;
  std::map<std::string, std::string, std::less<>> kv;  // guarded by kv_mu
  std::size_t stored = 0;                              // keys + values, guarded by kv_mu

  [[nodiscard]] bool authorized(const bhttp::request<bhttp::string_body>& req) const;
  void refuse_connection(tcp::socket& sock);

  void accept_next();
  bhttp::response<bhttp::string_body> handle(const bhttp::request<bhttp::string_body>& req);
};

namespace {

class http_session : public std::enable_shared_from_this<http_session> {
 public:
  http_session(http_metadata_server::impl& srv, tcp::socket sock) : srv_(srv), stream_(std::move(sock)) {}
  ~http_session() { srv_.active.fetch_sub(1, std::memory_order_relaxed); }

  void start() { read(); }
  void abort() { stream_.close(); }  // closes the socket and cancels the stream's timer

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(srv_.cfg.max_value_bytes);
    stream_.expires_after(srv_.cfg.request_timeout);
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](const error_code& ec, std::size_t) {
      self->on_read(ec);
    });
  }

  void on_read(const error_code& ec) {
    if (srv_.closed) return;  // stop() closed the socket; nothing to report
    if (ec == bhttp::error::end_of_stream || ec == asio::error::operation_aborted) return close();
    if (ec) {
      if (ec != beast::error::timeout && ec != asio::error::connection_reset) {
        TIDE_LOG_WARN("tide-metadata-server: dropped a connection: " << ec.message());
      }
      // A request over the body limit still deserves an answer.
      if (ec == bhttp::error::body_limit) {
        respond(error_reply(bhttp::status::payload_too_large,
                            "value too large: over max_value_bytes = " + std::to_string(srv_.cfg.max_value_bytes) + "\n"),
                false, /*linger=*/true);
        return;
      }
      return close();
    }
    auto req = parser_->release();
    const bool keep = req.keep_alive();
    respond(srv_.handle(req), keep);
  }

  static bhttp::response<bhttp::string_body> error_reply(bhttp::status s, std::string body) {
    bhttp::response<bhttp::string_body> res{s, 11};
    res.set(bhttp::field::content_type, "text/plain");
    res.body() = std::move(body);
    res.prepare_payload();
    return res;
  }

  // `linger`: the reply came before the client finished sending (413); see linger_close.
  void respond(bhttp::response<bhttp::string_body> res, bool keep_alive, bool linger = false) {
    res_ = std::move(res);
    res_.keep_alive(keep_alive);
    stream_.expires_after(srv_.cfg.request_timeout);
    bhttp::async_write(stream_, res_, [self = shared_from_this(), keep_alive, linger](const error_code& ec, std::size_t) {
      if (ec) return self->close();
      if (linger) return self->linger_close();
      if (!keep_alive) return self->close();
      self->read();
    });
  }

  // A lingering close: closing a socket with unread bytes resets the
  // connection, and the reset can destroy the reply before the client, still
  // sending its body, reads it ("Broken pipe" instead of 413).  So stop
  // sending, then read and discard until the client closes or the request
  // timeout passes.  Nothing is buffered beyond sink_.
  void linger_close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(srv_.cfg.request_timeout);
    discard();
  }

  void discard() {
    stream_.async_read_some(asio::buffer(sink_), [self = shared_from_this()](const error_code& ec, std::size_t) {
      if (ec || self->srv_.closed) return self->stream_.close();
      self->discard();
    });
  }

  void close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  http_metadata_server::impl& srv_;
  std::array<char, 16384> sink_{};  ///< linger_close's discard buffer
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::response<bhttp::string_body> res_;
};

// The value of `name` in a query string, still escaped.
std::optional<std::string_view> query_param(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    const auto eq = item.find('=');
    if (item.substr(0, eq) == name) return eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1);
  }
  return std::nullopt;
}

std::array<unsigned char, SHA256_DIGEST_LENGTH> sha256(std::string_view text) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> d{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data());
  return d;
}

}  // namespace

bool http_metadata_server::impl::authorized(const bhttp::request<bhttp::string_body>& req) const {
  if (!token_required) return true;
  const auto it = req.find(bhttp::field::authorization);
  if (it == req.end()) return false;
  // Digests of equal length: the comparison time does not depend on where,
  // or whether, the offered value differs.
  const auto offered = sha256(std::string_view{it->value().data(), it->value().size()});
  return CRYPTO_memcmp(offered.data(), bearer_digest.data(), offered.size()) == 0;
}

// Over max_connections: a 503 naming the bound if the socket takes it at
// once (it is a few bytes on a fresh connection), then close; never waits.
void http_metadata_server::impl::refuse_connection(tcp::socket& sock) {
  const std::string body = "too many connections: max_connections = " + std::to_string(cfg.max_connections) + "\n";
  const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nServer: tide-metadata-server\r\n"
                            "Content-Type: text/plain\r\nConnection: close\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
  error_code ignored;
  sock.non_blocking(true, ignored);
  sock.write_some(asio::buffer(reply), ignored);
  sock.shutdown(tcp::socket::shutdown_send, ignored);
  sock.close(ignored);
}

bhttp::response<bhttp::string_body> http_metadata_server::impl::handle(const bhttp::request<bhttp::string_body>& req) {
  auto reply = [&req](bhttp::status s, std::string body, const char* type = "text/plain") {
    bhttp::response<bhttp::string_body> res{s, req.version()};
    res.set(bhttp::field::server, "tide-metadata-server");
    res.set(bhttp::field::content_type, type);
    res.body() = std::move(body);
    res.prepare_payload();
    return res;
  };
  const std::string_view target{req.target().data(), req.target().size()};
  const auto qmark = target.find('?');
  const std::string_view path = target.substr(0, qmark);
  if (path != cfg.path) return reply(bhttp::status::not_found, "unknown path\n");
  const auto raw_key =
      qmark == std::string_view::npos ? std::nullopt : query_param(target.substr(qmark + 1), "key");
  if (!raw_key || raw_key->empty()) return reply(bhttp::status::bad_request, "missing key\n");
  auto key = detail::url_unescape(*raw_key);
  if (!key) return reply(bhttp::status::bad_request, key.error().detail + "\n");

  const bool write = req.method() == bhttp::verb::put || req.method() == bhttp::verb::delete_;
  if (write && !authorized(req)) {
    auto res = reply(bhttp::status::unauthorized,
                     req.find(bhttp::field::authorization) == req.end()
                         ? "PUT and DELETE need Authorization: Bearer <token>\n"
                         : "wrong token\n");
    res.set(bhttp::field::www_authenticate, "Bearer realm=\"tide-metadata\"");
    return res;
  }

  std::lock_guard lock{kv_mu};
  switch (req.method()) {
    case bhttp::verb::get: {
      auto it = kv.find(*key);
      if (it == kv.end()) return reply(bhttp::status::not_found, "metadata not found\n");
      return reply(bhttp::status::ok, it->second, "application/json");
    }
    case bhttp::verb::put: {
      auto it = kv.find(*key);
      const std::size_t before = it == kv.end() ? 0 : it->first.size() + it->second.size();
      const std::size_t after = key->size() + req.body().size();
      if (it == kv.end() && kv.size() >= cfg.max_keys) {
        return reply(bhttp::status::insufficient_storage,
                     "key limit reached: max_keys = " + std::to_string(cfg.max_keys) + "\n");
      }
      if (stored - before + after > cfg.max_total_bytes) {
        return reply(bhttp::status::insufficient_storage,
                     "store full: max_total_bytes = " + std::to_string(cfg.max_total_bytes) + "\n");
      }
      if (it == kv.end()) {
        kv.emplace(std::move(*key), req.body());
      } else {
        it->second = req.body();
      }
      stored = stored - before + after;
      return reply(bhttp::status::ok, "metadata updated\n");
    }
    case bhttp::verb::delete_: {
      auto it = kv.find(*key);
      if (it == kv.end()) return reply(bhttp::status::not_found, "metadata not found\n");
      stored -= it->first.size() + it->second.size();
      kv.erase(it);
      return reply(bhttp::status::ok, "metadata deleted\n");
    }
    default:
      return reply(bhttp::status::method_not_allowed, "use GET, PUT or DELETE\n");
  }
}

void http_metadata_server::impl::accept_next() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket sock) {
    if (closed) return;
    if (ec) {
      TIDE_LOG_WARN("tide-metadata-server: accept failed: " << ec.message());
      // Retry from a fresh handler so that a persistent error (EMFILE) does
      // not recurse; accept errors are rare enough not to need a back-off timer.
      asio::post(io, [this] {
        if (!closed) accept_next();
      });
      return;
    }
    std::erase_if(sessions, [](const std::weak_ptr<http_session>& w) { return w.expired(); });
    if (active.load(std::memory_order_relaxed) >= cfg.max_connections) {
      TIDE_LOG_WARN("tide-metadata-server: refusing a connection: " << cfg.max_connections << " open");
      refuse_connection(sock);
    } else {
      active.fetch_add(1, std::memory_order_relaxed);
      auto s = std::make_shared<http_session>(*this, std::move(sock));
      sessions.push_back(s);
      s->start();
    }
    accept_next();
  });
}

http_metadata_server::http_metadata_server(std::unique_ptr<impl> p) noexcept : impl_(std::move(p)) {}
http_metadata_server::http_metadata_server(http_metadata_server&&) noexcept = default;
http_metadata_server& http_metadata_server::operator=(http_metadata_server&& other) noexcept {
  if (this != &other) {
    stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
http_metadata_server::~http_metadata_server() { stop(); }

std::uint16_t http_metadata_server::port() const noexcept { return impl_ ? impl_->port : 0; }

std::size_t http_metadata_server::key_count() const {
  if (!impl_) return 0;
  std::lock_guard lock{impl_->kv_mu};
  return impl_->kv.size();
}

std::size_t http_metadata_server::stored_bytes() const {
  if (!impl_) return 0;
  std::lock_guard lock{impl_->kv_mu};
  return impl_->stored;
}

void http_metadata_server::stop() noexcept {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  impl* s = impl_.get();
  try {
    std::promise<void> done;
    asio::post(s->io, [s, &done] {
      s->closed = true;
      error_code ignored;
      s->acceptor.close(ignored);
      for (auto& w : s->sessions) {
        if (auto c = w.lock()) c->abort();
      }
      s->sessions.clear();
      done.set_value();
    });
    done.get_future().wait();
  } catch (const std::exception& e) {
    TIDE_LOG_ERROR("tide-metadata-server: stop: " << e.what());
  }
  s->work.reset();
  if (s->thread.joinable()) s->thread.join();
}

result<http_metadata_server> http_metadata_server::start(http_metadata_server_config config) {
  if (config.path.empty() || config.path.front() != '/') {
    return fail(errc::config_invalid, "metadata server path \"" + config.path + "\" must start with '/'");
  }
  error_code ec;
  const auto addr = asio::ip::make_address(config.host, ec);
  if (ec) return fail(errc::config_invalid, "metadata server host \"" + config.host + "\" is not an IP address");
  for (const auto& [name, value] : {std::pair<const char*, std::size_t>{"max_value_bytes", config.max_value_bytes},
                                    {"max_keys", config.max_keys},
                                    {"max_total_bytes", config.max_total_bytes},
                                    {"max_connections", config.max_connections}}) {
    if (value == 0) return fail(errc::config_invalid, std::string("metadata server ") + name + " must be > 0");
  }
  if (config.request_timeout.count() <= 0) {
    return fail(errc::config_invalid, "metadata server request_timeout must be > 0");
  }
  std::string token;
  if (!config.token_file.empty()) {
    auto t = detail::read_secret_file("token_file", config.token_file);
    if (!t) return fail(t.error());
    token = std::move(*t);
  }
  try {
    auto p = std::make_unique<impl>(std::move(config));
    if (!token.empty()) {
      p->token_required = true;
      p->bearer_digest = sha256("Bearer " + token);
      OPENSSL_cleanse(token.data(), token.size());
    }
    const tcp::endpoint ep{addr, p->cfg.port};
    p->acceptor.open(ep.protocol(), ec);
    if (!ec) p->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) p->acceptor.bind(ep, ec);
    if (!ec) p->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec == asio::error::address_in_use) {
      return fail(errc::already_exists, wire::format_peer_address(p->cfg.host, p->cfg.port) + " is in use");
    }
    if (ec) {
      return fail(errc::metadata_unavailable,
                  "cannot listen on " + wire::format_peer_address(p->cfg.host, p->cfg.port) + ": " + ec.message());
    }
    p->port = p->acceptor.local_endpoint().port();
    p->accept_next();
    impl* raw = p.get();
    p->thread = std::thread([raw] {
      for (;;) {
        try {
          raw->io.run();
          return;
        } catch (const std::exception& e) {
          TIDE_LOG_ERROR("tide-metadata-server: I/O thread caught: " << e.what());
        }
      }
    });
    return http_metadata_server{std::move(p)};
  } catch (const std::system_error& e) {
    return fail(errc::metadata_unavailable, std::string("metadata server: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(errc::out_of_memory, "metadata server");
  }
}

}  // namespace tide
