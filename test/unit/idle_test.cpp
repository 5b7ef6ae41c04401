// Idle strategies on the host: config errors, wake-ups from producers
// (never the sleep cap), lost-wake-up stress, and a conformance test over
// every shipped strategy.  cq_event with a real CQ: test/rxe/cq_event_test.cpp.

#include <tide/policy/busy_poll.hpp>
#include <tide/policy/detail/cpu_headroom.hpp>
#include <tide/policy/cq_event.hpp>
#include <tide/policy/hybrid.hpp>
#include <tide/policy/idle.hpp>
#include <tide/policy/spin_event.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>

namespace pol = tide::policy;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

static_assert(tide::idle_strategy<pol::busy_poll>);
static_assert(tide::idle_strategy<pol::hybrid>);
static_assert(tide::idle_strategy<pol::cq_event>);
static_assert(tide::idle_strategy<pol::spin_event>);

namespace {
struct wake_throws {  // wake() not noexcept: rejected
  static constexpr const char* kName = "x";
  struct config {};
  static tide::result<wake_throws> create(const config&) { return wake_throws{}; }
  tide::status attach(ibv_cq*, ibv_comp_channel*) { return {}; }
  void detach(ibv_cq*) noexcept {}
  void on_work() noexcept {}
  template <class F>
  void on_empty(F&&) noexcept {}
  void wake() {}
};
}  // namespace
static_assert(!tide::idle_strategy<wake_throws>);

// Configurations whose caps are far above the test's bounds: a wake-up that
// arrives within the bound came from wake(), not from the cap.
template <class I>
typename I::config long_sleep_config() {
  return {};
}
template <>
pol::hybrid::config long_sleep_config<pol::hybrid>() {
  return {.spin = 0ns, .max_sleep = 20s};
}
template <>
pol::cq_event::config long_sleep_config<pol::cq_event>() {
  return {.max_sleep = 20000ms, .ack_batch = 64};
}
template <>
pol::spin_event::config long_sleep_config<pol::spin_event>() {
  return {.spin = 100us, .max_sleep = 20000ms, .ack_batch = 64};
}

namespace {
// A worker that follows the protocol of <tide/policy/idle.hpp> over a
// counter of pending items; the producer publishes with a plain release
// increment (the strategy must not depend on a stronger order).
template <class I>
struct harness {
  explicit harness(I& idle) : idle_(idle) {}
  ~harness() { stop(); }

  void start() {
    th_ = std::thread([this] {
      auto pass = [this]() noexcept {
        const std::uint64_t p = pending_.load(std::memory_order_acquire);
        const std::uint64_t d = done_.load(std::memory_order_relaxed);
        if (p == d) return false;
        done_.store(p, std::memory_order_release);
        return true;
      };
      while (!quit_.load(std::memory_order_acquire)) {
        if (pass()) {
          idle_.on_work();
          continue;
        }
        idle_.on_empty(pass);
      }
    });
  }
  void stop() {
    if (!th_.joinable()) return;
    quit_.store(true, std::memory_order_release);
    idle_.wake();
    th_.join();
  }
  void produce() {
    pending_.fetch_add(1, std::memory_order_release);
    idle_.wake();
  }
  // Waits up to `bound` until the worker consumed everything produced.
  bool drained_within(std::chrono::nanoseconds bound) const {
    const auto until = clk::now() + bound;
    while (clk::now() < until) {
      if (done_.load(std::memory_order_acquire) == pending_.load(std::memory_order_relaxed)) return true;
      std::this_thread::sleep_for(50us);
    }
    return false;
  }

  I& idle_;
  std::atomic<std::uint64_t> pending_{0};
  std::atomic<std::uint64_t> done_{0};
  std::atomic<bool> quit_{false};
  std::thread th_;
};
}  // namespace

