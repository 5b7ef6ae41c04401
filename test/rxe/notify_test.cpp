// Transfer-bound notifications (issue 18 part 1): submit(batch, requests,
// notification) on real Soft-RoCE devices, every byte checked.
//  - 1000 batches of random sizes, a window of them in flight, each with a
//    notification: every one arrives exactly once, and when the target reads
//    it the bytes of its requests are there (a slot is reused only after its
//    notification was read, so an early one finds the previous batch's bytes);
//    batches that fail on the wire (a peer buffer unregistered after the
//    initiator resolved it) never notify.  With two NICs per side
//    (tools/rxe-vm --nics 2 --topology rails) both rails carry the data.
//  - a flood past the target's inbox bound: refused and counted on both
//    sides, every byte still delivered, and the next notification gets in.
//  - misuse: no requests, two segments, too long: invalid_argument.
//  - with the cluster secret the sender is the authenticated identity.
// Between these tide engines notifications go as RDMA SENDs on QP 0
// (notify_rdma_credits): the 1000-batch case asserts that nearly all did
// (outbox_stats().sent_rdma); a burst past the credits loses and doubles
// nothing; a peer that does not advertise gets TCP notifications; engines
// torn down with notifications in flight neither crash nor hang.  A lone
// WRITE's notification rides right behind it on QP 0 (outbox_stats().
// sent_with_data): read before the initiator's wait, its bytes are there;
// a lone WRITE that fails flushes it, and nothing arrives.
// Against a hand-made peer (raw_peer.hpp): credits owed to a peer whose
// ready ack is still due go out at once; a peer that advertises credits and
// posts no receives cannot wedge QP 0 (the tasks end, the notification goes
// over TCP).

#include <doctest/doctest.h>

#include <tide/engine.hpp>
#include <tide/net/handshake_client.hpp>
#include <tide/policy/in_process.hpp>

#include "devices_under_test.hpp"
#include "notify_pair.hpp"
#include "raw_peer.hpp"
#include "rxe_helpers.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;
using tide::test::buffer;
using tide::test::connected_pair;

std::vector<std::string> words(const char* var) {
  std::vector<std::string> out;
  if (const char* s = std::getenv(var)) {
    std::istringstream in(s);
    for (std::string w; in >> w;) out.push_back(w);
  }
  return out;
}

// Two NICs per side in a --nics 2 VM, else one (the two devices under test).
std::pair<std::vector<std::string>, std::vector<std::string>> sides() {
  auto a = words("RXE_VM_SIDE_A"), b = words("RXE_VM_SIDE_B");
  if (a.size() >= 2 && b.size() >= 2) {
    a.resize(2);
    b.resize(2);
    return {a, b};
  }
  const auto d = tide::test::devices_under_test();
  MESSAGE("one NIC per side (" << d[0] << ", " << d[1] << "); tools/rxe-vm --nics 2 gives two");
  return {{d[0]}, {d[1]}};
}

tide::engine_config config(const std::vector<std::string>& devices) {
  auto c = tide::test::config_for(devices);
  c.max_retry = 1;  // a buffer gone at the peer fails soon
  c.notify_rdma_credits = 8;  // the RDMA path (the default, kept explicit); cases that test TCP set 0
  return c;
}

// One batch in flight: where its requests went, and what became of it.
struct sent_batch {
  tide::batch_id id = 0;
  std::size_t slot = 0;
  std::vector<std::pair<std::size_t, std::size_t>> parts;  // (offset in the slot, length)
  bool final = false;
  bool completed = false;
};

constexpr std::size_t kPart = 256u << 10;  // request j of a batch lives at j * kPart of its slot
constexpr std::size_t kParts = 4;
constexpr std::size_t kSlotSize = kPart * kParts;
constexpr std::size_t kSlots = 8;  // batches in flight at most

std::string message_for(std::size_t index) { return "batch " + std::to_string(index); }

