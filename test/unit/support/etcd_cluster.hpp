#pragma once
// Test support: etcd members on loopback ports with temporary data
// directories (Debian's etcd, or $TIDE_ETCD), for the tests that need a real
// etcd.  Every wait is bounded; a member that does not come up fails the test.

#include <tide/metadata/backend.hpp>

#include "../../../src/metadata/etcd_codec.hpp"
#include "../../../src/metadata/http_client.hpp"
#include "process.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace tide::test {

using namespace std::chrono_literals;

inline std::string etcd_binary() {
  const char* p = std::getenv("TIDE_ETCD");
  return p && *p ? p : "/usr/bin/etcd";
}

/// A suite's main: runs doctest, or exits 77 (meson: skipped) saying why
/// where no etcd binary is installed.
inline int run_if_etcd(int argc, char** argv) {
  const std::string etcd = etcd_binary();
  if (::access(etcd.c_str(), X_OK) != 0) {
    std::printf("SKIP: no etcd binary at %s (install Debian's etcd-server, or set TIDE_ETCD)\n", etcd.c_str());
    return 77;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}

// A cluster of `n` etcd members on loopback; member i listens for clients on
// client_port[i] and for peers on peer_port[i].
class etcd_cluster {
 public:
  explicit etcd_cluster(std::size_t n) : members_(n) {
    const auto ports = tide::test::free_loopback_ports(2 * n);
    std::string initial;
    for (std::size_t i = 0; i < n; ++i) {
      members_[i].name = "m" + std::to_string(i);
      members_[i].client_port = ports[2 * i];
      members_[i].peer_port = ports[2 * i + 1];
      if (!initial.empty()) initial += ",";
      initial += members_[i].name + "=http://127.0.0.1:" + std::to_string(members_[i].peer_port);
    }
    initial_cluster_ = initial;
    for (std::size_t i = 0; i < n; ++i) start(i);
    for (std::size_t i = 0; i < n; ++i) REQUIRE_MESSAGE(wait_ready(i, 15s), "etcd member " << i << " not ready; see " << log(i));
  }

  void start(std::size_t i) {
    auto& m = members_[i];
    const std::string client = "http://127.0.0.1:" + std::to_string(m.client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    m.proc = tide::test::child_process(
        {etcd_binary(), "--name", m.name, "--data-dir", (dir_.path() / m.name).string(),
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", initial_cluster_, "--initial-cluster-token", "tide-test",
         "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap", "--log-level", "warn"},
        log(i));
  }

  // Ready = a linearizable range answers (the member has a leader).
  bool wait_ready(std::size_t i, std::chrono::milliseconds timeout) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < timeout) {
      if (!members_[i].proc.running()) return false;
      auto r = tide::detail::http_request("127.0.0.1", members_[i].client_port, "POST", "/v3/kv/range",
                                    tide::detail::etcd_key_request("ready?"), "application/json", 500ms);
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  std::string connection(std::size_t first = 0) const {
    std::string s = "etcd://";
    for (std::size_t k = 0; k < members_.size(); ++k) {
      const auto& m = members_[(first + k) % members_.size()];
      if (k) s += ",";
      s += "127.0.0.1:" + std::to_string(m.client_port);
    }
    return s;
  }
  metadata_config config(std::chrono::milliseconds timeout = 1000ms) const {
    metadata_config c;
    c.connection = connection();
    c.timeout = timeout;
    return c;
  }
  std::uint16_t client_port(std::size_t i) const { return members_[i].client_port; }
  tide::test::child_process& process(std::size_t i) { return members_[i].proc; }
  std::string log(std::size_t i) const { return (dir_.path() / (members_[i].name + ".log")).string(); }

 private:
  struct member {
    std::string name;
    std::uint16_t client_port = 0;
    std::uint16_t peer_port = 0;
    tide::test::child_process proc;
  };
  tide::test::temp_dir dir_;
  std::vector<member> members_;
  std::string initial_cluster_;
};

}  // namespace tide::test
