// Registration with the descriptor in a shared store (etcd, tide's HTTP
// metadata server), issue 36 item 3: registrations from several threads at
// once share store writes (group commit), and each still returns only once
// the store holds a descriptor with its buffer (what a Mooncake peer relies
// on); an unregistration likewise; a store write that fails reaches every
// registration that waited for it, with the store's error, and nothing
// hangs.  Engines on TCP alone over loopback, the real etcd and the real
// tide-metadata-server; with and without the cluster secret (sealed
// descriptors).  Waits are on the engine's own state
// (registrations_waiting), each with a safety limit that fails the test.
//
// With publish_delay the registrations return at once and one write per
// window (or flush_metadata) stores them; unregistrations stay synchronous.
//
// Exits 77 (meson: skipped) with the reason printed when no etcd binary can
// be found.

#define DOCTEST_CONFIG_IMPLEMENT
#include <tide/engine.hpp>
#include <tide/policy/etcd.hpp>
#include <tide/policy/http.hpp>
#include <tide/wire/auth.hpp>

#include "support/etcd_cluster.hpp"
#include "support/metadata_server.hpp"
#include "support/process.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;
using tide::errc;

namespace {

const std::string kSecretBytes(32, 's');

// A backend that counts its descriptor PUTs and runs a test's hook (once)
// before the next one: the hook holds a write in flight while others queue.
template <class Base>
struct gated : Base {
  static constexpr std::string_view kName = "gated";
  using Base::Base;
  static inline std::atomic<int> puts{0};
  static inline std::mutex hook_mu;
  static inline std::function<void()> hook;  ///< under hook_mu; taken by the next PUT
  static void arm(std::function<void()> f) {
    std::lock_guard lock(hook_mu);
    hook = std::move(f);
  }
  tide::status put_segment(std::string_view name, std::string_view json) {
    std::function<void()> h;
    {
      std::lock_guard lock(hook_mu);
      h.swap(hook);
    }
    if (h) h();
    ++puts;
    return Base::put_segment(name, json);
  }
};

struct etcd_store {
  static constexpr const char* kName = "etcd";
  using backend = gated<tide::policy::etcd>;
  struct policies : tide::default_policies {
    using metadata = backend;
  };
  tide::test::etcd_cluster cluster{1};
  std::string connection() const { return cluster.connection(); }
  void stop() { cluster.process(0).kill(); }
  void restart() {
    cluster.start(0);  // same ports, same data directory
    REQUIRE(cluster.wait_ready(0, 15s));
  }
};

struct http_store {
  static constexpr const char* kName = "http";
  using backend = gated<tide::policy::http>;
  struct policies : tide::default_policies {
    using metadata = backend;
  };
  tide::test::metadata_server_process server;
  std::string connection() const { return server.url(); }
  void stop() { server.process().kill(); }
  void restart() { server.start(server.port()); }  // empty: the next write stores the whole descriptor
};

// Spins (yielding) until `ready()`; false when `limit` passes first.
template <class F>
bool wait_until(F ready, std::chrono::seconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

struct secret_file {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("tide-registration-store-" + std::to_string(::getpid()) + ".secret");
  secret_file() {
    std::ofstream(path) << kSecretBytes;
    std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::replace);
  }
  ~secret_file() { std::filesystem::remove(path); }
};

template <class S>
tide::engine_config config(const S& store, const std::string& secret) {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.bind_host = "127.0.0.1";
  c.transports = "tcp";
  c.metadata = store.connection();
  c.metadata_timeout = 2000ms;
  c.auth_secret_file = secret;
  return c;
}

template <class S>
std::unique_ptr<tide::transfer_engine<typename S::policies>> make(const S& store, const std::string& secret) {
  auto e = tide::transfer_engine<typename S::policies>::create(config(store, secret));
  if (!e) FAIL("create: " << e.error().message());
  return std::move(*e);
}

// A peer's view of the store: the descriptor of `name` fetched afresh (with
// the secret: opened and MAC-checked as a peer's engine does).
template <class S>
class reader {
 public:
  reader(const S& store, bool sealed) : cache_(config_of(store, sealed)) {}
  // Whether the stored descriptor of `name` has a buffer at `addr`; a
  // failed fetch counts as "not seen" and is kept in fetch_error (no REQUIRE:
  // readers run on the test's threads).
  bool sees(const std::string& name, const void* addr) {
    auto d = cache_.descriptor_of(name, true);
    if (!d) {
      fetch_error = d.error().message();
      return false;
    }
    const auto a = reinterpret_cast<std::uint64_t>(addr);
    return std::any_of((*d)->buffers.begin(), (*d)->buffers.end(), [a](const tide::buffer_desc& b) { return b.addr == a; });
  }
  std::size_t buffers(const std::string& name) {
    auto d = cache_.descriptor_of(name, true);
    REQUIRE_MESSAGE(d, "fetching " << name << ": " << (d ? "" : d.error().message()));
    return (*d)->buffers.size();
  }
  std::string fetch_error;

