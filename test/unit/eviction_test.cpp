// Eviction policies: hand-worked traces (SIEVE with the paper's example,
// Mooncake's SIEVE, FIFO, LRU) and a conformance test over every policy.

#include <tide/policy/eviction.hpp>
#include <tide/policy/fifo.hpp>
#include <tide/policy/lru.hpp>
#include <tide/policy/sieve.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

static_assert(tide::eviction_policy<tide::policy::fifo>);
static_assert(tide::eviction_policy<tide::policy::sieve>);
static_assert(tide::eviction_policy<tide::policy::mooncake_sieve>);
static_assert(tide::eviction_policy<tide::policy::lru>);

// Things that are not eviction policies, and why.
struct no_order {
  static constexpr const char* kName = "x";
  struct hook {};
};
struct throwing_touch {
  static constexpr const char* kName = "x";
  struct hook {};
  struct order {
    void insert(hook&) noexcept {}
    void erase(hook&) noexcept {}
    void touch(hook&) {}  // not noexcept
    hook* evict() noexcept { return nullptr; }
    std::size_t size() const noexcept { return 0; }
  };
};
struct final_hook {
  static constexpr const char* kName = "x";
  struct hook final {};
  struct order {
    void insert(hook&) noexcept {}
    void erase(hook&) noexcept {}
    void touch(hook&) noexcept {}
    hook* evict() noexcept { return nullptr; }
    std::size_t size() const noexcept { return 0; }
  };
};
static_assert(!tide::eviction_policy<no_order>);
static_assert(!tide::eviction_policy<throwing_touch>);
static_assert(!tide::eviction_policy<final_hook>);

// A cache of single-character keys driven through the policy interface
// alone, recording which keys it evicts.
template <class P>
class cache_sim {
 public:
  struct item : P::hook {
    explicit item(char k) : key(k) {}
    char key;
  };

  explicit cache_sim(std::size_t capacity) : capacity_(capacity) {}
  ~cache_sim() {
    for (auto& [k, it] : items_) order_.erase(*it);
  }

  // Returns true on a hit.
  bool access(char k) {
    if (auto f = items_.find(k); f != items_.end()) {
      order_.touch(*f->second);
      return true;
    }
    if (items_.size() == capacity_) {
      auto* v = static_cast<item*>(order_.evict());
      REQUIRE(v != nullptr);
      evicted_ += v->key;
      items_.erase(v->key);
    }
    auto fresh = std::make_unique<item>(k);
    order_.insert(*fresh);
    items_.emplace(k, std::move(fresh));
    return false;
  }
  void run(const std::string& trace) {
    for (char c : trace) misses_ += !access(c);
  }
  void erase(char k) {
    order_.erase(*items_.at(k));
    items_.erase(k);
  }

  // Head (newest) to tail, as in the paper's figures.
  std::string list() const {
    std::string s;
    order_.for_each_head_to_tail([&](const typename P::hook& h) { s += static_cast<const item&>(h).key; });
    return s;
  }
  std::string visited() const {
    std::string s;
    order_.for_each_head_to_tail([&](const typename P::hook& h) {
      if (h.visited.load()) s += static_cast<const item&>(h).key;
    });
    return s;
  }
  char hand() const {
    const auto* h = order_.hand();
    return h == nullptr ? '-' : static_cast<const item*>(h)->key;
  }
  const std::string& evicted() const { return evicted_; }
  int misses() const { return misses_; }
  typename P::order& order() { return order_; }

 private:
  std::size_t capacity_;
  typename P::order order_;
  std::map<char, std::unique_ptr<item>> items_;
  std::string evicted_;
  int misses_ = 0;
};

// The paper's example (Zhang et al., NSDI'24, Figure 1): a cache of 7 holding
// A..G with A, B and G visited, then the requests H A D I B J.
const std::string kWarmup = "AABBCDEFGG";
const std::string kExample = "HADIBJ";

}  // namespace