/// The first non-empty take_notifies() of `e` within 30 s (empty if none came).
template <class Engine>
std::vector<tide::notify_desc> first_notifies(Engine& e) {
  std::vector<tide::notify_desc> got;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (got.empty() && std::chrono::steady_clock::now() < until) {
    got = e.take_notifies();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return got;
}

/// outbox_stats() of `e` once nothing is pending there, or after `within` (callers check pending).
template <class Engine>
tide::notify_outbox_stats settled_outbox(Engine& e, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (e.outbox_stats().pending != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return e.outbox_stats();
}

}  // namespace

TEST_CASE("1000 batches with notifications: each exactly once, after its data; none for a failed batch") {
  const auto [side_a, side_b] = sides();
  connected_pair p(config(side_a), config(side_b), kSlots * kSlotSize);
  auto& [a, b, src, dst, seg, dst_id] = p;

  constexpr std::size_t kBatches = 1000;
  constexpr std::size_t kFailEvery = 100;  // batch k * 100 + 50 fails on the wire
  std::mt19937_64 rng(18);
  std::map<std::size_t, sent_batch> open;  // by batch index: sent, notification not yet read (or failed)
  std::vector<bool> slot_busy(kSlots, false);
  std::vector<int> notified(kBatches, 0);
  std::set<std::size_t> failed;
  std::size_t completed = 0, bad_bytes = 0, stray = 0;

  // The target's side: every notification read is checked against the bytes it stands for.
  auto read_notifications = [&] {
    for (const auto& n : b->take_notifies()) {
      std::size_t index = kBatches;
      if (n.notify_msg.rfind("batch ", 0) == 0) index = std::stoul(n.notify_msg.substr(6));
      if (index >= kBatches) {
        ++stray;
        continue;
      }
      ++notified[index];
      CHECK(n.name == a->segment_name());
      auto it = open.find(index);
      if (it == open.end() || failed.count(index) != 0) {
        ++stray;  // a duplicate, or one for a failed batch
        continue;
      }
      const auto& sb = it->second;
      for (const auto& [off, len] : sb.parts) {
        const std::size_t at = sb.slot * kSlotSize + off;
        if (std::memcmp(src.data + at, dst.data + at, len) != 0) ++bad_bytes;
      }
      // The initiator may not have seen its batch final yet; the slot frees
      // once both happened.
      it->second.parts.clear();
      it->second.parts.emplace_back(0, 0);  // marks "notification read"
    }
  };
  auto notification_read = [](const sent_batch& sb) { return sb.parts.size() == 1 && sb.parts[0].second == 0; };
  // The initiator's side: batches that turned final; a slot is free once its batch is final and,
  // if it completed, its notification was read.
  auto reap = [&] {
    for (auto it = open.begin(); it != open.end();) {
      auto& sb = it->second;
      if (!sb.final) {
        auto st = a->batch_status(sb.id);
        REQUIRE(st);
        if (st->state == transfer_state::pending) {
          ++it;
          continue;
        }
        sb.final = true;
        sb.completed = st->state == transfer_state::completed;
        if (sb.completed) ++completed;
        else failed.insert(it->first);
        auto fb = a->free_batch(sb.id);
        REQUIRE_MESSAGE(fb, "batch " << it->first << ": " << (fb ? "" : fb.error().message()));
      }
      if (!sb.completed || notification_read(sb)) {
        slot_busy[sb.slot] = false;
        it = open.erase(it);
      } else {
        ++it;
      }
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + 600s;
  auto pump_until = [&](auto done) {
    while (!done()) {
      read_notifications();
      reap();
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline,
                      open.size() << " batch(es) open, first " << open.begin()->first);
      std::this_thread::sleep_for(100us);
    }
  };

  std::vector<std::unique_ptr<buffer>> doomed;  // unregistered at the target, freed at the end
  for (std::size_t k = 0; k < kBatches; ++k) {
    const bool fail_this = k % kFailEvery == kFailEvery / 2;
    std::optional<std::uint32_t> doomed_id;
    if (fail_this) {
      // Alone on the wire (a QP in error flushes its neighbours' WRs too): a
      // buffer the initiator knows and the target then takes away.
      pump_until([&] { return open.empty(); });
      doomed.push_back(std::make_unique<buffer>(4096));
      REQUIRE(b->register_memory(doomed.back()->data, 4096, "cpu:0"));
      doomed_id = b->buffer_id(doomed.back()->data).value();
      auto prime = transfer_request::in_buffer(transfer_op::write, src.data, seg, *doomed_id, 0, 64);
      REQUIRE(tide::test::run_one(*a, prime));  // its submit refreshes a's view of b
      REQUIRE(b->unregister_memory(doomed.back()->data));
    }
    pump_until([&] {
      for (std::size_t s = 0; s < kSlots; ++s)
        if (!slot_busy[s]) return true;
      return false;
    });
    std::size_t slot = 0;
    while (slot_busy[slot]) ++slot;
    sent_batch sb;
    sb.slot = slot;
    const std::size_t nparts = 1 + rng() % kParts;
    std::vector<transfer_request> reqs;
    for (std::size_t j = 0; j < nparts; ++j) {
      // Sizes from 1 byte to 256 KiB, skewed small.
      const std::size_t len = std::max<std::size_t>(1, (rng() % kPart) >> (rng() % 10));
      const std::size_t off = j * kPart;
      const std::size_t at = slot * kSlotSize + off;
      tide::test::fill(src.data + at, len, rng());
      sb.parts.emplace_back(off, len);
      reqs.push_back(transfer_request::in_buffer(transfer_op::write, src.data + at, seg, dst_id, at, len));
    }
    if (doomed_id) reqs.push_back(transfer_request::in_buffer(transfer_op::write, src.data, seg, *doomed_id, 0, 64));
    auto batch = a->allocate_batch(reqs.size());
    REQUIRE(batch);
    sb.id = *batch;
    auto s = a->submit(*batch, reqs, tide::notification{"", message_for(k)});
    REQUIRE_MESSAGE(s, s.error().message());
    slot_busy[slot] = true;
    open.emplace(k, std::move(sb));
    if (fail_this) {
      pump_until([&] { return open.empty(); });
      CHECK_MESSAGE(failed.count(k) == 1, "batch " << k << " with a request into an unregistered buffer did not fail");
    }
  }
  pump_until([&] { return open.empty(); });
  // A notification of a failed batch would have been sent by now: the
  // outbox is empty and the target's inbox read once more.
  pump_until([&] { return a->outbox_stats().pending == 0; });
  std::this_thread::sleep_for(200ms);
  read_notifications();

  std::size_t missing = 0, twice = 0, for_failed = 0;
  for (std::size_t k = 0; k < kBatches; ++k) {
    if (failed.count(k) != 0) {
      if (notified[k] != 0) ++for_failed;
    } else if (notified[k] == 0) {
      ++missing;
    } else if (notified[k] > 1) {
      ++twice;
    }
  }
  const auto out = a->outbox_stats();
  const auto in = b->notification_stats();
  MESSAGE(completed << " batches completed, " << failed.size() << " failed; outbox: " << out.sent << " sent ("
                    << out.sent_rdma << " over RDMA, " << out.sent_tcp << " over TCP, " << out.rdma_fallbacks
                    << " fell back), " << out.dropped_failed << " dropped (failed), " << out.refused << " refused, "
                    << out.send_errors << " errors; inbox: " << in.accepted << " accepted");
  for (const auto& n : a->stats().nics) MESSAGE(n.name << ": " << n.bytes << " bytes, " << n.wrs << " WRs");
  CHECK(failed.size() >= kBatches / kFailEvery);
  CHECK(completed + failed.size() == kBatches);
  CHECK(missing == 0);
  CHECK(twice == 0);
  CHECK(for_failed == 0);
  CHECK(stray == 0);
  CHECK(bad_bytes == 0);
  CHECK(out.submitted == kBatches);
  CHECK(out.sent == completed);
  CHECK(out.dropped_failed == failed.size());
  CHECK(out.refused + out.send_errors == 0);
  CHECK(in.accepted == completed);
  CHECK(out.sent_rdma + out.sent_tcp == out.sent);
  // Nearly all over RDMA: TCP only while a fresh endpoint connects after a
  // failed batch killed the old one's QPs.
  CHECK_MESSAGE(out.sent_rdma * 10 >= out.sent * 9, out.sent_rdma << " of " << out.sent << " over RDMA");
  if (side_a.size() == 2)
    for (const auto& n : a->stats().nics) CHECK_MESSAGE(n.bytes > 0, n.name << " carried nothing");
}

TEST_CASE("a flood past the target's inbox bound is refused and counted; the data path is unharmed") {
  const auto [side_a, side_b] = sides();
  // Over TCP the sender is told of each refusal; over RDMA only the target
  // counts them (a SEND has no answer), and the sender counts it delivered.
  for (const std::uint32_t credits : {0u, 8u}) {
  CAPTURE(credits);
  auto ca = config(side_a);
  auto cb = config(side_b);
  ca.notify_rdma_credits = cb.notify_rdma_credits = credits;
  cb.notify_max_count = 16;
  cb.notify_rate_per_peer = 0;  // the count bound, not the rate bound, refuses here
  auto a = tide::test::make_engine(ca);
  auto b = tide::test::make_engine(cb);
  constexpr std::size_t kFlood = 64, kSize = 64u << 10;
  buffer src(kFlood * kSize), dst(kFlood * kSize);
  REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
  REQUIRE(b->register_memory(dst.data, dst.size, "cpu:0"));
  const auto seg = a->open_segment(b->segment_name()).value();
  const auto dst_id = b->buffer_id(dst.data).value();
  tide::test::fill(src.data, src.size, 7);

  std::vector<tide::batch_id> batches;
  for (std::size_t k = 0; k < kFlood; ++k) {
    auto r = transfer_request::in_buffer(transfer_op::write, src.data + k * kSize, seg, dst_id, k * kSize, kSize);
    auto batch = a->allocate_batch(1).value();
    REQUIRE(a->submit(batch, {&r, 1}, tide::notification{"", "flood " + std::to_string(k)}));
    batches.push_back(batch);
  }
  for (auto batch : batches) {
    REQUIRE(a->wait(batch, 60s));
    CHECK(a->batch_status(batch)->state == transfer_state::completed);
    REQUIRE(a->free_batch(batch));
  }
  // A SEND's completion at the sender says the target's NIC has the message,
  // not that the target's lane has polled it: wait for the target to have
  // counted every one (accepted or refused) too.
  const auto until = std::chrono::steady_clock::now() + 60s;
  const auto target_counted = [&] {
    const auto s = b->notification_stats();
    return s.accepted + s.dropped_count + s.dropped_bytes + s.dropped_rate;
  };
  while ((a->outbox_stats().pending != 0 || target_counted() < kFlood) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(std::memcmp(src.data, dst.data, src.size) == 0);
  const auto out = a->outbox_stats();
  const auto in = b->notification_stats();
  MESSAGE("outbox: " << out.sent << " sent, " << out.refused << " refused; inbox: " << in.accepted << " accepted, "
                     << in.dropped_count << " refused by the count bound");
  CHECK(out.pending == 0);
  if (credits == 0) {
    CHECK(out.sent == 16);
    CHECK(out.refused == kFlood - 16);
    CHECK(out.sent_rdma == 0);
  } else {
    CHECK(out.sent + out.refused == kFlood);  // refused: the ones that fell back to TCP
    CHECK(out.sent_rdma > 0);
  }
  CHECK(out.send_errors == 0);
  CHECK(in.accepted == 16);
  CHECK(in.dropped_count == kFlood - 16);
  auto got = b->take_notifies();
  CHECK(got.size() == 16);
  std::set<std::string> distinct;
  for (const auto& n : got) distinct.insert(n.notify_msg);
  CHECK(distinct.size() == 16);

  // Room again: a transfer and its notification go through.
  std::memset(dst.data, 0, kSize);
  auto r = transfer_request::in_buffer(transfer_op::write, src.data, seg, dst_id, 0, kSize);
  auto batch = a->allocate_batch(1).value();
  REQUIRE(a->submit(batch, {&r, 1}, tide::notification{"", "after"}));
  REQUIRE(a->wait(batch, 60s));
  REQUIRE(a->free_batch(batch));
  std::vector<tide::notify_desc> after;
  while (after.empty() && std::chrono::steady_clock::now() < until) {
    after = b->take_notifies();
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(after.size() == 1);
  CHECK(after[0].notify_msg == "after");
  CHECK(std::memcmp(src.data, dst.data, kSize) == 0);
  }
}

TEST_CASE("notification misuse is invalid_argument, and nothing is submitted") {
  const auto [side_a, side_b] = sides();
  auto a = tide::test::make_engine(config(side_a));
  auto b = tide::test::make_engine(config(side_b));
  auto c = tide::test::make_engine(config(side_b));
  buffer src(8192), dst(8192), other(8192);
  REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
  REQUIRE(b->register_memory(dst.data, dst.size, "cpu:0"));
  REQUIRE(c->register_memory(other.data, other.size, "cpu:0"));
  const auto sb = a->open_segment(b->segment_name()).value();
  const auto sc = a->open_segment(c->segment_name()).value();
  const auto ib = b->buffer_id(dst.data).value(), ic = c->buffer_id(other.data).value();
  auto batch = a->allocate_batch(4).value();

  auto s = a->submit(batch, {}, tide::notification{"", "nothing"});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::invalid_argument);

  const std::vector<transfer_request> two{transfer_request::in_buffer(transfer_op::write, src.data, sb, ib, 0, 4096),
                                          transfer_request::in_buffer(transfer_op::write, src.data, sc, ic, 0, 4096)};
  s = a->submit(batch, two, tide::notification{"", "two targets"});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::invalid_argument);
  CHECK(s.error().detail.find("segment") != std::string::npos);

  const auto one = transfer_request::in_buffer(transfer_op::write, src.data, sb, ib, 0, 4096);
  s = a->submit(batch, {&one, 1}, tide::notification{"", std::string(tide::notification::kMaxBytes + 1, 'x')});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::invalid_argument);

  // A request the transport refuses: its error, and the notification is not counted.
  const auto oob = transfer_request::in_buffer(transfer_op::write, src.data, sb, ib, 8000, 4096);
  s = a->submit(batch, {&oob, 1}, tide::notification{"", "out of bounds"});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::out_of_bounds);

  CHECK(a->batch_status(batch)->state == transfer_state::waiting);  // nothing went in
  CHECK(a->outbox_stats().submitted == 0);
  // Still usable: one good submit with its notification.
  REQUIRE(a->submit(batch, {&one, 1}, tide::notification{"custom-name", "good"}));
  REQUIRE(a->wait(batch, 60s));
  REQUIRE(a->free_batch(batch));
  const std::vector<tide::notify_desc> got = first_notifies(*b);
  REQUIRE(got.size() == 1);
  CHECK(got[0].name == "custom-name");  // no cluster secret: the name the sender gave
  CHECK(got[0].notify_msg == "good");
  CHECK(c->take_notifies().empty());
}

