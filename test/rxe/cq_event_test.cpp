// cq_event and spin_event on a real CQ (Soft-RoCE in the VM): a completion wakes a worker
// that sleeps in epoll, again and again (re-arming), wake() still works,
// events are acknowledged so that ibv_destroy_cq returns, attach rejects
// bad arguments, and an idle worker uses (almost) no CPU.
// Exits 77 (skipped) where no RDMA device exists.

#define DOCTEST_CONFIG_IMPLEMENT
#include "loopback_qp.hpp"

#include <tide/policy/cq_event.hpp>
#include <tide/policy/spin_event.hpp>

#include <doctest/doctest.h>

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using tide::testing::loopback_qp;

namespace {

// Kills the process if a step hangs (ibv_destroy_cq blocks forever on
// unacknowledged events): a hang must fail, not stall CI.
class watchdog {
 public:
  explicit watchdog(std::chrono::seconds limit, const char* what)
      : th_([this, limit, what] {
          const auto until = clk::now() + limit;
          while (!done_.load() && clk::now() < until) std::this_thread::sleep_for(10ms);
          if (!done_.load()) {
            std::fprintf(stderr, "watchdog: '%s' still running after %lld s\n", what,
                         static_cast<long long>(limit.count()));
            std::_Exit(1);
          }
        }) {}
  ~watchdog() {
    done_ = true;
    th_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread th_;
};

// The worker of <tide/policy/idle.hpp>: a pass polls the CQ and takes
// "submitted" items; counts completions.
template <class Idle>
struct worker {
  worker(Idle& idle, ibv_cq* cq) : idle_(idle), cq_(cq) {}

  void run() {
    th_ = std::thread([this] {
      auto pass = [this]() noexcept {
        ibv_wc wc[16];
        const int n = ::ibv_poll_cq(cq_, 16, wc);
        for (int i = 0; i < n; ++i) {
          if (wc[i].status != IBV_WC_SUCCESS) bad_.fetch_add(1);
        }
        if (n > 0) completions_.fetch_add(static_cast<unsigned>(n), std::memory_order_release);
        const auto s = submitted_.load(std::memory_order_acquire);
        const bool took = s != taken_.load(std::memory_order_relaxed);
        if (took) taken_.store(s, std::memory_order_release);
        return n > 0 || took;
      };
      while (!quit_.load(std::memory_order_acquire)) {
        if (pass()) {
          idle_.on_work();
          last_work_sleeps_.store(idle_.sleeps(), std::memory_order_release);
          continue;
        }
        idle_.on_empty(pass);
      }
      timespec ts{};
      ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      cpu_ns_ = ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
    });
  }
  void stop() {
    quit_ = true;
    idle_.wake();
    th_.join();
  }
  // Waits until the worker has entered a sleep since its last useful pass.
  bool asleep(std::chrono::milliseconds bound) const {
    const auto until = clk::now() + bound;
    while (idle_.sleeps() <= last_work_sleeps_.load(std::memory_order_acquire)) {
      if (clk::now() > until) return false;
      std::this_thread::sleep_for(200us);
    }
    std::this_thread::sleep_for(5ms);  // well inside epoll_wait by now
    return true;
  }
  template <class Counter>
  static bool reaches(const Counter& c, std::uint64_t value, std::chrono::milliseconds bound) {
    const auto until = clk::now() + bound;
    while (c.load(std::memory_order_acquire) < value) {
      if (clk::now() > until) return false;
      std::this_thread::sleep_for(100us);
    }
    return true;
  }

