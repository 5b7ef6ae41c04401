// The TCP transport's client: connections that pipeline requests to one
// peer's data port.
//
// Ownership: a peer_pool owns its connections (shared_ptr; every pending
// handler holds one too).  A connection's socket, timer, queues and flags
// are touched only by its I/O thread, except `in_` / `closed_` under `mu_`
// (any submitting thread appends there) and `queued_` (an atomic load
// estimate read by the pool).

#include "client.hpp"

#include <tide/detail/log.hpp>
#include <tide/wire/auth.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

namespace tide::tcp::detail {

class connection;

namespace {

constexpr std::chrono::milliseconds kWatchdogPeriod{50};
constexpr std::uint8_t kMaxRequeues = 3;

// An intrusive FIFO of ops through op::next_.
struct op_fifo {
  op* head = nullptr;
  op* tail = nullptr;
  std::size_t size = 0;
  [[nodiscard]] bool empty() const noexcept { return head == nullptr; }
  void push(op* o) noexcept {
    o->next_ = nullptr;
    if (tail == nullptr) head = o;
    else tail->next_ = o;
    tail = o;
    ++size;
  }
  op* pop() noexcept {
    op* o = head;
    if (o == nullptr) return nullptr;
    head = o->next_;
    if (head == nullptr) tail = nullptr;
    o->next_ = nullptr;
    --size;
    return o;
  }
  void append(op_fifo& other) noexcept {
    while (op* o = other.pop()) push(o);
  }
};

}  // namespace

class peer_pool {
 public:
  peer_pool(client& c, peer p) : client_(c), peer_(std::move(p)), v1_(peer_.version < 2 || c.cfg().force_v1) {}
  /// Any thread; takes mu_ (and then one connection's).
  void submit(op& o) noexcept;
  void close_all(errc e);

 private:
  client& client_;
  const peer peer_;
  const bool v1_;
  std::mutex mu_;
  bool closed_ = false;  // under mu_: the client stops
  std::vector<std::shared_ptr<connection>> conns_;
};

class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(client& c, peer_pool& pool, asio::io_context& io, const peer& p, bool v1)
      : client_(c), pool_(pool), io_(io), peer_(p), v1_(v1), sock_(io), resolver_(io), timer_(io) {}