TEST_CASE("with the cluster secret the target records the authenticated sender, not the name a notification claims") {
  const auto [side_a, side_b] = sides();
  char path[] = "/tmp/tide-notify-sec-XXXXXX";
  const int fd = ::mkstemp(path);  // 0600, as the secret must be
  REQUIRE(fd >= 0);
  std::string bytes(32, '\0');
  std::mt19937 g(18);
  for (auto& c : bytes) c = static_cast<char>(g());
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == 32);
  ::close(fd);
  auto ca = config(side_a), cb = config(side_b);
  ca.auth_secret_file = cb.auth_secret_file = path;
  auto a = tide::test::make_engine(ca);
  auto b = tide::test::make_engine(cb);
  ::unlink(path);
  buffer src(65536), dst(65536);
  REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
  REQUIRE(b->register_memory(dst.data, dst.size, "cpu:0"));
  const auto seg = a->open_segment(b->segment_name()).value();
  tide::test::fill(src.data, src.size, 3);
  auto r = transfer_request::in_buffer(transfer_op::write, src.data, seg, b->buffer_id(dst.data).value(), 0, src.size);
  auto batch = a->allocate_batch(1).value();
  REQUIRE(a->submit(batch, {&r, 1}, tide::notification{"someone-else:1", "signed"}));
  REQUIRE(a->wait(batch, 60s));
  REQUIRE(a->free_batch(batch));
  const std::vector<tide::notify_desc> got = first_notifies(*b);
  REQUIRE(got.size() == 1);
  CHECK(got[0].name == a->segment_name());
  CHECK(got[0].notify_msg == "signed");
  CHECK(std::memcmp(src.data, dst.data, src.size) == 0);
}

