// The TCP transport's server: one session per accepted connection, driving
//   [authenticate] -> wait for a header -> check the range -> move the payload
//   straight between the socket and the registered buffer -> status -> again.
//
// Ownership: the server's list holds weak references; each pending handler
// holds the session.  A session's socket, timer and fields are touched only
// by its I/O thread; the buffer it holds open (local_memory) is released on
// every path that ends the request or the session.

#include "server.hpp"

#include <tide/detail/log.hpp>
#include <tide/wire/address.hpp>
#include <tide/wire/auth.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <random>

namespace tide::tcp::detail {

namespace {

// One source: an IPv4 address, or an IPv6 /64 (a host there owns the whole
// prefix, so counting addresses would count nothing).
std::string source_key(const asio_tcp::endpoint& ep) {
  const auto a = ep.address();
  if (a.is_v4()) return a.to_v4().to_string();
  const auto v6 = a.to_v6();
  if (v6.is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, v6).to_string();
  const auto b = v6.to_bytes();
  std::string key = "v6:";
  static constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < 8; ++i) {
    key += kHex[b[i] >> 4];
    key += kHex[b[i] & 15];
  }
  return key + "::/64";
}

std::int64_t ms_to_ns(std::chrono::milliseconds d) { return static_cast<std::int64_t>(d.count()) * 1'000'000; }

}  // namespace

class session : public std::enable_shared_from_this<session> {
 public:
  session(server& srv, asio_tcp::socket sock, std::string source)
      : srv_(srv), sock_(std::move(sock)), timer_(sock_.get_executor()), source_(std::move(source)) {}
  ~session() { srv_.release_source(source_); }

