#pragma once
// Test support: child processes (etcd, tide-metadata-server), free loopback
// ports, temporary directories and raw TCP clients.  Every wait is bounded.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <thread>
#include <vector>

namespace tide::test {

/// A process started with fork/exec; stdout and stderr go to `log_path`.
/// The destructor kills it (SIGKILL) and reaps it.
class child_process {
 public:
  child_process() = default;
  child_process(std::vector<std::string> argv, std::string log_path);
  child_process(child_process&& o) noexcept;
  child_process& operator=(child_process&& o) noexcept;
  ~child_process();

  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] const std::string& log_path() const noexcept { return log_; }
  /// Sends `sig` (SIGSTOP / SIGCONT / SIGTERM ...) without waiting.
  void signal(int sig) const noexcept;
  /// SIGKILL and reap.
  void kill() noexcept;
  /// SIGTERM, wait up to `grace`, then SIGKILL; reaps.  Returns the exit status
  /// (or -1 when it had to be killed).
  int terminate(std::chrono::milliseconds grace = std::chrono::seconds(3)) noexcept;
  /// Waits up to `timeout` for it to exit; returns its exit status (128 +
  /// signal when killed by one), or -1 after killing it at the deadline.
  int wait_exit(std::chrono::milliseconds timeout) noexcept;
  /// Waits until the log contains `needle`; returns that line.
  [[nodiscard]] std::optional<std::string> wait_for_log(const std::string& needle,
                                                        std::chrono::milliseconds timeout) const;

 private:
  pid_t pid_ = -1;
  std::string log_;
};

/// A directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class temp_dir {
 public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

/// `n` distinct TCP ports on 127.0.0.1 that were free a moment ago.
[[nodiscard]] std::vector<std::uint16_t> free_loopback_ports(std::size_t n);

/// A blocking TCP client socket for feeding bad input to servers.
class raw_client {
 public:
  /// Connects to 127.0.0.1:port (REQUIREs success), from `source` when given
  /// (any 127.x.y.z: the whole 127/8 is loopback).
  explicit raw_client(std::uint16_t port, const char* source = nullptr);
  ~raw_client();
  raw_client(const raw_client&) = delete;
  raw_client& operator=(const raw_client&) = delete;
  /// Sends all of `bytes`; false when the peer has closed.
  bool send(const std::string& bytes);
  void shutdown_write();
  /// Reads until EOF or `timeout`; returns what arrived and whether EOF was seen.
  struct read_result {
    std::string data;
    bool eof = false;
    bool reset = false;
  };
  read_result read_until_eof(std::chrono::milliseconds timeout);
  [[nodiscard]] int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

/// A listening socket on 127.0.0.1 that never accepts: connects succeed (the
/// kernel's backlog) and nothing is ever answered.
class silent_listener {
 public:
  silent_listener();
  ~silent_listener();
  silent_listener(const silent_listener&) = delete;
  silent_listener& operator=(const silent_listener&) = delete;
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  [[nodiscard]] int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// A one-connection server with a script: accept, read one frame (8-byte
/// little-endian length + that many bytes), write `reply`, close.  For
/// testing the client against replies tide's server would never send.
class scripted_server {
 public:
  explicit scripted_server(std::string reply);
  ~scripted_server();
  scripted_server(const scripted_server&) = delete;
  scripted_server& operator=(const scripted_server&) = delete;
  [[nodiscard]] std::uint16_t port() const noexcept { return listener_.port(); }

 private:
  silent_listener listener_;
  std::thread thread_;
};

/// A relay in front of a handshake port (frames: 8-byte little-endian
/// length + payload): each frame a client sends goes on to 127.0.0.1:
/// `upstream` and the reply comes back, unless `answer(payload)` returns
/// bytes to send in its place.  For testing a client against a real peer
/// that rejects some requests.  Serves one connection at a time; `answer`
/// runs on the relay's thread.
class frame_relay {
 public:
  using answer_fn = std::function<std::optional<std::string>(std::string_view payload)>;
  frame_relay(std::uint16_t upstream, answer_fn answer);
  ~frame_relay();
  frame_relay(const frame_relay&) = delete;
  frame_relay& operator=(const frame_relay&) = delete;
  [[nodiscard]] std::uint16_t port() const noexcept { return listener_.port(); }

 private:
  void serve(int client);

  silent_listener listener_;
  std::uint16_t upstream_;
  answer_fn answer_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Resident set size of this process in bytes (from /proc/self/statm).
[[nodiscard]] std::size_t resident_bytes();

/// Runs `argv` to completion (output to `log_path`), bounded by `timeout`
/// (then SIGKILL); returns the exit status, or -1 when it was killed.
int run_to_completion(std::vector<std::string> argv, const std::string& log_path,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// Resident set size of process `pid` in bytes (from /proc/<pid>/statm); 0
/// when it cannot be read.
[[nodiscard]] std::size_t resident_bytes(pid_t pid);

/// Waits until every thread of `pid` is stopped (state T, after SIGSTOP):
/// kill() returns before the stop takes effect.  False after `timeout`.
[[nodiscard]] bool wait_stopped(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Milliseconds since `start`.
[[nodiscard]] inline long long elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tide::test