namespace {

// Submits `n` one-request batches of `size` bytes from a to b (request k at
// k * size, its own fill), each with notification "burst <k>", and waits for
// the data; returns the batches' states.
template <class Engine>
void submit_burst(Engine& a, tide::segment_id seg, std::uint32_t dst_id, buffer& src, std::size_t n, std::size_t size,
                  const std::string& prefix, std::vector<tide::batch_id>* keep = nullptr) {
  for (std::size_t k = 0; k < n; ++k) {
    tide::test::fill(src.data + k * size, size, 1000 + k);
    auto r = transfer_request::in_buffer(transfer_op::write, src.data + k * size, seg, dst_id, k * size, size);
    auto batch = a.allocate_batch(1).value();
    auto s = a.submit(batch, {&r, 1}, tide::notification{"", prefix + std::to_string(k)});
    REQUIRE_MESSAGE(s, s.error().message());
    if (keep != nullptr) keep->push_back(batch);
  }
}

// Reads b's inbox until `n` messages came or `wait` passed; checks each
// names a distinct k whose bytes are at the target.  Returns how many came.
template <class Engine>
std::size_t read_burst(Engine& b, const buffer& src, const buffer& dst, std::size_t n, std::size_t size,
                       const std::string& prefix, std::chrono::milliseconds wait) {
  std::set<std::size_t> seen;
  std::size_t dup = 0, bad = 0, stray = 0;
  const auto until = std::chrono::steady_clock::now() + wait;
  while (seen.size() < n && std::chrono::steady_clock::now() < until) {
    for (const auto& m : b.take_notifies()) {
      if (m.notify_msg.rfind(prefix, 0) != 0) {
        ++stray;
        continue;
      }
      const std::size_t k = std::stoul(m.notify_msg.substr(prefix.size()));
      if (k >= n) {
        ++stray;
        continue;
      }
      if (!seen.insert(k).second) ++dup;
      if (std::memcmp(src.data + k * size, dst.data + k * size, size) != 0) ++bad;
    }
    std::this_thread::sleep_for(1ms);
  }
  CHECK(dup == 0);
  CHECK(bad == 0);
  CHECK(stray == 0);
  return seen.size();
}

}  // namespace

