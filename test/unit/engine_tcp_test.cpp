// The engine over TCP on loopback, no RDMA device needed: the transfer cases
// of test/rxe/engine_test.cpp between two engines in one process and between
// two processes, every byte verified; bad input; cancel and timeout with
// nothing written after final; a peer killed mid-transfer; notifications
// after the data; the secret on the data port; an engine on a host without
// RDMA devices.
#include <tide/engine.hpp>

#include "support/process.hpp"

#define DOCTEST_CONFIG_IMPLEMENT
#include <tide/memory/memory_kind.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using tide::errc;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;

extern char** environ;

namespace {

/// Page-aligned, zeroed.
struct buffer {
  explicit buffer(std::size_t n) : size(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    std::memset(data, 0, n);
  }
  ~buffer() { std::free(data); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  std::size_t size;
  unsigned char* data;
};

void fill(unsigned char* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(g() >> 13);
}

/// An engine on TCP alone, on loopback, with no RDMA device looked at.
tide::engine_config tcp_config() {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.transports = "tcp";
  c.transfer_timeout = 30s;
  c.bind_host = "127.0.0.1";
  return c;
}

std::unique_ptr<tide::transfer_engine<>> make(const tide::engine_config& c) {
  auto e = tide::transfer_engine<>::create(c);
  if (!e) FAIL("create: " << e.error().message());
  return std::move(*e);
}

/// One request in its own batch: its final status (the batch freed).
tide::transfer_status run_one(tide::transfer_engine<>& e, const transfer_request& r, std::chrono::milliseconds t = 30s) {
  auto b = e.allocate_batch(1);
  REQUIRE(b);
  REQUIRE(e.submit(*b, {&r, 1}));
  REQUIRE(e.wait(*b, t));
  auto st = e.status_of(*b, 0);
  REQUIRE(st);
  REQUIRE(e.free_batch(*b));
  return *st;
}

// ---- the peer process: this binary run as `--tcp-peer <bytes> [secret file]` ----
// It prints "SEGMENT <name> <base>" once its memory is registered, then answers
// "CHECK off len seed" and "FILL off len seed" with OK or BAD until EXIT.
int peer_main(std::size_t bytes, const char* secret) {
  auto c = tcp_config();
  if (secret != nullptr) c.auth_secret_file = secret;
  auto e = tide::transfer_engine<>::create(c);
  if (!e) {
    std::printf("ERROR %s\n", e.error().message().c_str());
    return 1;
  }
  buffer mem(bytes);
  if (auto r = (*e)->register_memory(mem.data, bytes); !r) {
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
    std::vector<unsigned char> want(len);
    fill(want.data(), len, seed);
    if (off > bytes || len > bytes - off) std::printf("BAD\n");
    else if (std::strcmp(cmd, "FILL") == 0) std::memcpy(mem.data + off, want.data(), len), std::printf("OK\n");
    else std::printf(std::memcmp(mem.data + off, want.data(), len) == 0 ? "OK\n" : "BAD\n");
    std::fflush(stdout);
  }
  return 0;
}

/// The test's side of a peer process.
class peer {
 public:
  explicit peer(std::size_t bytes, const std::string& secret = {}) {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::string self = std::filesystem::read_symlink("/proc/self/exe");
    std::string n = std::to_string(bytes);
    std::vector<char*> argv{self.data(), const_cast<char*>("--tcp-peer"), n.data()};
    if (!secret.empty()) argv.push_back(const_cast<char*>(secret.c_str()));
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, self.c_str(), &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
    char line[512];
    REQUIRE(std::fgets(line, sizeof line, from_) != nullptr);
    char name[256];
    unsigned long long base = 0;
    INFO("peer said: " << line);
    REQUIRE(std::sscanf(line, "SEGMENT %255s %llu", name, &base) == 2);
    name_ = name;
    base_ = base;
  }
  ~peer() {
    if (pid_ > 0) {
      std::fputs("EXIT\n", to_);
      std::fflush(to_);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::fclose(to_);
    std::fclose(from_);
  }
  [[nodiscard]] bool ask(const char* cmd, std::uint64_t off, std::uint64_t len, std::uint64_t seed) {
    std::fprintf(to_, "%s %llu %llu %llu\n", cmd, static_cast<unsigned long long>(off),
                 static_cast<unsigned long long>(len), static_cast<unsigned long long>(seed));
    std::fflush(to_);
    char line[64];
    return std::fgets(line, sizeof line, from_) != nullptr && std::strncmp(line, "OK", 2) == 0;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  /// SIGSTOP, returning once the kernel has stopped it (its state is T).
  void stop() {
    ::kill(pid_, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(pid_) + "/stat";
    for (int i = 0; i < 5000; ++i) {
      std::ifstream in(stat);
      std::string pid, comm, state;
      in >> pid >> comm >> state;
      if (state == "T") return;
      std::this_thread::sleep_for(1ms);
    }
    FAIL("the peer did not stop");
  }
  void kill() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] std::uint64_t base() const { return base_; }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string name_;
  std::uint64_t base_ = 0;
};

}  // namespace

TEST_CASE("tcp engine pair in one process: WRITE and READ, 1 B .. 32 MiB, unaligned, every byte checked") {
  auto a = make(tcp_config());
  auto b = make(tcp_config());
  CHECK(a->tcp_port() != 0);
  constexpr std::size_t kMax = 32u << 20;
  buffer src(kMax + 64), dst(kMax + 64), back(kMax + 64);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(a->register_memory(back.data, back.size));
  REQUIRE(b->register_memory(dst.data, dst.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  auto desc = a->segment_descriptor(*seg);
  REQUIRE(desc);
  CHECK((*desc)->protocol == "tcp");
  CHECK((*desc)->tcp_data_port == b->tcp_port());
  CHECK((*desc)->devices.empty());
  std::uint64_t seed = 1;
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{65535},
                              std::size_t{65536 + 3}, std::size_t{1} << 20, (std::size_t{3} << 20) + 5, kMax}) {
    for (const std::size_t off : {std::size_t{0}, std::size_t{13}}) {
      if (n + off > kMax + 64) continue;
      CAPTURE(n);
      CAPTURE(off);
      fill(src.data + off, n, ++seed);
      auto w = transfer_request::in_buffer(transfer_op::write, src.data + off, *seg, 0, off, n);
      const auto ws = run_one(*a, w);
      CHECK(ws.state == transfer_state::completed);
      CHECK(ws.transferred_bytes == n);
      CHECK(std::memcmp(dst.data + off, src.data + off, n) == 0);
      std::memset(back.data, 0, n + off + 1);
      auto r = transfer_request::in_buffer(transfer_op::read, back.data + off, *seg, 0, off, n);
      CHECK(run_one(*a, r).state == transfer_state::completed);
      CHECK(std::memcmp(back.data + off, src.data + off, n) == 0);
      CHECK(back.data[off + n] == 0);  // nothing past the end
    }
  }
  // The telemetry says TCP carried it.
  auto batch = a->allocate_batch(1);
  REQUIRE(batch);
  auto w = transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, 4096);
  REQUIRE(a->submit(*batch, {&w, 1}));
  REQUIRE(a->wait(*batch, 30s));
  auto tel = a->task_telemetry(*batch, 0);
  REQUIRE(tel);
  CHECK(tel->transports == tide::transfer_telemetry::kViaTcp);
  CHECK(tel->wrs >= 1);
  REQUIRE(a->free_batch(*batch));
  CHECK(a->tcp_stats().ops_ok > 0);
  CHECK(b->tcp_stats().requests_served > 0);
}

TEST_CASE("tcp engine, staged (stage_host_memory): every byte through the bounce buffers at both ends, "
          "sizes around the 1 MiB chunk") {
  auto c = tcp_config();
  c.stage_host_memory = true;
  auto a = make(c);
  auto b = make(c);
  constexpr std::size_t kMax = (std::size_t{5} << 20) + 64;
  buffer src(kMax), dst(kMax), back(kMax);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(a->register_memory(back.data, back.size));
  REQUIRE(b->register_memory(dst.data, dst.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  std::uint64_t seed = 40;
  std::uint64_t moved = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{4096}, (std::size_t{1} << 20) - 1, std::size_t{1} << 20,
                              (std::size_t{1} << 20) + 1, (std::size_t{5} << 20) + 13}) {
    CAPTURE(n);
    const std::size_t off = 17;
    if (n + off > kMax) continue;
    fill(src.data + off, n, ++seed);
    CHECK(run_one(*a, transfer_request::in_buffer(transfer_op::write, src.data + off, *seg, 0, off, n)).state ==
          transfer_state::completed);
    CHECK(std::memcmp(dst.data + off, src.data + off, n) == 0);
    std::memset(back.data, 0, kMax);
    CHECK(run_one(*a, transfer_request::in_buffer(transfer_op::read, back.data + off, *seg, 0, off, n)).state ==
          transfer_state::completed);
    CHECK(std::memcmp(back.data + off, src.data + off, n) == 0);
    CHECK(back.data[off + n] == 0);
    CHECK(back.data[off - 1] == 0);
    moved += 2 * n;
  }
  // Each side staged every byte it moved: the initiator its WRITEs' sources
  // and READs' destinations, the server the same bytes at its end.
  CHECK(a->tcp_stats().bytes_staged == moved);
  CHECK(b->tcp_stats().bytes_staged == moved);
}

TEST_CASE("tcp engine: GPU memory without a CUDA driver is refused at registration, with the reason") {
  if (tide::memory::cuda().usable) return;  // tools/gpu-check registers real GPU memory
  auto a = make(tcp_config());
  buffer buf(65536);
  auto r = a->register_memory(buf.data, buf.size, "cuda:0");
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::memory_unsupported);
  CHECK(r.error().detail.find(tide::memory::cuda().why_not) != std::string::npos);
  // Host memory registers as before.
  CHECK(a->register_memory(buf.data, buf.size));
}

TEST_CASE("tcp engine: bad input gets its own errc, checked at submit and by the serving side") {
  auto a = make(tcp_config());
  auto b = make(tcp_config());
  buffer src(65536), rw(65536), ro(65536), lo(65536);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(b->register_memory(rw.data, rw.size));
  REQUIRE(b->register_memory(ro.data, ro.size, "*", tide::buffer_access::remote_read));
  REQUIRE(b->register_memory(lo.data, lo.size, "*", tide::buffer_access::local_only));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  auto bt = a->allocate_batch(4);
  REQUIRE(bt);
  auto submit_err = [&](const transfer_request& r) {
    auto st = a->submit(*bt, {&r, 1});
    REQUIRE_FALSE(st);
    return st.error().code;
  };
  buffer unreg(4096);
  CHECK(submit_err(transfer_request::in_buffer(transfer_op::write, unreg.data, *seg, 0, 0, 16)) == errc::unregistered_source);
  CHECK(submit_err(transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 65000, 1024)) == errc::out_of_bounds);
  CHECK(submit_err(transfer_request::in_buffer(transfer_op::write, src.data, *seg, 1, 0, 16)) == errc::remote_access_denied);
  CHECK(submit_err(transfer_request::in_buffer(transfer_op::write, src.data, *seg, 99, 0, 16)) == errc::out_of_bounds);
  CHECK(submit_err(transfer_request::at_address(transfer_op::write, src.data, *seg,
                                                reinterpret_cast<std::uint64_t>(lo.data), 16)) == errc::out_of_bounds);
  CHECK(submit_err(transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, 0)) == errc::zero_length);
  REQUIRE(a->free_batch(*bt));
  CHECK(std::all_of(lo.data, lo.data + lo.size, [](unsigned char c) { return c == 0; }));
  CHECK(std::all_of(ro.data, ro.data + ro.size, [](unsigned char c) { return c == 0; }));
}

