// (d) idle strategies: wake-up latency (p50/p99) after the worker has gone
// idle, and the CPU time a worker uses while idle.  On the host: busy_poll,
// hybrid, and cq_event on its eventfd alone (no device).  With --rdma (in
// the VM): completions on a real CQ wake cq_event (no wake() call), and
// hybrid for comparison (a completion does not wake it).

#include "common.hpp"

#include "../../test/rxe/loopback_qp.hpp"

#include <tide/policy/busy_poll.hpp>
#include <tide/policy/cq_event.hpp>
#include <tide/policy/hybrid.hpp>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace tide::bench {
namespace {

using namespace std::chrono_literals;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

// A transfer worker per <tide/policy/idle.hpp>.  Work is either a new
// timestamp in the mailbox (software submission, woken by wake()) or a
// completion on the CQ (the producer stamps the mailbox, then posts).
template <class I>
class worker {
 public:
  worker(I& idle, ibv_cq* cq, std::size_t expected) : idle_(idle), cq_(cq) { lat_us_.reserve(expected); }

  void start() {
    th_ = std::thread([this] {
      const double cpu0 = thread_cpu_seconds();
      auto pass = [this]() noexcept { return this->pass(); };
      while (!quit_.load(std::memory_order_acquire)) {
        if (pass()) {
          idle_.on_work();
          continue;
        }
        idle_.on_empty(pass);
      }
      cpu_s_ = thread_cpu_seconds() - cpu0;
    });
  }
  void stop() {
    quit_.store(true, std::memory_order_release);
    idle_.wake();
    th_.join();
  }
  void stamp(std::int64_t ns) { mailbox_.store(ns, std::memory_order_release); }
  std::size_t received() const { return received_.load(std::memory_order_acquire); }

  std::vector<double> lat_us_;
  double cpu_s_ = 0;

 private:
  bool pass() noexcept {
    if (cq_ != nullptr) {
      ibv_wc wc[16];
      const int n = ::ibv_poll_cq(cq_, 16, wc);
      if (n <= 0) return false;
      record();
      return true;
    }
    const std::int64_t m = mailbox_.load(std::memory_order_acquire);
    if (m == seen_) return false;
    seen_ = m;
    record();
    return true;
  }
  void record() noexcept {
    const std::int64_t sent = mailbox_.load(std::memory_order_acquire);
    if (lat_us_.size() < lat_us_.capacity()) lat_us_.push_back(static_cast<double>(now_ns() - sent) / 1e3);
    received_.fetch_add(1, std::memory_order_release);
  }

  I& idle_;
  ibv_cq* cq_;
  std::atomic<std::int64_t> mailbox_{0};
  std::int64_t seen_ = 0;
  std::atomic<std::size_t> received_{0};
  std::atomic<bool> quit_{false};
  std::thread th_;
};

struct latency_result {
  double p50 = 0, p99 = 0;
  std::size_t samples = 0;
};

// `samples` submissions, each after `gap` of silence; the producer either
// calls wake() (software work) or posts an RDMA WRITE (cq != nullptr).
template <class I>
latency_result latency(I& idle, testing::loopback_qp* lb, int samples, std::chrono::microseconds gap) {
  worker<I> w(idle, lb != nullptr ? lb->cq() : nullptr, static_cast<std::size_t>(samples));
  w.start();
  for (int i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(gap);
    w.stamp(now_ns());
    if (lb != nullptr) {
      if (lb->post_write() != 0) std::abort();
    } else {
      idle.wake();
    }
    const auto until = clk::now() + 5s;
    while (w.received() < static_cast<std::size_t>(i + 1) && clk::now() < until) std::this_thread::yield();
  }
  w.stop();
  return {percentile(w.lat_us_, 50), percentile(w.lat_us_, 99), w.lat_us_.size()};
}

template <class I>
double idle_cpu_percent(I& idle, ibv_cq* cq, double seconds) {
  worker<I> w(idle, cq, 0);
  const auto t0 = clk::now();
  w.start();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  w.stop();
  return 100.0 * w.cpu_s_ / seconds_since(t0);
}

struct strategy_row {
  std::string name;
  std::vector<double> p50, p99, cpu;
  std::string gap;
};

}  // namespace

