#pragma once
// Private to src/net: the handshake server's shared state, which its I/O
// thread (handshake_server.cpp: accept, stop) and each connection's state
// machine (handshake_connection.cpp) touch.  Only the I/O thread touches
// sockets, timers and the connection list; the counters are atomic and
// `sources` is locked.

#include <tide/net/handshake_server.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace tide::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class server_connection;

inline constexpr std::string_view kProbeReply = "{\"status\":\"success\"}\n";
inline constexpr std::string_view kNullReply = "null\n";

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
  std::vector<std::weak_ptr<server_connection>> conns;
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

/// A connection admitted by accept_next (counted in srv.active,
/// srv.unauthenticated and srv.sources[source]), started: it reads its
/// first frame.  I/O thread.
std::shared_ptr<server_connection> start_connection(handshake_server::impl& srv, tcp::socket sock, std::string source,
                                                    std::string peer);
/// Closes it without a word (stop()).  I/O thread.
void abort_connection(server_connection& c);

}  // namespace tide::net
