// (e) The lane's submit queue: tide's intrusive MPSC slice_queue (a whole
// chain per CAS, the consumer takes everything with one exchange) against
// Boost.Lockfree's queue<slice*> (one CAS per slice on each side, bounded,
// preallocated nodes).  Producers push chains of k slices as dispatch() does
// (k = 1: a one-slice request; k = 32: a batch cut into runs); one consumer
// drains, as a lane does.  Reports slices per second, median and spread.

#include "common.hpp"

#include <tide/rdma/detail/slice_queue.hpp>

#include <boost/lockfree/queue.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace tide::bench {
namespace {

using rdma::detail::slice;

// Runs `producers` threads pushing chains of `k` for `seconds`; returns slices/s.
template <class Push, class Drain>
double run(int producers, std::size_t k, double seconds, Push push, Drain drain) {
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> consumed{0};
  std::vector<std::unique_ptr<slice[]>> pools;
  for (int p = 0; p < producers; ++p) pools.push_back(std::make_unique<slice[]>(k));
  // A slice is reused once the consumer returned it: each producer waits for
  // its chain to come back (flag), as a batch's slices are recycled.
  std::vector<std::unique_ptr<std::atomic<std::size_t>>> back;
  for (int p = 0; p < producers; ++p) back.push_back(std::make_unique<std::atomic<std::size_t>>(k));
  for (int p = 0; p < producers; ++p)
    for (std::size_t i = 0; i < k; ++i) pools[p][i].local_buffer = static_cast<std::uint32_t>(p);
  std::thread consumer([&] {
    std::uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      n += drain([&](slice* s) { back[s->local_buffer]->fetch_add(1, std::memory_order_release); });
    }
    n += drain([&](slice* s) { back[s->local_buffer]->fetch_add(1, std::memory_order_release); });
    consumed.store(n);
  });
  std::vector<std::thread> ps;
  for (int p = 0; p < producers; ++p)
    ps.emplace_back([&, p] {
      while (!stop.load(std::memory_order_relaxed)) {
        if (back[p]->load(std::memory_order_acquire) != k) continue;
        back[p]->store(0, std::memory_order_relaxed);
        slice* s = pools[p].get();
        for (std::size_t i = 0; i + 1 < k; ++i) s[i].next = &s[i + 1];
        push(&s[0], &s[k - 1]);
      }
    });
  const auto t0 = clk::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : ps) t.join();
  consumer.join();
  return static_cast<double>(consumed.load()) / seconds_since(t0);
}

}  // namespace

nlohmann::json submit_queues(const options& o) {
  nlohmann::json out = nlohmann::json::array();
  table t({"queue", "producers", "chain", "Mslices/s median [min-max]"});
  for (int producers : {1, 2, 4}) {
    for (std::size_t k : {std::size_t{1}, std::size_t{32}}) {
      std::vector<double> own, lockfree;
      for (int r = 0; r < o.repeats; ++r) {
        rdma::detail::slice_queue q;
        own.push_back(run(
            producers, k, o.run_seconds, [&](slice* f, slice* l) { q.push(f, l); },
            [&](auto&& give_back) {
              std::uint64_t n = 0;
              for (slice* s = q.take_all(); s != nullptr;) {
                slice* next = s->next;
                give_back(s);
                s = next;
                ++n;
              }
              return n;
            }) / 1e6);
        boost::lockfree::queue<slice*> lq(8192);
        lockfree.push_back(run(
            producers, k, o.run_seconds,
            [&](slice* f, slice* l) {
              for (slice* s = f; s != nullptr;) {
                slice* next = s == l ? nullptr : s->next;  // read before the consumer owns it
                while (!lq.push(s)) {
                }
                s = next;
              }
            },
            [&](auto&& give_back) {
              std::uint64_t n = 0;
              slice* s = nullptr;
              while (lq.pop(s)) {
                give_back(s);
                ++n;
              }
              return n;
            }) / 1e6);
      }
      const auto a = stat::of(own), b = stat::of(lockfree);
      t.add({"slice_queue (chain CAS)", std::to_string(producers), std::to_string(k), a.text("%.2f")});
      t.add({"boost::lockfree::queue", std::to_string(producers), std::to_string(k), b.text("%.2f")});
      out.push_back({{"producers", producers}, {"chain", k}, {"slice_queue", a.to_json()}, {"lockfree_queue", b.to_json()}});
    }
  }
  t.print("(e) lane submit queue: slices handed to one consumer per second");
  return out;
}

}  // namespace tide::bench
