// rdma::batch_table and the slice -> task -> batch roll-up, without devices:
// ids (stale, never allocated, exhausted), concurrent allocate / free /
// lookup (run under TSan by tools/sanitize), first cause, final means final.
#include <tide/rdma/batch_table.hpp>
#include <tide/rdma/detail/task_telemetry.hpp>
#include <tide/detail/sharded_shared_mutex.hpp>  // cpu_relax

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace tide;
using rdma::batch_table;

namespace {

std::unique_ptr<batch_table> make_table(std::size_t max_batches,
                                       std::size_t max_tasks = batch_table::kDefaultMaxTasks) {
  auto t = batch_table::create(max_batches, max_tasks);
  REQUIRE(t);
  return std::move(*t);
}

// Submits `slices` slices per task to `tasks` tasks of `b` the way the
// transport's submit does (reset, then publish `used`).
void fake_submit(rdma::detail::batch_state& b, std::size_t tasks, std::size_t slices,
                 std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  std::lock_guard lock(b.submit_mu);
  const std::size_t used = b.used.load();
  for (std::size_t i = used; i < used + tasks; ++i) {
    rdma::detail::reset_task(b.tasks[i], slices, 0, std::chrono::steady_clock::now() + timeout);
    for (auto& s : b.tasks[i].slices) {
      s = {};
      s.task = &b.tasks[i];
      s.length = 10;
    }
  }
  b.unfinished.fetch_add(tasks);
  b.inflight.fetch_add(tasks * slices);
  b.used.store(used + tasks);
}

std::chrono::milliseconds stress_duration() {
  const char* ms = std::getenv("TIDE_STRESS_MS");
  return std::chrono::milliseconds(ms != nullptr ? std::atoi(ms) : 500);
}

}  // namespace

TEST_CASE("batch_table: never-allocated, freed and stale ids are unknown_batch") {
  auto t = make_table(4);
  CHECK(t->lookup(0) == nullptr);
  CHECK(t->task_status(0, 0).error().code == errc::unknown_batch);
  CHECK(t->batch_status(3).error().code == errc::unknown_batch);
  CHECK(t->wait(1, std::chrono::milliseconds(1)).error().code == errc::unknown_batch);
  CHECK(t->cancel(2).error().code == errc::unknown_batch);
  CHECK(t->free(2).error().code == errc::unknown_batch);
  CHECK(t->lookup(batch_id{1} << 40) == nullptr);  // slot beyond max_batches

  const batch_id a = t->allocate(2).value();
  REQUIRE(t->lookup(a) != nullptr);
  CHECK(t->batch_status(a).value().state == transfer_state::waiting);
  CHECK(t->task_status(a, 0).error().code == errc::unknown_task);
  REQUIRE(t->free(a));
  CHECK(t->lookup(a) == nullptr);
  CHECK(t->free(a).error().code == errc::unknown_batch);
  // The slot is reused under a new generation; the old id stays dead.
  const batch_id b = t->allocate(2).value();
  CHECK((b & 0xffffffffu) == (a & 0xffffffffu));
  CHECK(b != a);
  CHECK(t->lookup(a) == nullptr);
  CHECK(t->lookup(b) != nullptr);
  CHECK(t->batch_status(a).error().code == errc::unknown_batch);
}

TEST_CASE("batch_table: exhausting max_batches names the limit; freeing makes room") {
  auto t = make_table(3);
  std::vector<batch_id> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(t->allocate(1).value());
  auto r = t->allocate(1);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::resource_exhausted);
  CHECK(r.error().detail.find("all 3 batches") != std::string::npos);
  CHECK(r.error().detail.find("max_batches") != std::string::npos);
  CHECK(t->live_batches() == 3);
  REQUIRE(t->free(ids[1]));
  CHECK(t->allocate(1));
  CHECK(t->allocate(0).error().code == errc::capacity_zero);
  CHECK(batch_table::create(0).error().code == errc::config_invalid);
}

TEST_CASE("batch_table: a slot too small for a new batch keeps its old batch alive") {
  auto t = make_table(1);
  const batch_id a = t->allocate(2).value();
  rdma::detail::batch_state* old = t->lookup(a);
  REQUIRE(old != nullptr);
  REQUIRE(t->free(a));
  const batch_id b = t->allocate(100).value();  // replaces the batch of the only slot
  rdma::detail::batch_state* now = t->lookup(b);
  REQUIRE(now != nullptr);
  CHECK(now != old);
  CHECK(now->capacity >= 100);
  // A late reader of the old batch still reads owned memory, and a dead tag.
  CHECK_FALSE(batch_table::still(*old, a));
  CHECK_FALSE(batch_table::still(*old, b));
  CHECK(old->used.load() == 0);
}