  /// Any thread.  False once the connection is closed (the pool picks another).
  bool enqueue(op& o) noexcept {
    bool kick = false;
    {
      std::lock_guard lock(mu_);
      if (closed_) return false;
      in_.push(&o);
      kick = !kick_posted_;
      kick_posted_ = true;
    }
    queued_.fetch_add(o.length + 1, std::memory_order_relaxed);
    if (kick) asio::post(io_, [self = shared_from_this()] { self->on_kick(); });
    return true;
  }
  [[nodiscard]] std::uint64_t queued() const noexcept { return queued_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool closed() const noexcept {
    std::lock_guard lock(mu_);
    return closed_;
  }
  /// Any thread: closes it on its I/O thread; its ops end with `e`.
  void close_later(errc e) {
    asio::post(io_, [self = shared_from_this(), e] { self->fail_all(e, "the transport stops"); });
  }

 private:
  enum class phase : std::uint8_t { idle, connecting, authenticating, ready, closed };

  // ---------------------------------------------------------------- connect
  void connect() {
    if (phase_ == phase::closed) return;
    phase_ = phase::connecting;
    phase_since_ns_ = now_ns();
    arm_watchdog();
    error_code ec;
    const auto addr = asio::ip::make_address(peer_.host, ec);
    if (!ec) {
      on_resolved({asio_tcp::endpoint{addr, peer_.port}});
      return;
    }
    resolver_.async_resolve(peer_.host, std::to_string(peer_.port),
                            [self = shared_from_this()](const error_code& e, asio_tcp::resolver::results_type r) {
                              if (self->phase_ == phase::closed) return;
                              if (e) return self->fail_all(errc::peer_unreachable, "cannot resolve " + self->peer_.host + ": " + e.message());
                              std::vector<asio_tcp::endpoint> eps;
                              for (const auto& x : r) eps.push_back(x.endpoint());
                              self->on_resolved(std::move(eps));
                            });
  }

  void on_resolved(std::vector<asio_tcp::endpoint> eps) {
    asio::async_connect(sock_, eps, [self = shared_from_this()](const error_code& e, const asio_tcp::endpoint&) {
      if (self->phase_ == phase::closed) return;
      if (e) {
        self->client_.count().connect_failures.fetch_add(1, std::memory_order_relaxed);
        return self->fail_all(errc::peer_unreachable, "connect to " + self->where() + ": " + e.message());
      }
      error_code ignored;
      self->sock_.set_option(asio_tcp::no_delay(true), ignored);
      counters::add(self->client_.count().connections_opened);
      if (self->client_.cfg().secret) return self->auth_hello();
      self->on_ready();
    });
  }

  // ---------------------------------------------------------------- authentication (wire/tcp_data.hpp)
  void auth_hello() {
    phase_ = phase::authenticating;
    auto nonce = wire::fresh_nonce();
    if (!nonce) return fail_all(errc::auth_failed, "no random nonce: " + nonce.error().message());
    client_nonce_ = *nonce;
    asio::async_write(sock_, asio::buffer(wire::kTcpAuthHello.data(), wire::kTcpAuthHello.size()),
                      [self = shared_from_this()](const error_code& e, std::size_t) {
                        if (self->phase_ == phase::closed) return;
                        if (e) return self->fail_all(errc::connection_lost, "auth hello: " + e.message());
                        self->auth_read_challenge();
                      });
  }

  void auth_read_challenge() {
    scratch_.resize(wire::kTcpStatusSize + wire::kAuthNonceBytes);
    asio::async_read(sock_, asio::buffer(scratch_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->fail_all(errc::auth_failed, "no challenge from " + self->where() + " (" + e.message() +
                                                          "): does the peer have the cluster secret?");
      const auto code = wire::decode_tcp_status(std::span<const std::uint8_t, 8>(self->scratch_.data(), 8));
      if (!code || *code != 0) return self->fail_all(errc::auth_failed, self->where() + " refused the authentication");
      std::memcpy(self->server_nonce_.data(), self->scratch_.data() + 8, wire::kAuthNonceBytes);
      self->auth_request();
    });
  }

  void auth_request() {
    const auto& secret = *client_.cfg().secret;
    const std::string& id = client_.cfg().identity;
    const auto mac = wire::auth_mac(secret, wire::auth_direction::request, wire::kTcpDataAuthType, server_nonce_,
                                    client_nonce_, id, wire::kTcpDataAuthBody);
    scratch_.assign(client_nonce_.begin(), client_nonce_.end());
    scratch_.push_back(static_cast<std::uint8_t>(id.size() & 0xff));
    scratch_.push_back(static_cast<std::uint8_t>(id.size() >> 8));
    scratch_.insert(scratch_.end(), id.begin(), id.end());
    scratch_.insert(scratch_.end(), mac.begin(), mac.end());
    asio::async_write(sock_, asio::buffer(scratch_), [self = shared_from_this()](const error_code& e, std::size_t) {
      if (self->phase_ == phase::closed) return;
      if (e) return self->fail_all(errc::connection_lost, "auth request: " + e.message());
      self->scratch_.resize(wire::kTcpStatusSize + wire::kMacBytes);
      asio::async_read(self->sock_, asio::buffer(self->scratch_), [self](const error_code& e2, std::size_t) {
        if (self->phase_ == phase::closed) return;
        if (e2) return self->fail_all(errc::auth_failed, self->where() + " closed the authentication: " + e2.message());
        self->auth_check_reply();
      });
    });
  }

  void auth_check_reply() {
    const auto code = wire::decode_tcp_status(std::span<const std::uint8_t, 8>(scratch_.data(), 8));
    if (!code || *code != 0) return fail_all(errc::auth_failed, where() + " refused our proof of the cluster secret");
    wire::auth_message m;
    std::memcpy(m.mac.data(), scratch_.data() + 8, wire::kMacBytes);
    m.body = std::string(wire::kTcpDataAuthBody);
    if (!wire::verify_auth_mac(*client_.cfg().secret, wire::auth_direction::reply, wire::kTcpDataAuthType,
                               server_nonce_, client_nonce_, client_.cfg().identity, m))
      return fail_all(errc::auth_failed, where() + " did not prove the cluster secret");
    on_ready();
  }

  // ---------------------------------------------------------------- the pipeline
  void on_ready() {
    phase_ = phase::ready;
    phase_since_ns_ = now_ns();
    last_progress_ns_ = phase_since_ns_;
    pump_send();
    arm_watchdog();
  }

  void on_kick() {
    {
      std::lock_guard lock(mu_);
      kick_posted_ = false;
      pending_.append(in_);
    }
    if (phase_ == phase::idle) return connect();
    if (phase_ == phase::ready) pump_send();
    arm_watchdog();
  }

  [[nodiscard]] std::uint32_t window() const noexcept { return v1_ ? 1 : client_.cfg().max_ops_per_conn; }

  void pump_send() {
    if (phase_ != phase::ready || sending_ != nullptr || send_broken_) return;
    while (op* o = pending_.head) {
      if (const errc why = o->stop_reason(); why != errc::ok) {
        pending_.pop();
        complete(o, why);
        continue;
      }
      if (inflight_.size >= window()) return;
      pending_.pop();
      inflight_.push(o);
      start_send(o);
      return;
    }
  }

  void start_send(op* o) {
    sending_ = o;
    sent_ = 0;
    send_stage_.restart();
    header_ = wire::encode_tcp_header({o->length, o->remote_addr, o->kind, !v1_});
    send_total_ = wire::kTcpHeaderSize + (o->kind == transfer_op::write ? o->length : 0);
    send_some();
    pump_receive();
  }

  // A loop of write_some calls rather than one async_write: the watchdog
  // sees each step's progress on a long payload.
  void send_some() {
    op* o = sending_;
    // Passed by value: the operation keeps its own copy of the sequence.
    std::array<asio::const_buffer, 2> bufs{};
    if (sent_ < wire::kTcpHeaderSize) bufs[0] = asio::buffer(header_.data() + sent_, wire::kTcpHeaderSize - sent_);
    if (o->kind == transfer_op::write) {
      const std::uint64_t off = sent_ > wire::kTcpHeaderSize ? sent_ - wire::kTcpHeaderSize : 0;
      if (o->stager == nullptr) {
        bufs[1] = asio::buffer(reinterpret_cast<const void*>(o->local_addr + off), o->length - off);
      } else {
        std::size_t copied = 0;
        if (const errc c = send_stage_.next_out(*o->stager, o->local_addr, o->length, off, bufs[1], copied);
            c != errc::ok)
          return stage_failed(o, c,
                              c == errc::out_of_memory
                                  ? std::string("no memory for a staging buffer")
                                  : "the staging copy out of " + std::string(o->stager->name()) + " memory failed");
        counters::add(client_.count().bytes_staged, copied);
      }
    }
    sock_.async_write_some(bufs, [self = shared_from_this()](const error_code& e, std::size_t k) { self->on_sent(e, k); });
  }

  void on_sent(const error_code& e, std::size_t k) {
    if (phase_ == phase::closed) return;
    if (e) {
      // The server may have refused a request and closed: its status can
      // still be read.  The receive side ends the connection when it meets
      // the end of the stream.
      sending_ = nullptr;
      send_broken_ = true;
      if (receiving_) return;
      return fail_all(errc::connection_lost, "send to " + where() + ": " + e.message());
    }
    last_progress_ns_ = now_ns();
    sent_ += k;
    if (sent_ < send_total_) return send_some();
    op* o = sending_;
    sending_ = nullptr;
    if (o->kind == transfer_op::write) counters::add(client_.count().bytes_written, o->length);
    // A version-1 WRITE has no status: done once its last byte left.
    if (v1_ && o->kind == transfer_op::write) {
      inflight_.pop();
      complete(o, errc::ok);
      return reconnect_v1();
    }
    pump_send();
  }

  void pump_receive() {
    if (phase_ != phase::ready || receiving_ || inflight_.empty()) return;
    op* head = inflight_.head;
    if (v1_) {
      if (head->kind == transfer_op::read) {
        receiving_ = true;
        read_payload(head, 0);
      }
      return;
    }
    receiving_ = true;
    asio::async_read(sock_, asio::buffer(status_), [self = shared_from_this()](const error_code& e, std::size_t) {
      self->on_status(e);
    });
  }

  void on_status(const error_code& e) {
    if (phase_ == phase::closed) return;
    if (e) return fail_all(errc::connection_lost, "status from " + where() + ": " + e.message());
    last_progress_ns_ = now_ns();
    const auto code = wire::decode_tcp_status(std::span<const std::uint8_t, 8>(status_.data(), 8));
    op* head = inflight_.head;
    if (!code) return fail_all(errc::protocol_error, where() + " sent no status frame (is it a version-1 peer?)");
    if (*code != 0) {
      inflight_.pop();
      const errc why = wire::tcp_status_errc(*code);
      TIDE_LOG_DEBUG("tcp: " << where() << " refused " << (head->kind == transfer_op::write ? "WRITE" : "READ")
                             << " [" << head->remote_addr << ", +" << head->length << "): "
                             << wire::to_string(static_cast<wire::tcp_status>(*code)));
      complete(head, why);
      // The server closes after a refusal (as Mooncake's does).
      return fail_all(errc::connection_lost, where() + " closed after refusing a request");
    }
    if (head->kind == transfer_op::read) return read_payload(head, 0);
    inflight_.pop();
    complete(head, errc::ok);
    received_one();
  }

  // The head's response is in: the next one, or, once a send has failed and
  // every request sent has its answer, the end of the connection.
  void received_one() {
    receiving_ = false;
    if (v1_) return reconnect_v1();
    if (send_broken_ && inflight_.empty())
      return fail_all(errc::connection_lost, "send to " + where() + " failed");
    pump_receive();
    pump_send();
  }

  // A staging copy (or its buffer) failed for `o`: it ends with `e`, and
  // the connection, mid-stream, closes; its other requests go elsewhere.
  void stage_failed(op* o, errc e, const std::string& why) {
    copy_failed_op_ = o;
    copy_failed_errc_ = e;
    fail_all(errc::connection_lost, why);
  }

  // Staged READ: `off` bytes are in the destination, `fill` more in the
  // bounce buffer; a full chunk (or the last) is copied in before the next.
  void read_staged(op* o, std::uint64_t off, std::size_t fill) {
    std::byte* stage = recv_stage_.get(*o->stager);
    if (stage == nullptr) return stage_failed(o, errc::out_of_memory, "no memory for a staging buffer");
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(stage_buffer::kBytes, o->length - off));
    sock_.async_read_some(asio::buffer(stage + fill, want - fill),
                          [self = shared_from_this(), o, off, fill, want, stage](const error_code& e, std::size_t k) {
                            if (self->phase_ == phase::closed) return;
                            if (e) return self->fail_all(errc::connection_lost, "READ from " + self->where() + ": " + e.message());
                            self->last_progress_ns_ = now_ns();
                            if (fill + k < want) return self->read_staged(o, off, fill + k);
                            if (const errc c = o->stager->from_host(o->local_addr + off, stage, want); c != errc::ok)
                              return self->stage_failed(o, c, "the staging copy into " + std::string(o->stager->name()) +
                                                                  " memory failed");
                            counters::add(self->client_.count().bytes_staged, want);
                            if (off + want < o->length) return self->read_staged(o, off + want, 0);
                            self->read_done(o);
                          });
  }

