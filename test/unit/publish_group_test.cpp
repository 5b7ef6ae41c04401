// Group commit of descriptor publishes (detail/publish_group.hpp, issue 36
// item 3): callers that arrive while a publish is in flight share the next
// one; its status reaches each of them; what it stores covers every change
// its members made before they joined; publishes never overlap.  Waits are
// on the group's own state (pending_members), never on a sleep.  And the
// deferred publisher above it (publish_delay_ms): one write per window, flush,
// a retry after a failed write, teardown during a write.  Runs under TSan
// in tools/sanitize.
#include <tide/detail/deferred_publisher.hpp>
#include <tide/detail/publish_group.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using tide::errc;
using tide::status;
using tide::detail::publish_group;
using namespace std::chrono_literals;

namespace {

// Spins (yielding) until `ready()`; false when `limit` passes first, a
// safety net so that a broken group fails the test instead of hanging it.
template <class F>
bool wait_until(F ready, std::chrono::seconds limit = 60s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

// A store that records, per publish, how many changes existed when it began.
struct fake_store {
  std::mutex mu;
  std::size_t changes = 0;        ///< under mu: changes made by callers
  std::size_t stored = 0;         ///< under mu: changes covered by the last publish that succeeded
  std::atomic<int> publishes{0};
  std::atomic<int> in_flight{0};  ///< > 1 would be overlapping publishes
  std::atomic<bool> overlapped{false};

  std::size_t change() {
    std::lock_guard lock(mu);
    return changes++;  // this caller's change, numbered from 0
  }
  // A publish: snapshot, then `body` (the slow part, the PUT), then store.
  template <class Body>
  status publish(Body body) {
    if (in_flight.fetch_add(1) != 0) overlapped = true;
    ++publishes;
    std::size_t snapshot = 0;
    {
      std::lock_guard lock(mu);
      snapshot = changes;
    }
    status r = body();
    if (r) {
      std::lock_guard lock(mu);
      if (snapshot > stored) stored = snapshot;
    }
    in_flight.fetch_sub(1);
    return r;
  }
  bool covered(std::size_t change_no) {
    std::lock_guard lock(mu);
    return change_no < stored;
  }
};

}  // namespace

TEST_CASE("publish_group: callers arriving during a publish share the next one, and each sees its change stored") {
  publish_group g;
  fake_store store;
  constexpr std::size_t kWaiters = 8;
  std::atomic<bool> first_started{false};
  // The first caller's publish holds until all the others wait in the next round.
  std::thread first([&] {
    const std::size_t mine = store.change();
    auto r = g.commit([&] {
      return store.publish([&]() -> status {
        first_started = true;
        if (!wait_until([&] { return g.pending_members() == kWaiters; }))
          return tide::fail(errc::timed_out, "the waiters never joined");
        return {};
      });
    });
    CHECK(r.has_value());
    CHECK(store.covered(mine));
  });
  REQUIRE(wait_until([&] { return first_started.load(); }));
  std::vector<std::thread> waiters;
  std::atomic<int> ok{0};
  for (std::size_t i = 0; i < kWaiters; ++i)
    waiters.emplace_back([&] {
      const std::size_t mine = store.change();
      auto r = g.commit([&] { return store.publish([]() -> status { return {}; }); });
      if (r && store.covered(mine)) ++ok;
    });
  first.join();
  for (auto& t : waiters) t.join();
  CHECK(ok.load() == static_cast<int>(kWaiters));
  CHECK(store.publishes.load() == 2);  // the first caller's, then one for all eight
  CHECK(g.rounds() == 2);
  CHECK(g.commits() == kWaiters + 1);
  CHECK(g.pending_members() == 0);
  CHECK_FALSE(store.overlapped.load());
}

TEST_CASE("publish_group: a failed publish fails every member of its round, with its error; the next round runs anew") {
  publish_group g;
  fake_store store;
  constexpr std::size_t kWaiters = 6;
  std::atomic<bool> first_started{false};
  std::thread first([&] {
    (void)store.change();
    auto r = g.commit([&] {
      return store.publish([&]() -> status {
        first_started = true;
        if (!wait_until([&] { return g.pending_members() == kWaiters; }))
          return tide::fail(errc::timed_out, "the waiters never joined");
        return {};
      });
    });
    CHECK(r.has_value());
  });
  REQUIRE(wait_until([&] { return first_started.load(); }));
  std::vector<std::thread> waiters;
  std::mutex mu;
  std::vector<std::string> errors;
  for (std::size_t i = 0; i < kWaiters; ++i)
    waiters.emplace_back([&] {
      (void)store.change();
      auto r = g.commit([&] {
        return store.publish([]() -> status { return tide::fail(errc::metadata_unavailable, "store down"); });
      });
      std::lock_guard lock(mu);
      errors.push_back(r ? "ok" : r.error().message());
    });
  first.join();
  for (auto& t : waiters) t.join();
  REQUIRE(errors.size() == kWaiters);
  for (const auto& e : errors) CHECK(e == "metadata_unavailable: store down");
  CHECK(store.publishes.load() == 2);  // not one retry per waiter
  // The store is back: the next caller's round publishes and covers every change.
  const std::size_t last = store.change();
  CHECK(g.commit([&] { return store.publish([]() -> status { return {}; }); }).has_value());
  CHECK(store.covered(last));
  CHECK(store.covered(kWaiters));
  CHECK(store.publishes.load() == 3);
}

TEST_CASE("publish_group: a publish that throws rethrows to its runner and fails the other members of its round") {
  publish_group g;
  std::atomic<bool> first_started{false};
  // Round 1 holds until two callers wait in round 2; whichever of them runs
  // round 2 throws, the other must get an error, not wait forever.
  std::thread first([&] {
    auto r = g.commit([&]() -> status {
      first_started = true;
      if (!wait_until([&] { return g.pending_members() == 2; })) return tide::fail(errc::timed_out, "never joined");
      return {};
    });
    CHECK(r.has_value());
  });
  REQUIRE(wait_until([&] { return first_started.load(); }));
  std::atomic<int> thrown{0}, failed{0};
  auto member = [&] {
    try {
      auto r = g.commit([]() -> status { throw std::runtime_error("boom"); });
      if (!r && r.error().code == errc::metadata_unavailable) ++failed;
    } catch (const std::runtime_error&) {
      ++thrown;
    }
  };
  std::thread b(member), c(member);
  first.join();
  b.join();
  c.join();
  CHECK(thrown.load() == 1);
  CHECK(failed.load() == 1);
  // Nothing is left in flight: a later commit runs its own publish.
  CHECK(g.commit([]() -> status { return {}; }).has_value());
  CHECK(g.rounds() == 3);
}

TEST_CASE("publish_group stress: many threads, failing and succeeding rounds; a success always covers the caller's change") {
  publish_group g;
  fake_store store;
  constexpr int kThreads = 8, kEach = 300;
  std::atomic<int> round_no{0};
  std::atomic<int> uncovered{0}, succeeded{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        const std::size_t mine = store.change();
        auto r = g.commit([&] {
          return store.publish([&]() -> status {
            if (round_no.fetch_add(1) % 5 == 4) return tide::fail(errc::metadata_unavailable, "every fifth fails");
            return {};
          });
        });
        if (r) {
          ++succeeded;
          if (!store.covered(mine)) ++uncovered;
        } else {
          ++failed;
          CHECK(r.error().code == errc::metadata_unavailable);
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK(uncovered.load() == 0);
  CHECK(succeeded.load() + failed.load() == kThreads * kEach);
  CHECK_FALSE(store.overlapped.load());
  CHECK(g.commits() == static_cast<std::uint64_t>(kThreads * kEach));
  CHECK(g.rounds() == static_cast<std::uint64_t>(store.publishes.load()));
  MESSAGE((kThreads * kEach) << " commits shared " << g.rounds() << " publishes");
}

// ---- deferred_publisher (publish_delay_ms): one write per window ----

TEST_CASE("deferred_publisher: changes from 8 threads are stored by one write per window, the last one covering all") {
  fake_store store;
  publish_group group;
  constexpr auto kDelay = 20ms;
  tide::detail::deferred_publisher deferred(kDelay, [&] {
    return group.commit([&] { return store.publish([] { return status{}; }); });
  });
  constexpr std::size_t kThreads = 8, kEach = 500;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (std::size_t i = 0; i < kEach; ++i) {
        (void)store.change();
        deferred.changed();
      }
    });
  for (auto& th : threads) th.join();
  REQUIRE(wait_until([&] { return store.covered(kThreads * kEach - 1); }));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  // A window opens at the first change it has not stored and its write runs
  // when it closes: writes are at least kDelay apart.
  const auto windows = static_cast<int>(elapsed / kDelay) + 1;
  CHECK(store.publishes.load() >= 1);
  CHECK_MESSAGE(store.publishes.load() <= windows, store.publishes.load() << " writes in " << windows << " windows");
  CHECK_FALSE(store.overlapped.load());
}

TEST_CASE("deferred_publisher: changes that never stop are still stored: a window closes at its first change's "
          "time plus the delay, later changes do not push it back") {
  fake_store store;
  publish_group group;
  tide::detail::deferred_publisher deferred(50ms, [&] {
    return group.commit([&] { return store.publish([] { return status{}; }); });
  });
  // A change every millisecond, until a write has been made (or the limit):
  // a window that moved with each change would never close.
  const auto limit = std::chrono::steady_clock::now() + 20s;
  while (store.publishes.load() == 0 && std::chrono::steady_clock::now() < limit) {
    (void)store.change();
    deferred.changed();
    std::this_thread::sleep_for(1ms);
  }
  CHECK(store.publishes.load() >= 1);
}

TEST_CASE("deferred_publisher: flush stores at once and returns the store's error; the changes stay pending") {
  fake_store store;
  publish_group group;
  std::atomic<int> failures_left{1};
  // A window far past the test: only flush writes.
  tide::detail::deferred_publisher deferred(600000ms, [&] {
    return group.commit([&] {
      return store.publish([&] {
        return failures_left.fetch_sub(1) > 0 ? tide::fail(errc::metadata_unavailable, "store down") : status{};
      });
    });
  });
  (void)store.change();
  deferred.changed();
  CHECK(store.publishes.load() == 0);  // the window has not closed
  auto r = deferred.flush();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::metadata_unavailable);
  CHECK(r.error().detail == "store down");
  CHECK_FALSE(store.covered(0));
  CHECK(deferred.flush());
  CHECK(store.covered(0));
  CHECK(store.publishes.load() == 2);
}

