// The /metrics endpoint's threads (issue 18): the server thread formats a
// snapshot while other threads record into the meter and several clients
// scrape at once, and the server is destroyed while a client is half-way
// through a request.  Written for ThreadSanitizer (tools/sanitize runs it
// under TSan and ASan); the checks also hold without it.

#include <tide/metrics.hpp>
#include <tide/telemetry.hpp>

#include <doctest/doctest.h>

#include "support/loopback_http.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace tide;

namespace {

using tide::test::connect_loopback;

// GET /metrics; the body, or "" when the answer was not a 200.
std::string scrape(std::uint16_t port) {
  const std::string out =
      tide::test::http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  if (out.rfind("HTTP/1.1 200", 0) != 0) return {};
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : out.substr(body + 4);
}

// The value of tide_tasks_total{state="completed"}, or all ones when it is missing.
// (No std::regex: libstdc++'s trips -Werror=maybe-uninitialized under the sanitizers.)
std::uint64_t completed_total(const std::string& text) {
  const std::string key = "\ntide_tasks_total{state=\"completed\"} ";
  const auto at = text.find(key);
  if (at == std::string::npos) return ~std::uint64_t{0};
  return std::strtoull(text.c_str() + at + key.size(), nullptr, 10);
}

}  // namespace

TEST_CASE("metrics::http_server: scrapes from four threads while two threads record; counts only grow") {
  transfer_meter meter;
  std::atomic<int> formatted{0};
  auto server = metrics::http_server::start("127.0.0.1", 0, [&] {
    metrics::inputs in;
    in.tasks = meter.read();
    formatted.fetch_add(1, std::memory_order_relaxed);
    return metrics::format(in);
  });
  REQUIRE(server);
  const std::uint16_t port = (*server)->port();

  constexpr std::uint64_t kPerProducer = 20000;
  std::atomic<bool> go{false};
  std::vector<std::thread> producers;
  for (int p = 0; p < 2; ++p)
    producers.emplace_back([&, p] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::uint64_t i = 0; i < kPerProducer; ++i)
        meter.record(p == 0 ? transfer_op::write : transfer_op::read, 4096u << (i % 12),
                     static_cast<std::int64_t>(1000 + i), transfer_state::completed, errc::ok);
    });
  constexpr int kScrapes = 15;
  std::atomic<int> bad{0}, shrank{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t last = 0;
      for (int i = 0; i < kScrapes; ++i) {
        const std::string text = scrape(port);
        const std::uint64_t n = completed_total(text);
        if (text.empty() || n == ~std::uint64_t{0}) {
          bad.fetch_add(1);
          continue;
        }
        if (n < last) shrank.fetch_add(1);
        last = n;
      }
    });
  go.store(true, std::memory_order_release);
  for (auto& t : producers) t.join();
  for (auto& t : clients) t.join();
  CHECK(bad.load() == 0);
  CHECK(shrank.load() == 0);
  CHECK(formatted.load() == 4 * kScrapes);
  // After the producers joined, one scrape has every record.
  CHECK(completed_total(scrape(port)) == 2 * kPerProducer);
}

TEST_CASE("metrics::http_server: destroyed while a client is half-way through a request, promptly") {
  std::atomic<int> calls{0};
  auto server = metrics::http_server::start("127.0.0.1", 0, [&] {
    calls.fetch_add(1);
    return std::string("tide_x_total 1\n");
  });
  REQUIRE(server);
  const int fd = connect_loopback((*server)->port());
  const std::string part = "GET /metrics HTTP/1.1\r\nHo";
  REQUIRE(::send(fd, part.data(), part.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(part.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the server is reading it
  const auto t0 = std::chrono::steady_clock::now();
  server->reset();
  // Well inside the 5 s request deadline: the destructor closes the connection, not waits it out.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  char c;
  CHECK(::recv(fd, &c, 1, 0) <= 0);  // closed without an answer
  ::close(fd);
  CHECK(calls.load() == 0);
}