nlohmann::json idle_strategies(const options& o) {
  const int samples = o.quick ? 60 : 200;
  const int reps = o.quick ? 1 : std::min(o.repeats, 3);
  const auto gap = 3ms;  // > hybrid's 1 ms spin below: the worker is asleep
  std::vector<strategy_row> rows;

  auto measure = [&](const std::string& name, auto make, testing::loopback_qp* lb, int n, auto gap_used) {
    strategy_row r{name, {}, {}, {}, std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(gap_used).count()) + " ms"};
    for (int i = 0; i < reps; ++i) {
      auto idle = make();
      if (lb != nullptr && !idle.attach(lb->cq(), lb->channel())) std::abort();
      const auto l = latency(idle, lb, n, gap_used);
      r.p50.push_back(l.p50);
      r.p99.push_back(l.p99);
      if (lb != nullptr) idle.detach(lb->cq());
    }
    for (int i = 0; i < reps; ++i) {
      auto idle = make();
      if (lb != nullptr && !idle.attach(lb->cq(), lb->channel())) std::abort();
      r.cpu.push_back(idle_cpu_percent(idle, lb != nullptr ? lb->cq() : nullptr, o.idle_seconds));
      if (lb != nullptr) idle.detach(lb->cq());
    }
    rows.push_back(r);
  };

  auto busy = [] { return *policy::busy_poll::create(); };
  auto hybrid_default = [] { return *policy::hybrid::create(); };
  auto hybrid_1ms = [] { return *policy::hybrid::create({.spin = 1ms, .max_sleep = 1s}); };
  auto events = [] { return *policy::cq_event::create(); };

  measure("busy_poll", busy, nullptr, samples, gap);
  measure("hybrid (spin 100 ms, sleep <= 1 s)", hybrid_default, nullptr, samples, gap);
  measure("hybrid (spin 1 ms, sleep <= 1 s)", hybrid_1ms, nullptr, samples, gap);
  measure("cq_event (eventfd only, no device)", events, nullptr, samples, gap);

  testing::loopback_qp lb;
  std::string rdma_note;
  if (o.rdma) {
    const std::string err = lb.open();
    if (!err.empty()) {
      rdma_note = "--rdma: " + err + "; device rows skipped";
    } else {
      rdma_note = std::string("--rdma: device ") + lb.device_name() + ", self-connected RC QP, 8-byte RDMA WRITEs";
      measure("cq_event, CQ completion (no wake())", events, &lb, samples, gap);
      measure("busy_poll, CQ completion", busy, &lb, samples, gap);
      // A completion does not wake hybrid: it waits for the sleep to end.
      measure("hybrid (spin 1 ms, sleep <= 1 s), CQ completion", hybrid_1ms, &lb, o.quick ? 5 : 10, 1500ms);
    }
  }

  table t({"strategy", "gap", "wake-up p50 (us)", "wake-up p99 (us)", "idle CPU (% of a core)"});
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    const stat p50 = stat::of(r.p50), p99 = stat::of(r.p99), cpu = stat::of(r.cpu);
    t.add({r.name, r.gap, p50.text("%.1f"), p99.text("%.1f"), cpu.text("%.2f")});
    out.push_back({{"strategy", r.name}, {"gap", r.gap}, {"p50_us", p50.to_json()}, {"p99_us", p99.to_json()},
                   {"idle_cpu_percent", cpu.to_json()}});
  }
  t.print("(d) idle strategies: wake-up latency after `gap` of silence (" + std::to_string(samples) +
          " samples per run) and worker CPU while idle for " + fmt("%.1f", o.idle_seconds) + " s; median [min-max] of " +
          std::to_string(reps) + " runs");
  std::printf("exact wake-ups (membarrier): %s\n", policy::hybrid::exact_wakeups() ? "yes" : "no (1 ms caps)");
  if (!rdma_note.empty()) std::printf("%s\n", rdma_note.c_str());
  if (lb.cq() != nullptr) lb.close();
  return out;
}

}  // namespace tide::bench