TEST_CASE("batch_table: free of a batch with slices in flight is batch_busy, naming the counts") {
  auto t = make_table(2);
  const batch_id id = t->allocate(2).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 2, 3);
  auto r = t->free(id);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::batch_busy);
  CHECK(r.error().detail.find("2 task(s) unfinished, 6 slice(s) in flight") != std::string::npos);
  for (std::size_t i = 0; i < 2; ++i)
    for (auto& s : b->tasks[i].slices) rdma::detail::retire_slice(s, errc::ok);
  CHECK(t->batch_status(id).value().state == transfer_state::completed);
  CHECK(t->batch_status(id).value().transferred_bytes == 60);
  CHECK(t->free(id));
}

// A free right after wait() was batch_busy ("0 task(s) unfinished, 1
// slice(s) in flight") when the thread retiring the last slice was
// preempted between its task's final state and its last touch of the batch
// for longer than free's 100 ms (a loaded rxe VM, seen from Python).
TEST_CASE("batch_table: a free once every task is final waits out the slices still leaving") {
  auto t = make_table(2);
  const batch_id id = t->allocate(1).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 1, 1);
  // The retiring thread as preempted: the task is final, the slice has not
  // yet given up the batch's in-flight count.
  REQUIRE(rdma::detail::finish_task(b->tasks[0], transfer_state::completed));
  b->tasks[0].slices_left.store(0);
  CHECK(t->batch_status(id).value().state == transfer_state::completed);
  std::thread late([b] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    b->inflight.fetch_sub(1, std::memory_order_release);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = t->free(id);
  const auto took = std::chrono::steady_clock::now() - t0;
  late.join();
  CHECK_MESSAGE(r, (r ? "" : r.error().message()));
  CHECK(took >= std::chrono::milliseconds(350));
}

TEST_CASE("first cause: the first error stays; flushes give way and never overwrite") {
  auto t = make_table(1);
  const batch_id id = t->allocate(3).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 3, 3);
  const std::string peer = "10.47.0.2:15000@rxe1";
  for (std::size_t i = 0; i < 3; ++i)
    for (auto& s : b->tasks[i].slices) {
      s.peer_path = &peer;
      s.local_device = 1;
    }
  // Task 0: a remote access error, then flushes.
  auto& t0 = b->tasks[0].slices;
  rdma::detail::retire_slice(t0[0], errc::remote_access_error);
  rdma::detail::retire_slice(t0[1], errc::work_request_flushed);
  rdma::detail::retire_slice(t0[2], errc::work_request_flushed);
  auto s0 = t->task_status(id, 0).value();
  CHECK(s0.state == transfer_state::failed);
  CHECK(s0.reason == errc::remote_access_error);
  CHECK(s0.failed_local_device == 1);
  CHECK(s0.failed_peer_path == peer);
  // Task 1: a flush first, then the error that caused it.
  auto& t1 = b->tasks[1].slices;
  rdma::detail::retire_slice(t1[0], errc::work_request_flushed);
  rdma::detail::retire_slice(t1[1], errc::transport_retry_exceeded);
  rdma::detail::retire_slice(t1[2], errc::remote_operation_error);
  CHECK(t->task_status(id, 1).value().reason == errc::transport_retry_exceeded);
  // Task 2: timed out first; the flushes that follow do not replace it.
  rdma::detail::stop_task(b->tasks[2], transfer_state::timeout, errc::timed_out);
  for (auto& s : b->tasks[2].slices) rdma::detail::retire_slice(s, errc::work_request_flushed);
  auto s2 = t->task_status(id, 2).value();
  CHECK(s2.state == transfer_state::timeout);
  CHECK(s2.reason == errc::timed_out);
  // The batch reports its first failed task's cause.
  CHECK(t->batch_status(id).value().reason == errc::remote_access_error);
}