  void start() {
    error_code ignored;
    sock_.set_option(asio_tcp::no_delay(true), ignored);
    if (srv_.cfg().secret) return auth_hello();
    wait_header();
  }
  [[nodiscard]] asio::any_io_executor executor() { return sock_.get_executor(); }
  /// Any thread: ends the session on its own thread.
  void close_later() {
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

 private:
  enum class phase : std::uint8_t { auth, idle, header, payload, closed };

  // ---------------------------------------------------------------- deadlines
  // One timer per session watches the deadline of the wait at hand,
  // last_progress_ns_ + limit_ (during a payload every read moves
  // last_progress_ns_).  Entering a phase only stores the new deadline; the
  // timer is re-armed when that deadline is earlier than the armed one, and
  // when it fires before the deadline (which moved on meanwhile) it re-arms
  // for the rest.  So a session serving thousands of requests a second
  // re-arms about once per progress_timeout instead of three times a request
  // (each a canceled wait run as a handler, and a timerfd update).
  void enter(phase p, std::chrono::milliseconds limit) {
    phase_ = p;
    last_progress_ns_ = now_ns();
    limit_ = limit;
    const std::int64_t deadline = last_progress_ns_ + ms_to_ns(limit);
    if (armed_ns_ == 0 || deadline < armed_ns_) arm(deadline);
  }

  void arm(std::int64_t deadline_ns) {
    armed_ns_ = deadline_ns;
    const std::uint64_t gen = ++timer_gen_;
    timer_.expires_after(std::chrono::nanoseconds(std::max<std::int64_t>(0, deadline_ns - now_ns())));
    timer_.async_wait([self = shared_from_this(), gen](const error_code& e) { self->on_timer(e, gen); });
  }

  void on_timer(const error_code& e, std::uint64_t gen) {
    if (e || gen != timer_gen_ || phase_ == phase::closed) return;
    armed_ns_ = 0;
    const std::int64_t deadline = last_progress_ns_ + ms_to_ns(limit_);
    if (now_ns() < deadline) return arm(deadline);
    if (phase_ != phase::idle) {
      counters::add(srv_.count().dropped);
      TIDE_LOG_WARN("tcp data port: " << peer_text() << " dropped: "
                                      << (phase_ == phase::auth     ? "no authentication within "
                                          : phase_ == phase::header ? "no complete request header within "
                                                                    : "payload stalled for ")
                                      << limit_.count() << " ms");
    }
    close();
  }

  // ---------------------------------------------------------------- authentication (wire/tcp_data.hpp)
  void auth_hello() {
    enter(phase::auth, srv_.cfg().request_timeout);
    scratch_.resize(wire::kTcpAuthHello.size());
    asio::async_read(sock_, asio::buffer(scratch_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();
      if (std::memcmp(self->scratch_.data(), wire::kTcpAuthHello.data(), wire::kTcpAuthHello.size()) != 0)
        return self->refuse_auth("no authentication hello (a peer without the cluster secret, or Mooncake)");
      auto nonce = wire::fresh_nonce();
      if (!nonce) return self->refuse_auth("no random nonce");
      self->server_nonce_ = *nonce;
      const auto ok = wire::encode_tcp_status(wire::tcp_status::ok);
      self->scratch_.assign(ok.begin(), ok.end());
      self->scratch_.insert(self->scratch_.end(), nonce->begin(), nonce->end());
      asio::async_write(self->sock_, asio::buffer(self->scratch_), [self](const error_code& e2, std::size_t) {
        if (self->phase_ == phase::closed) return;
        if (e2) return self->close();
        self->auth_read_request();
      });
    });
  }

  void auth_read_request() {
    scratch_.resize(wire::kAuthNonceBytes + 2);
    asio::async_read(sock_, asio::buffer(scratch_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();
      std::memcpy(self->client_nonce_.data(), self->scratch_.data(), wire::kAuthNonceBytes);
      const std::size_t id_len = self->scratch_[16] | (std::size_t{self->scratch_[17]} << 8);
      if (id_len == 0 || id_len > wire::kTcpAuthIdentityMax) return self->refuse_auth("identity length out of range");
      self->scratch_.resize(id_len + wire::kMacBytes);
      asio::async_read(self->sock_, asio::buffer(self->scratch_), [self, id_len](const error_code& e2, std::size_t) {
        if (self->phase_ == phase::closed) return;
        if (e2) return self->close();
        self->auth_check(id_len);
      });
    });
  }

  void auth_check(std::size_t id_len) {
    const auto& secret = *srv_.cfg().secret;
    identity_.assign(reinterpret_cast<const char*>(scratch_.data()), id_len);
    wire::auth_message m;
    std::memcpy(m.mac.data(), scratch_.data() + id_len, wire::kMacBytes);
    m.body = std::string(wire::kTcpDataAuthBody);
    if (!wire::verify_auth_mac(secret, wire::auth_direction::request, wire::kTcpDataAuthType, server_nonce_,
                               client_nonce_, identity_, m))
      return refuse_auth("its proof of the cluster secret does not verify");
    const auto mac = wire::auth_mac(secret, wire::auth_direction::reply, wire::kTcpDataAuthType, server_nonce_,
                                    client_nonce_, identity_, wire::kTcpDataAuthBody);
    const auto ok = wire::encode_tcp_status(wire::tcp_status::ok);
    scratch_.assign(ok.begin(), ok.end());
    scratch_.insert(scratch_.end(), mac.begin(), mac.end());
    asio::async_write(sock_, asio::buffer(scratch_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();
      self->wait_header();
    });
  }

  void refuse_auth(const char* why) {
    counters::add(srv_.count().auth_failed);
    TIDE_LOG_WARN("tcp data port: " << peer_text() << " refused: " << why);
    status_ = wire::encode_tcp_status(wire::tcp_status::auth_failed);
    asio::async_write(sock_, asio::buffer(status_), [self = shared_from_this()](const error_code&, std::size_t) {
      self->close();
    });
  }

  // ---------------------------------------------------------------- requests
  // Idle until a header's first bytes arrive.  The read is tried at once (a
  // pipelining client has usually sent the next header already) and takes
  // at most one header, so no payload byte is consumed here.  Only a header
  // that arrives in pieces enters the header phase and its shorter deadline.
  void wait_header() {
    enter(phase::idle, srv_.cfg().idle_timeout);
    sock_.async_read_some(asio::buffer(header_), [self = shared_from_this()](const error_code& e, std::size_t k) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();  // the peer closed between requests: its right
      if (k == self->header_.size()) return self->on_header();
      self->enter(phase::header, self->srv_.cfg().request_timeout);
      asio::async_read(self->sock_, asio::buffer(self->header_.data() + k, self->header_.size() - k),
                       [self](const error_code& e2, std::size_t) {
                         if (self->phase_ == phase::closed) return;
                         if (e2) return self->close();
                         self->on_header();
                       });
    });
  }