TEST_CASE("idle strategies: bad configuration gets config_invalid") {
  auto h1 = pol::hybrid::create({.spin = -1ns, .max_sleep = 1s});
  REQUIRE_FALSE(h1.has_value());
  CHECK(h1.error().code == tide::errc::config_invalid);
  auto h2 = pol::hybrid::create({.spin = 0ns, .max_sleep = 0ns});
  REQUIRE_FALSE(h2.has_value());
  CHECK(h2.error().code == tide::errc::config_invalid);
  auto c1 = pol::cq_event::create({.max_sleep = 0ms, .ack_batch = 1});
  REQUIRE_FALSE(c1.has_value());
  CHECK(c1.error().code == tide::errc::config_invalid);
  auto c2 = pol::cq_event::create({.max_sleep = 10ms, .ack_batch = 0});
  REQUIRE_FALSE(c2.has_value());
  CHECK(c2.error().code == tide::errc::config_invalid);
  auto s1 = pol::spin_event::create({.spin = -1ns});
  REQUIRE_FALSE(s1.has_value());
  CHECK(s1.error().detail.find("spin_event.spin") != std::string::npos);
  auto s2 = pol::spin_event::create({.spin = 1us, .max_sleep = 0ms});
  REQUIRE_FALSE(s2.has_value());
  CHECK(s2.error().code == tide::errc::config_invalid);
}

TEST_CASE("cq_event: attach needs a CQ and its completion channel") {
  auto c = pol::cq_event::create();
  REQUIRE(c.has_value());
  auto r = c->attach(nullptr, nullptr);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == tide::errc::invalid_argument);
  c->detach(nullptr);  // unknown: no effect
}

TEST_CASE("membarrier is available here (exact wake-ups)") {
  // Not a requirement of the library (it falls back to 1 ms caps), but the
  // wake-up tests below are only meaningful when it holds; say so if not.
  if (!pol::hybrid::exact_wakeups()) MESSAGE("membarrier unavailable: sleeps capped at 1 ms");
  CHECK(pol::busy_poll::exact_wakeups());
}

// The spinning strategies with a spin window of `spin` and a 20 s sleep cap.
template <class I>
typename I::config window_config(std::chrono::nanoseconds spin);
template <>
pol::hybrid::config window_config<pol::hybrid>(std::chrono::nanoseconds spin) {
  return {.spin = spin, .max_sleep = 20s};
}
template <>
pol::spin_event::config window_config<pol::spin_event>(std::chrono::nanoseconds spin) {
  // The window itself, whatever the load of the host running the test.
  return {.spin = spin, .max_sleep = 20000ms, .adapt = false};
}

