// Transient failures on the only rail are retried, not failed (issue 17,
// item 7).  One NIC per side (rxe0 <-> rxe1 over one veth pair, the VM's
// default network), many 64 KiB WRITEs in flight, and a burst of 100% loss
// on that link (netem on both veths, from the test: both ends are in this
// VM) that outlasts every retry round a fixed max_retry survives:
//  - the burst ends well within transfer_timeout: 0 requests fail, every
//    byte arrives, the retries show in the telemetry;
//  - cancel() during the burst: every task ends CANCELED within a backoff
//    cap or so of the cancel, although its slices were waiting to retry;
//  - transfer_timeout shorter than the burst: every task is final (FAILED
//    or TIMEOUT) shortly after its deadline, none waits out the burst.
// The QPs' ACK timeout is short (qp_timeout 12, 3 retries: ~70 ms per
// failed round) so the cases stay short; with tide's four immediate
// retries a slice survived ~0.3 s of loss, the burst lasts 2 s.
// Needs tools/rxe-vm (RXE_VM_NETDEV_<dev>, root for tc); skips elsewhere.
// TIDE_TEST_TIME_SCALE (default 1) stretches the time bounds: tools/tsan-rxe
// runs it under ThreadSanitizer on an emulated CPU.

#include <doctest/doctest.h>

#include <tide/engine.hpp>

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;
using tide::test::buffer;
using tide::test::fill;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t kRequests = 512;
constexpr std::size_t kSize = 64u << 10;

std::string env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v == nullptr ? std::string() : std::string(v);
}

double time_scale() {
  const std::string v = env("TIDE_TEST_TIME_SCALE");
  return v.empty() ? 1.0 : std::max(1.0, std::atof(v.c_str()));
}

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// 100% loss on both directions of the link between two devices, for as long
// as it lives (netem on each device's veth; the VM's default network has no
// qdisc there).
class loss_burst {
 public:
  static std::optional<std::vector<std::string>> netdevs(const std::string& a, const std::string& b) {
    const std::string na = env("RXE_VM_NETDEV_" + a), nb = env("RXE_VM_NETDEV_" + b);
    if (na.empty() || nb.empty()) {
      MESSAGE("needs tools/rxe-vm (RXE_VM_NETDEV_" << a << "): skipped");
      return std::nullopt;
    }
    for (const char* shaped : {"RXE_VM_LOSSES", "RXE_VM_RATES", "RXE_VM_DELAYS"})
      if (const std::string v = env(shaped); !v.empty() && v.find_first_not_of("- ") != std::string::npos) {
        MESSAGE("needs a VM without --loss/--rate/--delay (" << shaped << "=" << v << "): skipped");
        return std::nullopt;
      }
    return std::vector<std::string>{na, nb};
  }
  explicit loss_burst(std::vector<std::string> devs) : devs_(std::move(devs)) {
    for (const auto& d : devs_) REQUIRE(std::system(("tc qdisc add dev " + d + " root netem loss 100%").c_str()) == 0);
  }
  ~loss_burst() { end(); }
  void end() {
    for (const auto& d : devs_) CHECK(std::system(("tc qdisc del dev " + d + " root").c_str()) == 0);
    devs_.clear();
  }

 private:
  std::vector<std::string> devs_;
};

struct pair_rig {
  std::unique_ptr<tide::transfer_engine<>> a, b;
  buffer la{kRequests * kSize}, lb{kRequests * kSize};
  tide::segment_id seg = 0;

