// detail::notify_outbox and the task_group hook of finish_task, without
// devices: a notification goes out once, after the last task of its submit
// is final, only when all of them COMPLETED; refusals and errors are
// counted; stop() delivers what is queued; a copy sent over TCP after a
// SEND whose fate was unknown is dropped by the target's inbox (notify_id,
// on both wires).  Tasks are retired with the transport's own
// retire_slice, from several threads (run under TSan by tools/sanitize).
// The inbox on its own: notify_inbox_test.cpp.
#include <tide/detail/notify_inbox.hpp>
#include <tide/detail/notify_outbox.hpp>
#include <tide/net/handshake_client.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/notify_qp.hpp>

#include <doctest/doctest.h>

#include "support/process.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace tide;
using rdma::detail::batch_state;

namespace {

// What the send function saw, in order.
struct fake_peer {
  std::mutex mu;
  std::vector<std::pair<std::string, notify_desc>> sent;
  errc answer = errc::ok;  // ok, or the error every send returns
  status send(const std::string& seg, const notify_desc& n) {
    std::lock_guard lock(mu);
    sent.emplace_back(seg, n);
    if (answer != errc::ok) return fail(answer, "told to");
    return {};
  }
  std::size_t count() {
    std::lock_guard lock(mu);
    return sent.size();
  }
  // As the outbox calls it (the abort flag is for exchanges that can hang).
  detail::notify_outbox::send_fn fn() {
    return [this](const std::string& seg, const notify_desc& n, const std::atomic<bool>&) { return send(seg, n); };
  }
};

// Tasks [first, first + n) of `b` with `slices` slices each, joined to `g`, as plan_and_dispatch does.
void submit(batch_state& b, std::size_t first, std::size_t n, std::size_t slices, rdma::detail::task_group* g) {
  for (std::size_t i = first; i < first + n; ++i) {
    rdma::detail::reset_task(b.tasks[i], slices, 0, std::chrono::steady_clock::now() + std::chrono::seconds(30));
    b.tasks[i].group = g;
    for (auto& s : b.tasks[i].slices) {
      s = {};
      s.task = &b.tasks[i];
      s.length = 10;
    }
  }
  b.unfinished.fetch_add(n);
  b.inflight.fetch_add(n * slices);
  b.used.store(first + n);
}

bool eventually(const std::function<bool()>& p) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!p()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("notify_outbox: sent once, only after the last task of its submit is final") {
  fake_peer w;
  detail::notify_outbox out(w.fn());
  batch_state b(8);
  auto item = out.make("peer:1", notify_desc{"me", "hello"}, 3);
  submit(b, 0, 3, 2, item.get());
  (void)item.release();
  CHECK(out.stats().pending == 1);
  // Five of six slices back: nothing may go out yet.
  for (std::size_t i = 0; i < 3; ++i) rdma::detail::retire_slice(b.tasks[i].slices[0], errc::ok);
  rdma::detail::retire_slice(b.tasks[0].slices[1], errc::ok);
  rdma::detail::retire_slice(b.tasks[1].slices[1], errc::ok);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(w.count() == 0);
  CHECK(out.stats().sent == 0);
  rdma::detail::retire_slice(b.tasks[2].slices[1], errc::ok);
  REQUIRE(eventually([&] { return out.stats().sent == 1; }));
  CHECK(w.count() == 1);
  CHECK(w.sent[0].first == "peer:1");
  CHECK(w.sent[0].second.name == "me");
  CHECK(w.sent[0].second.notify_msg == "hello");
  const auto st = out.stats();
  CHECK(st.submitted == 1);
  CHECK(st.pending == 0);
  CHECK(st.dropped_failed == 0);
}

TEST_CASE("notify_outbox: a failed, timed-out or canceled task drops the notification, counted") {
  fake_peer w;
  detail::notify_outbox out(w.fn());
  batch_state b(16);
  // One submit per way to end badly, plus a clean one that must still go out.
  std::size_t used = 0;
  for (int k = 0; k < 4; ++k) {
    auto item = out.make("peer:1", notify_desc{"me", std::to_string(k)}, 2);
    submit(b, used, 2, 1, item.get());
    (void)item.release();
    used += 2;
  }
  rdma::detail::retire_slice(b.tasks[0].slices[0], errc::ok);
  rdma::detail::retire_slice(b.tasks[1].slices[0], errc::remote_access_error);  // k = 0: FAILED
  rdma::detail::stop_task(b.tasks[2], transfer_state::timeout, errc::timed_out);
  rdma::detail::retire_slice(b.tasks[2].slices[0], errc::timed_out);  // k = 1: TIMEOUT (dropped before posting)
  rdma::detail::retire_slice(b.tasks[3].slices[0], errc::ok);
  rdma::detail::stop_task(b.tasks[4], transfer_state::canceled, errc::canceled);
  rdma::detail::retire_slice(b.tasks[4].slices[0], errc::canceled);  // k = 2: CANCELED
  rdma::detail::retire_slice(b.tasks[5].slices[0], errc::ok);
  rdma::detail::retire_slice(b.tasks[6].slices[0], errc::ok);  // k = 3: COMPLETED
  rdma::detail::retire_slice(b.tasks[7].slices[0], errc::ok);
  REQUIRE(eventually([&] { return out.stats().pending == 0; }));
  const auto st = out.stats();
  CHECK(st.dropped_failed == 3);
  CHECK(st.sent == 1);
  REQUIRE(w.count() == 1);
  CHECK(w.sent[0].second.notify_msg == "3");
}

TEST_CASE("notify_outbox: a refusal and a send error are counted apart; a discarded item is not counted") {
  fake_peer w;
  detail::notify_outbox out(w.fn());
  batch_state b(4);
  out.discard(out.make("peer:1", notify_desc{"me", "never"}, 1));
  CHECK(out.stats().submitted == 0);
  CHECK(out.stats().pending == 0);
  {
    std::lock_guard lock(w.mu);
    w.answer = errc::handshake_rejected;
  }
  auto a = out.make("peer:1", notify_desc{"me", "a"}, 1);
  submit(b, 0, 1, 1, a.get());
  (void)a.release();
  rdma::detail::retire_slice(b.tasks[0].slices[0], errc::ok);
  REQUIRE(eventually([&] { return out.stats().refused == 1; }));
  {
    std::lock_guard lock(w.mu);
    w.answer = errc::peer_unreachable;
  }
  auto c = out.make("peer:1", notify_desc{"me", "c"}, 1);
  submit(b, 1, 1, 1, c.get());
  (void)c.release();
  rdma::detail::retire_slice(b.tasks[1].slices[0], errc::ok);
  REQUIRE(eventually([&] { return out.stats().send_errors == 1; }));
  CHECK(out.stats().sent == 0);
  // The worker counts the outcome first and gives up `pending` after it
  // (a check right after send_errors moved saw 1 under ASan).
  CHECK(eventually([&] { return out.stats().pending == 0; }));
}

TEST_CASE("notify_outbox: tasks retired from many threads; every notification exactly once, stop() drains") {
  fake_peer w;
  constexpr std::size_t kSubmits = 400, kTasks = 4, kSlices = 3;
  std::vector<std::size_t> seen;
  {
    // A grace far beyond what 400 instant sends take: stop() returns as soon as they are out.
    detail::notify_outbox out(w.fn(), {.stop_grace = std::chrono::seconds(60)});
    batch_state b(kSubmits * kTasks);
    for (std::size_t k = 0; k < kSubmits; ++k) {
      auto item = out.make("peer:1", notify_desc{"me", std::to_string(k)}, kTasks);
      submit(b, k * kTasks, kTasks, kSlices, item.get());
      (void)item.release();
    }
    // Four "lanes", each retiring every fourth slice of every task.
    std::vector<std::thread> lanes;
    for (std::size_t l = 0; l < 4; ++l)
      lanes.emplace_back([&, l] {
        std::size_t n = 0;
        for (std::size_t t = 0; t < kSubmits * kTasks; ++t)
          for (std::size_t s = 0; s < kSlices; ++s)
            if (n++ % 4 == l) rdma::detail::retire_slice(b.tasks[t].slices[s], errc::ok);
      });
    for (auto& t : lanes) t.join();
    CHECK(b.unfinished.load() == 0);
    out.stop();  // every task is final: stop sends what is still queued
    CHECK(out.stats().sent == kSubmits);
    CHECK(out.stats().pending == 0);
    CHECK(out.stats().dropped_at_stop == 0);
  }
  REQUIRE(w.count() == kSubmits);
  std::vector<int> times(kSubmits, 0);
  for (const auto& [seg, n] : w.sent) ++times[std::stoul(n.notify_msg)];
  for (std::size_t k = 0; k < kSubmits; ++k) CHECK_MESSAGE(times[k] == 1, "notification " << k);
}

namespace {

// Lane 0 of the initiator's context as far as a notification sees it: takes
// the item, and the test decides what became of the SEND.
struct fake_lane final : rdma::detail::notify_sink {
  std::mutex mu;
  std::vector<rdma::detail::notify_send*> taken;
  bool take_notify(rdma::detail::notify_send* n) noexcept override {
    std::lock_guard lock(mu);
    taken.push_back(n);
    return true;
  }
};

// The SEND's bytes as the target's lane decodes them.
notify_desc over_rdma(const notify_desc& n) {
  std::vector<std::byte> slot(rdma::detail::kNotifySlot);
  const std::uint32_t len = rdma::detail::encode_notify_message(n, slot.data());
  REQUIRE(len != 0);
  auto d = rdma::detail::decode_notify_send(slot.data(), len);
  REQUIRE(d.ok);
  return d.msg;
}

}  // namespace

TEST_CASE("a SEND the target took but whose completion teardown flushed, sent again over TCP, is taken once") {
  detail::notify_inbox target;
  // The TCP path (its JSON keeps the id: metadata_descriptors_test).
  detail::notify_outbox out([&](const std::string&, const notify_desc& n, const std::atomic<bool>&) -> status {
    if (!target.push(n, n.name)) return fail(errc::handshake_rejected, "refused");
    return {};
  });
  fake_lane lane;
  batch_state b(2);
  for (std::size_t k = 0; k < 2; ++k) {
    auto item = out.make("peer:1", notify_desc{"me", "kv " + std::to_string(k)}, 1);
    item->sink = &lane;
    submit(b, k, 1, 1, item.get());
    (void)item.release();
    rdma::detail::retire_slice(b.tasks[k].slices[0], errc::ok);
  }
  REQUIRE(lane.taken.size() == 2);
  // kv 0: delivered, then the QP flushed before its completion came (teardown).
  CHECK(target.push(over_rdma(lane.taken[0]->wire_msg), "me"));
  lane.taken[0]->sent(false);
  // kv 1: never went out (no credit in time).
  lane.taken[1]->sent(false);
  REQUIRE(eventually([&] { return out.stats().pending == 0; }));
  CHECK(out.stats().rdma_fallbacks == 2);
  CHECK(out.stats().sent_tcp == 2);
  const auto got = target.take();
  REQUIRE(got.size() == 2);
  CHECK(got[0] == notify_desc{"me", "kv 0"});  // the id stays in the inbox
  CHECK(got[1] == notify_desc{"me", "kv 1"});
  CHECK(target.stats().duplicates == 1);
  CHECK(target.stats().accepted == 2);
}

TEST_CASE("notify_outbox: a SEND the lane saw complete is counted and freed on that lane, nothing over TCP") {
  fake_peer peer;
  detail::notify_outbox out(peer.fn());
  fake_lane lane;
  batch_state b(1);
  auto item = out.make("peer:1", notify_desc{"me", "kv"}, 1);
  item->sink = &lane;
  submit(b, 0, 1, 1, item.get());
  (void)item.release();
  rdma::detail::retire_slice(b.tasks[0].slices[0], errc::ok);
  REQUIRE(lane.taken.size() == 1);
  lane.taken[0]->sent(true);
  // Settled before sent() returns: no dispatcher thread to wake while the
  // target's reader wants a CPU (issue 36, item 4).
  const auto s = out.stats();
  CHECK(s.pending == 0);
  CHECK(s.sent_rdma == 1);
  CHECK(s.sent == 1);
  CHECK(s.rdma_fallbacks == 0);
  out.stop();
  CHECK(peer.count() == 0);
}

namespace {

// An item whose SEND lane 0 posted behind its one WRITE (notify_port.hpp's
// ride): submitted with one one-slice task, `rides` set as the lane sets it.
detail::notify_outbox::item* riding(detail::notify_outbox& out, batch_state& b, std::size_t task, fake_lane& lane) {
  auto item = out.make("peer:1", notify_desc{"me", "kv " + std::to_string(task)}, 1);
  item->sink = &lane;
  item->message = item.get();
  submit(b, task, 1, 1, item.get());
  item->rides.store(true);
  return item.release();
}

}  // namespace

TEST_CASE("a notification riding behind its WRITE settles once both its task and its SEND are done, in either order") {
  fake_peer peer;
  detail::notify_outbox out(peer.fn());
  fake_lane lane;
  batch_state b(5);
  auto task_ends = [&](std::size_t k, errc e) { rdma::detail::retire_slice(b.tasks[k].slices[0], e); };

  // Task first, then the SEND's completion: nothing moves until the second.
  auto* n0 = riding(out, b, 0, lane);
  task_ends(0, errc::ok);
  CHECK(out.stats().pending == 1);
  n0->sent(true);
  // The SEND first, then the task.
  auto* n1 = riding(out, b, 1, lane);
  n1->sent(true);
  CHECK(out.stats().pending == 1);
  task_ends(1, errc::ok);
  CHECK(out.stats().pending == 0);
  CHECK(out.stats().sent_rdma == 2);
  CHECK(out.stats().sent_with_data == 2);
  CHECK(lane.taken.empty());  // never sent a second time

  // Flushed (the WRITE failed and was retried elsewhere), then the task
  // completed: the usual path, to the lane picked at submit.
  auto* n2 = riding(out, b, 2, lane);
  n2->sent(false);
  task_ends(2, errc::ok);
  REQUIRE(lane.taken.size() == 1);
  CHECK(lane.taken[0] == n2);
  n2->sent(true);
  CHECK(out.stats().sent_rdma == 3);
  CHECK(out.stats().sent_with_data == 2);

  // Flushed and the task failed: dropped, counted.
  auto* n3 = riding(out, b, 3, lane);
  task_ends(3, errc::remote_access_error);
  n3->sent(false);
  REQUIRE(eventually([&] { return out.stats().dropped_failed == 1; }));

  // Delivered, but the task ended canceled after its post: the SEND went
  // behind the bytes, so it counts as sent.
  auto* n4 = riding(out, b, 4, lane);
  task_ends(4, errc::canceled);
  n4->sent(true);
  CHECK(out.stats().sent_with_data == 3);
  REQUIRE(eventually([&] { return out.stats().pending == 0; }));
  CHECK(lane.taken.size() == 1);
  out.stop();
  CHECK(peer.count() == 0);
}

TEST_CASE("riding notifications: the task's end and the SEND's completion race on two threads, each settles once") {
  fake_peer peer;
  constexpr std::size_t kItems = 2000;
  detail::notify_outbox out(peer.fn());
  fake_lane lane;
  batch_state b(kItems);
  std::vector<detail::notify_outbox::item*> items;
  for (std::size_t k = 0; k < kItems; ++k) items.push_back(riding(out, b, k, lane));
  // Every third SEND flushed: that item goes on to the lane once its task is done.
  std::thread tasks([&] {
    for (std::size_t k = 0; k < kItems; ++k) rdma::detail::retire_slice(b.tasks[k].slices[0], errc::ok);
  });
  std::thread sends([&] {
    for (std::size_t k = 0; k < kItems; ++k) items[k]->sent(k % 3 != 0);
  });
  tasks.join();
  sends.join();
  const std::size_t flushed = (kItems + 2) / 3;
  REQUIRE(lane.taken.size() == flushed);
  for (auto* n : lane.taken) n->sent(true);
  CHECK(out.stats().pending == 0);
  CHECK(out.stats().sent_rdma == kItems);
  CHECK(out.stats().sent_with_data == kItems - flushed);
  out.stop();
  CHECK(peer.count() == 0);
}

TEST_CASE("notify_outbox: each notification gets its own id under the outbox's origin; two outboxes differ") {
  fake_peer w;
  detail::notify_outbox out(w.fn());
  detail::notify_outbox other(w.fn());
  batch_state b(3);
  for (std::size_t k = 0; k < 3; ++k) {
    auto item = (k < 2 ? out : other).make("peer:1", notify_desc{"me", std::to_string(k)}, 1);
    submit(b, k, 1, 1, item.get());
    (void)item.release();
    rdma::detail::retire_slice(b.tasks[k].slices[0], errc::ok);
  }
  REQUIRE(eventually([&] { return w.count() == 3; }));
  std::lock_guard lock(w.mu);
  std::map<std::string, notify_id> by_msg;
  for (const auto& [seg, n] : w.sent) {
    REQUIRE(n.id.has_value());
    by_msg[n.notify_msg] = *n.id;
  }
  CHECK(by_msg["0"].origin == by_msg["1"].origin);
  CHECK(by_msg["0"].seq != by_msg["1"].seq);
  CHECK(by_msg["0"].seq != 0);
  CHECK(by_msg["2"].origin != by_msg["0"].origin);  // 2^-64 to fail by chance
}

TEST_CASE("a notification's id survives the SEND; one without (version 1) still decodes") {
  const notify_desc with{"node:1", "kv 7", notify_id{0xfedcba9876543210ull, 42}};
  CHECK(over_rdma(with) == with);
  const notify_desc without{"node:1", "kv 7"};
  CHECK(over_rdma(without) == without);
  std::vector<std::byte> slot(rdma::detail::kNotifySlot);
  CHECK(rdma::detail::encode_notify_message(without, slot.data()) == rdma::detail::kNotifyHeader + 10);
  const std::uint32_t len = rdma::detail::encode_notify_message(with, slot.data());
  CHECK(len == rdma::detail::kNotifyIdHeader + 10);
  CHECK_FALSE(rdma::detail::decode_notify_send(slot.data(), len - 1).ok);
  slot[1] = std::byte{3};  // an unknown version is dropped, not misread
  CHECK_FALSE(rdma::detail::decode_notify_send(slot.data(), len).ok);
}

namespace {

// Submits one single-task notification to `segment` on task `i` of `b` and
// retires it COMPLETED, so the outbox has it to send.
void ready_one(detail::notify_outbox& out, batch_state& b, std::size_t i, const std::string& segment) {
  auto item = out.make(segment, notify_desc{"me", segment + " " + std::to_string(i)}, 1);
  submit(b, i, 1, 1, item.get());
  (void)item.release();
  rdma::detail::retire_slice(b.tasks[i].slices[0], errc::ok);
}

}  // namespace

// Review 1ab3d99, finding 2: one outbox thread sent every notification in
// turn, with no abort, so a target that accepts connections and never
// answers held every notification behind it for the connect and receive
// timeouts, and stop() (engine teardown, Python close()) waited them all
// out.  Here the dead target is a real listening socket nobody reads, the
// exchange a real send_notify with timeouts of a minute.
TEST_CASE("notify_outbox: a black-holed target delays no other; stop() aborts its exchange and drops what is left") {
  tide::test::silent_listener hole;
  fake_peer live;
  std::atomic<int> dead_started{0}, dead_returned{0};
  constexpr std::size_t kDead = 5, kLive = 1000, kTargets = 10;
  batch_state b(kDead + kLive);
  {
    detail::notify_outbox out(
        [&](const std::string& seg, const notify_desc& n, const std::atomic<bool>& abort) -> status {
          if (seg != "dead:1") return live.send(seg, n);
          ++dead_started;
          net::request_options ro;
          ro.connect_timeout = std::chrono::minutes(1);
          ro.receive_timeout = std::chrono::minutes(1);
          ro.abort = &abort;
          auto r = net::send_notify("127.0.0.1", hole.port(), n, ro);
          ++dead_returned;
          return r;
        },
        {.max_queued = 16384, .max_senders = 4, .stop_grace = std::chrono::milliseconds(200)});
    for (std::size_t i = 0; i < kDead; ++i) ready_one(out, b, i, "dead:1");
    for (std::size_t i = 0; i < kLive; ++i) ready_one(out, b, kDead + i, "live:" + std::to_string(i % kTargets));
    // Every live one arrives while the first dead exchange still hangs.
    REQUIRE(eventually([&] { return live.count() == kLive; }));
    CHECK(dead_returned.load() == 0);
    CHECK(dead_started.load() == 1);  // one exchange per target: the other four wait behind it
    const auto before = out.stats();
    CHECK(before.sent == kLive);
    CHECK(before.queued == kDead - 1);
    CHECK(before.pending == kDead);
    CHECK(out.senders() <= 4);
    const auto t0 = std::chrono::steady_clock::now();
    out.stop();
    const auto took = std::chrono::steady_clock::now() - t0;
    // A hang guard, not a timing claim: without the abort this is minutes.
    CHECK(took < std::chrono::seconds(5));
    CHECK(dead_returned.load() == 1);
    const auto st = out.stats();
    CHECK(st.dropped_at_stop == kDead);
    CHECK(st.send_errors == 0);
    CHECK(st.pending == 0);
    CHECK(st.queued == 0);
    CHECK(st.sent == kLive);
  }
  // Per target in order.
  std::map<std::string, std::size_t> last;
  std::lock_guard lock(live.mu);
  for (const auto& [seg, n] : live.sent) {
    const std::size_t i = std::stoul(n.notify_msg.substr(n.notify_msg.find(' ') + 1));
    if (auto it = last.find(seg); it != last.end()) CHECK(it->second < i);
    last[seg] = i;
  }
}

// The TCP queue is bounded: past max_queued a send is dropped and counted,
// not kept for a target that cannot keep up.
TEST_CASE("notify_outbox: past max_queued a notification is dropped and counted") {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> sent{0};
  constexpr std::size_t kMax = 10, kN = 50;
  batch_state b(kN);
  detail::notify_outbox out(
      [&](const std::string&, const notify_desc&, const std::atomic<bool>&) -> status {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return open; });  // a target that takes its time
        ++sent;
        return {};
      },
      {.max_queued = kMax, .max_senders = 2, .stop_grace = std::chrono::seconds(60)});
  for (std::size_t i = 0; i < kN; ++i) ready_one(out, b, i, "slow:1");
  // Everything handed over is sent (one at a time), queued, or dropped.
  REQUIRE(eventually([&] {
    const auto st = out.stats();
    return st.dropped_overflow + st.queued + 1 == kN;
  }));
  const auto st = out.stats();
  CHECK(st.queued <= kMax);
  CHECK(st.dropped_overflow >= kN - kMax - 1);
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  REQUIRE(eventually([&] { return out.stats().pending == 0; }));
  CHECK(out.stats().sent == kN - out.stats().dropped_overflow);
  CHECK(static_cast<std::size_t>(sent.load()) == out.stats().sent);
}