TEST_CASE("final means final: TIMEOUT and CANCELED wait for the last slice to retire") {
  auto t = make_table(2);
  const batch_id id = t->allocate(2).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 2, 2, std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Past its deadline: marked, but its WRs are still out, so not final.
  CHECK(t->task_status(id, 0).value().state == transfer_state::pending);
  CHECK(b->tasks[0].stop.load() == transfer_state::timeout);
  CHECK(t->wait(id, std::chrono::milliseconds(150)).error().code == errc::timed_out);
  // Slices not yet posted are dropped.
  CHECK(rdma::detail::should_drop(b->tasks[0].slices[1]) == errc::timed_out);
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    CHECK(t->wait(id, std::chrono::seconds(10)));
    woke = true;
  });
  for (std::size_t i = 0; i < 2; ++i) {
    rdma::detail::retire_slice(b->tasks[i].slices[0], errc::ok);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(woke.load());
    CHECK(t->task_status(id, i).value().state == transfer_state::pending);
    rdma::detail::retire_slice(b->tasks[i].slices[1], errc::timed_out);
    CHECK(t->task_status(id, i).value().state == transfer_state::timeout);
  }
  waiter.join();
  CHECK(woke.load());
  CHECK(t->batch_status(id).value().state == transfer_state::timeout);
  CHECK(t->task_status(id, 0).value().transferred_bytes == 10);
  REQUIRE(t->free(id));

  // Cancel: the same, and slices submitted after the cancel are dropped too.
  const batch_id c = t->allocate(2).value();
  b = t->lookup(c);
  fake_submit(*b, 1, 2);
  REQUIRE(t->cancel(c));
  CHECK(t->task_status(c, 0).value().state == transfer_state::pending);
  rdma::detail::retire_slice(b->tasks[0].slices[0], errc::work_request_flushed);
  rdma::detail::retire_slice(b->tasks[0].slices[1], errc::canceled);
  auto st = t->task_status(c, 0).value();
  CHECK(st.state == transfer_state::canceled);
  CHECK(st.reason == errc::canceled);
  fake_submit(*b, 1, 1);
  CHECK(rdma::detail::should_drop(b->tasks[1].slices[0]) == errc::canceled);
  rdma::detail::retire_slice(b->tasks[1].slices[0], errc::canceled);
  CHECK(t->task_status(c, 1).value().state == transfer_state::canceled);
  CHECK(t->wait(c, std::chrono::seconds(1)));
  CHECK(t->free(c));
}

TEST_CASE("wait's spin: a batch that ends during it returns at once; the spin never outlasts the timeout") {
  using namespace std::chrono;
  auto t = make_table(2);
  const batch_id id = t->allocate(1).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 1, 1);
  // Bounds by events, not by the scheduler: the spin is a minute, so a wait
  // that outlasts its timeout or misses the batch's end takes a minute, while
  // a loaded CI host delays a correct one by milliseconds.
  constexpr auto spin = seconds(60);
  constexpr auto far_below_spin = seconds(30);
  // A spin of a minute on a batch that never ends: the 50 ms timeout still rules.
  auto t0 = steady_clock::now();
  CHECK(t->wait(id, milliseconds(50), spin).error().code == errc::timed_out);
  CHECK(steady_clock::now() - t0 < far_below_spin);
  // The batch ends 20 ms into the spin: wait returns then, not after the spin.
  t0 = steady_clock::now();  // before the finisher starts, so took >= 20 ms
  std::thread finisher([&] {
    std::this_thread::sleep_for(milliseconds(20));
    rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok);
  });
  CHECK(t->wait(id, seconds(120), spin));
  const auto took = steady_clock::now() - t0;
  finisher.join();
  CHECK(took >= milliseconds(20));
  CHECK(took < far_below_spin);
  CHECK(t->batch_status(id).value().state == transfer_state::completed);
  // And after a short spin the sleeping waiter is woken by the last slice.
  const batch_id late = t->allocate(1).value();
  b = t->lookup(late);
  fake_submit(*b, 1, 1);
  std::thread late_finisher([&] {
    std::this_thread::sleep_for(milliseconds(30));
    rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok);
  });
  CHECK(t->wait(late, seconds(10), microseconds(10)));
  late_finisher.join();
  CHECK(t->free(id));
  CHECK(t->free(late));
}