  void on_header() {
    req_ = wire::decode_tcp_header(header_);
    wire::tcp_status st = wire::tcp_status::addr_rejected;
    if (req_.size != 0 && req_.addr <= UINT64_MAX - req_.size)
      st = srv_.memory().open_range(req_.addr, req_.size, req_.op, handle_, stager_);
    if (st != wire::tcp_status::ok) {
      handle_ = nullptr;
      return reject(st);
    }
    done_ = 0;
    stage_.restart();
    enter(phase::payload, srv_.cfg().progress_timeout);
    if (req_.op == transfer_op::write) return receive_payload();
    if (req_.v2) {
      status_ = wire::encode_tcp_status(wire::tcp_status::ok);
      total_ = wire::kTcpStatusSize + req_.size;
    } else {
      total_ = req_.size;
    }
    send_payload();
  }

  void reject(wire::tcp_status st) {
    counters::add(srv_.count().requests_rejected);
    TIDE_LOG_DEBUG("tcp data port: " << peer_text() << " " << (req_.op == transfer_op::write ? "WRITE" : "READ")
                                     << " [" << req_.addr << ", +" << req_.size << ") refused: " << wire::to_string(st));
    if (!req_.v2) return close();
    status_ = wire::encode_tcp_status(st);
    asio::async_write(sock_, asio::buffer(status_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();
      self->linger();
    });
  }