 private:
  static tide::metadata_config config_of(const S& store, bool sealed) {
    tide::metadata_config c;
    c.connection = store.connection();
    c.timeout = 2000ms;
    if (sealed) c.secret = tide::wire::cluster_secret::from_bytes(kSecretBytes).value();
    return c;
  }
  tide::segment_cache<typename S::backend> cache_;
};

constexpr std::size_t kEach = 4096;

}  // namespace

TEST_CASE_TEMPLATE("store: registrations from 8 threads at once; each buffer is in the store when its call returns",
                   S, etcd_store, http_store) {
  secret_file secret;
  for (const bool sealed : {false, true}) {
    CAPTURE(sealed);
    S store;
    auto owner = make(store, sealed ? secret.path.string() : "");
    constexpr std::size_t kThreads = 8, kPerThread = 12;
    std::vector<unsigned char> memory(kThreads * kPerThread * kEach);
    const std::uint64_t encodes0 = owner->descriptor_encodes();
    std::atomic<int> unseen{0}, still_seen{0}, failed{0};
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        reader<S> peer(store, sealed);
        for (std::size_t i = 0; i < kPerThread; ++i) {
          void* p = memory.data() + (t * kPerThread + i) * kEach;
          if (!owner->register_memory(p, kEach, "cpu:0")) {
            ++failed;
            continue;
          }
          if (!peer.sees(owner->segment_name(), p)) ++unseen;
        }
        // Half of them go again: gone from the store when the call returns.
        for (std::size_t i = 0; i < kPerThread; i += 2) {
          void* p = memory.data() + (t * kPerThread + i) * kEach;
          if (!owner->unregister_memory(p)) {
            ++failed;
            continue;
          }
          if (peer.sees(owner->segment_name(), p)) ++still_seen;
        }
      });
    for (auto& th : threads) th.join();
    CHECK(failed.load() == 0);
    CHECK(unseen.load() == 0);
    CHECK(still_seen.load() == 0);
    reader<S> peer(store, sealed);
    CHECK(peer.buffers(owner->segment_name()) == kThreads * kPerThread / 2);
    // One encode per store write, at most one write per call.
    const std::uint64_t writes = owner->descriptor_encodes() - encodes0;
    CHECK(writes <= kThreads * (kPerThread + kPerThread / 2));
    const std::string what = std::string(S::kName) + (sealed ? " sealed" : "");
    MESSAGE(what << ": " << kThreads * (kPerThread + kPerThread / 2) << " calls from " << kThreads << " threads, "
                 << writes << " store writes");
  }
}

TEST_CASE_TEMPLATE("store: registrations that wait during a store write share the next one", S, etcd_store,
                   http_store) {
  secret_file secret;
  S store;
  auto owner = make(store, secret.path.string());
  constexpr std::size_t kWaiters = 6;
  std::vector<unsigned char> memory((kWaiters + 1) * kEach);
  const int puts0 = S::backend::puts.load();
  const std::uint64_t encodes0 = owner->descriptor_encodes();
  // The first registration's write holds until the others wait for the next
  // (they start once it holds, so their buffers are not in it).
  std::atomic<bool> holding{false};
  bool joined = false;
  S::backend::arm([&] {
    holding = true;
    joined = wait_until([&] { return owner->registrations_waiting() == kWaiters; });
  });
  std::thread first([&] { CHECK(owner->register_memory(memory.data(), kEach, "cpu:0")); });
  REQUIRE(wait_until([&] { return holding.load(); }));
  std::vector<std::thread> waiters;
  std::atomic<int> unseen{0}, failed{0};
  for (std::size_t i = 1; i <= kWaiters; ++i)
    waiters.emplace_back([&, i] {
      reader<S> peer(store, true);
      void* p = memory.data() + i * kEach;
      if (!owner->register_memory(p, kEach, "cpu:0"))
        ++failed;
      else if (!peer.sees(owner->segment_name(), p))
        ++unseen;
    });
  first.join();
  for (auto& th : waiters) th.join();
  CHECK(joined);
  CHECK(failed.load() == 0);
  CHECK(unseen.load() == 0);
  // The first registration's write, then one for all six.
  CHECK(S::backend::puts.load() - puts0 == 2);
  CHECK(owner->descriptor_encodes() - encodes0 == 2);
}