TEST_CASE("sieve: the paper's example, step by step") {
  cache_sim<tide::policy::sieve> c(7);
  c.run(kWarmup);
  CHECK(c.list() == "GFEDCBA");
  CHECK(c.visited() == "GBA");
  CHECK(c.hand() == '-');  // the hand starts at the tail

  // H misses: the hand clears A and B, evicts C, stops at D; H enters the
  // head unvisited.
  CHECK_FALSE(c.access('H'));
  CHECK(c.list() == "HGFEDBA");
  CHECK(c.evicted() == "C");
  CHECK(c.hand() == 'D');
  CHECK(c.visited() == "G");

  // A and D hit: bits set, nothing moves.
  CHECK(c.access('A'));
  CHECK(c.access('D'));
  CHECK(c.list() == "HGFEDBA");
  CHECK(c.visited() == "GDA");

  // I misses: the hand clears D, evicts E, stops at F.
  CHECK_FALSE(c.access('I'));
  CHECK(c.list() == "IHGFDBA");
  CHECK(c.evicted() == "CE");
  CHECK(c.hand() == 'F');

  CHECK(c.access('B'));
  // J misses: F is unvisited and goes; the hand stops at G.
  CHECK_FALSE(c.access('J'));
  CHECK(c.list() == "JIHGDBA");
  CHECK(c.evicted() == "CEF");
  CHECK(c.hand() == 'G');
  CHECK(c.visited() == "GBA");
}

TEST_CASE("sieve: the hand wraps from the head to the tail") {
  cache_sim<tide::policy::sieve> c(3);
  c.run("ABCABC");  // all three visited
  CHECK(c.visited() == "CBA");
  // D: the hand clears A, B, C (the head), wraps to A, now unvisited: A
  // goes and the hand stops at B, A's predecessor.
  c.run("D");
  CHECK(c.evicted() == "A");
  CHECK(c.list() == "DCB");
  CHECK(c.hand() == 'B');
  CHECK(c.visited() == "");
  c.run("E");  // B is unvisited: evicted at once, hand stops at C
  CHECK(c.evicted() == "AB");
  CHECK(c.list() == "EDC");
  CHECK(c.hand() == 'C');
}

TEST_CASE("sieve: evicting the head leaves the hand at the tail") {
  cache_sim<tide::policy::sieve> c(2);
  c.run("ABA");  // B (head) unvisited, A (tail) visited
  c.run("C");    // clears A, moves to B, evicts B: no predecessor
  CHECK(c.evicted() == "B");
  CHECK(c.hand() == '-');
  CHECK(c.list() == "CA");
  c.run("D");  // starts again at the tail: A (cleared before) goes
  CHECK(c.evicted() == "BA");
  CHECK(c.list() == "DC");
}

TEST_CASE("sieve: erasing the entry under the hand moves the hand to its predecessor") {
  cache_sim<tide::policy::sieve> c(7);
  c.run(kWarmup + kExample);
  REQUIRE(c.hand() == 'G');
  c.erase('G');  // G was visited; the hand now rests on H
  CHECK(c.hand() == 'H');
  CHECK(c.list() == "JIHDBA");
  c.run("KL");  // K fills the free slot; L evicts H (unvisited)
  CHECK(c.evicted() == "CEFH");
  CHECK(c.hand() == 'I');
}

TEST_CASE("mooncake_sieve: inserted visited, so the first sweep clears everything") {
  cache_sim<tide::policy::mooncake_sieve> c(7);
  c.run(kWarmup);
  CHECK(c.visited() == "GFEDCBA");
  // H: the hand clears A..G, wraps, evicts A; stops at B.
  c.run("H");
  CHECK(c.evicted() == "A");
  CHECK(c.list() == "HGFEDCB");
  CHECK(c.hand() == 'B');
  // A misses now (evicts B), D hits, I evicts C, B misses (clears D,
  // evicts E), J evicts F.
  c.run("ADIBJ");
  CHECK(c.evicted() == "ABCEF");
  CHECK(c.list() == "JBIAHGD");
  CHECK(c.misses() == 7 + 5);  // 7 cold, then H A I B J
}

TEST_CASE("fifo: evicts in insertion order, hits change nothing") {
  cache_sim<tide::policy::fifo> c(7);
  c.run(kWarmup);
  CHECK(c.list() == "GFEDCBA");
  c.run(kExample);
  // H evicts A; A misses, evicts B; D hits; I evicts C; B evicts D; J evicts E.
  CHECK(c.evicted() == "ABCDE");
  CHECK(c.list() == "JBIAHGF");
  CHECK(c.misses() == 7 + 5);
}

