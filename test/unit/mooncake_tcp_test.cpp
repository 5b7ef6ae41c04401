// tide's TCP transport against a real Mooncake (transfer_engine_bench
// --protocol=tcp, built by ../shared/tools/build-mooncake.sh and named by
// TIDE_MOONCAKE_BENCH), both directions, version-2 and version-1 framing,
// P2P metadata.  Exits 77 (skipped) without a Mooncake build: CI cannot
// fetch its sources.
//
//  - tide initiator -> Mooncake target: WRITE a pattern into the target's
//    buffer, READ it back, compare; once as a version-2 client, once forced
//    to version 1 (tcp_proto = 1).
//  - Mooncake initiator -> tide target: its WRITEs land in the tide buffer
//    (Mooncake's buffer is fresh anonymous memory: zeros) and nothing past
//    the range it writes changes; its READs complete (it exits non-zero on a
//    failed task); again with MC_TCP_PROTO=1.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <tide/engine.hpp>

#include "support/process.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;

namespace {

const char* mooncake_bench() {
  const char* p = std::getenv("TIDE_MOONCAKE_BENCH");
  return p != nullptr && *p != '\0' && std::filesystem::is_regular_file(p) ? p : nullptr;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct aligned {
  explicit aligned(std::size_t n) : size(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, n))) {}
  ~aligned() { std::free(data); }
  aligned(const aligned&) = delete;
  aligned& operator=(const aligned&) = delete;
  std::size_t size;
  unsigned char* data;
};

tide::engine_config tcp_only() {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.transports = "tcp";
  c.transfer_timeout = 20s;
  return c;
}

/// A Mooncake target on TCP; its segment name once it listens.
struct mooncake_target {
  tide::test::temp_dir dir;
  tide::test::child_process proc;
  std::string segment;
  mooncake_target() {
    const std::string log = (dir.path() / "target.log").string();
    proc = tide::test::child_process({mooncake_bench(), "--mode=target", "--protocol=tcp",
                                      "--metadata_server=P2PHANDSHAKE", "--local_server_name=127.0.0.1",
                                      "--buffer_size=16777216"},
                                     log);
    auto line = proc.wait_for_log("listening on", 60s);
    REQUIRE_MESSAGE(line, "the Mooncake target printed no RPC port: " << read_text(log));
    std::smatch m;
    REQUIRE(std::regex_search(*line, m, std::regex(R"(listening on \S+:(\d+))")));
    segment = "127.0.0.1:" + m[1].str();
    std::this_thread::sleep_for(1s);  // it registers its buffer after the listener is up
  }
};

}  // namespace

TEST_CASE("tide initiator -> Mooncake TCP target: WRITE then READ back, version 2 and version 1") {
  for (const unsigned proto : {2u, 1u}) {
    CAPTURE(proto);
    mooncake_target target;
    auto c = tcp_only();
    c.tcp_proto = proto;
    auto e = tide::transfer_engine<>::create(c);
    REQUIRE(e);
    constexpr std::size_t kSize = 1 << 20;
    aligned src(kSize), back(kSize);
    std::mt19937_64 g(proto);
    for (std::size_t i = 0; i < kSize; ++i) src.data[i] = static_cast<unsigned char>(g());
    std::memset(back.data, 0, kSize);
    REQUIRE((*e)->register_memory(src.data, kSize));
    REQUIRE((*e)->register_memory(back.data, kSize));
    auto seg = (*e)->open_segment(target.segment);
    REQUIRE_MESSAGE(seg, (seg ? "" : seg.error().message()));
    auto desc = (*e)->segment_descriptor(*seg);
    REQUIRE(desc);
    CHECK((*desc)->protocol == "tcp");
    REQUIRE((*desc)->tcp_data_port != 0);
    REQUIRE(!(*desc)->buffers.empty());
    const std::uint64_t base = (*desc)->buffers[0].addr;
    for (const auto op : {transfer_op::write, transfer_op::read}) {
      auto b = (*e)->allocate_batch(4);
      REQUIRE(b);
      std::vector<transfer_request> reqs;
      for (std::size_t i = 0; i < 4; ++i)
        reqs.push_back(transfer_request::at_address(op, (op == transfer_op::write ? src.data : back.data) + i * (kSize / 4),
                                                    *seg, base + 8192 + i * (kSize / 4), kSize / 4));
      REQUIRE((*e)->submit(*b, reqs));
      REQUIRE((*e)->wait(*b, 30s));
      auto st = (*e)->batch_status(*b);
      REQUIRE(st);
      CHECK_MESSAGE(st->state == transfer_state::completed, "reason " << tide::to_string(st->reason));
      REQUIRE((*e)->free_batch(*b));
    }
    CHECK(std::memcmp(src.data, back.data, kSize) == 0);
  }
}

TEST_CASE("Mooncake TCP initiator -> tide target: its WRITEs land in range, its READs complete; version 2 and 1") {
  for (const bool v1 : {false, true}) {
    CAPTURE(v1);
    auto e = tide::transfer_engine<>::create(tcp_only());
    REQUIRE(e);
    constexpr std::size_t kSize = 8 << 20;
    aligned mem(kSize);
    std::memset(mem.data, 0xab, kSize);
    REQUIRE((*e)->register_memory(mem.data, kSize, "cpu:0"));
    // Mooncake's initiator writes block x batch x threads bytes from the buffer's start.
    constexpr std::size_t kBlock = 65536, kBatch = 16, kThreads = 2, kSpan = kBlock * kBatch * kThreads;
    for (const char* op : {"write", "read"}) {
      CAPTURE(op);
      tide::test::temp_dir dir;
      const std::string log = (dir.path() / "initiator.log").string();
      if (v1) ::setenv("MC_TCP_PROTO", "1", 1);
      tide::test::child_process ini({mooncake_bench(), "--mode=initiator", "--protocol=tcp",
                                     "--metadata_server=P2PHANDSHAKE", "--local_server_name=127.0.0.1",
                                     "--segment_id=" + (*e)->segment_name(), std::string("--operation=") + op,
                                     "--block_size=" + std::to_string(kBlock), "--batch_size=" + std::to_string(kBatch),
                                     "--threads=" + std::to_string(kThreads), "--buffer_size=16777216", "--duration=2"},
                                    log);
      ::unsetenv("MC_TCP_PROTO");
      const int status = ini.wait_exit(60s);
      const auto ts = (*e)->tcp_stats();
      INFO("tide's data port: " << ts.accepted << " accepted, " << ts.refused_source << " refused (source), "
                                << ts.refused_full << " refused (full), " << ts.dropped << " dropped, "
                                << ts.requests_rejected << " rejected");
      INFO(read_text(log).substr(0, 4000));
      CHECK(status == 0);
      CHECK(read_text(log).find("Test completed") != std::string::npos);
    }
    CHECK(std::all_of(mem.data, mem.data + kSpan, [](unsigned char c) { return c == 0; }));
    CHECK(std::all_of(mem.data + kSpan, mem.data + kSize, [](unsigned char c) { return c == 0xab; }));
    const auto s = (*e)->tcp_stats();
    CHECK(s.bytes_served_in > 0);
    CHECK(s.bytes_served_out > 0);
    CHECK(s.requests_rejected == 0);
  }
}

int main(int argc, char** argv) {
  if (mooncake_bench() == nullptr) {
    std::printf("no Mooncake transfer_engine_bench (set TIDE_MOONCAKE_BENCH): skipped (exit 77)\n");
    return 77;
  }
  ::signal(SIGPIPE, SIG_IGN);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