  pair_rig(const std::string& dev_a, const std::string& dev_b, std::chrono::milliseconds timeout) {
    a = tide::test::make_engine<>(config(dev_a, timeout));
    b = tide::test::make_engine<>(config(dev_b, timeout));
    REQUIRE(a->register_memory(la.data, la.size));
    REQUIRE(b->register_memory(lb.data, lb.size));
    seg = a->open_segment(b->segment_name()).value();
    // The endpoint exists before the burst, as on a busy engine.
    REQUIRE(tide::test::run_one(*a, write(0), 10s));
    std::memset(lb.data, 0, lb.size);
  }
  static tide::engine_config config(const std::string& dev, std::chrono::milliseconds timeout) {
    auto c = tide::test::config_for({dev});
    c.transfer_timeout = timeout;
    c.qp_timeout = 12;   // 16.8 ms ACK timeout
    c.qp_retry_cnt = 3;  // a round fails after ~70 ms of silence
    c.coalesce_requests = false;
    c.max_wrs_write = 1024;  // one 64 KiB WR per request
    return c;
  }
  transfer_request write(std::size_t i) const {
    return transfer_request::at_address(transfer_op::write, la.data + i * kSize, seg,
                                        reinterpret_cast<std::uint64_t>(lb.data + i * kSize), kSize);
  }
  tide::batch_id submit_all() {
    fill(la.data, la.size, 17);
    std::vector<transfer_request> reqs;
    for (std::size_t i = 0; i < kRequests; ++i) reqs.push_back(write(i));
    auto batch = a->allocate_batch(kRequests).value();
    REQUIRE(a->submit(batch, reqs));
    return batch;
  }
  struct tally {
    std::size_t completed = 0, failed = 0, timeout = 0, canceled = 0, other = 0;
    tide::errc first_reason = tide::errc::ok;
  };
  tally count(tide::batch_id batch) {
    tally t;
    for (std::size_t i = 0; i < kRequests; ++i) {
      const auto st = a->status_of(batch, i).value();
      switch (st.state) {
        case transfer_state::completed: ++t.completed; break;
        case transfer_state::failed: ++t.failed; break;
        case transfer_state::timeout: ++t.timeout; break;
        case transfer_state::canceled: ++t.canceled; break;
        default: ++t.other;
      }
      if (st.state != transfer_state::completed && t.first_reason == tide::errc::ok) t.first_reason = st.reason;
    }
    MESSAGE(t.completed << " completed, " << t.failed << " failed, " << t.timeout << " timeout, " << t.canceled
                        << " canceled, " << t.other << " not final; first reason " << tide::to_string(t.first_reason)
                        << "; " << a->batch_telemetry(batch).value().retries << " retries");
    return t;
  }
};

}  // namespace

TEST_CASE("2 s of 100% loss on the only link, 512 x 64 KiB WRITEs in flight: none fails, every byte arrives") {
  const auto devs = tide::test::devices_under_test();
  const auto netdevs = loss_burst::netdevs(devs[0], devs[1]);
  if (!netdevs) return;
  pair_rig r(devs[0], devs[1], 20s);
  const auto t0 = clock_type::now();
  tide::batch_id batch{};
  {
    loss_burst loss(*netdevs);
    batch = r.submit_all();
    std::this_thread::sleep_for(2s);
    CHECK(r.a->batch_status(batch).value().state == transfer_state::pending);
  }
  REQUIRE(r.a->wait(batch, 30s));
  MESSAGE("batch final " << ms_since(t0) << " ms after the burst began");
  const auto t = r.count(batch);
  CHECK(t.completed == kRequests);
  CHECK(t.failed == 0);
  CHECK(r.a->batch_telemetry(batch).value().retries > 0);
  CHECK(std::memcmp(r.la.data, r.lb.data, r.la.size) == 0);
  REQUIRE(r.a->free_batch(batch));
}

TEST_CASE("cancel during a loss burst: tasks whose slices wait to retry end CANCELED promptly") {
  const auto devs = tide::test::devices_under_test();
  const auto netdevs = loss_burst::netdevs(devs[0], devs[1]);
  if (!netdevs) return;
  pair_rig r(devs[0], devs[1], 20s);
  loss_burst loss(*netdevs);
  const auto batch = r.submit_all();
  // Long enough for several failed rounds: the slices wait in their backoff.
  std::this_thread::sleep_for(800ms);
  REQUIRE(r.a->batch_status(batch).value().state == transfer_state::pending);
  const auto t0 = clock_type::now();
  REQUIRE(r.a->cancel(batch));
  REQUIRE(r.a->wait(batch, 10s));
  const double took = ms_since(t0);
  MESSAGE("every task final " << took << " ms after cancel()");
  CHECK(took < 1000.0 * time_scale());
  const auto t = r.count(batch);
  CHECK(t.canceled + t.completed == kRequests);
  CHECK(t.canceled > 0);
  loss.end();
  REQUIRE(r.a->free_batch(batch));
}

TEST_CASE("transfer_timeout shorter than a loss burst: every task final soon after its deadline") {
  const auto devs = tide::test::devices_under_test();
  const auto netdevs = loss_burst::netdevs(devs[0], devs[1]);
  if (!netdevs) return;
  pair_rig r(devs[0], devs[1], 1500ms);
  loss_burst loss(*netdevs);
  const auto t0 = clock_type::now();
  const auto batch = r.submit_all();
  REQUIRE(r.a->wait(batch, 10s));
  const double took = ms_since(t0);
  MESSAGE("every task final " << took << " ms after submit (transfer_timeout 1500 ms)");
  CHECK(took < 2500.0 * time_scale());
  const auto t = r.count(batch);
  CHECK(t.failed + t.timeout == kRequests);
  loss.end();
  REQUIRE(r.a->free_batch(batch));
}
