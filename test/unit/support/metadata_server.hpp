#pragma once
// Test support: tide-metadata-server ($TIDE_METADATA_SERVER, which meson
// test sets) in a child process on a loopback port.

#include "process.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace tide::test {

using namespace std::chrono_literals;

inline std::string metadata_server_binary() {
  const char* p = std::getenv("TIDE_METADATA_SERVER");
  REQUIRE_MESSAGE(p != nullptr, "TIDE_METADATA_SERVER is not set (meson test sets it)");
  return p;
}

// tide-metadata-server in a child process on a loopback port.
class metadata_server_process {
 public:
  explicit metadata_server_process(std::uint16_t port = 0) { start(port); }
  void start(std::uint16_t port) {
    const std::string log = (dir_.path() / ("server-" + std::to_string(starts_++) + ".log")).string();
    proc_ = tide::test::child_process({metadata_server_binary(), "--host", "127.0.0.1", "--port", std::to_string(port)}, log);
    auto line = proc_.wait_for_log("listening on 127.0.0.1:", 5000ms);
    REQUIRE_MESSAGE(line.has_value(), "tide-metadata-server did not start; see " << log);
    const auto colon = line->rfind(':');
    port_ = static_cast<std::uint16_t>(std::stoi(line->substr(colon + 1)));
  }
  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/metadata"; }
  tide::test::child_process& process() { return proc_; }

 private:
  tide::test::temp_dir dir_;
  tide::test::child_process proc_;
  std::uint16_t port_ = 0;
  int starts_ = 0;
};

}  // namespace tide::test
