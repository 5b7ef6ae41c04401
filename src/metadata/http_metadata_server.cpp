// The one TU that instantiates Beast's server side.

#include <tide/metadata/http_metadata_server.hpp>

#include "http_client.hpp"

#include <tide/detail/log.hpp>
#include <tide/net/address.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

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

  mutable std::mutex kv_mu;
  std::map<std::string, std::string, std::less<>> kv;

  void accept_next();
  bhttp::response<bhttp::string_body> handle(const bhttp::request<bhttp::string_body>& req);
};

namespace {

class http_session : public std::enable_shared_from_this<http_session> {
 public:
  http_session(http_metadata_server::impl& srv, tcp::socket sock) : srv_(srv), stream_(std::move(sock)) {}
  ~http_session() { srv_.active.fetch_sub(1, std::memory_order_relaxed); }

  void start() { read(); }
  void abort() {
    error_code ignored;
    stream_.socket().close(ignored);
  }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(srv_.cfg.max_body);
    stream_.expires_after(srv_.cfg.idle_timeout);
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](const error_code& ec, std::size_t) {
      self->on_read(ec);
    });
  }

  void on_read(const error_code& ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::operation_aborted) return close();
    if (ec) {
      if (ec != beast::error::timeout && ec != asio::error::connection_reset) {
        TIDE_LOG_WARN("tide-metadata-server: dropped a connection: " << ec.message());
      }
      // A request over the body limit still deserves an answer.
      if (ec == bhttp::error::body_limit) {
        respond(error_reply(bhttp::status::payload_too_large, "body too large\n"), false);
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

  void respond(bhttp::response<bhttp::string_body> res, bool keep_alive) {
    res_ = std::move(res);
    res_.keep_alive(keep_alive);
    stream_.expires_after(srv_.cfg.idle_timeout);
    bhttp::async_write(stream_, res_, [self = shared_from_this(), keep_alive](const error_code& ec, std::size_t) {
      if (ec || !keep_alive) return self->close();
      self->read();
    });
  }

  void close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.socket().close(ignored);
  }

  http_metadata_server::impl& srv_;
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

}  // namespace

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

  std::lock_guard lock{kv_mu};
  switch (req.method()) {
    case bhttp::verb::get: {
      auto it = kv.find(*key);
      if (it == kv.end()) return reply(bhttp::status::not_found, "metadata not found\n");
      return reply(bhttp::status::ok, it->second, "application/json");
    }
    case bhttp::verb::put:
      kv.insert_or_assign(std::move(*key), req.body());
      return reply(bhttp::status::ok, "metadata updated\n");
    case bhttp::verb::delete_: {
      auto it = kv.find(*key);
      if (it == kv.end()) return reply(bhttp::status::not_found, "metadata not found\n");
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
      error_code ignored;
      sock.close(ignored);
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
  try {
    auto p = std::make_unique<impl>(std::move(config));
    const tcp::endpoint ep{addr, p->cfg.port};
    p->acceptor.open(ep.protocol(), ec);
    if (!ec) p->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) p->acceptor.bind(ep, ec);
    if (!ec) p->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec == asio::error::address_in_use) {
      return fail(errc::already_exists, net::format_peer_address(p->cfg.host, p->cfg.port) + " is in use");
    }
    if (ec) {
      return fail(errc::metadata_unavailable,
                  "cannot listen on " + net::format_peer_address(p->cfg.host, p->cfg.port) + ": " + ec.message());
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
