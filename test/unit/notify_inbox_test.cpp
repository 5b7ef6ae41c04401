// detail::notify_inbox without devices: take() with and without a wait
// (a push from another thread wakes it: run under TSan by tools/sanitize),
// copies dropped per sender and origin, and the bounds of those windows.
#include <tide/detail/notify_inbox.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

using namespace tide;

TEST_CASE("notify_inbox::take with a wait: a push wakes it early, an empty inbox times out, 0 never sleeps") {
  using namespace std::chrono;
  detail::notify_inbox inbox;
  auto t0 = steady_clock::now();
  CHECK(inbox.take().empty());
  CHECK(steady_clock::now() - t0 < milliseconds(50));
  t0 = steady_clock::now();
  CHECK(inbox.take(milliseconds(100)).empty());
  CHECK(steady_clock::now() - t0 >= milliseconds(100));
  // A waiter sleeping in take() gets the message another thread pushes.
  std::thread pusher([&] {
    std::this_thread::sleep_for(milliseconds(50));
    CHECK(inbox.push(notify_desc{"a", "kv 1"}, "a"));
  });
  t0 = steady_clock::now();
  auto got = inbox.take(seconds(10));
  const auto waited = steady_clock::now() - t0;
  pusher.join();
  REQUIRE(got.size() == 1);
  CHECK(got[0].notify_msg == "kv 1");
  CHECK(waited < seconds(5));
  // Queued before the call: returned at once.
  CHECK(inbox.push(notify_desc{"a", "kv 2"}, "a"));
  t0 = steady_clock::now();
  CHECK(inbox.take(seconds(10)).size() == 1);
  CHECK(steady_clock::now() - t0 < seconds(1));
}

TEST_CASE("notify_inbox: a copy is dropped per sender and origin, within the window; what a bound refused is not remembered") {
  detail::notify_inbox box({.max_count = 4, .max_bytes = 1000, .rate_per_sec = 0});
  auto msg = [](std::uint64_t origin, std::uint64_t seq) {
    return notify_desc{"p", "m", notify_id{origin, seq}};
  };
  CHECK(box.push(msg(1, 5), "p"));
  CHECK(box.push(msg(1, 5), "p"));     // the copy: answered as taken
  CHECK(box.push(msg(1, 3), "p"));     // older, not seen: taken
  CHECK(box.push(msg(2, 5), "p"));     // another origin
  CHECK(box.push(msg(1, 5), "q"));     // another sender (a claimed origin cannot silence someone else's)
  CHECK(box.stats().duplicates == 1);
  CHECK(box.stats().accepted == 4);
  CHECK_FALSE(box.push(msg(1, 6), "p"));  // inbox full: refused, not remembered
  CHECK(box.stats().dropped_count == 1);
  CHECK(box.take().size() == 4);
  CHECK(box.push(msg(1, 6), "p"));  // the same id, now that there is room: taken
  CHECK(box.push(msg(1, 3), "p"));  // still in the window: a copy
  // Past the window: the oldest ids are forgotten and taken again (a copy
  // comes within a handshake timeout, not kSeqWindow notifications later).
  CHECK(box.take().size() == 1);
  CHECK(box.push(msg(1, 6 + detail::notify_inbox::kSeqWindow), "p"));
  CHECK(box.push(msg(1, 6), "p"));
  CHECK(box.push(msg(1, 6 + detail::notify_inbox::kSeqWindow), "p"));
  // Without an id (Mooncake, send_notify) nothing is ever dropped as a copy.
  CHECK(box.take().size() == 2);
  CHECK(box.push(notify_desc{"p", "m"}, "p"));
  CHECK(box.push(notify_desc{"p", "m"}, "p"));
  CHECK(box.stats().duplicates == 3);
  CHECK(box.take().size() == 2);
}

// Review 1ab3d99, finding 19: the inbox forgot every sender's window at
// once when the 4096th (sender, origin) pair came, so a teardown copy that
// arrived just after was taken twice.
TEST_CASE("notify_inbox: a copy arriving after 4096 other (sender, origin) pairs is still dropped") {
  detail::notify_inbox box({.max_count = 1u << 20, .max_bytes = std::size_t{1} << 30, .rate_per_sec = 0});
  auto msg = [](std::string name, std::uint64_t origin, std::uint64_t seq) {
    return notify_desc{std::move(name), "m", notify_id{origin, seq}};
  };
  REQUIRE(box.push(msg("p", 1, 5), "p"));
  // A stranger minting origins under one name: only its own windows go.
  for (std::uint64_t o = 1; o <= 4096; ++o) REQUIRE(box.push(msg("x", o, 1), "x"));
  CHECK(box.windows() == 1 + detail::notify_inbox::kMaxOriginsPerSender);
  CHECK(box.push(msg("p", 1, 5), "p"));
  CHECK(box.stats().duplicates == 1);
  // 4096 senders with one origin each while p keeps sending: the idlest go, not p.
  for (std::uint64_t i = 0; i < 4096; ++i) {
    REQUIRE(box.push(msg("s" + std::to_string(i), 7, 1), "s" + std::to_string(i)));
    if (i % 64 == 0) REQUIRE(box.push(msg("p", 1, 6 + i / 64), "p"));
  }
  CHECK(box.windows() <= detail::notify_inbox::kMaxWindows);
  CHECK(box.push(msg("p", 1, 5), "p"));
  CHECK(box.stats().duplicates == 2);
  // The stranger's most recent origin went with the idlest senders.
  CHECK(box.push(msg("x", 4096, 1), "x"));
  CHECK(box.stats().duplicates == 2);
  CHECK(box.stats().accepted == 1 + 4096 + 4096 + 64 + 1);
}