TEST_CASE("batch_table: concurrent allocate / free / lookup / status never mix batches up") {
  // Two owners allocate, submit, retire and free their own batches over
  // and over (sizes vary, so slots get replaced); two readers hammer every
  // id ever handed out.  A reader must see either unknown_batch or the
  // owner's own batch, never another's state.
  auto t = make_table(8);
  std::atomic<bool> stop{false};
  std::vector<std::atomic<batch_id>> seen(64);
  for (auto& s : seen) s = 0;
  std::atomic<std::size_t> next_seen{0};
  std::atomic<std::uint64_t> cycles{0}, hits{0}, misses{0}, exhausted{0};
  auto owner = [&](int seed) {
    std::size_t cap = 1 + static_cast<std::size_t>(seed);
    while (!stop.load(std::memory_order_relaxed)) {
      cap = cap % 37 + 1;
      auto id = t->allocate(cap);
      if (!id) {
        CHECK(id.error().code == errc::resource_exhausted);
        ++exhausted;
        continue;
      }
      seen[next_seen.fetch_add(1) % seen.size()].store(*id);
      auto* b = t->lookup(*id);
      REQUIRE(b != nullptr);
      REQUIRE(b->capacity >= cap);
      fake_submit(*b, cap, 2);
      for (std::size_t i = 0; i < cap; ++i)
        for (auto& s : b->tasks[i].slices) rdma::detail::retire_slice(s, errc::ok);
      auto st = t->batch_status(*id);
      REQUIRE(st);
      CHECK(st->state == transfer_state::completed);
      CHECK(st->transferred_bytes == cap * 20);
      REQUIRE(t->free(*id));
      ++cycles;
    }
  };
  auto reader = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      for (auto& s : seen) {
        const batch_id id = s.load();
        if (auto st = t->batch_status(id)) {
          ++hits;
          CHECK(st->state != transfer_state::failed);
        } else {
          CHECK(st.error().code == errc::unknown_batch);
          ++misses;
        }
        (void)t->lookup(id ^ (batch_id{1} << 32));
      }
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(owner, 1);
  threads.emplace_back(owner, 5);
  threads.emplace_back(reader);
  threads.emplace_back(reader);
  // An allocator that fills the table to its limit now and then.
  threads.emplace_back([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      std::vector<batch_id> held;
      while (auto id = t->allocate(3)) held.push_back(*id);
      for (batch_id id : held) CHECK(t->free(id));
    }
  });
  std::this_thread::sleep_for(stress_duration());
  stop = true;
  for (auto& th : threads) th.join();
  MESSAGE("cycles " << cycles.load() << ", reads hit " << hits.load() << ", missed " << misses.load()
                    << ", exhausted " << exhausted.load());
  CHECK(cycles.load() > 0);
  CHECK(t->live_batches() == 0);
}

TEST_CASE("no exceptions on the hot path: a batch too big for memory is out_of_memory, not bad_alloc") {
  auto t = make_table(2, batch_table::kMaxTasksLimit);
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)  // their allocators abort instead
  auto r = t->allocate(std::size_t{1} << 30);  // ~2^30 tasks: far more than this host has
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::out_of_memory);
  CHECK(r.error().detail.find("1073741824 tasks") != std::string::npos);
#endif
  // The table is intact.
  const batch_id id = t->allocate(4).value();
  CHECK(t->free(id));
  static_assert(noexcept(t->allocate(1)) && noexcept(t->free(1)) && noexcept(t->task_status(1, 0)) &&
                noexcept(t->batch_status(1)) && noexcept(t->wait(1, std::declval<std::chrono::milliseconds>())) &&
                noexcept(t->cancel(1)));
}

namespace {
// Counts batch_final calls per id (the Python module's completion queue in small).
struct counting_listener final : batch_listener {
  std::mutex mu;
  std::vector<batch_id> seen;
  void batch_final(batch_id b) noexcept override {
    std::lock_guard lock(mu);
    seen.push_back(b);
  }
  std::size_t count() {
    std::lock_guard lock(mu);
    return seen.size();
  }
};
}  // namespace

// The last task takes the batch's mutex to wake waiters only when one has
// registered as a sleeper (or a listener is set): a waiter that sleeps must
// be woken by the completion itself, not by wait()'s 100 ms re-check.
TEST_CASE("wait: a sleeping waiter is woken by the last completion, also when the two race") {
  using namespace std::chrono;
  auto t = make_table(2);
  const batch_id id = t->allocate(1).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 1, 1);
  steady_clock::time_point woke{};
  std::thread waiter([&] {
    CHECK(t->wait(id, seconds(10), microseconds(0)));
    woke = steady_clock::now();
  });
  while (b->sleepers.load() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(5));  // inside cv.wait by now
  const auto retired = steady_clock::now();
  rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok);
  waiter.join();
  CHECK(woke - retired < milliseconds(80));
  CHECK(b->sleepers.load() == 0);
  CHECK(t->free(id));
  // Racing: the waiter registers while the last slice retires.  A lost wake
  // costs the 100 ms re-check; a few slow rounds are scheduling, many are a bug.
  int slow = 0;
  for (int round = 0; round < 200; ++round) {
    const batch_id r = t->allocate(1).value();
    auto* rb = t->lookup(r);
    fake_submit(*rb, 1, 1);
    std::thread finisher([&] { rdma::detail::retire_slice(rb->tasks[0].slices[0], errc::ok); });
    const auto t0 = steady_clock::now();
    CHECK(t->wait(r, seconds(10), microseconds(0)));
    if (steady_clock::now() - t0 >= milliseconds(80)) ++slow;
    finisher.join();
    CHECK(t->free(r));
  }
  CHECK(slow <= 2);
}

