#pragma once
// The peer process of the rxe suites that need a second process (engine_test.cpp, lanes_test.cpp):
// the test binary re-runs itself as `<binary> --peer <device> <port> <bytes>` (peer_main), and the
// test talks to it over pipes (peer_process).  Test code only.
//
// The protocol: the peer prints "SEGMENT <name> <base address>" once its memory is registered,
// then answers "CHECK off len seed" (is its memory at off the pattern of seed?) and
// "FILL off len seed" with OK or BAD, until "EXIT" or the end of its input.

#include "rxe_helpers.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace tide::test {

/// The peer's side: an engine on `device` (`port` 0: the default handshake port) with `bytes`
/// registered.  Returns the process's exit status.
inline int peer_main(const std::string& device, std::uint16_t port, std::size_t bytes) {
  auto c = config_for({device});
  if (port != 0) c.handshake_port = port;
  auto e = transfer_engine<>::create(c);
  if (!e) {
    std::printf("ERROR %s\n", e.error().message().c_str());
    return 1;
  }
  buffer mem(bytes);
  if (auto r = (*e)->register_memory(mem.data, bytes, "cpu:0"); !r) {
    std::printf("ERROR %s\n", r.error().message().c_str());
    return 1;
  }
  std::printf("SEGMENT %s %llu\n", (*e)->segment_name().c_str(),
              static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(mem.data)));
  std::fflush(stdout);
  char line[256];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    char cmd[16];
    unsigned long long off = 0, len = 0, seed = 0;
    if (std::sscanf(line, "%15s %llu %llu %llu", cmd, &off, &len, &seed) < 1) continue;
    if (std::strcmp(cmd, "EXIT") == 0) break;
    if (off > bytes || len > bytes - off) {
      std::printf("BAD\n");
    } else {
      std::vector<unsigned char> want(len);
      fill(want.data(), len, seed);
      if (std::strcmp(cmd, "FILL") == 0) {
        std::memcpy(mem.data + off, want.data(), len);
        std::printf("OK\n");
      } else {
        std::printf(std::memcmp(mem.data + off, want.data(), len) == 0 ? "OK\n" : "BAD\n");
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

/// In a suite's main(), before doctest: runs peer_main when this process is a peer.
/// True (and `status` set) when it was one.
inline bool run_as_peer(int argc, char** argv, int& status) {
  if (argc < 5 || std::strcmp(argv[1], "--peer") != 0) return false;
  status = peer_main(argv[2], static_cast<std::uint16_t>(std::atoi(argv[3])), std::strtoull(argv[4], nullptr, 10));
  return true;
}

/// The test's side: a child process running peer_main, talked to over pipes.  The test
/// ignores SIGPIPE, so a killed peer's pipe does not end it.
struct peer_process {
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;
  std::string segment;
  std::uint64_t base = 0;

  peer_process(const std::string& device, std::uint16_t port, std::size_t bytes) {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    REQUIRE(n > 0);
    std::string self(exe, static_cast<std::size_t>(n));
    std::string port_text = std::to_string(port), bytes_text = std::to_string(bytes);
    std::vector<char*> argv{self.data(),      const_cast<char*>("--peer"), const_cast<char*>(device.c_str()),
                            port_text.data(), bytes_text.data(),          nullptr};
    REQUIRE(posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to = ::fdopen(in[1], "w");
    from = ::fdopen(out[0], "r");
    char line[512];
    REQUIRE(std::fgets(line, sizeof line, from) != nullptr);
    char name[256];
    unsigned long long base_addr = 0;
    REQUIRE_MESSAGE(std::sscanf(line, "SEGMENT %255s %llu", name, &base_addr) == 2, "peer said: " << line);
    segment = name;
    base = base_addr;
  }
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;

  /// "CHECK" or "FILL" `len` bytes at `off` with the pattern of `seed`: true when the peer said OK.
  bool ask(const char* cmd, std::size_t off, std::size_t len, std::uint64_t seed) {
    std::fprintf(to, "%s %zu %zu %llu\n", cmd, off, len, static_cast<unsigned long long>(seed));
    std::fflush(to);
    char line[64];
    return std::fgets(line, sizeof line, from) != nullptr && std::strncmp(line, "OK", 2) == 0;
  }
  /// SIGKILL, and reaped: the peer's engine vanishes without a goodbye.
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~peer_process() {
    if (to != nullptr) {
      if (pid > 0) std::fprintf(to, "EXIT\n");
      std::fclose(to);
    }
    if (from != nullptr) std::fclose(from);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace tide::test