TEST_CASE("deferred_publisher: a failed window write is tried again, a second later at the soonest") {
  fake_store store;
  publish_group group;
  std::atomic<int> failures_left{1};
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> writes;  // under mu
  tide::detail::deferred_publisher deferred(10ms, [&] {
    {
      std::lock_guard lock(mu);
      writes.push_back(std::chrono::steady_clock::now());
    }
    return group.commit([&] {
      return store.publish([&] {
        return failures_left.fetch_sub(1) > 0 ? tide::fail(errc::metadata_unavailable, "store down") : status{};
      });
    });
  });
  (void)store.change();
  deferred.changed();
  REQUIRE(wait_until([&] { return store.covered(0); }));
  std::lock_guard lock(mu);
  REQUIRE(writes.size() == 2);
  CHECK(writes[1] - writes[0] >= 1s);  // not every 10 ms against a store that is down
}

TEST_CASE("deferred_publisher: destroyed during a write, with a change pending: it waits for the write and returns") {
  fake_store store;
  publish_group group;
  std::atomic<bool> writing{false};
  {
    tide::detail::deferred_publisher deferred(1ms, [&] {
      return group.commit([&] {
        return store.publish([&] {
          writing = true;
          std::this_thread::sleep_for(100ms);  // the PUT, slow: the destructor comes meanwhile
          return status{};
        });
      });
    });
    (void)store.change();
    deferred.changed();
    REQUIRE(wait_until([&] { return writing.load(); }));
    (void)store.change();
    deferred.changed();  // pending when the destructor runs: dropped
  }
  CHECK(store.publishes.load() == 1);
  CHECK(store.covered(0));
}
