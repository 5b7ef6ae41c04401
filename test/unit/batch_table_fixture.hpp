#pragma once
// What the batch_table tests share: a table, a submit without a transport,
// the stress tests' duration.
#include <tide/rdma/batch_table.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace batch_fixture {

using tide::rdma::batch_table;

inline std::unique_ptr<batch_table> make_table(std::size_t max_batches,
                                              std::size_t max_tasks = batch_table::kDefaultMaxTasks) {
  auto t = batch_table::create(max_batches, max_tasks);
  REQUIRE(t);
  return std::move(*t);
}

// Submits `slices` slices per task to `tasks` tasks of `b` the way the
// transport's submit does (reset, then publish `used`).
inline void fake_submit(tide::rdma::detail::batch_state& b, std::size_t tasks, std::size_t slices,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  std::lock_guard lock(b.submit_mu);
  const std::size_t used = b.used.load();
  for (std::size_t i = used; i < used + tasks; ++i) {
    tide::rdma::detail::reset_task(b.tasks[i], slices, 0, std::chrono::steady_clock::now() + timeout);
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

inline std::chrono::milliseconds stress_duration() {
  const char* ms = std::getenv("TIDE_STRESS_MS");
  return std::chrono::milliseconds(ms != nullptr ? std::atoi(ms) : 500);
}

}  // namespace batch_fixture