TEST_CASE("tcp engine: 10 threads at once, each its own range, every byte checked") {
  auto a = make(tcp_config());
  auto b = make(tcp_config());
  constexpr std::size_t kThreads = 10, kPer = 1 << 20;
  buffer src(kThreads * kPer), dst(kThreads * kPer), back(kThreads * kPer);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(a->register_memory(back.data, back.size));
  REQUIRE(b->register_memory(dst.data, dst.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (std::size_t t = 0; t < kThreads; ++t)
    th.emplace_back([&, t] {
      for (int round = 0; round < 4; ++round) {
        const std::size_t off = t * kPer;
        fill(src.data + off, kPer, t * 100 + round);
        auto w = transfer_request::in_buffer(transfer_op::write, src.data + off, *seg, 0, off, kPer);
        auto r = transfer_request::in_buffer(transfer_op::read, back.data + off, *seg, 0, off, kPer);
        auto bw = a->allocate_batch(2);
        if (!bw || !a->submit(*bw, {&w, 1}) || !a->wait(*bw, 30s)) {
          bad.fetch_add(1);
          continue;
        }
        auto sw = a->batch_status(*bw);
        if (!sw || sw->state != transfer_state::completed) bad.fetch_add(1);
        if (!a->submit(*bw, {&r, 1}) || !a->wait(*bw, 30s)) bad.fetch_add(1);
        auto sr = a->batch_status(*bw);
        if (!sr || sr->state != transfer_state::completed) bad.fetch_add(1);
        if (!a->free_batch(*bw)) bad.fetch_add(1);
        if (std::memcmp(back.data + off, src.data + off, kPer) != 0) bad.fetch_add(1);
      }
    });
  for (auto& x : th) x.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("tcp engine: two processes, WRITE and READ checked in the peer; a killed peer fails within the timeout") {
  peer p(8 << 20);
  auto c = tcp_config();
  c.transfer_timeout = 5s;
  auto a = make(c);
  buffer src(8 << 20), back(8 << 20);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(a->register_memory(back.data, back.size));
  auto seg = a->open_segment(p.name());
  REQUIRE(seg);
  fill(src.data, 4 << 20, 77);
  auto w = transfer_request::at_address(transfer_op::write, src.data, *seg, p.base() + 4096, 4 << 20);
  CHECK(run_one(*a, w).state == transfer_state::completed);
  CHECK(p.ask("CHECK", 4096, 4 << 20, 77));
  REQUIRE(p.ask("FILL", 0, 1 << 20, 78));
  auto r = transfer_request::at_address(transfer_op::read, back.data, *seg, p.base(), 1 << 20);
  CHECK(run_one(*a, r).state == transfer_state::completed);
  std::vector<unsigned char> want(1 << 20);
  fill(want.data(), want.size(), 78);
  CHECK(std::memcmp(back.data, want.data(), want.size()) == 0);

  // Killed with a batch of large READs in flight: every task final (FAILED)
  // within the transfer timeout, nothing hangs.
  const std::uint64_t base = p.base();
  auto b = a->allocate_batch(8);
  REQUIRE(b);
  std::vector<transfer_request> reqs;
  for (int i = 0; i < 8; ++i)
    reqs.push_back(transfer_request::at_address(transfer_op::read, back.data + i * (1 << 20), *seg, base + i * (1 << 20), 1 << 20));
  REQUIRE(a->submit(*b, reqs));
  p.kill();
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(a->wait(*b, 20s));
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);  // a hang guard: the timeout is 5 s
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto st = a->status_of(*b, i);
    REQUIRE(st);
    CHECK(tide::is_final(st->state));
  }
  REQUIRE(a->free_batch(*b));
  // The next call to a live peer works.
  peer q(1 << 20);
  auto seg2 = a->open_segment(q.name());
  REQUIRE(seg2);
  fill(src.data, 65536, 5);
  auto w2 = transfer_request::at_address(transfer_op::write, src.data, *seg2, q.base(), 65536);
  CHECK(run_one(*a, w2).state == transfer_state::completed);
  CHECK(q.ask("CHECK", 0, 65536, 5));
}

TEST_CASE("tcp engine: cancel and timeout against a stopped peer; nothing is written after the task is final") {
  peer p(16 << 20);
  auto c = tcp_config();
  SUBCASE("cancel") { c.transfer_timeout = 60s; }
  SUBCASE("timeout") { c.transfer_timeout = 1s; }
  auto a = make(c);
  buffer back(16 << 20);
  std::memset(back.data, 0xab, back.size);
  REQUIRE(a->register_memory(back.data, back.size));
  auto seg = a->open_segment(p.name());
  REQUIRE(seg);
  REQUIRE(p.ask("FILL", 0, 16 << 20, 9));
  p.stop();  // the kernel still accepts; nothing is answered
  auto b = a->allocate_batch(4);
  REQUIRE(b);
  std::vector<transfer_request> reqs;
  for (int i = 0; i < 4; ++i)
    reqs.push_back(transfer_request::at_address(transfer_op::read, back.data + i * (4 << 20), *seg,
                                                p.base() + i * (4 << 20), 4 << 20));
  REQUIRE(a->submit(*b, reqs));
  if (c.transfer_timeout == 60s) REQUIRE(a->cancel(*b));
  REQUIRE(a->wait(*b, 30s));
  const transfer_state want = c.transfer_timeout == 60s ? transfer_state::canceled : transfer_state::timeout;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto st = a->status_of(*b, i);
    REQUIRE(st);
    CHECK(st->state == want);
  }
  std::vector<unsigned char> snapshot(back.data, back.data + back.size);
  p.signal(SIGCONT);  // whatever it sends now must land nowhere
  REQUIRE(p.ask("CHECK", 0, 4096, 9));  // it runs again, and has answered
  std::this_thread::sleep_for(200ms);
  CHECK(std::memcmp(snapshot.data(), back.data, back.size) == 0);
  REQUIRE(a->free_batch(*b));
}