  void read_done(op* o) {
    recv_mark_.reset(sock_);
    counters::add(client_.count().bytes_read, o->length);
    inflight_.pop();
    complete(o, errc::ok);
    received_one();
  }

  void read_payload(op* o, std::uint64_t off) {
    if (o->stager != nullptr) return read_staged(o, off, 0);
    if (off > 0) recv_mark_.expect(sock_, o->length - off);
    sock_.async_read_some(asio::buffer(reinterpret_cast<void*>(o->local_addr + off), o->length - off),
                          [self = shared_from_this(), o, off](const error_code& e, std::size_t k) {
                            if (self->phase_ == phase::closed) return;
                            if (e) return self->fail_all(errc::connection_lost, "READ from " + self->where() + ": " + e.message());
                            self->last_progress_ns_ = now_ns();
                            if (off + k < o->length) return self->read_payload(o, off + k);
                            self->read_done(o);
                          });
  }

  // Version 1: the server serves one request per connection.
  void reconnect_v1() {
    error_code ignored;
    sock_.close(ignored);
    receiving_ = false;
    send_broken_ = false;
    phase_ = phase::idle;
    if (!pending_.empty()) connect();
  }

  void complete(op* o, errc e) noexcept {
    queued_.fetch_sub(o->length + 1, std::memory_order_relaxed);
    counters::add(e == errc::ok ? client_.count().ops_ok : client_.count().ops_failed);
    o->done(e);
  }