TEST_CASE("a burst of notifications past the credits, read late: none lost, none twice, each after its data") {
  const auto [side_a, side_b] = sides();
  auto cb = config(side_b);
  cb.notify_rate_per_peer = 0;
  constexpr std::size_t kBurst = 300, kSize = 4096;
  connected_pair p(config(side_a), cb, kBurst * kSize);
  auto& [a, b, src, dst, seg, dst_id] = p;
  p.connect();  // so that the burst finds the endpoint up
  std::vector<tide::batch_id> batches;
  submit_burst(*a, seg, dst_id, src, kBurst, kSize, "burst ", &batches);
  for (auto batch : batches) {
    REQUIRE(a->wait(batch, 60s));
    CHECK(a->batch_status(batch)->state == transfer_state::completed);
    REQUIRE(a->free_batch(batch));
  }
  // The target reads nothing until every notification left the sender: the
  // credits ran out on the way (300 > 8), the receiver returned them.
  const auto out = settled_outbox(*a, 60s);
  MESSAGE("outbox: " << out.sent << " sent (" << out.sent_rdma << " RDMA, " << out.sent_tcp << " TCP, "
                     << out.rdma_fallbacks << " fell back), " << out.refused << " refused");
  CHECK(out.pending == 0);
  CHECK(out.sent == kBurst);
  CHECK(out.sent_rdma + out.sent_tcp == kBurst);
  CHECK(out.sent_rdma > 8);  // more than one round of credits went over RDMA
  CHECK(out.refused + out.send_errors == 0);
  // A SEND completes at the sender when the target's NIC took it; the
  // target's lane puts it in the inbox a moment later.
  for (int i = 0; i < 3000 && b->notification_stats().queued < kBurst; ++i) std::this_thread::sleep_for(1ms);
  CHECK(b->notification_stats().queued == kBurst);  // within the inbox bound (4096)
  CHECK(read_burst(*b, src, dst, kBurst, kSize, "burst ", 30s) == kBurst);
  CHECK(b->notification_stats().accepted == kBurst);
}

