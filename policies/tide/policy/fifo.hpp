#pragma once
/// tide::policy::fifo — evict the oldest entry; a hit changes nothing.

#include <tide/policy/eviction.hpp>

#include <boost/intrusive/list.hpp>

#include <cstddef>
#include <string_view>

namespace tide::policy {

/// First in, first out.  Hits are free (no write at all), so finds never
/// contend; the miss ratio is the worst of the shipped policies on skewed
/// traces.  Mooncake's FIFOEndpointStore in this shape.
struct fifo {
  static constexpr std::string_view kName = "fifo";

  struct hook : boost::intrusive::list_base_hook<> {};

  class order {
   public:
    order() = default;
    order(const order&) = delete;
    order& operator=(const order&) = delete;

    /// New entries go to the head; the tail is the oldest.
    void insert(hook& h) noexcept { list_.push_front(h); }
    void erase(hook& h) noexcept { list_.erase(list_type::s_iterator_to(h)); }
    void touch(hook& /*h*/) noexcept {}
    [[nodiscard]] hook* evict() noexcept {
      if (list_.empty()) return nullptr;
      hook& victim = list_.back();
      list_.pop_back();
      return &victim;
    }
    [[nodiscard]] std::size_t size() const noexcept { return list_.size(); }

    /// Introspection for tests: visits entries from head (newest) to tail.
    /// Requires exclusive access.
    template <class F>
    void for_each_head_to_tail(F&& f) const {
      for (const hook& h : list_) f(h);
    }

   private:
    using list_type = boost::intrusive::list<hook, boost::intrusive::constant_time_size<true>>;
    list_type list_;
  };
};

}  // namespace tide::policy