  // After a refusal the connection ends, as Mooncake's server ends it, but
  // without a reset: closing with a refused WRITE's payload unread would
  // send one, and a reset can beat the status to the client.  So: no more
  // sending, the rest of the input read and dropped until the client closes
  // (bounded by request_timeout), then close.
  void linger() {
    error_code ignored;
    sock_.shutdown(asio_tcp::socket::shutdown_send, ignored);
    enter(phase::header, srv_.cfg().request_timeout);
    scratch_.resize(16384);
    drain_input();
  }
  void drain_input() {
    sock_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();
      self->drain_input();
    });
  }

  // A staging copy failed: the request cannot complete, and mid-stream the
  // connection can only close (the client's request fails over or retries).
  void stage_failed(const char* what) {
    TIDE_LOG_WARN("tcp data port: " << peer_text() << " [" << req_.addr << ", +" << req_.size << "): " << what);
    close();
  }

  // Staged WRITE: `fill` bytes of the chunk at done_ are in the bounce
  // buffer; a full chunk (or the last) is copied into the buffer's memory.
  void receive_staged(std::size_t fill) {
    std::byte* stage = stage_.get(*stager_);
    if (stage == nullptr) return stage_failed("no memory for a staging buffer");
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(stage_buffer::kBytes, req_.size - done_));
    sock_.async_read_some(asio::buffer(stage + fill, want - fill),
                          [self = shared_from_this(), fill, want, stage](const error_code& e, std::size_t k) {
                            if (self->phase_ == phase::closed) return;
                            if (e) return self->close();
                            self->last_progress_ns_ = now_ns();
                            if (fill + k < want) return self->receive_staged(fill + k);
                            if (self->stager_->from_host(self->req_.addr + self->done_, stage, want) != errc::ok)
                              return self->stage_failed("the staging copy into the buffer failed");
                            counters::add(self->srv_.count().bytes_staged, want);
                            self->done_ += want;
                            if (self->done_ < self->req_.size) return self->receive_staged(0);
                            self->write_served();
                          });
  }

  void write_served() {
    watermark_.reset(sock_);
    release();
    counters::add(srv_.count().bytes_served_in, req_.size);
    counters::add(srv_.count().requests_served);
    if (!req_.v2) return wait_header();
    status_ = wire::encode_tcp_status(wire::tcp_status::ok);
    asio::async_write(sock_, asio::buffer(status_), [self = shared_from_this()](const error_code& e2, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e2) return self->close();
      self->wait_header();
    });
  }

  // WRITE: the payload goes straight into the registered buffer.
  void receive_payload() {
    if (stager_ != nullptr) return receive_staged(0);
    if (done_ > 0) watermark_.expect(sock_, req_.size - done_);
    sock_.async_read_some(asio::buffer(reinterpret_cast<void*>(req_.addr + done_), req_.size - done_),
                          [self = shared_from_this()](const error_code& e, std::size_t k) {
                            if (self->phase_ == phase::closed) return;
                            if (e) return self->close();
                            self->last_progress_ns_ = now_ns();
                            self->done_ += k;
                            if (self->done_ < self->req_.size) return self->receive_payload();
                            self->write_served();
                          });
  }

  // READ: the status (version 2), then the payload straight from the buffer.
  void send_payload() {
    // Passed by value: the operation keeps its own copy of the sequence.
    std::array<asio::const_buffer, 2> bufs{};
    const std::size_t head = req_.v2 ? wire::kTcpStatusSize : 0;
    if (done_ < head) bufs[0] = asio::buffer(status_.data() + done_, head - done_);
    const std::uint64_t off = done_ > head ? done_ - head : 0;
    if (stager_ == nullptr) {
      bufs[1] = asio::buffer(reinterpret_cast<const void*>(req_.addr + off), req_.size - off);
    } else {
      std::size_t copied = 0;
      if (const errc c = stage_.next_out(*stager_, req_.addr, req_.size, off, bufs[1], copied); c != errc::ok)
        return stage_failed(c == errc::out_of_memory ? "no memory for a staging buffer"
                                                     : "the staging copy out of the buffer failed");
      counters::add(srv_.count().bytes_staged, copied);
    }
    sock_.async_write_some(bufs, [self = shared_from_this()](const error_code& e, std::size_t k) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->close();
      self->last_progress_ns_ = now_ns();
      self->done_ += k;
      if (self->done_ < self->total_) return self->send_payload();
      self->release();
      counters::add(self->srv_.count().bytes_served_out, self->req_.size);
      counters::add(self->srv_.count().requests_served);
      self->wait_header();
    });
  }

  void release() noexcept {
    if (handle_ != nullptr) {
      srv_.memory().close_range(handle_);
      handle_ = nullptr;
    }
  }

  // The socket closes first (no system call touches the buffer afterwards),
  // then the buffer is released.
  void close() noexcept {
    if (phase_ == phase::closed) return;
    phase_ = phase::closed;
    error_code ignored;
    sock_.close(ignored);
    timer_.cancel();
    release();
  }

  [[nodiscard]] std::string peer_text() const {
    error_code ec;
    const auto ep = sock_.remote_endpoint(ec);
    std::string who = ec ? source_ : wire::format_peer_address(ep.address().to_string(), ep.port());
    return identity_.empty() ? who : who + " (" + identity_ + ")";
  }

  server& srv_;
  asio_tcp::socket sock_;
  asio::steady_timer timer_;
  const std::string source_;
  phase phase_ = phase::idle;
  std::uint64_t timer_gen_ = 0;
  std::int64_t armed_ns_ = 0;  ///< the deadline the timer waits for; 0: not armed
  std::int64_t last_progress_ns_ = 0;
  std::chrono::milliseconds limit_{0};
  wire::tcp_header_bytes header_{};
  wire::tcp_header req_{};
  wire::tcp_status_bytes status_{};
  void* handle_ = nullptr;
  std::uint64_t done_ = 0, total_ = 0;
  // Staging (a buffer whose memory the socket cannot touch): the request's
  // copy engine and its bounce buffer.
  const memory::copy_engine* stager_ = nullptr;
  stage_buffer stage_;
  receive_watermark watermark_;  // WRITE payloads
  std::vector<std::uint8_t> scratch_;
  wire::auth_nonce server_nonce_{}, client_nonce_{};
  std::string identity_;
};

server::server(const config& cfg, io_pool& io, counters& c, local_memory& mem)
    : cfg_(cfg), io_(io), counters_(c), mem_(mem), acceptor_(io.at(0)) {}

namespace {
error_code try_bind(asio_tcp::acceptor& acc, const asio_tcp::endpoint& ep) {
  error_code ec;
  if (acc.is_open()) acc.close(ec);
  acc.open(ep.protocol(), ec);
  if (ec) return ec;
  acc.set_option(asio_tcp::acceptor::reuse_address(true), ec);
  if (ec) return ec;
  acc.bind(ep, ec);
  if (ec) return ec;
  acc.listen(asio::socket_base::max_listen_connections, ec);
  return ec;
}
}  // namespace