TEST_CASE_TEMPLATE("hybrid, spin_event: spin for the window, then sleep; wake() ends the sleep and work restarts the window",
                   I, pol::hybrid, pol::spin_event) {
  constexpr auto kSpin = 200ms;  // long enough to observe on a loaded host
  auto idle = I::create(window_config<I>(kSpin));
  REQUIRE(idle.has_value());
  harness<I> h(*idle);
  const auto t0 = clk::now();
  h.start();
  std::this_thread::sleep_for(5ms);
  // Read the count first, then the clock: if the window had not elapsed by
  // then, the worker cannot have slept yet (this holds however late the
  // scheduler runs this thread).
  const auto early = idle->sleeps();
  if (clk::now() - t0 < kSpin) CHECK(early == 0);
  const auto until = clk::now() + 10s;
  while (idle->sleeps() == 0 && clk::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(idle->sleeps() > 0);  // asleep now, for up to 20 s
  CHECK(clk::now() - t0 >= kSpin);  // and not before the spin window ended
  const auto t_wake = clk::now();
  h.produce();
  CHECK(h.drained_within(2s));  // far below the 20 s cap: wake() did it
  MESSAGE(I::kName << " wake-up observed after " << std::chrono::duration<double, std::micro>(clk::now() - t_wake).count()
                   << " us (including the observer's polling)");
  // The work restarted the window: no second sleep within it.
  const auto after_work = idle->sleeps();
  const auto t1 = clk::now();
  std::this_thread::sleep_for(20ms);
  if (clk::now() - t1 < kSpin - 50ms) CHECK(idle->sleeps() == after_work);
  h.stop();
}

TEST_CASE_TEMPLATE("idle conformance: every item produced is consumed promptly", I, pol::busy_poll, pol::hybrid,
                   pol::cq_event, pol::spin_event) {
  auto idle = I::create(long_sleep_config<I>());
  REQUIRE(idle.has_value());
  harness<I> h(*idle);
  h.start();
  SUBCASE("single items after idle periods") {
    for (int i = 0; i < 20; ++i) {
      std::this_thread::sleep_for(2ms);  // let the worker go to sleep
      h.produce();
      REQUIRE(h.drained_within(2s));
    }
  }
  SUBCASE("lost wake-up stress: 3 producers, random gaps") {
    // A lost wake-up would leave an item pending until the 20 s cap.
    std::vector<std::thread> ps;
    for (int p = 0; p < 3; ++p) {
      ps.emplace_back([&, p] {
        for (int i = 0; i < 300; ++i) {
          h.produce();
          if ((i + p) % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 5)));
        }
      });
    }
    for (auto& t : ps) t.join();
    CHECK(h.drained_within(3s));
    CHECK(h.pending_.load() == 900);
  }
  h.stop();
}

// spin_event's adaptation, as a unit: the score fed synthetic samples (the
// kernel's runnable-thread count against the CPUs), and the /proc/loadavg
// parser.  The live sampler runs in every spin_event case above.
TEST_CASE("cpu headroom: spinning stops on a crowded host and comes back on a quiet one") {
  using hs = pol::detail::headroom_score;
  constexpr std::uint32_t kCpus = 2;
  std::uint32_t score = 0;
  CHECK(hs::spin_pays(score));  // no sample yet: spin, as before
  // Quiet: the sampler and one other spinner of ours on 2 CPUs.
  for (int i = 0; i < 100; ++i) score = hs::next(score, 2, kCpus);
  CHECK(hs::spin_pays(score));
  // A kernel thread runnable for a moment, one sample in four: still spin.
  for (int i = 0; i < 100; ++i) score = hs::next(score, i % 4 == 0 ? 3 : 2, kCpus);
  CHECK(hs::spin_pays(score));
  // One busy loop per CPU (plus the sampler): spinning stops within three samples ...
  int crowded = 0;
  while (hs::spin_pays(score) && crowded < 100) {
    score = hs::next(score, kCpus + 1, kCpus);
    ++crowded;
  }
  CHECK(crowded <= 3);
  CHECK_FALSE(hs::spin_pays(score));
  // ... and stays stopped while the load lasts, whatever our own threads do.
  for (int i = 0; i < 100; ++i) score = hs::next(score, kCpus + 1 + static_cast<std::uint32_t>(i % 3), kCpus);
  CHECK_FALSE(hs::spin_pays(score));
  // A sample without information (unparsable text, unknown CPU count) changes nothing.
  CHECK(hs::next(score, 0, kCpus) == score);
  CHECK(hs::next(score, 5, 0) == score);
  // The load ends: spinning is back within three quiet samples.
  int quiet = 0;
  while (!hs::spin_pays(score) && quiet < 100) {
    score = hs::next(score, 1, kCpus);
    ++quiet;
  }
  CHECK(quiet <= 3);
  CHECK(hs::spin_pays(score));
  // Many CPUs: 12 runnable threads on 16 is not crowded, 17 is.
  CHECK_FALSE(hs::crowded(12, 16));
  CHECK_FALSE(hs::crowded(16, 16));
  CHECK(hs::crowded(17, 16));
}

