#pragma once
// The TCP transport's server (not API): the data port, serving peers'
// requests against local_memory (see tcp_transport.hpp).

#include "common.hpp"

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tide::tcp::detail {

class session;

class server {
 public:
  server(const config& cfg, io_pool& io, counters& c, local_memory& mem);
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds and listens (the caller's thread).  Errors: config_invalid,
  /// already_exists (no free port), handshake_failed (listen failed).
  [[nodiscard]] result<std::uint16_t> bind();
  /// Starts accepting (on I/O thread 0).
  void start();
  /// Closes the acceptor and every session, each on its own thread; their
  /// buffers are released as the I/O threads run out.  Once.
  void shutdown() noexcept;

  [[nodiscard]] const config& cfg() const noexcept { return cfg_; }
  [[nodiscard]] counters& count() noexcept { return counters_; }
  [[nodiscard]] local_memory& memory() noexcept { return mem_; }
  /// A session ends: its source's count goes down.  Any I/O thread.
  void release_source(const std::string& key) noexcept;

 private:
  void accept_next();
  [[nodiscard]] bool admit(const std::string& key);

  const config& cfg_;
  io_pool& io_;
  counters& counters_;
  local_memory& mem_;
  asio_tcp::acceptor acceptor_;
  std::mutex mu_;
  bool stopped_ = false;                                   // under mu_
  std::size_t open_ = 0;                                   // under mu_
  std::unordered_map<std::string, std::size_t> sources_;  // under mu_
  std::vector<std::weak_ptr<session>> sessions_;           // under mu_ (pruned as it grows)
};

}  // namespace tide::tcp::detail