TEST_CASE("a lone WRITE's notification rides behind it: read with its bytes there, once; a lone WRITE that fails takes it down") {
  const auto [side_a, side_b] = sides();
  constexpr std::size_t kWrites = 200, kSlot = 4096;
  connected_pair p(config(side_a), config(side_b), kWrites * kSlot);
  auto& [a, b, src, dst, seg, dst_id] = p;
  p.connect();

  std::mt19937_64 rng(36);
  std::size_t bad_bytes = 0, wrong = 0;
  for (std::size_t k = 0; k < kWrites; ++k) {
    const std::size_t len = k == 0 ? 1 : 1 + rng() % kSlot;
    tide::test::fill(src.data + k * kSlot, len, rng());
    const auto r = transfer_request::in_buffer(transfer_op::write, src.data + k * kSlot, seg, dst_id, k * kSlot, len);
    auto batch = a->allocate_batch(1).value();
    REQUIRE(a->submit(batch, {&r, 1}, tide::notification{"", message_for(k)}));
    // Read before the initiator waits: the message may come before its
    // completion does, never before the bytes.
    const auto got = first_notifies(*b);
    REQUIRE(got.size() == 1);
    if (got[0].notify_msg != message_for(k)) ++wrong;
    if (std::memcmp(src.data + k * kSlot, dst.data + k * kSlot, len) != 0) ++bad_bytes;
    REQUIRE(a->wait(batch, 60s));
    CHECK(a->batch_status(batch)->state == transfer_state::completed);
    REQUIRE(a->free_batch(batch));
  }
  auto out = settled_outbox(*a, 30s);
  MESSAGE("outbox: " << out.sent << " sent (" << out.sent_rdma << " RDMA, " << out.sent_with_data
                     << " behind their WRITE, " << out.sent_tcp << " TCP)");
  CHECK(wrong == 0);
  CHECK(bad_bytes == 0);
  CHECK(out.sent == kWrites);
  // Credits come back every four messages, so riding never waits for one:
  // only a SEND posted in the moment a credit message is still on its way goes the usual way.
  CHECK_MESSAGE(out.sent_with_data * 10 >= kWrites * 9, out.sent_with_data << " of " << kWrites << " rode");
  CHECK(b->notification_stats().duplicates == 0);
  CHECK(b->take_notifies().empty());

  // A lone WRITE into a buffer the target took away: the WRITE fails, the
  // SEND behind it is flushed with the QP, and nothing arrives.
  buffer doomed(4096);
  REQUIRE(b->register_memory(doomed.data, doomed.size, "cpu:0"));
  const auto doomed_id = b->buffer_id(doomed.data).value();
  auto prime = transfer_request::in_buffer(transfer_op::write, src.data, seg, doomed_id, 0, 64);
  REQUIRE(tide::test::run_one(*a, prime));  // a's view of b holds the buffer
  REQUIRE(b->unregister_memory(doomed.data));
  const auto before = a->outbox_stats();
  auto fails = transfer_request::in_buffer(transfer_op::write, src.data, seg, doomed_id, 0, 64);
  auto batch = a->allocate_batch(1).value();
  REQUIRE(a->submit(batch, {&fails, 1}, tide::notification{"", "doomed"}));
  REQUIRE(a->wait(batch, 60s));
  CHECK(a->batch_status(batch)->state == transfer_state::failed);
  REQUIRE(a->free_batch(batch));
  out = settled_outbox(*a, 30s);
  CHECK(out.dropped_failed == before.dropped_failed + 1);
  CHECK(out.sent == before.sent);
  std::this_thread::sleep_for(200ms);
  CHECK(b->take_notifies().empty());

  // And the next one arrives, over the endpoint that replaced the failed one.
  auto again = transfer_request::in_buffer(transfer_op::write, src.data, seg, dst_id, 0, 4096);
  batch = a->allocate_batch(1).value();
  REQUIRE(a->submit(batch, {&again, 1}, tide::notification{"", "again"}));
  const auto got = first_notifies(*b);
  REQUIRE(got.size() == 1);
  CHECK(got[0].notify_msg == "again");
  REQUIRE(a->wait(batch, 60s));
  REQUIRE(a->free_batch(batch));
}

TEST_CASE("a peer that does not advertise RDMA notifications gets them over TCP, either way round") {
  const auto [side_a, side_b] = sides();
  for (const bool target_off : {true, false}) {
    CAPTURE(target_off);
    auto ca = config(side_a), cb = config(side_b);
    (target_off ? cb : ca).notify_rdma_credits = 0;
    constexpr std::size_t kN = 20, kSize = 8192;
    connected_pair p(ca, cb, kN * kSize);
    auto& [a, b, src, dst, seg, dst_id] = p;
    std::vector<tide::batch_id> batches;
    submit_burst(*a, seg, dst_id, src, kN, kSize, "plain ", &batches);
    for (auto batch : batches) {
      REQUIRE(a->wait(batch, 60s));
      REQUIRE(a->free_batch(batch));
    }
    CHECK(read_burst(*b, src, dst, kN, kSize, "plain ", 30s) == kN);
    // The target has them before the sender has counted the last reply.
    const auto out = settled_outbox(*a, 30s);
    CHECK(out.sent == kN);
    CHECK(out.sent_tcp == kN);
    CHECK(out.sent_rdma == 0);
    CHECK(out.rdma_fallbacks == 0);  // never offered to a lane: the endpoint has no RDMA notifications
  }
}