  /// Closes the connection for good: every op it holds (queued, pending, in
  /// flight) ends with `e`.  The socket is closed first, on this thread, so
  /// no system call of an in-flight op runs after done().
  void fail_all(errc e, const std::string& why) {
    if (phase_ == phase::closed) return;
    const bool had_inflight = !inflight_.empty();
    phase_ = phase::closed;
    error_code ignored;
    sock_.close(ignored);
    resolver_.cancel();
    timer_.cancel();
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      pending_.append(in_);
    }
    if (had_inflight) {
      counters::add(client_.count().connections_lost);
      TIDE_LOG_DEBUG("tcp: " << why << "; " << inflight_.size << " request(s) in flight end with " << to_string(e));
    }
    sending_ = nullptr;
    receiving_ = false;
    while (op* o = inflight_.pop()) complete(o, o == copy_failed_op_ ? copy_failed_errc_ : e);
    copy_failed_op_ = nullptr;
    // Ops never sent go to another connection of the pool (a few times: a
    // peer that closes every connection at once must not spin us), unless
    // the peer cannot be reached or proved nothing, or we stop.
    const bool elsewhere = e == errc::connection_lost || e == errc::protocol_error;
    while (op* o = pending_.pop()) {
      if (elsewhere && o->requeued_ < kMaxRequeues) {
        ++o->requeued_;
        queued_.fetch_sub(o->length + 1, std::memory_order_relaxed);
        pool_.submit(*o);
      } else {
        complete(o, elsewhere ? errc::connection_lost : e);
      }
    }
  }

  // One timer: every kWatchdogPeriod while the connection has work or is
  // connecting, else once after client_idle_timeout.  Arming for work
  // replaces an idle wait (expires_after cancels it; its handler sees a
  // stale generation).
  void arm_watchdog() {
    if (phase_ == phase::closed) return;
    const bool busy = !pending_.empty() || !inflight_.empty() || phase_ == phase::connecting ||
                      phase_ == phase::authenticating;
    if (watchdog_armed_ && (watchdog_busy_ || !busy)) return;
    watchdog_armed_ = true;
    watchdog_busy_ = busy;
    const std::uint64_t gen = ++watchdog_gen_;
    timer_.expires_after(busy ? std::chrono::steady_clock::duration(kWatchdogPeriod)
                              : std::chrono::steady_clock::duration(client_.cfg().client_idle_timeout));
    timer_.async_wait([self = shared_from_this(), gen](const error_code& e) {
      if (gen != self->watchdog_gen_) return;
      self->watchdog_armed_ = false;
      if (e || self->phase_ == phase::closed) return;
      self->on_watchdog();
    });
  }

  void on_watchdog() {
    const std::int64_t now = now_ns();
    const auto& cfg = client_.cfg();
    auto ms = [](std::chrono::milliseconds d) { return static_cast<std::int64_t>(d.count()) * 1'000'000; };
    if ((phase_ == phase::connecting || phase_ == phase::authenticating) && now - phase_since_ns_ > ms(cfg.connect_timeout))
      return fail_all(phase_ == phase::connecting ? errc::peer_unreachable : errc::auth_failed,
                      (phase_ == phase::connecting ? "connect to " : "authentication with ") + where() +
                          " timed out after " + std::to_string(cfg.connect_timeout.count()) + " ms");
    // Stopped requests not sent yet leave now, whatever the window.
    op_fifo keep;
    while (op* o = pending_.pop()) {
      if (const errc why = o->stop_reason(); why != errc::ok) complete(o, why);
      else keep.push(o);
    }
    pending_ = keep;
    if (!inflight_.empty()) {
      const std::int64_t stalled = now - last_progress_ns_;
      if (stalled > ms(cfg.progress_timeout))
        return fail_all(errc::connection_lost, where() + " moved no byte for " + std::to_string(stalled / 1'000'000) + " ms");
      bool stopped = false;
      for (op* o = inflight_.head; o != nullptr && !stopped; o = o->next_) stopped = o->stop_reason() != errc::ok;
      if (stopped && stalled > transport::kStalledStopMs * 1'000'000LL)
        return fail_all(errc::connection_lost, "a canceled request to " + where() + " made no progress");
    }
    if (phase_ == phase::ready && pending_.empty() && inflight_.empty() &&
        now - last_progress_ns_ >= ms(cfg.client_idle_timeout))
      return fail_all(errc::connection_lost, "idle");  // nothing to fail: the pool opens another when needed
    arm_watchdog();
  }

  [[nodiscard]] std::string where() const { return peer_.host + ":" + std::to_string(peer_.port); }

  client& client_;
  peer_pool& pool_;
  asio::io_context& io_;
  const peer peer_;
  const bool v1_;
  asio_tcp::socket sock_;
  asio_tcp::resolver resolver_;
  asio::steady_timer timer_;
  // Staging (ops with a stager): a bounce buffer per direction, as a send
  // and a receive run at once.
  stage_buffer send_stage_;
  stage_buffer recv_stage_;
  receive_watermark recv_mark_;  // READ payloads
  op* copy_failed_op_ = nullptr;  ///< ends with copy_failed_errc_ in fail_all
  errc copy_failed_errc_ = errc::copy_failed;

  mutable std::mutex mu_;
  op_fifo in_;              // under mu_
  bool kick_posted_ = false;  // under mu_
  bool closed_ = false;     // under mu_
  std::atomic<std::uint64_t> queued_{0};

  // I/O thread only.
  phase phase_ = phase::idle;
  std::int64_t phase_since_ns_ = 0;
  std::int64_t last_progress_ns_ = 0;
  bool watchdog_armed_ = false;
  bool watchdog_busy_ = false;
  std::uint64_t watchdog_gen_ = 0;
  op_fifo pending_;
  op_fifo inflight_;
  op* sending_ = nullptr;
  bool send_broken_ = false;  // a send failed: nothing more goes out
  std::uint64_t sent_ = 0, send_total_ = 0;
  bool receiving_ = false;
  wire::tcp_header_bytes header_{};
  wire::tcp_status_bytes status_{};
  std::vector<std::uint8_t> scratch_;
  wire::auth_nonce client_nonce_{}, server_nonce_{};
};