TEST_CASE("lru: evicts the least recently used") {
  cache_sim<tide::policy::lru> c(7);
  c.run(kWarmup);
  CHECK(c.list() == "GFEDCBA");
  c.run("H");
  CHECK(c.list() == "HGFEDCB");
  c.run("A");  // miss, evicts B
  c.run("D");  // hit: D to the head
  CHECK(c.list() == "DAHGFEC");
  c.run("IBJ");  // I evicts C, B evicts E, J evicts F
  CHECK(c.evicted() == "ABCEF");
  CHECK(c.list() == "JBIDAHG");
  CHECK(c.misses() == 7 + 5);
}

TEST_CASE("sieve misses least on the paper's example") {
  cache_sim<tide::policy::sieve> s(7);
  cache_sim<tide::policy::fifo> f(7);
  cache_sim<tide::policy::lru> l(7);
  s.run(kWarmup + kExample);
  f.run(kWarmup + kExample);
  l.run(kWarmup + kExample);
  CHECK(s.misses() == 7 + 3);
  CHECK(s.misses() < f.misses());
  CHECK(s.misses() < l.misses());
}

// --- conformance: every shipped policy --------------------------------------

namespace {
template <class P>
struct entry : P::hook {
  explicit entry(int k) : key(k) {}
  int key;
};
}  // namespace

TEST_CASE_TEMPLATE("eviction conformance", P, tide::policy::fifo, tide::policy::sieve, tide::policy::mooncake_sieve,
                   tide::policy::lru) {
  using E = entry<P>;
  typename P::order order;
  CHECK(order.size() == 0);
  CHECK(order.evict() == nullptr);

  SUBCASE("every entry is evicted exactly once") {
    std::vector<std::unique_ptr<E>> es;
    for (int i = 0; i < 50; ++i) {
      es.push_back(std::make_unique<E>(i));
      order.insert(*es.back());
      if (i % 3 == 0) order.touch(*es[static_cast<std::size_t>(i / 2)]);
    }
    CHECK(order.size() == 50);
    std::set<int> seen;
    while (auto* h = order.evict()) CHECK(seen.insert(static_cast<E*>(h)->key).second);
    CHECK(seen.size() == 50);
    CHECK(order.size() == 0);
  }

  SUBCASE("random insert/erase/touch/evict against a model") {
    std::mt19937 rng(42);
    std::vector<std::unique_ptr<E>> pool;
    for (int i = 0; i < 64; ++i) pool.push_back(std::make_unique<E>(i));
    std::set<int> in;
    for (int step = 0; step < 20000; ++step) {
      const int k = static_cast<int>(rng() % 64);
      switch (rng() % 4) {
        case 0:
          if (!in.count(k)) {
            order.insert(*pool[static_cast<std::size_t>(k)]);
            in.insert(k);
          }
          break;
        case 1:
          if (in.count(k)) {
            order.erase(*pool[static_cast<std::size_t>(k)]);
            in.erase(k);
          }
          break;
        case 2:
          if (in.count(k)) order.touch(*pool[static_cast<std::size_t>(k)]);
          break;
        default:
          if (auto* h = order.evict()) {
            const int v = static_cast<E*>(h)->key;
            REQUIRE(in.count(v) == 1);
            in.erase(v);
          } else {
            REQUIRE(in.empty());
          }
      }
      REQUIRE(order.size() == in.size());
    }
    for (int k : in) order.erase(*pool[static_cast<std::size_t>(k)]);
  }

  SUBCASE("touch is safe from several threads at once") {
    std::vector<std::unique_ptr<E>> es;
    for (int i = 0; i < 32; ++i) {
      es.push_back(std::make_unique<E>(i));
      order.insert(*es.back());
    }
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t) {
      ts.emplace_back([&, t] {
        for (int r = 0; r < 2000; ++r) order.touch(*es[static_cast<std::size_t>((r * 7 + t) % 32)]);
      });
    }
    for (auto& t : ts) t.join();
    CHECK(order.size() == 32);
    int n = 0;
    while (order.evict() != nullptr) ++n;
    CHECK(n == 32);
  }
}
