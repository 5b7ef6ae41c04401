// metrics::http_server: GET /metrics over HTTP/1.1 with Boost.Beast, on one
// thread running one io_context.  One connection at a time (a scraper
// connects every few seconds; a second one waits in the listen backlog),
// each bounded in size and time, so a slow or hostile client holds the
// endpoint for at most kRequestTimeout.  See <tide/metrics.hpp>.
#include <tide/metrics.hpp>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace tide::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {
constexpr std::size_t kMaxRequestBytes = 8192;
constexpr std::chrono::seconds kRequestTimeout{5};
}  // namespace

struct http_server::impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  text_fn text;
  std::thread thread;
  std::uint16_t port = 0;

  // The one connection being served, or none (accept waits meanwhile).
  struct connection {
    explicit connection(tcp::socket s) : stream(std::move(s)) {}
    beast::tcp_stream stream;
    beast::flat_buffer buffer{kMaxRequestBytes};
    http::request_parser<http::empty_body> parser;
    http::response<http::string_body> response;
  };

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        accept();  // e.g. EMFILE: the next one may work
        return;
      }
      serve(std::make_shared<connection>(std::move(s)));
    });
  }

  void serve(std::shared_ptr<connection> c) {
    c->parser.header_limit(static_cast<std::uint32_t>(kMaxRequestBytes));
    c->parser.body_limit(0);
    c->stream.expires_after(kRequestTimeout);
    http::async_read(c->stream, c->buffer, c->parser, [this, c](beast::error_code ec, std::size_t) {
      if (ec) {
        finish(c);  // timeout, too large, malformed, closed: no answer
        return;
      }
      respond(c, c->parser.get());
    });
  }

  void respond(const std::shared_ptr<connection>& c, const http::request<http::empty_body>& req) {
    auto& res = c->response;
    res.version(req.version());
    res.keep_alive(false);
    res.set(http::field::server, "tide");
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (path != "/metrics") {
      res.result(http::status::not_found);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "not found: only /metrics is served\n";
    } else if (req.method() != http::verb::get) {
      res.result(http::status::method_not_allowed);
      res.set(http::field::allow, "GET");
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "only GET\n";
    } else {
      try {
        res.body() = text();
        res.result(http::status::ok);
        res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      } catch (const std::exception& e) {
        res.result(http::status::internal_server_error);
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = std::string("metrics: ") + e.what() + "\n";
      }
    }
    res.prepare_payload();
    c->stream.expires_after(kRequestTimeout);
    http::async_write(c->stream, res, [this, c](beast::error_code, std::size_t) { finish(c); });
  }

  void finish(const std::shared_ptr<connection>& c) {
    beast::error_code ignored;
    c->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    c->stream.close();
    accept();
  }
};

http_server::http_server(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

result<std::unique_ptr<http_server>> http_server::start(const std::string& host, std::uint16_t port, text_fn text) {
  beast::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) return fail(errc::config_invalid, "metrics_bind: \"" + host + "\" is no IP address");
  auto im = std::make_unique<impl>();
  im->text = std::move(text);
  const tcp::endpoint ep(addr, port);
  im->acceptor.open(ep.protocol(), ec);
  if (!ec) im->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) im->acceptor.bind(ep, ec);
  if (ec == asio::error::address_in_use)
    return fail(errc::already_exists, "metrics_port " + std::to_string(port) + " on " + host + " is in use");
  if (!ec) im->acceptor.listen(16, ec);
  if (ec) return fail(errc::handshake_failed, "metrics endpoint " + host + ":" + std::to_string(port) + ": " + ec.message());
  im->port = im->acceptor.local_endpoint().port();
  im->accept();
  impl* raw = im.get();
  im->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<http_server>(new http_server(std::move(im)));
}

http_server::~http_server() {
  if (!impl_) return;
  // stop() abandons the connection in progress (its handlers are destroyed
  // with the io_context, after the thread has left run()).
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint16_t http_server::port() const noexcept { return impl_->port; }

}  // namespace tide::metrics
