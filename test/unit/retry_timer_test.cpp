// detail::retry_timer and its backoff schedule, without devices: slices of
// real batch_state tasks are parked and come back through `resume` in due
// order, never early; a canceled task's parked slices retire within one
// stop_poll (one marked before its park is refused); a retry past the
// deadline is refused; close() retires every
// parked slice at once with its own failure and refuses later parks.
#include <tide/rdma/detail/retry_timer.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

using namespace tide;
using namespace std::chrono_literals;
using rdma::detail::retry_backoff;
using rdma::detail::retry_timer;
using rdma::detail::slice;

namespace {

// `tasks` tasks of one slice each, submitted the way the transport does.
struct fake_batch {
  explicit fake_batch(std::size_t tasks, std::chrono::milliseconds timeout = 60s) : b(tasks) {
    for (std::size_t i = 0; i < tasks; ++i) {
      rdma::detail::reset_task(b.tasks[i], 1, 0, std::chrono::steady_clock::now() + timeout);
      b.tasks[i].slices[0] = {};
      b.tasks[i].slices[0].task = &b.tasks[i];
      b.tasks[i].slices[0].length = 10;
    }
    b.unfinished.store(tasks);
    b.inflight.store(tasks);
    b.used.store(tasks);
  }
  slice& s(std::size_t i) { return b.tasks[i].slices[0]; }
  transfer_state state(std::size_t i) const { return b.tasks[i].state.load(); }
  rdma::detail::batch_state b;
};

// What `resume` saw, in order.
struct resumed {
  std::mutex mu;
  std::vector<std::pair<slice*, errc>> got;
  std::vector<std::chrono::steady_clock::time_point> at;
  retry_timer::resume_fn fn(errc retire_with = errc::ok) {
    return [this, retire_with](slice& s, errc e) {
      {
        std::lock_guard lock(mu);
        got.emplace_back(&s, e);
        at.push_back(std::chrono::steady_clock::now());
      }
      rdma::detail::retire_wr(s, retire_with);
    };
  }
  std::size_t count() {
    std::lock_guard lock(mu);
    return got.size();
  }
};

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("retry_backoff: the first retry at once, then first, doubling, capped; no overflow") {
  const retry_backoff b;
  CHECK(b.delay(0) == 0ns);
  CHECK(b.delay(1) == 4ms);
  CHECK(b.delay(2) == 8ms);
  CHECK(b.delay(3) == 16ms);
  CHECK(b.delay(6) == 128ms);
  CHECK(b.delay(7) == 200ms);
  CHECK(b.delay(64) == 200ms);
  CHECK(b.delay(255) == 200ms);
  CHECK(b.delay(~0u) == 200ms);
  const retry_backoff odd{3ms, 10ms, 1ms};
  CHECK(odd.delay(1) == 3ms);
  CHECK(odd.delay(2) == 6ms);
  CHECK(odd.delay(3) == 10ms);
  CHECK(odd.delay(200) == 10ms);
}

TEST_CASE("retry_timer: slices come back through resume in due order, not before they are due, once each") {
  fake_batch fb(4);
  resumed r;
  retry_timer timer(r.fn());
  CHECK(timer.parked() == 0);
  const std::chrono::milliseconds delays[] = {60ms, 20ms, 100ms, 40ms};
  const errc errors[] = {errc::transport_retry_exceeded, errc::work_request_flushed, errc::remote_operation_error,
                         errc::qp_state_error};
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::size_t>> due;  // the first park starts the thread
  for (std::size_t i = 0; i < 4; ++i) {
    const auto now = std::chrono::steady_clock::now();
    REQUIRE(timer.park(fb.s(i), errors[i], delays[i]) == retry_timer::park_result::parked);
    due.emplace_back(now + delays[i], i);
  }
  CHECK(timer.parked() == 4);
  std::sort(due.begin(), due.end());
  REQUIRE(eventually([&] { return r.count() == 4; }, 5s));
  CHECK(timer.parked() == 0);
  for (std::size_t k = 0; k < 4; ++k) {
    const std::size_t i = due[k].second;
    CHECK(r.got[k].first == &fb.s(i));
    CHECK(r.got[k].second == errors[i]);
    CHECK(r.at[k] >= due[k].first);
    CHECK(fb.state(i) == transfer_state::completed);  // resume retired it ok
  }
  CHECK(fb.b.unfinished.load() == 0);
  CHECK(fb.b.inflight.load() == 0);
}

TEST_CASE("retry_timer: a canceled task's parked slices retire within a stop poll, without resume") {
  fake_batch fb(4);
  resumed r;
  retry_timer timer(r.fn(), retry_backoff{4ms, 200ms, 10ms});
  // Marked before it is parked: refused, the caller retires it.
  rdma::detail::stop_task(fb.b.tasks[3], transfer_state::timeout, errc::timed_out);
  CHECK(timer.park(fb.s(3), errc::transport_retry_exceeded, 1s) == retry_timer::park_result::stopped);
  rdma::detail::retire_wr(fb.s(3), errc::timed_out);
  CHECK(fb.state(3) == transfer_state::timeout);
  for (std::size_t i = 0; i < 3; ++i)
    REQUIRE(timer.park(fb.s(i), errc::transport_retry_exceeded, 10s) == retry_timer::park_result::parked);
  const auto t0 = std::chrono::steady_clock::now();
  rdma::detail::stop_task(fb.b.tasks[1], transfer_state::canceled, errc::canceled);
  fb.b.canceled.store(true);  // batch cancel: the other two go too (should_drop marks them)
  rdma::detail::stop_task(fb.b.tasks[0], transfer_state::canceled, errc::canceled);
  REQUIRE(eventually([&] { return fb.b.unfinished.load() == 0; }, 2s));
  const auto took = std::chrono::steady_clock::now() - t0;
  MESSAGE("canceled tasks final after " << std::chrono::duration<double, std::milli>(took).count() << " ms");
  CHECK(took < 500ms);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(fb.state(i) == transfer_state::canceled);
    CHECK(fb.b.tasks[i].reason.load() == errc::canceled);
  }
  CHECK(r.count() == 0);
  CHECK(timer.parked() == 0);
}