TEST_CASE("engines torn down with notifications in flight: no crash, no hang, nothing doubled") {
  const auto [side_a, side_b] = sides();
  constexpr std::size_t kN = 64, kSize = 65536;
  buffer src(kN * kSize), dst(kN * kSize);
  auto cb = config(side_b);
  cb.notify_rate_per_peer = 0;
  auto b = tide::test::make_engine(cb);
  REQUIRE(b->register_memory(dst.data, dst.size, "cpu:0"));
  const auto dst_id = b->buffer_id(dst.data).value();
  {
    // The initiator goes while batches and their notifications are in
    // flight: a batch its teardown flushed ends FAILED and sends nothing; a
    // notification a lane still holds goes back to the outbox, which sends
    // it over TCP before the engine is gone.
    auto a = tide::test::make_engine(config(side_a));
    REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
    const auto seg = a->open_segment(b->segment_name()).value();
    auto warm = transfer_request::in_buffer(transfer_op::write, src.data, seg, dst_id, 0, 64);
    REQUIRE(tide::test::run_one(*a, warm));
    submit_burst(*a, seg, dst_id, src, kN, kSize, "gone ");
    const auto t0 = std::chrono::steady_clock::now();
    a.reset();
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  }
  // What arrived arrived once and after its data; a batch torn down before
  // its data landed sends nothing.
  const std::size_t got = read_burst(*b, src, dst, kN, kSize, "gone ", 3s);
  MESSAGE(got << " of " << kN << " notifications arrived before the initiator was gone");
  {
    // The target goes with its receives posted and notifications on the way.
    auto a = tide::test::make_engine(config(side_a));
    REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
    const auto seg = a->open_segment(b->segment_name()).value();
    auto warm = transfer_request::in_buffer(transfer_op::write, src.data, seg, dst_id, 0, 64);
    REQUIRE(tide::test::run_one(*a, warm));
    submit_burst(*a, seg, dst_id, src, kN, kSize, "late ");
    const auto t0 = std::chrono::steady_clock::now();
    b.reset();
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    const auto out = settled_outbox(*a, 120s);
    MESSAGE("after the target went: " << out.sent << " sent, " << out.dropped_failed << " dropped, "
                                      << out.send_errors << " errors, " << out.pending << " pending");
    CHECK(out.pending == 0);  // nothing stuck in a lane
    CHECK(out.sent + out.dropped_failed + out.refused + out.send_errors == kN);
    a.reset();
  }
}

namespace {

struct in_process_policies : tide::default_policies {
  using metadata = tide::policy::in_process;
};

}  // namespace

// Review 1ab3d99, finding 18: the passive side held the credits it owed
// back while it waited for the active side's ready ack (endpoint::ready()),
// and its lane 0 spun meanwhile: until the ack came, or for
// ready_ack_timeout when it was lost.  Here the ack never comes and its
// deadline is two minutes away; the credit message must not wait for it.
TEST_CASE("credits owed to a peer whose ready ack is still due go out at once") {
  const auto devs = tide::test::devices_under_test();
  auto ca = config({devs[0]});
  ca.ready_ack_timeout = 120s;
  auto a = tide::test::make_engine(ca);
  tide::test::raw_peer peer(devs[1]);
  const std::string from = "127.0.0.1:1@fake0";
  auto reply = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(),
                                             peer.request(from, a->segment_name() + "@" + devs[0], 8));
  REQUIRE_MESSAGE(reply, reply.error().message());
  REQUIRE_MESSAGE(reply->reply_msg.empty(), reply->reply_msg);
  REQUIRE(reply->notify_credits.has_value());
  const std::uint32_t owed_after = std::max<std::uint32_t>(1, *reply->notify_credits / 2);
  peer.post_recvs(4);  // for the engine's credit messages
  peer.connect(*reply);
  auto& ctx = a->transport().context(0);
  auto h = ctx.find_endpoint(from);
  REQUIRE(h);
  REQUIRE(h->state() == tide::rdma::endpoint_state::connected_wait_ready_ack);
  // The engine owes a credit message once it has reposted R/2 receives.
  for (std::uint32_t k = 0; k < owed_after; ++k)
    REQUIRE(peer.send_notify(tide::notify_desc{"127.0.0.1:1", "m" + std::to_string(k)}) == IBV_WC_SUCCESS);
  const auto credit = peer.wait_recv(60s);
  REQUIRE_MESSAGE(credit.has_value(), "no credit message within 60 s of the engine owing one");
  CHECK(credit->ok);
  CHECK(credit->kind == tide::rdma::detail::notify_kind::credit);
  CHECK(credit->credits == owed_after);
  // It went out before the ack, not once the ack's deadline passed.
  CHECK(h->state() == tide::rdma::endpoint_state::connected_wait_ready_ack);
  h.reset();
  CHECK(a->take_notifies().size() == owed_after);
}