void peer_pool::submit(op& o) noexcept {
  try {
    std::unique_lock lock(mu_);
    for (;;) {
      if (closed_) {
        lock.unlock();  // done() may come back here
        return o.done(errc::endpoint_closed);
      }
      std::erase_if(conns_, [](const auto& c) { return c->closed(); });
      std::shared_ptr<connection> pick;
      std::uint64_t least = std::numeric_limits<std::uint64_t>::max();
      for (const auto& c : conns_)
        if (const std::uint64_t q = c->queued(); q < least) {
          least = q;
          pick = c;
        }
      // A new connection while every one has work queued (and room).
      if (pick == nullptr || (least > 0 && conns_.size() < client_.cfg().conns_per_peer)) {
        pick = std::make_shared<connection>(client_, *this, client_.io().next(), peer_, v1_);
        conns_.push_back(pick);
      }
      // Under mu_, so close_all() either sees this op's connection or
      // this call sees closed_.
      if (pick->enqueue(o)) return;
    }
  } catch (...) {
    o.done(errc::out_of_memory);
  }
}

void peer_pool::close_all(errc e) {
  std::lock_guard lock(mu_);
  closed_ = true;
  for (auto& c : conns_) c->close_later(e);
  conns_.clear();
}


client::client(const config& cfg, io_pool& io, counters& c) : cfg_(cfg), io_(io), counters_(c) {}

client::~client() { shutdown(); }

peer_pool* client::pool_for(const peer& p) {
  std::string key = p.host + "|" + std::to_string(p.port) + "|" + std::to_string(p.version);
  {
    std::shared_lock lock(mu_);
    if (auto it = pools_.find(key); it != pools_.end()) return it->second.get();
  }
  std::unique_lock lock(mu_);
  auto& slot = pools_[key];
  if (!slot) slot = std::make_unique<peer_pool>(*this, p);
  return slot.get();
}

void client::submit(const peer& p, op& o) noexcept {
  if (stopping_.load(std::memory_order_acquire)) return o.done(errc::endpoint_closed);
  peer_pool* pool = nullptr;
  try {
    pool = pool_for(p);
  } catch (...) {
    return o.done(errc::out_of_memory);
  }
  pool->submit(o);
}

void client::shutdown() noexcept {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  std::unique_lock lock(mu_);
  for (auto& [key, pool] : pools_) pool->close_all(errc::endpoint_closed);
}

}  // namespace tide::tcp::detail