TEST_CASE_TEMPLATE("store stopped: every registration waiting for the write fails with the store's error; none hangs",
                   S, etcd_store, http_store) {
  secret_file secret;
  S store;
  auto owner = make(store, secret.path.string());
  constexpr std::size_t kWaiters = 6;
  std::vector<unsigned char> memory((kWaiters + 2) * kEach);
  const int puts0 = S::backend::puts.load();
  // The first write holds until six registrations wait for the next one,
  // then the store goes away under both writes.
  std::atomic<bool> holding{false};
  bool joined = false;
  S::backend::arm([&] {
    holding = true;
    joined = wait_until([&] { return owner->registrations_waiting() == kWaiters; });
    store.stop();
  });
  std::mutex mu;
  std::vector<tide::error> errors;
  auto register_one = [&](std::size_t i) {
    auto r = owner->register_memory(memory.data() + i * kEach, kEach, "cpu:0");
    std::lock_guard lock(mu);
    errors.push_back(r ? tide::error{} : r.error());
  };
  std::thread first(register_one, 0);
  REQUIRE(wait_until([&] { return holding.load(); }));
  std::vector<std::thread> waiters;
  for (std::size_t i = 1; i <= kWaiters; ++i) waiters.emplace_back(register_one, i);
  first.join();
  for (auto& th : waiters) th.join();
  CHECK(joined);
  REQUIRE(errors.size() == kWaiters + 1);
  for (const auto& e : errors) {
    CHECK(e.code == errc::metadata_unavailable);
    CHECK_MESSAGE(e.detail.find("register_memory: the descriptor was not stored") != std::string::npos,
                  e.message());
    CHECK_MESSAGE(e.detail.find("goes into the next descriptor the store takes") != std::string::npos, e.message());
  }
  MESSAGE("a waiting registration got: " << errors.back().message());
  // Two writes were tried (the one in flight, then one for the six), not one per caller.
  CHECK(S::backend::puts.load() - puts0 == 2);
  // The store is back: the next registration stores every buffer, the failed ones too.
  store.restart();
  REQUIRE(owner->register_memory(memory.data() + (kWaiters + 1) * kEach, kEach, "cpu:0"));
  reader<S> peer(store, true);
  CHECK(peer.buffers(owner->segment_name()) == kWaiters + 2);
}

// ---- publish_delay: registrations leave their store write to a window ----

template <class S>
std::unique_ptr<tide::transfer_engine<typename S::policies>> make_delayed(const S& store, const std::string& secret,
                                                                          std::chrono::milliseconds delay) {
  auto c = config(store, secret);
  c.publish_delay = delay;
  auto e = tide::transfer_engine<typename S::policies>::create(c);
  if (!e) FAIL("create: " << e.error().message());
  return std::move(*e);
}