TEST_CASE("watch: told once when the last task ends, at once when none runs; free and a clear stop it") {
  auto t = make_table(4);
  counting_listener l;
  const batch_id id = t->allocate(2).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 2, 1);
  CHECK(t->watch(id, &l));
  rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok);
  CHECK(l.count() == 0);  // one task still runs
  rdma::detail::retire_slice(b->tasks[1].slices[0], errc::remote_access_error);
  REQUIRE(l.count() == 1);
  CHECK(l.seen[0] == id);
  // Watching a batch that is already final tells at once (the listener may race the end).
  CHECK(t->watch(id, &l));
  CHECK(l.count() == 2);
  CHECK(t->free(id));
  CHECK(t->watch(id, &l).error().code == errc::unknown_batch);  // stale id
  // The slot's next batch does not inherit the listener.
  const batch_id next = t->allocate(1).value();
  auto* nb = t->lookup(next);
  fake_submit(*nb, 1, 1);
  rdma::detail::retire_slice(nb->tasks[0].slices[0], errc::ok);
  CHECK(l.count() == 2);
  // A cleared watch is not told.
  const batch_id third = t->allocate(1).value();
  auto* tb = t->lookup(third);
  fake_submit(*tb, 1, 1);
  CHECK(t->watch(third, &l));
  CHECK(t->watch(third, nullptr));
  rdma::detail::retire_slice(tb->tasks[0].slices[0], errc::ok);
  CHECK(l.count() == 2);
  CHECK(t->free(next));
  CHECK(t->free(third));
}

TEST_CASE("watch: a watch racing the last completion is told exactly once or at once, never lost") {
  auto t = make_table(2);
  for (int round = 0; round < 200; ++round) {
    counting_listener l;
    const batch_id id = t->allocate(1).value();
    auto* b = t->lookup(id);
    fake_submit(*b, 1, 1);
    std::thread finisher([&] { rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok); });
    CHECK(t->watch(id, &l));
    finisher.join();
    // Either the retirement saw the listener, or watch() saw the batch final: at least once, at most twice.
    CHECK(l.count() >= 1);
    CHECK(l.count() <= 2);
    CHECK(t->free(id));
  }
}

// Review turn 3, finding 19: allocate_batch(300'000'000) asked for 64 GiB
// (and kept it for the engine's life); the cap refuses it by name.
TEST_CASE("batch_table: a capacity above max_tasks_per_batch is batch_too_large, naming the limit") {
  auto t = make_table(2, 100);
  auto r = t->allocate(101);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::batch_too_large);
  CHECK(r.error().detail.find("above 100") != std::string::npos);
  CHECK(r.error().detail.find("max_tasks_per_batch") != std::string::npos);
  CHECK(t->allocate(100));
  auto big = make_table(2);  // the default: 64k
  CHECK(big->max_tasks() == 65536);
  CHECK(big->allocate(300'000'000).error().code == errc::batch_too_large);
  CHECK(batch_table::create(1, 0).error().code == errc::config_invalid);
  CHECK(batch_table::create(1, batch_table::kMaxTasksLimit + 1).error().code == errc::config_invalid);
}

namespace {
// What free() and then allocate() do to batch `id`'s tag when allocate hands
// the same batch_state out again: the id dies, the next generation's lives.
batch_id recycle_in_place(rdma::detail::batch_state& b, batch_id id) {
  const std::uint64_t next_gen = (id >> 32) + 1;
  b.tag.store((next_gen << 1) | 1u);
  return (next_gen << 32) | (id & 0xffffffffu);
}
}  // namespace

