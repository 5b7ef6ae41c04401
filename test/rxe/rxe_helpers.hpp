#pragma once
// Helpers of the rxe suites (engine_test.cpp, lanes_test.cpp): page-aligned buffers, seeded
// patterns, one-request transfers, engine configs and engines.  Test code only.

#include <tide/engine.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace tide::test {

using namespace std::chrono_literals;

struct buffer {
  explicit buffer(std::size_t n) : size(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, round(n)))) {
    std::memset(data, 0, n);
  }
  ~buffer() { std::free(data); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  static std::size_t round(std::size_t n) { return (n + 4095) / 4096 * 4096; }
  std::size_t size;
  unsigned char* data;
};

inline void fill(unsigned char* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t v = g();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(g());
}

/// A loopback engine on `devices`, 60 s transfer timeout.
inline engine_config config_for(std::vector<std::string> devices) {
  engine_config c;
  c.local_server_name = "127.0.0.1";
  c.devices = std::move(devices);
  c.transfer_timeout = 60s;
  return c;
}

/// An engine on `c`; ends the test case with create's error when it fails.
template <class P = default_policies>
std::unique_ptr<transfer_engine<P>> make_engine(const engine_config& c) {
  auto e = transfer_engine<P>::create(c);
  if (!e) FAIL("transfer_engine::create: " << e.error().message());
  return std::move(*e);
}

/// One request in its own batch; ok only when it COMPLETED with every byte.
template <class Engine>
status run_one(Engine& e, const transfer_request& r, std::chrono::milliseconds timeout = 60s) {
  auto b = e.allocate_batch(1);
  if (!b) return fail(b.error());
  if (auto s = e.submit(*b, {&r, 1}); !s) {
    (void)e.free_batch(*b);
    return s;
  }
  auto w = e.wait(*b, timeout);
  auto st = e.status_of(*b, 0);
  auto fr = e.free_batch(*b);
  if (!w) return w;
  if (!st) return fail(st.error());
  if (st->state != transfer_state::completed)
    return fail(st->reason, std::string("task ended ") + std::string(to_string(st->state)));
  if (st->transferred_bytes != r.length) return fail(errc::completion_error, "byte count");
  if (!fr) return fr;
  return {};
}

}  // namespace tide::test