result<std::uint16_t> server::bind() {
  error_code ec;
  const auto addr = asio::ip::make_address(cfg_.bind_host, ec);
  if (ec) return fail(errc::config_invalid, "tcp data port: bind host \"" + cfg_.bind_host + "\" is not an IP address");
  asio_tcp::endpoint ep{addr, cfg_.port};
  if (cfg_.port != 0) {
    ec = try_bind(acceptor_, ep);
  } else {
    if (cfg_.port_range_min == 0 || cfg_.port_range_min > cfg_.port_range_max)
      return fail(errc::config_invalid, "tcp data port range [" + std::to_string(cfg_.port_range_min) + ", " +
                                            std::to_string(cfg_.port_range_max) + "] is empty");
    std::vector<std::uint16_t> ports(static_cast<std::size_t>(cfg_.port_range_max - cfg_.port_range_min) + 1);
    std::iota(ports.begin(), ports.end(), cfg_.port_range_min);
    std::shuffle(ports.begin(), ports.end(), std::mt19937{std::random_device{}()});
    ec = asio::error::address_in_use;
    for (const auto port : ports) {
      ep.port(port);
      ec = try_bind(acceptor_, ep);
      if (ec != asio::error::address_in_use) break;
    }
  }
  if (ec == asio::error::address_in_use)
    return fail(errc::already_exists, cfg_.port != 0 ? "tcp data port " + std::to_string(cfg_.port) + " is in use"
                                                     : "no free tcp data port in [" + std::to_string(cfg_.port_range_min) +
                                                           ", " + std::to_string(cfg_.port_range_max) + "]");
  if (ec) return fail(errc::handshake_failed, "tcp data port: cannot listen on " + cfg_.bind_host + ": " + ec.message());
  return acceptor_.local_endpoint().port();
}

void server::start() {
  asio::post(acceptor_.get_executor(), [this] { accept_next(); });
}

bool server::admit(const std::string& key) {
  std::lock_guard lock(mu_);
  if (stopped_) return false;
  if (open_ >= cfg_.max_connections) {
    counters::add(counters_.refused_full);
    return false;
  }
  std::size_t& n = sources_[key];
  if (n >= cfg_.max_connections_per_source) {
    counters::add(counters_.refused_source);
    return false;
  }
  ++n;
  ++open_;
  counters_.open_connections.store(open_, std::memory_order_relaxed);
  return true;
}

void server::release_source(const std::string& key) noexcept {
  std::lock_guard lock(mu_);
  if (auto it = sources_.find(key); it != sources_.end() && --it->second == 0) sources_.erase(it);
  --open_;
  counters_.open_connections.store(open_, std::memory_order_relaxed);
}

void server::accept_next() {
  acceptor_.async_accept(io_.next(), [this](const error_code& e, asio_tcp::socket sock) {
    if (e == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!e) {
      counters::add(counters_.accepted);
      error_code ec;
      const auto ep = sock.remote_endpoint(ec);
      const std::string key = ec ? std::string("?") : source_key(ep);
      if (!admit(key)) {
        // Closed on accept: the client reads an end of stream before any status.
        TIDE_LOG_DEBUG("tcp data port: connection from " << key << " refused (connection limits)");
        sock.close(ec);
      } else {
        std::shared_ptr<session> s;
        try {
          s = std::make_shared<session>(*this, std::move(sock), key);  // owns the source count from here
        } catch (...) {
          release_source(key);
        }
        if (s) {
          try {
            std::lock_guard lock(mu_);
            if (sessions_.size() >= 2 * open_ + 64)
              std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
            sessions_.push_back(s);
          } catch (...) {  // not listed: shutdown() will not reach it, so it does not run
            s.reset();
          }
          if (s) asio::post(s->executor(), [s] { s->start(); });
        }
      }
    } else {
      TIDE_LOG_WARN("tcp data port: accept failed: " << e.message());
    }
    accept_next();
  });
}

void server::shutdown() noexcept {
  std::vector<std::weak_ptr<session>> all;
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    all.swap(sessions_);
  }
  asio::post(acceptor_.get_executor(), [this] {
    error_code ignored;
    acceptor_.close(ignored);
  });
  for (auto& w : all)
    if (auto s = w.lock()) s->close_later();
}

}  // namespace tide::tcp::detail