// Review 1ab3d99, finding 3: QPs ran with infinite RNR retries, so a peer
// that advertises notification credits but posts no receives left the
// first notification SEND drawing RNR NAKs for ever, and every WR behind it
// on QP 0: those tasks never became final.  The peer here is raw verbs QPs
// connected to the engine's passive side under the name of a real engine
// (b), whose descriptor in the initiator's metadata names the hand-made
// NIC and memory; b's handshake port takes the TCP notification.
TEST_CASE("a peer that advertises notification credits but posts no receives: tasks end, the notification goes over TCP") {
  const auto devs = tide::test::devices_under_test();
  auto b = tide::test::make_engine(config({devs[1]}));
  const std::string name = b->segment_name();
  const std::string from = name + "@fake0";
  auto ca = config({devs[0]});
  ca.metadata = "";
  ca.cluster_id = "raw-peer-rnr";
  ca.transfer_timeout = 30s;
  auto a = tide::test::make_engine<in_process_policies>(ca);
  tide::test::raw_peer peer(devs[1]);  // posts no receives
  {
    tide::metadata_config mc;
    mc.cluster_id = ca.cluster_id;
    tide::policy::in_process store(mc);
    tide::segment_desc d;
    d.name = name;
    tide::device_desc dev;
    dev.name = "fake0";
    dev.gid = peer.gid();
    d.devices.push_back(dev);
    tide::buffer_desc bd;
    bd.name = "cpu:0";
    bd.addr = reinterpret_cast<std::uint64_t>(peer.buf);
    bd.length = tide::test::raw_peer::kSlots;
    bd.lkey = {peer.mr->lkey};
    bd.rkey = {peer.mr->rkey};
    d.buffers.push_back(bd);
    d.priority["cpu:0"] = tide::priority_entry{{"fake0"}, {}};
    d.timestamp = tide::current_timestamp();
    REQUIRE(store.put_segment(name, tide::encode_segment(d)));
  }
  auto req = peer.request(from, a->segment_name() + "@" + devs[0], 8);
  auto reply = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), req);
  REQUIRE_MESSAGE(reply, reply.error().message());
  REQUIRE_MESSAGE(reply->reply_msg.empty(), reply->reply_msg);
  REQUIRE(reply->notify_credits.has_value());
  peer.connect(*reply);
  req.ready_ack = true;
  auto ack = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), req);
  REQUIRE_MESSAGE(ack, ack.error().message());
  REQUIRE(ack->reply_msg.empty());
  auto& ctx = a->transport().context(0);
  REQUIRE(ctx.find_endpoint(from));
  REQUIRE(ctx.find_endpoint(from)->notify_ready());

  buffer src(tide::test::raw_peer::kSlots);
  tide::test::fill(src.data, src.size, 3);
  REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
  const auto seg = a->open_segment(name).value();
  const auto remote = reinterpret_cast<std::uint64_t>(peer.buf);
  // The notification's own transfer lands (a WRITE needs no receive); its
  // SEND is handed to lane 0 as the task ends.
  {
    const auto batch = a->allocate_batch(1).value();
    const auto r = transfer_request::at_address(transfer_op::write, src.data, seg, remote, 4096);
    REQUIRE(a->submit(batch, {&r, 1}, tide::notification{"", "after the data"}));
    REQUIRE(a->wait(batch, 60s));
    CHECK(a->batch_status(batch)->state == transfer_state::completed);
    REQUIRE(a->free_batch(batch));
  }
  // Batches after it, spread over both lanes: what lane 0 posts queues on
  // QP 0 behind the SEND.  Each must end (COMPLETED, or FAILED once the
  // endpoint is gone: the peer cannot handshake again) within its timeout.
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    constexpr std::size_t kN = 16, kLen = 1024;
    std::vector<transfer_request> reqs;
    for (std::size_t i = 0; i < kN; ++i)
      reqs.push_back(transfer_request::at_address(transfer_op::write, src.data + i * kLen, seg, remote + i * kLen, kLen));
    const auto batch = a->allocate_batch(kN).value();
    REQUIRE(a->submit(batch, reqs));
    const auto w = a->wait(batch, 60s);  // a hang guard: transfer_timeout is 30 s
    REQUIRE_MESSAGE(w, w.error().message());
    const auto st = a->batch_status(batch)->state;
    CHECK((st == transfer_state::completed || st == transfer_state::failed));
    REQUIRE(a->free_batch(batch));
  }
  // The SEND failed with its QP (RNR retries exhausted): the notification
  // went over TCP to b, and the peer gets no RDMA notifications again.
  const auto out = settled_outbox(*a, 60s);
  CHECK(out.pending == 0);
  CHECK(out.rdma_fallbacks == 1);
  CHECK(out.sent_tcp == 1);
  CHECK(out.sent_rdma == 0);
  const auto got = first_notifies(*b);
  REQUIRE(got.size() == 1);
  CHECK(got[0].notify_msg == "after the data");
  CHECK(got[0].name == a->segment_name());
  CHECK(ctx.rdma_notify_refused(from));
}