TEST_CASE("spin window: a check that says spinning no longer pays ends the window at the next clock reading") {
  pol::detail::spin_window w(10s);
  bool pays = true;
  std::chrono::nanoseconds last_spun{-1};
  int asked = 0;
  auto still_pays = [&](std::chrono::nanoseconds spun) noexcept {
    ++asked;
    CHECK(spun >= last_spun);  // the time spun so far, from the window's first empty pass
    last_spun = spun;
    return pays;
  };
  for (int i = 0; i < 1000; ++i) REQUIRE(w.spin(still_pays));
  CHECK(asked == 1000 / 64);  // asked where the clock is read, every 64th pass
  pays = false;
  int more = 0;
  while (w.spin(still_pays) && more < 1000) ++more;
  CHECK(more < 64);
  CHECK_FALSE(w.spin(still_pays));  // expired until reset()
  w.reset();
  pays = true;
  CHECK(w.spin(still_pays));
}

TEST_CASE("spin_event: a window ends early once the host has more runnable threads than CPUs") {
  // A spinner keeps its CPU until its window ends, so the thread it has just
  // woken (a notification's reader) waited the whole window for a CPU.
  if (::access("/proc/loadavg", R_OK) != 0) {
    MESSAGE("no /proc/loadavg: spin_event cannot see the host's load here");
    return;
  }
  auto idle = pol::spin_event::create({.spin = 30s, .max_sleep = 20000ms, .adapt = true});
  REQUIRE(idle.has_value());
  harness<pol::spin_event> h(*idle);
  h.start();
  h.produce();  // work: the next empty pass opens a 30 s window
  REQUIRE(h.drained_within(5s));
  std::this_thread::sleep_for(20ms);
  if (idle->sleeps() != 0) {  // the host was crowded already: no window opened
    MESSAGE("the host is crowded already: spin_event did not spin, nothing to end");
    return;
  }
  // One busy thread per CPU and one more: runnable threads > CPUs while they run.
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  REQUIRE(cpus > 0);
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (long i = 0; i <= cpus; ++i)
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) tide::detail::cpu_relax();
    });
  const auto t0 = clk::now();
  while (idle->sleeps() == 0 && clk::now() - t0 < 10s) std::this_thread::sleep_for(1ms);
  const auto waited = clk::now() - t0;
  stop = true;
  for (auto& t : busy) t.join();
  CHECK(idle->sleeps() > 0);  // asleep long before the 30 s window's end
  MESSAGE("the window ended " << std::chrono::duration<double, std::milli>(waited).count()
                              << " ms after the host became crowded");
  h.stop();
}

TEST_CASE("cpu headroom: /proc/loadavg's runnable count") {
  const auto parse = [](std::string_view s) { return pol::detail::parse_loadavg_running(s.data(), s.size()); };
  CHECK(parse("0.22 0.95 1.49 3/456 12345\n") == 3);
  CHECK(parse("12.00 11.50 9.25 17/1024 99") == 17);
  CHECK(parse("0.00 0.00 0.00 1/80 7") == 1);
  CHECK(parse("") == 0);
  CHECK(parse("0.22 0.95 1.49") == 0);           // no fourth field
  CHECK(parse("0.22 0.95 1.49 3") == 0);         // no "/total"
  CHECK(parse("0.22 0.95 1.49 x/456 1") == 0);   // not a number
  CHECK(parse("0.22 0.95 1.49 12345678901/4 1") == 0);  // absurdly long: refused, not overflowed
  static_assert(pol::detail::parse_loadavg_running("0 0 0 5/9 1", 11) == 5);
}

TEST_CASE("cpu headroom: the live sampler answers from any thread") {
  // Whatever this host's load, every thread gets a verdict at once (TSan
  // checks the sampler's sharing).
  std::vector<std::thread> ts;
  std::atomic<int> answers{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        (void)pol::detail::cpu_headroom::spin_pays();
        (void)pol::detail::cpu_headroom::crowded_now();
        answers.fetch_add(1, std::memory_order_relaxed);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(answers.load() == 4 * 2000);
}