TEST_CASE_TEMPLATE("publish_delay: registrations return before the store has them; flush_metadata stores them all "
                   "in one write; an unregistration is stored before it returns",
                   S, etcd_store, http_store) {
  secret_file secret;
  S store;
  // A window far past the test: only flush_metadata and unregistrations write.
  auto owner = make_delayed(store, secret.path.string(), 600000ms);
  constexpr std::size_t kBuffers = 200;
  std::vector<unsigned char> memory(kBuffers * kEach);
  reader<S> peer(store, true);
  const int puts0 = S::backend::puts.load();
  for (std::size_t i = 0; i < kBuffers; ++i) REQUIRE(owner->register_memory(memory.data() + i * kEach, kEach, "cpu:0"));
  CHECK(S::backend::puts.load() == puts0);
  CHECK(peer.buffers(owner->segment_name()) == 0);
  REQUIRE(owner->flush_metadata());
  CHECK(S::backend::puts.load() - puts0 == 1);
  CHECK(peer.buffers(owner->segment_name()) == kBuffers);
  CHECK(owner->flush_metadata());  // nothing changed: still one write, nothing lost
  CHECK(peer.buffers(owner->segment_name()) == kBuffers);
  // A batch waits for the window too; an unregistration does not, and its
  // write carries the batch's buffers with it.
  std::vector<unsigned char> more(2 * kEach);
  const tide::buffer_entry entries[] = {{more.data(), kEach}, {more.data() + kEach, kEach}};
  REQUIRE(owner->register_memory_batch(entries, "cpu:0"));
  CHECK_FALSE(peer.sees(owner->segment_name(), more.data()));
  REQUIRE(owner->unregister_memory(memory.data()));
  CHECK_FALSE(peer.sees(owner->segment_name(), memory.data()));
  CHECK(peer.sees(owner->segment_name(), more.data() + kEach));
  CHECK(peer.buffers(owner->segment_name()) == kBuffers + 1);
}

TEST_CASE_TEMPLATE("publish_delay: the window's write stores a registration without a flush, and a peer that opened "
                   "the segment before it reads the new buffer",
                   S, etcd_store, http_store) {
  // The memory outlives the engines that serve it (declared first).
  std::vector<unsigned char> first(kEach, 1), later(kEach), dst(kEach);
  for (std::size_t i = 0; i < later.size(); ++i) later[i] = static_cast<unsigned char>(i * 7 + 3);
  S store;
  auto owner = make_delayed(store, "", 100ms);
  auto initiator = make(store, "");
  REQUIRE(owner->register_memory(first.data(), kEach, "cpu:0"));
  REQUIRE(owner->flush_metadata());
  auto seg = initiator->open_segment(owner->segment_name());
  REQUIRE(seg);
  REQUIRE(initiator->register_memory(dst.data(), dst.size(), "cpu:0"));

  const int puts0 = S::backend::puts.load();
  REQUIRE(owner->register_memory(later.data(), kEach, "cpu:0"));
  reader<S> peer(store, false);
  CHECK(wait_until([&] { return peer.sees(owner->segment_name(), later.data()); }));
  CHECK(S::backend::puts.load() - puts0 == 1);
  // The initiator's cached descriptor predates `later`: the miss re-fetches it.
  auto b = initiator->allocate_batch(1);
  REQUIRE(b);
  const auto r = tide::transfer_request::at_address(tide::transfer_op::read, dst.data(), *seg,
                                                    reinterpret_cast<std::uint64_t>(later.data()), kEach);
  REQUIRE(initiator->submit(*b, {&r, 1}));
  REQUIRE(initiator->wait(*b, 30s));
  auto st = initiator->status_of(*b, 0);
  REQUIRE(st);
  CHECK(st->state == tide::transfer_state::completed);
  CHECK(dst == later);
  REQUIRE(initiator->free_batch(*b));
}

TEST_CASE_TEMPLATE("publish_delay, store stopped: registrations still return; flush_metadata fails with the store's "
                   "error and stores everything once the store is back",
                   S, etcd_store, http_store) {
  secret_file secret;
  S store;
  auto owner = make_delayed(store, secret.path.string(), 600000ms);
  std::vector<unsigned char> memory(3 * kEach);
  store.stop();
  for (std::size_t i = 0; i < 3; ++i) REQUIRE(owner->register_memory(memory.data() + i * kEach, kEach, "cpu:0"));
  auto r = owner->flush_metadata();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::metadata_unavailable);
  CHECK_MESSAGE(r.error().detail.find("flush_metadata: the descriptor was not stored") != std::string::npos,
                r.error().message());
  store.restart();
  REQUIRE(owner->flush_metadata());
  reader<S> peer(store, true);
  CHECK(peer.buffers(owner->segment_name()) == 3);
}

int main(int argc, char** argv) { return tide::test::run_if_etcd(argc, argv); }