TEST_CASE("retry_timer: a retry that would start at or after the deadline is refused; the slice stays the caller's") {
  fake_batch fb(1, 50ms);
  resumed r;
  retry_timer timer(r.fn());
  CHECK(retry_timer::before_deadline(fb.s(0), 0ns));
  CHECK_FALSE(retry_timer::before_deadline(fb.s(0), 1s));
  CHECK(timer.park(fb.s(0), errc::transport_retry_exceeded, 1s) == retry_timer::park_result::past_deadline);
  CHECK(timer.parked() == 0);
  CHECK(fb.state(0) == transfer_state::pending);
  rdma::detail::retire_wr(fb.s(0), errc::transport_retry_exceeded);
  CHECK(fb.state(0) == transfer_state::failed);
  CHECK(r.count() == 0);
}

TEST_CASE("retry_timer: close() retires every parked slice at once with its own failure; later parks are refused") {
  fake_batch fb(3);
  resumed r;
  retry_timer timer(r.fn());
  REQUIRE(timer.park(fb.s(0), errc::transport_retry_exceeded, 30s) == retry_timer::park_result::parked);
  REQUIRE(timer.park(fb.s(1), errc::remote_operation_error, 20s) == retry_timer::park_result::parked);
  const auto t0 = std::chrono::steady_clock::now();
  timer.close();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(fb.state(0) == transfer_state::failed);
  CHECK(fb.b.tasks[0].reason.load() == errc::transport_retry_exceeded);
  CHECK(fb.state(1) == transfer_state::failed);
  CHECK(fb.b.tasks[1].reason.load() == errc::remote_operation_error);
  CHECK(timer.park(fb.s(2), errc::transport_retry_exceeded, 1ms) == retry_timer::park_result::closed);
  CHECK(fb.state(2) == transfer_state::pending);
  timer.close();  // idempotent
  rdma::detail::retire_wr(fb.s(2), errc::canceled);
  CHECK(r.count() == 0);
  CHECK(fb.b.unfinished.load() == 0);
  CHECK(fb.b.inflight.load() == 0);
}

TEST_CASE("retry_timer: parks from several threads while slices come due and close() races them: each slice once") {
  constexpr std::size_t kThreads = 4, kPerThread = 200;
  fake_batch fb(kThreads * kPerThread);
  resumed r;
  auto timer = std::make_unique<retry_timer>(r.fn(), retry_backoff{1ms, 5ms, 2ms});
  std::atomic<std::size_t> refused{0};
  std::vector<std::thread> parkers;
  for (std::size_t t = 0; t < kThreads; ++t)
    parkers.emplace_back([&, t] {
      for (std::size_t i = 0; i < kPerThread; ++i) {
        slice& s = fb.s(t * kPerThread + i);
        const auto d = std::chrono::microseconds((i * 37) % 3000);
        if (timer->park(s, errc::work_request_flushed, d) != retry_timer::park_result::parked) {
          rdma::detail::retire_wr(s, errc::work_request_flushed);
          refused.fetch_add(1);
        }
        if (i % 16 == 0) std::this_thread::sleep_for(100us);
      }
    });
  std::this_thread::sleep_for(10ms);
  timer->close();
  for (auto& p : parkers) p.join();
  // Every slice retired exactly once: resumed (completed), retired by close
  // (failed) or refused (failed).  A double retirement would wrap the counts.
  CHECK(fb.b.unfinished.load() == 0);
  CHECK(fb.b.inflight.load() == 0);
  std::size_t completed = 0, failed = 0;
  for (std::size_t i = 0; i < kThreads * kPerThread; ++i) {
    completed += fb.state(i) == transfer_state::completed;
    failed += fb.state(i) == transfer_state::failed;
  }
  MESSAGE(completed << " resumed, " << failed << " failed (" << refused.load() << " refused after close)");
  CHECK(completed == r.count());
  CHECK(completed + failed == kThreads * kPerThread);
}