TEST_CASE("tcp engine: a notification arrives after the data, over the handshake port") {
  auto a = make(tcp_config());
  auto b = make(tcp_config());
  buffer src(1 << 20), dst(1 << 20);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(b->register_memory(dst.data, dst.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  for (int i = 0; i < 20; ++i) {
    fill(src.data, src.size, 300 + i);
    auto bt = a->allocate_batch(1);
    REQUIRE(bt);
    auto w = transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, src.size);
    REQUIRE(a->submit(*bt, {&w, 1}, tide::notification{"", "block " + std::to_string(i)}));
    std::vector<tide::notify_desc> got;
    for (int k = 0; k < 100 && got.empty(); ++k) got = b->take_notifies(100ms);
    REQUIRE(got.size() == 1);
    CHECK(got[0].notify_msg == "block " + std::to_string(i));
    CHECK(got[0].name == a->segment_name());
    // The data was there before the message.
    CHECK(std::memcmp(dst.data, src.data, src.size) == 0);
    REQUIRE(a->wait(*bt, 30s));
    REQUIRE(a->free_batch(*bt));
  }
  CHECK(a->probe(b->segment_name(), 2s));
}

TEST_CASE("tcp engine: with the cluster secret the data port is authenticated; a peer without it gets nothing") {
  tide::test::temp_dir dir;
  const auto write_secret = [&](const char* name, char c) {
    const auto path = dir.path() / name;
    std::ofstream(path) << std::string(32, c);
    std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    return path.string();
  };
  const std::string s1 = write_secret("s1", 'k');
  const std::string s2 = write_secret("s2", 'z');
  auto c1 = tcp_config();
  c1.auth_secret_file = s1;
  auto a = make(c1);
  auto b = make(c1);
  buffer src(65536), dst(65536);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(b->register_memory(dst.data, dst.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  fill(src.data, src.size, 4);
  CHECK(run_one(*a, transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, src.size)).state ==
        transfer_state::completed);
  CHECK(std::memcmp(dst.data, src.data, src.size) == 0);
  // An engine with another secret opens nothing; a raw Mooncake-style client
  // without the exchange is refused before any request is read.
  auto c2 = tcp_config();
  c2.auth_secret_file = s2;
  auto x = make(c2);
  CHECK_FALSE(x->open_segment(b->segment_name()));
  tide::test::raw_client raw(b->tcp_port());
  const std::uint64_t addr = reinterpret_cast<std::uint64_t>(dst.data);
  std::string hdr(24, '\0');
  const std::uint64_t size = 16;
  std::memcpy(hdr.data(), &size, 8);
  std::memcpy(hdr.data() + 8, &addr, 8);
  hdr[16] = static_cast<char>(0x81);
  raw.send(hdr + std::string(16, 'X'));
  const auto reply = raw.read_until_eof(5s);
  CHECK((reply.eof || reply.reset));
  CHECK(dst.data[0] != 'X');
  CHECK(b->tcp_stats().auth_failed >= 1);
}

TEST_CASE("an engine on a host without RDMA devices runs on TCP alone with the default transports") {
  tide::test::temp_dir empty_sysfs;  // no class/infiniband: no device
  auto c = tcp_config();
  c.transports = "rdma,tcp";
  c.sysfs_root = empty_sysfs.path().string();
  auto a = make(c);
  CHECK(a->transport().context_count() == 0);
  CHECK(a->tcp_port() != 0);
  // "rdma" alone is still an error there.
  auto r = c;
  r.transports = "rdma";
  auto e = tide::transfer_engine<>::create(r);
  REQUIRE_FALSE(e);
  CHECK(e.error().code == errc::no_device);
  auto bad = c;
  bad.transports = "rdma,udp";
  auto f = tide::transfer_engine<>::create(bad);
  REQUIRE_FALSE(f);
  CHECK(f.error().code == errc::config_invalid);
  CHECK(f.error().detail.find("udp") != std::string::npos);
  // And it moves bytes to a TCP-only peer.
  auto b = make(tcp_config());
  buffer src(4096), dst(4096);
  REQUIRE(a->register_memory(src.data, src.size));
  REQUIRE(b->register_memory(dst.data, dst.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  fill(src.data, 4096, 8);
  CHECK(run_one(*a, transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, 4096)).state ==
        transfer_state::completed);
  CHECK(std::memcmp(dst.data, src.data, 4096) == 0);
}

// Mooncake tests only that MC_FORCE_TCP is set (transfer_engine_impl.cpp), so any value forces
// TCP there, and here: tide reads MC_* variables with Mooncake's meaning.
TEST_CASE("MC_FORCE_TCP makes an engine TCP only, whatever its value, as in Mooncake") {
  for (const char* v : {"1", "maybe"}) {
    ::setenv("MC_FORCE_TCP", v, 1);
    auto c = tcp_config();
    c.transports = "rdma,tcp";
    REQUIRE(c.apply_env());
    CHECK(c.transports == "tcp");
    tide::engine_config d;  // transports left at its default: the variable decides
    CHECK(d.resolve()->transports == "tcp");
  }
  ::unsetenv("MC_FORCE_TCP");
}

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--tcp-peer") == 0)
    return peer_main(std::strtoull(argv[2], nullptr, 10), argc >= 4 ? argv[3] : nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