// Review turn 3, finding 13: cancel() looked the batch up and then marked it,
// with nothing keeping free() and allocate() from handing the same
// batch_state to a new owner in between, whose tasks then ended CANCELED.
// Here the window is held open: free() recycles a batch under its submit
// mutex, so the test takes that mutex, lets cancel() in, and recycles the
// batch the way free + allocate would.
TEST_CASE("batch_table: a cancel racing a free and allocate of its batch leaves the new owner alone") {
  auto t = make_table(1);
  const batch_id old_id = t->allocate(2).value();
  auto* b = t->lookup(old_id);
  REQUIRE(b != nullptr);
  std::atomic<bool> returned{false};
  status canceled;
  {
    std::unique_lock in_free(b->submit_mu);
    std::thread canceler([&] {
      canceled = t->cancel(old_id);
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(returned.load());  // cancel waits for the free in progress
    const batch_id new_id = recycle_in_place(*b, old_id);
    in_free.unlock();
    canceler.join();
    REQUIRE_FALSE(canceled);
    CHECK(canceled.error().code == errc::unknown_batch);
    CHECK_FALSE(b->canceled.load());
    fake_submit(*b, 1, 1);
    CHECK(rdma::detail::should_drop(b->tasks[0].slices[0]) == errc::ok);
    rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok);
    CHECK(t->task_status(new_id, 0).value().state == transfer_state::completed);
  }
}

// The same race with real frees and allocates: an owner allocates a batch,
// shows its id to a canceler, frees it and allocates again (the table's only
// slot, so the same batch_state comes back) for work of its own, while the
// canceler keeps canceling the shown id.  A cancel may hit the shown batch
// or miss it, never the next one.  Run under TSan by tools/sanitize.
TEST_CASE("batch_table: cancels of a batch being freed never reach its next owner (stress)") {
  auto t = make_table(1);
  std::atomic<bool> stop{false};
  std::atomic<batch_id> shown{0};
  std::atomic<std::uint64_t> cycles{0}, stray{0}, hit{0};
  std::thread owner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const batch_id victim = t->allocate(4).value();
      shown.store(victim);
      for (int k = 0; k < 16; ++k) tide::detail::cpu_relax();
      REQUIRE(t->free(victim));
      const batch_id id = t->allocate(4).value();
      auto* b = t->lookup(id);
      fake_submit(*b, 1, 1);
      if (rdma::detail::should_drop(b->tasks[0].slices[0]) != errc::ok) ++stray;
      rdma::detail::retire_slice(b->tasks[0].slices[0], errc::ok);
      if (t->task_status(id, 0).value().state != transfer_state::completed) ++stray;
      REQUIRE(t->free(id));
      ++cycles;
    }
  });
  std::thread canceler([&] {
    while (!stop.load(std::memory_order_relaxed))
      if (const batch_id id = shown.load(); id != 0 && t->cancel(id)) ++hit;
  });
  std::this_thread::sleep_for(stress_duration());
  stop = true;
  owner.join();
  canceler.join();
  MESSAGE("cycles " << cycles.load() << ", cancels that hit the shown batch " << hit.load());
  CHECK(cycles.load() > 0);
  CHECK(stray.load() == 0);
}