  Idle& idle_;
  ibv_cq* cq_;
  std::atomic<std::uint64_t> completions_{0};
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> taken_{0};
  std::atomic<int> bad_{0};
  std::atomic<std::uint64_t> last_work_sleeps_{0};
  std::atomic<bool> quit_{false};
  long long cpu_ns_ = 0;
  std::thread th_;
};

// A 20 s cap: a wake-up within the test's bounds came from the CQ event.
template <class Idle>
tide::result<Idle> make_sleepy();
template <>
tide::result<tide::policy::cq_event> make_sleepy() {
  return tide::policy::cq_event::create({.max_sleep = 20000ms, .ack_batch = 4});
}
template <>
tide::result<tide::policy::spin_event> make_sleepy() {
  return tide::policy::spin_event::create({.spin = 1ms, .max_sleep = 20000ms, .ack_batch = 4});
}

}  // namespace

TEST_CASE_TEMPLATE("cq_event, spin_event: completions wake a sleeping worker, with no wake() call", Idle,
                   tide::policy::cq_event, tide::policy::spin_event) {
  loopback_qp lb;
  const std::string err = lb.open();
  REQUIRE_MESSAGE(err.empty(), err);
  MESSAGE("device " << std::string(lb.device_name()));
  {
    auto idle = make_sleepy<Idle>();
    REQUIRE(idle.has_value());
    REQUIRE(idle->attach(lb.cq(), lb.channel()).has_value());
    worker<Idle> w(*idle, lb.cq());
    w.run();
    constexpr int kRounds = 10;
    double worst_ms = 0;
    for (int i = 0; i < kRounds; ++i) {
      REQUIRE(w.asleep(5000ms));
      const auto before = idle->cq_events();
      const auto t0 = clk::now();
      REQUIRE(lb.post_write(static_cast<std::uint64_t>(i)) == 0);
      REQUIRE(worker<Idle>::reaches(w.completions_, static_cast<std::uint64_t>(i + 1), 5000ms));
      worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(clk::now() - t0).count());
      CHECK(idle->cq_events() > before);  // it was the event, not a spurious return
    }
    MESSAGE("worst post-to-reap latency while asleep: " << worst_ms << " ms over " << kRounds << " rounds");
    CHECK(idle->cq_events() >= kRounds);
    CHECK(w.bad_ == 0);

    SUBCASE("wake() still ends the sleep with a CQ attached") {
      REQUIRE(w.asleep(5000ms));
      w.submitted_.fetch_add(1, std::memory_order_release);
      idle->wake();
      CHECK(worker<Idle>::reaches(w.taken_, 1, 5000ms));
    }
    SUBCASE("an idle worker uses almost no CPU") {
      std::this_thread::sleep_for(1000ms);
      w.stop();
      MESSAGE("worker CPU time over ~1.1 s of run, mostly idle: " << w.cpu_ns_ / 1e6 << " ms");
      CHECK(w.cpu_ns_ < 200'000'000LL);  // generous: TCG emulation is slow
    }
    if (w.th_.joinable()) w.stop();
    watchdog dog(30s, "detach + ibv_destroy_cq");
    idle->detach(lb.cq());  // acknowledges what the ack batches left
    CHECK(lb.close());      // would block forever on unacknowledged events
  }
}

TEST_CASE("cq_event: attach rejects a CQ without its channel, and a second attach") {
  loopback_qp lb;
  const std::string err = lb.open();
  REQUIRE_MESSAGE(err.empty(), err);
  auto idle = tide::policy::cq_event::create();
  REQUIRE(idle.has_value());
  auto no_channel = idle->attach(lb.plain_cq(), nullptr);
  REQUIRE_FALSE(no_channel.has_value());
  CHECK(no_channel.error().code == tide::errc::invalid_argument);
  auto wrong_channel = idle->attach(lb.plain_cq(), lb.channel());  // made without a channel
  REQUIRE_FALSE(wrong_channel.has_value());
  CHECK(wrong_channel.error().code == tide::errc::invalid_argument);
  REQUIRE(idle->attach(lb.cq(), lb.channel()).has_value());
  auto twice = idle->attach(lb.cq(), lb.channel());
  REQUIRE_FALSE(twice.has_value());
  CHECK(twice.error().code == tide::errc::already_exists);
  idle->detach(lb.cq());
}

int main(int argc, char** argv) {
  if (loopback_qp::device_count() == 0) {
    std::fprintf(stderr, "no RDMA device: skipped (exit 77)\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
