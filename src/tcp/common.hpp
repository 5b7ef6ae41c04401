#pragma once
// What the TCP transport's client and server share (not API): the I/O
// threads, the counters, and the few Asio helpers both use.

#include <tide/memory/memory_kind.hpp>
#include <tide/tcp/tcp_transport.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>
#include <vector>

namespace tide::tcp::detail {

namespace asio = boost::asio;
using asio_tcp = asio::ip::tcp;
using boost::system::error_code;

/// The I/O threads: one io_context each, so a connection (bound to one
/// context) is only ever touched by one thread.  Owned by the transport;
/// start() once, stop() once after every socket is closed.
class io_pool {
 public:
  explicit io_pool(unsigned n) {
    for (unsigned i = 0; i < n; ++i) contexts_.push_back(std::make_unique<asio::io_context>(1));
  }
  void start() {
    for (auto& c : contexts_) {
      guards_.emplace_back(c->get_executor());
      threads_.emplace_back([ctx = c.get()] {
        for (;;) {
          try {
            ctx->run();
            return;
          } catch (...) {  // a handler threw: keep the thread (handlers are noexcept in intent)
          }
        }
      });
    }
  }
  /// Lets each context run out of work (the aborted operations of closed
  /// sockets finish first) and joins the threads.
  void stop() noexcept {
    guards_.clear();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }
  [[nodiscard]] asio::io_context& next() noexcept {
    return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()];
  }
  [[nodiscard]] asio::io_context& at(std::size_t i) noexcept { return *contexts_[i % contexts_.size()]; }

 private:
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  std::vector<std::thread> threads_;
  std::atomic<std::size_t> next_{0};
};

/// The counters behind tcp::stats (relaxed: independent monotonic counts).
struct counters {
  std::atomic<std::uint64_t> ops_ok{0}, ops_failed{0}, bytes_written{0}, bytes_read{0};
  std::atomic<std::uint64_t> connections_opened{0}, connect_failures{0}, connections_lost{0};
  std::atomic<std::uint64_t> accepted{0}, refused_source{0}, refused_full{0}, requests_served{0},
      requests_rejected{0}, auth_failed{0}, dropped{0}, bytes_served_in{0}, bytes_served_out{0}, open_connections{0};
  std::atomic<std::uint64_t> bytes_staged{0};
  static void add(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept { c.fetch_add(n, std::memory_order_relaxed); }
};

/// The socket's receive low-water mark (SO_RCVLOWAT) while a large payload
/// comes in.  A reader woken for every few segments that arrive pays a
/// wake-up, an epoll_wait and a recv each time, and on loopback the sender's
/// core pays for the wake-ups too; told to wait for the rest of the payload
/// (up to kMax), the reader wakes about once per payload.  The mark never
/// exceeds the bytes still due, or a reader could wait for bytes the peer
/// will never send; between payloads it is 1 again, so a header or status
/// is read at once.  The kernel caps it (tcp_rmem[2] / 2) and lets a reader
/// in early when the receive buffer fills.  One I/O thread's, beside its socket.
class receive_watermark {
 public:
  static constexpr std::uint64_t kMin = std::uint64_t{64} << 10;  ///< below this: no mark
  static constexpr std::uint64_t kMax = std::uint64_t{4} << 20;
  /// Before a read with `remaining` payload bytes still due.  The first read
  /// of a payload goes without (a small one is usually all there).
  void expect(asio_tcp::socket& s, std::uint64_t remaining) noexcept {
    set(s, remaining >= kMin ? static_cast<int>(std::min(remaining, kMax)) : 1);
  }
  /// The payload is in: the next read takes whatever comes.
  void reset(asio_tcp::socket& s) noexcept { set(s, 1); }

 private:
  void set(asio_tcp::socket& s, int v) noexcept {
    if (v == mark_) return;
    error_code ec;
    s.set_option(asio::socket_base::receive_low_watermark(v), ec);
    if (!ec) mark_ = v;  // refused (a closed socket): nothing more is read from it
  }
  int mark_ = 1;
};

/// A bounce buffer for payloads a copy engine stages (GPU memory, or host
/// memory with the staging switch): one per direction of a connection,
/// allocated on the first staged request, page-locked by the first engine
/// that pins (CUDA: copies then run at the DMA engine's speed), unpinned
/// when it goes.  One I/O thread's.
class stage_buffer {
 public:
  static constexpr std::size_t kBytes = std::size_t{1} << 20;
  stage_buffer() = default;
  stage_buffer(const stage_buffer&) = delete;
  stage_buffer& operator=(const stage_buffer&) = delete;
  ~stage_buffer() {
    if (pinned_by_ != nullptr) pinned_by_->unpin(data_.get());
  }
  /// Sending a staged payload [src, src + total): the bytes to send from
  /// payload offset `off`, copied out of `src`'s memory one chunk at a time
  /// (the next once the last is sent).  `copied`: the bytes this call
  /// copied (0 while the chunk lasts).  Errors: out_of_memory (no buffer),
  /// the engine's copy error.  restart() before each payload.
  [[nodiscard]] errc next_out(const memory::copy_engine& e, std::uint64_t src, std::uint64_t total,
                              std::uint64_t off, asio::const_buffer& out, std::size_t& copied) noexcept {
    copied = 0;
    std::byte* stage = get(e);
    if (stage == nullptr) return errc::out_of_memory;
    if (off == end_) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kBytes, total - off));
      if (const errc c = e.to_host(stage, src + off, n); c != errc::ok) return c;
      begin_ = off;
      end_ = off + n;
      copied = n;
    }
    out = asio::buffer(stage + (off - begin_), end_ - off);
    return errc::ok;
  }
  void restart() noexcept { begin_ = end_ = 0; }

  /// The buffer, ready for `e`'s copies; null when it cannot be allocated.
  [[nodiscard]] std::byte* get(const memory::copy_engine& e) noexcept {
    if (!data_) {
      data_.reset(new (std::nothrow) std::byte[kBytes]);
      if (!data_) return nullptr;
    }
    if (pinned_by_ == nullptr && tried_ != &e) {
      tried_ = &e;
      if (e.pin(data_.get(), kBytes)) pinned_by_ = &e;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  const memory::copy_engine* pinned_by_ = nullptr;
  const memory::copy_engine* tried_ = nullptr;  ///< the last engine asked to pin (once each)
  std::uint64_t begin_ = 0, end_ = 0;           ///< next_out: the payload range now in the buffer
};

[[nodiscard]] inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace tide::tcp::detail
