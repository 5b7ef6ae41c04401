#pragma once
/// tide::policy::sieve (NSDI'24) and tide::policy::mooncake_sieve.

#include <tide/policy/eviction.hpp>

#include <boost/intrusive/list.hpp>

#include <atomic>
#include <cstddef>
#include <iterator>
#include <string_view>

namespace tide::policy {
namespace detail {

struct sieve_hook : boost::intrusive::list_base_hook<> {
  /// Set by a hit, cleared by the passing hand.  Written under the store's
  /// shared lock by many finders at once (hence atomic, relaxed: the bit
  /// orders nothing else) and read by evict() under the exclusive lock.
  std::atomic<bool> visited{false};
};

/// One FIFO list (head = newest) plus a hand.  kInsertVisited is the only
/// difference between the paper's algorithm and Mooncake's variant.
template <bool kInsertVisited>
class sieve_order {
 public:
  using hook = sieve_hook;

  sieve_order() = default;
  sieve_order(const sieve_order&) = delete;
  sieve_order& operator=(const sieve_order&) = delete;

  /// Inserts at the head with visited = kInsertVisited.
  void insert(hook& h) noexcept {
    h.visited.store(kInsertVisited, std::memory_order_relaxed);
    list_.push_front(h);
  }

  /// Unlinks h.  If the hand rests on h it moves to h's predecessor (toward
  /// the head), exactly as after an eviction of h.
  void erase(hook& h) noexcept {
    auto it = list_type::s_iterator_to(h);
    if (hand_ == &h) hand_ = it == list_.begin() ? nullptr : &*std::prev(it);
    list_.erase(it);
  }

  /// A hit sets the bit and moves nothing.  The load first keeps a hot
  /// entry's cache line shared among finders instead of re-writing it.
  void touch(hook& h) noexcept {
    if (!h.visited.load(std::memory_order_relaxed)) h.visited.store(true, std::memory_order_relaxed);
  }

  /// The hand starts at the tail (or where it stopped), clears visited bits
  /// while moving toward the head, wraps from the head to the tail, evicts
  /// the first unvisited entry and stops at that entry's predecessor
  /// (nullptr when the victim was the head: the next search starts at the
  /// tail).  Terminates within one full turn since it clears what it passes.
  [[nodiscard]] hook* evict() noexcept {
    if (list_.empty()) return nullptr;
    auto it = hand_ != nullptr ? list_type::s_iterator_to(*hand_) : std::prev(list_.end());
    while (it->visited.load(std::memory_order_relaxed)) {
      it->visited.store(false, std::memory_order_relaxed);
      it = it == list_.begin() ? std::prev(list_.end()) : std::prev(it);
    }
    hook& victim = *it;
    hand_ = it == list_.begin() ? nullptr : &*std::prev(it);
    list_.erase(it);
    return &victim;
  }

  [[nodiscard]] std::size_t size() const noexcept { return list_.size(); }

  /// Introspection for tests: head (newest) to tail, and the hand (nullptr
  /// = the tail).  Exclusive access.
  template <class F>
  void for_each_head_to_tail(F&& f) const {
    for (const hook& h : list_) f(h);
  }
  [[nodiscard]] const hook* hand() const noexcept { return hand_; }

 private:
  using list_type = boost::intrusive::list<hook, boost::intrusive::constant_time_size<true>>;
  list_type list_;
  hook* hand_ = nullptr;
};

}  // namespace detail

/// SIEVE as in "SIEVE is Simpler than LRU" (Zhang et al., NSDI'24): new
/// entries enter the head unvisited; a hit sets one bit (no list move, no
/// lock); the hand sweeps from the tail toward the head.  The default
/// eviction policy: lowest miss ratio of the shipped ones on skewed traces
/// and free hits.  Not scan resistant (see the Zipf + scan benchmark).
struct sieve {
  static constexpr std::string_view kName = "sieve";
  using hook = detail::sieve_hook;
  using order = detail::sieve_order<false>;
};

/// Mooncake's SIEVEEndpointStore (after its PR #767): identical, except that
/// entries are inserted *visited*, so a new entry survives the hand's first
/// pass (CLOCK-like).  Kept to reproduce Mooncake's behaviour.
struct mooncake_sieve {
  static constexpr std::string_view kName = "mooncake_sieve";
  using hook = detail::sieve_hook;
  using order = detail::sieve_order<true>;
};

}  // namespace tide::policy