// Review turn 3, finding 21: wait() re-checked the id only while tasks were
// unfinished, so a wait on an id freed (and handed out again, with nothing
// pending) after its lookup returned ok.  The window is held open with the
// batch's wait mutex, which wait takes after its lookup.
TEST_CASE("batch_table: wait on an id freed and reallocated meanwhile is unknown_batch, not ok") {
  auto t = make_table(1);
  const batch_id old_id = t->allocate(2).value();
  auto* b = t->lookup(old_id);
  REQUIRE(b != nullptr);
  status waited;
  std::thread waiter;
  {
    std::unique_lock wait_mu(b->mu);
    waiter = std::thread([&] { waited = t->wait(old_id, std::chrono::seconds(5)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)recycle_in_place(*b, old_id);
  }
  waiter.join();
  REQUIRE_FALSE(waited);
  CHECK(waited.error().code == errc::unknown_batch);
}

// Review turn 3, finding 21: a task whose every slice arrived was reported
// TIMEOUT when its deadline passed first, so a caller redid a transfer whose
// bytes were there.
TEST_CASE("a task past its deadline whose slices all succeeded is COMPLETED; one with a dropped slice TIMEOUT") {
  auto t = make_table(1);
  const batch_id id = t->allocate(2).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 2, 2, std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  t->expire(*b);
  REQUIRE(b->tasks[0].stop.load() == transfer_state::timeout);
  for (auto& s : b->tasks[0].slices) rdma::detail::retire_slice(s, errc::ok);
  rdma::detail::retire_slice(b->tasks[1].slices[0], errc::ok);
  rdma::detail::retire_slice(b->tasks[1].slices[1], errc::timed_out);  // dropped before posting
  const auto s0 = t->task_status(id, 0).value();
  CHECK(s0.state == transfer_state::completed);
  CHECK(s0.transferred_bytes == 20);
  const auto s1 = t->task_status(id, 1).value();
  CHECK(s1.state == transfer_state::timeout);
  CHECK(s1.reason == errc::timed_out);
  CHECK(t->free(id));
}

TEST_CASE("telemetry: lanes stamping a task while readers poll it and the meter; exact once final (TSan)") {
  auto table = make_table(4);
  const batch_id id = table->allocate(2).value();
  auto* b = table->lookup(id);
  REQUIRE(b != nullptr);
  constexpr std::size_t kSlices = 4000;
  fake_submit(*b, 2, kSlices / 2);
  const auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  for (std::size_t t = 0; t < 2; ++t) rdma::detail::start_telemetry(b->tasks[t], transfer_op::write, 4096 * (t + 1), now_ns());
  std::atomic<bool> done{false};
  // Readers: the engine's telemetry calls and a metrics scrape, during the traffic.
  std::thread reader([&] {
    while (!done.load()) {
      auto bt = table->batch_telemetry(id);
      REQUIRE(bt);
      CHECK(bt->wrs <= kSlices);
      (void)table->task_telemetry(id, 1);
      (void)table->meter().read();
    }
  });
  // Two "lanes", each posting and retiring the slices of both tasks.
  std::vector<std::thread> lanes;
  for (std::size_t l = 0; l < 2; ++l)
    lanes.emplace_back([&, l] {
      for (std::size_t t = 0; t < 2; ++t)
        for (std::size_t k = l; k < kSlices / 2; k += 2) {
          auto& s = b->tasks[t].slices[k];
          rdma::detail::note_posted(*s.task, static_cast<std::uint16_t>(l), static_cast<std::uint16_t>(l + 2), now_ns());
          if (k % 100 == 0) rdma::detail::note_retry(*s.task);
          rdma::detail::retire_slice(s, errc::ok);
        }
    });
  for (auto& th : lanes) th.join();
  done = true;
  reader.join();
  const auto bt = table->batch_telemetry(id).value();
  CHECK(bt.state == transfer_state::completed);
  CHECK(bt.tasks == 2);
  CHECK(bt.wrs == kSlices);
  CHECK(bt.retries == 2 * 20);
  CHECK(bt.local_nics == 3u);
  CHECK(bt.peer_nics == 12u);
  CHECK(bt.bytes == 4096 * 3);
  CHECK(bt.first_post >= bt.submit);
  CHECK(bt.completion >= bt.first_post);
  const auto m = table->meter().read();
  CHECK(m.finals[0] == 2);
  CHECK(m.latency[1][0].count() == 1);  // 4 KiB write
  CHECK(m.latency[1][1].count() == 1);  // 8 KiB write: <= 64 KiB
  REQUIRE(table->free(id));
}

// Review 1ab3d99, finding 1(a): failed_peer_path viewed the segment view
// that only the task's keep_alive held, so a status read kept past
// free_batch (Python's one-call transfers build their tuple after the free)
// read freed memory once a refresh had let the segment's old view go.  The
// path is the table's copy now.  Under ASan (tools/sanitize) the old view
// is a heap-use-after-free; without it the block is reused below.
TEST_CASE("failed_peer_path stays valid after free_batch, with the segment view gone") {
  auto t = make_table(1);
  const batch_id id = t->allocate(2).value();
  auto* b = t->lookup(id);
  fake_submit(*b, 2, 1);
  const std::string text = "10.47.0.2:15000@rxe1-a-name-past-the-small-string-buffer";
  {
    // The segment's resolved view, held by its tasks alone (a refresh
    // swapped the transport's copy for a newer one).
    auto view = std::make_shared<const std::string>(text);
    for (std::size_t i = 0; i < 2; ++i) {
      b->tasks[i].keep_alive = view;
      b->tasks[i].slices[0].peer_path = view.get();
      b->tasks[i].slices[0].local_device = 1;
    }
  }
  rdma::detail::retire_slice(b->tasks[0].slices[0], errc::remote_access_error);
  rdma::detail::retire_slice(b->tasks[1].slices[0], errc::transport_retry_exceeded);
  const transfer_status st = t->task_status(id, 0).value();
  const transfer_status whole = t->batch_status(id).value();
  REQUIRE(st.state == transfer_state::failed);
  REQUIRE(whole.state == transfer_state::failed);
  REQUIRE(t->free(id));  // the last hold on the view goes
  const std::string reuse(text.size(), 'X');  // the freed block, most likely
  CHECK(st.failed_peer_path == text);
  CHECK(whole.failed_peer_path == text);
  CHECK(st.failed_local_device == 1);
  CHECK(t->failed_paths_kept() == 1);  // one copy per path
  CHECK(reuse.front() == 'X');
}

// Review 1ab3d99, finding 1(b): a status read that saw a task past its
// deadline marked it TIMEOUT with no check that the batch was still the
// one it looked up; free() and allocate() could hand the same batch_state
// to a new owner in between, whose task then ended TIMEOUT.  A status read
// now marks only under the submit mutex, which free() holds while it
// recycles (as cancel does, review turn 3 finding 13), with the tag checked
// again under it.  Here the free is held open with that mutex.
TEST_CASE("batch_table: a status read while a free holds the batch marks none of its tasks") {
  auto t = make_table(1);
  const batch_id old_id = t->allocate(2).value();
  auto* b = t->lookup(old_id);
  REQUIRE(b != nullptr);
  fake_submit(*b, 2, 1, std::chrono::milliseconds(-1));  // past its deadline already
  {
    std::unique_lock in_free(b->submit_mu);
    std::thread reader([&] {
      CHECK(t->task_status(old_id, 0).value().state == transfer_state::pending);
      CHECK(t->batch_status(old_id).value().state == transfer_state::pending);
    });
    reader.join();
    // The free could hand these tasks to a new owner now: none is marked.
    CHECK(b->tasks[0].stop.load() == transfer_state::pending);
    CHECK(b->tasks[1].stop.load() == transfer_state::pending);
  }
  // With nothing holding the batch a status read marks what is past its deadline.
  CHECK(t->task_status(old_id, 0).value().state == transfer_state::pending);
  CHECK(b->tasks[0].stop.load() == transfer_state::timeout);
  CHECK(t->batch_status(old_id).value().state == transfer_state::pending);
  CHECK(b->tasks[1].stop.load() == transfer_state::timeout);
  for (std::size_t i = 0; i < 2; ++i) rdma::detail::retire_slice(b->tasks[i].slices[0], errc::timed_out);
  CHECK(t->batch_status(old_id).value().state == transfer_state::timeout);
  CHECK(t->free(old_id));
}

// The same races with real frees and allocates (review 21: the stress test
// above only has tasks that succeed, with 30 s deadlines).  An owner fills
// the table's only slot with tasks that fail on the wire and are past their
// deadline, shows the id, frees it, and gives the same batch_state to work
// of its own with a far deadline; readers poll the shown id.  A read is
// the shown batch's or unknown, its path is readable after the free (ASan:
// tools/sanitize), and the next owner's tasks are never marked.
TEST_CASE("batch_table: status reads of failed, expired batches racing free and reallocation (stress)") {
  auto t = make_table(1);
  const std::string text = "10.47.0.2:15000@rxe1-a-name-past-the-small-string-buffer";
  constexpr std::size_t kTasks = 4;
  std::atomic<bool> stop{false};
  std::atomic<batch_id> shown{0};
  std::atomic<std::uint64_t> cycles{0}, stray{0}, failed_reads{0}, bad_path{0}, foreign{0};
  std::thread owner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const batch_id victim = t->allocate(kTasks).value();
      auto* b = t->lookup(victim);
      fake_submit(*b, kTasks, 2, std::chrono::milliseconds(-1));
      {
        auto view = std::make_shared<const std::string>(text);
        for (std::size_t i = 0; i < kTasks; ++i) {
          b->tasks[i].keep_alive = view;
          for (auto& s : b->tasks[i].slices) s.peer_path = view.get();
        }
      }
      shown.store(victim);
      for (std::size_t i = 0; i < kTasks; ++i) {
        rdma::detail::retire_slice(b->tasks[i].slices[0], errc::remote_access_error);
        rdma::detail::retire_slice(b->tasks[i].slices[1], errc::work_request_flushed);
      }
      REQUIRE(t->free(victim));
      const batch_id id = t->allocate(kTasks).value();
      b = t->lookup(id);
      REQUIRE(b != nullptr);
      fake_submit(*b, kTasks, 1);  // 30 s away
      for (int k = 0; k < 64; ++k) tide::detail::cpu_relax();  // readers of the old id meet the new tasks
      for (std::size_t i = 0; i < kTasks; ++i) {
        if (b->tasks[i].stop.load() != transfer_state::pending) ++stray;
        rdma::detail::retire_slice(b->tasks[i].slices[0], errc::ok);
      }
      for (std::size_t i = 0; i < kTasks; ++i) {
        const auto st = t->task_status(id, i);
        if (!st || st->state != transfer_state::completed) ++stray;
      }
      REQUIRE(t->free(id));
      ++cycles;
    }
  });
  auto reader = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const batch_id id = shown.load();
      if (id == 0) continue;
      for (std::size_t i = 0; i < kTasks; ++i) {
        const auto st = t->task_status(id, i);
        if (!st) {
          if (st.error().code != errc::unknown_batch && st.error().code != errc::unknown_task) ++foreign;
          continue;
        }
        // The shown batch's tasks never complete: a COMPLETED is the next owner's.
        if (st->state == transfer_state::completed) ++foreign;
        if (is_final(st->state)) ++failed_reads;
        if (!st->failed_peer_path.empty() && st->failed_peer_path != text) ++bad_path;
      }
      if (const auto bs = t->batch_status(id)) {
        if (bs->state == transfer_state::completed) ++foreign;
        if (!bs->failed_peer_path.empty() && bs->failed_peer_path != text) ++bad_path;
      }
    }
  };
  std::thread r1(reader), r2(reader);
  std::this_thread::sleep_for(stress_duration());
  stop = true;
  owner.join();
  r1.join();
  r2.join();
  MESSAGE("cycles " << cycles.load() << ", final reads of the shown batch " << failed_reads.load());
  CHECK(cycles.load() > 0);
  CHECK(stray.load() == 0);
  CHECK(foreign.load() == 0);
  CHECK(bad_path.load() == 0);
  CHECK(t->live_batches() == 0);
}
