#pragma once
/// tide::policy::lru — least recently used; the baseline SIEVE is measured
/// against.

#include <tide/policy/eviction.hpp>

#include <boost/intrusive/list.hpp>

#include <atomic>
#include <cstddef>
#include <string_view>
#include <thread>

namespace tide::policy {

/// Least recently used.  Every hit moves the entry to the head, so touch()
/// takes a short spin lock of its own: concurrent finds serialise on it.
/// That cost (and its miss ratio) is what the benchmarks compare SIEVE to.
struct lru {
  static constexpr std::string_view kName = "lru";

  struct hook : boost::intrusive::list_base_hook<> {};

  class order {
   public:
    order() = default;
    order(const order&) = delete;
    order& operator=(const order&) = delete;

    void insert(hook& h) noexcept { list_.push_front(h); }
    void erase(hook& h) noexcept { list_.erase(list_type::s_iterator_to(h)); }
    /// Moves h to the head.  Thread-safe against other touch() calls; the
    /// store never runs it concurrently with insert/erase/evict.
    void touch(hook& h) noexcept {
      lock();
      if (&list_.front() != &h) list_.splice(list_.begin(), list_, list_type::s_iterator_to(h));
      unlock();
    }
    [[nodiscard]] hook* evict() noexcept {
      if (list_.empty()) return nullptr;
      hook& victim = list_.back();
      list_.pop_back();
      return &victim;
    }
    [[nodiscard]] std::size_t size() const noexcept { return list_.size(); }

    /// Introspection for tests: head (most recent) to tail.  Exclusive access.
    template <class F>
    void for_each_head_to_tail(F&& f) const {
      for (const hook& h : list_) f(h);
    }

   private:
    using list_type = boost::intrusive::list<hook, boost::intrusive::constant_time_size<true>>;

    void lock() noexcept {
      unsigned spins = 0;
      // Test-and-test-and-set; acquire pairs with the release in unlock().
      while (busy_.load(std::memory_order_relaxed) || busy_.exchange(true, std::memory_order_acquire)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
    void unlock() noexcept { busy_.store(false, std::memory_order_release); }

    list_type list_;
    std::atomic<bool> busy_{false};
  };
};

}  // namespace tide::policy
