#pragma once
// The engine's notification inbox: what the handshake server's notify
// handler fills and take_notifies() drains, bounded so that a flood from the
// network costs a bounded amount of memory (review finding 11).
//
// Bounds: at most max_count messages and max_bytes of name + text queued;
// per sender (its authenticated identity, else the name it claims) at most
// rate_per_sec messages a second with a burst of as many (a token bucket).
// A message over a bound is refused (the sender is told it was not taken)
// and counted by reason.  The per-sender table holds at most kMaxSenders
// entries; past that it starts over (the rate bound then restarts for all,
// the count and byte bounds still hold).
//
// Duplicates: a transfer-bound notification carries a notify_id, and the
// sender may deliver it twice (a SEND whose completion teardown flushed is
// sent again over TCP).  Per sender and origin the inbox remembers which of
// the last kSeqWindow sequence numbers it took, and drops a copy of one
// (counted, reported to the sender as taken: it was).  An id older than the
// window is taken: the copies come within a handshake timeout of each other,
// far inside it, and losing a notification is worse than doubling one.
// The windows are bounded: at most kMaxOriginsPerSender per sender (a
// sender's origin changes only when it restarts) and kMaxWindows in all.
// Past a bound the least recently used window goes, the sender's own first,
// so a stranger minting (sender, origin) pairs evicts its own windows or the
// idlest senders', never all of them: a copy that arrives within the
// handshake timeout of its original, from a sender that is sending, is
// still recognised (a table that started over at 4096 pairs forgot every
// sender at once: review 1ab3d99, finding 19).
//
// Thread safety: every member takes the one mutex (has_messages reads an
// atomic copy of the count); push runs on handshake handler threads and on
// lane 0 of a context (RDMA notifications: its thread, or a reader that
// borrowed it), take and stats on user threads.

#include <tide/wire/descriptors.hpp>

#include <algorithm>
#include <atomic>
#include <bitset>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tide {

/// Bounds of the inbox (engine_config fields of the same names).
struct notify_limits {
  std::size_t max_count = 4096;
  std::size_t max_bytes = std::size_t{4} << 20;
  /// Per sender and second; 0 = no rate bound.
  std::uint32_t rate_per_sec = 1000;
};

/// Counters since the engine started.
struct notify_stats {
  std::uint64_t accepted = 0;
  std::uint64_t dropped_count = 0;  ///< refused: max_count messages already queued
  std::uint64_t dropped_bytes = 0;  ///< refused: max_bytes would be exceeded
  std::uint64_t dropped_rate = 0;   ///< refused: the sender passed rate_per_sec
  std::uint64_t duplicates = 0;     ///< a copy of one already taken (same notify_id): dropped
  std::size_t queued = 0;           ///< messages waiting for take_notifies()
  std::size_t queued_bytes = 0;
};

namespace detail {

class notify_inbox {
 public:
  static constexpr std::size_t kMaxSenders = 4096;
  static constexpr std::size_t kSeqWindow = 1024;
  /// Duplicate windows, in all and per sender (see the top).
  static constexpr std::size_t kMaxWindows = 4096;
  static constexpr std::size_t kMaxOriginsPerSender = 16;
  using clock = std::chrono::steady_clock;

  explicit notify_inbox(notify_limits limits = {}) : limits_(limits) {}

  /// Queues `n` (without its id) unless a bound refuses it; returns whether
  /// it was queued, or was a copy of one queued before.
  bool push(const notify_desc& n, std::string_view sender) {
    const std::size_t size = n.name.size() + n.notify_msg.size();
    std::lock_guard lock(mu_);
    seq_window* seen = n.id ? &window_of(sender, n.id->origin) : nullptr;
    if (seen != nullptr && seen->has(n.id->seq)) {
      ++stats_.duplicates;
      return true;
    }
    if (limits_.rate_per_sec != 0 && !take_token(sender)) {
      ++stats_.dropped_rate;
      return false;
    }
    if (q_.size() >= limits_.max_count) {
      ++stats_.dropped_count;
      return false;
    }
    if (size > limits_.max_bytes - bytes_) {
      ++stats_.dropped_bytes;
      return false;
    }
    q_.push_back(n);
    q_.back().id.reset();
    if (seen != nullptr) seen->add(n.id->seq);
    bytes_ += size;
    ++stats_.accepted;
    queued_.store(q_.size(), std::memory_order_release);
    if (waiters_ != 0) arrived_.notify_all();
    if (on_arrival_) on_arrival_();
    return true;
  }

  /// Everything queued; when nothing is, waits up to `wait` for a message.
  std::vector<notify_desc> take(std::chrono::milliseconds wait = std::chrono::milliseconds{0}) {
    std::unique_lock lock(mu_);
    if (q_.empty() && wait.count() > 0) {
      ++waiters_;
      arrived_.wait_for(lock, wait, [&] { return !q_.empty(); });
      --waiters_;
    }
    std::vector<notify_desc> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
    q_.clear();
    bytes_ = 0;
    queued_.store(0, std::memory_order_relaxed);
    return out;
  }

  /// Whether a message waits; one load, any thread.
  [[nodiscard]] bool has_messages() const noexcept { return queued_.load(std::memory_order_acquire) != 0; }

  /// While a watch is open, push() calls `wake` (under the inbox's lock:
  /// it must not call back into the inbox) after queuing a message: a
  /// reader that waits elsewhere than in take() (on a lane,
  /// rdma::lane::run_borrowed) is woken by it.  Watches nest; every one
  /// passes the same `wake` (the first one's is kept).  Any thread.
  void watch(std::function<void()> wake) {
    std::lock_guard lock(mu_);
    if (watches_++ == 0) on_arrival_ = std::move(wake);
  }
  void unwatch() {
    std::lock_guard lock(mu_);
    if (watches_ != 0 && --watches_ == 0) on_arrival_ = nullptr;
  }

  [[nodiscard]] notify_stats stats() const {
    std::lock_guard lock(mu_);
    notify_stats s = stats_;
    s.queued = q_.size();
    s.queued_bytes = bytes_;
    return s;
  }

  /// Duplicate windows held (tests).
  [[nodiscard]] std::size_t windows() const {
    std::lock_guard lock(mu_);
    return windows_;
  }

 private:
  struct bucket {
    double tokens = 0;
    clock::time_point last{};
  };

  // Which of the kSeqWindow sequence numbers up to `top` were taken (bit i:
  // top - i), as an anti-replay window; sequence numbers start at 1.
  struct seq_window {
    std::uint64_t top = 0;
    std::bitset<kSeqWindow> taken;
    [[nodiscard]] bool has(std::uint64_t seq) const noexcept {
      return seq <= top && top - seq < kSeqWindow && taken.test(top - seq);
    }
    void add(std::uint64_t seq) noexcept {
      if (seq > top) {
        if (seq - top >= kSeqWindow) taken.reset();
        else taken <<= (seq - top);
        top = seq;
      }
      if (top - seq < kSeqWindow) taken.set(top - seq);
    }
  };

  // The window of (sender, origin), made when new, and marked most
  // recently used; evicts past the bounds (see the top).  O(1) plus a walk
  // of at most kMaxOriginsPerSender origins.
  seq_window& window_of(std::string_view sender, std::uint64_t origin) {
    auto found = by_sender_.find(sender);
    sender_list::iterator s;
    if (found == by_sender_.end()) {
      senders_lru_.emplace_front();
      s = senders_lru_.begin();
      try {
        s->name.assign(sender);
        by_sender_.emplace(std::string_view(s->name), s);
      } catch (...) {
        senders_lru_.erase(s);
        throw;
      }
    } else {
      s = found->second;
      senders_lru_.splice(senders_lru_.begin(), senders_lru_, s);
    }
    auto& origins = s->origins;
    for (auto o = origins.begin(); o != origins.end(); ++o)
      if (o->origin == origin) {
        origins.splice(origins.begin(), origins, o);
        return o->window;
      }
    if (origins.size() >= kMaxOriginsPerSender) {
      origins.pop_back();  // this sender's least recently used origin
      --windows_;
    }
    origins.emplace_front();
    origins.front().origin = origin;
    ++windows_;
    // The idlest senders give their oldest windows up; never `s` itself
    // (the front: kMaxWindows is far above kMaxOriginsPerSender).
    while (windows_ > kMaxWindows) {
      auto& idle = senders_lru_.back();
      if (!idle.origins.empty()) {
        idle.origins.pop_back();
        --windows_;
      }
      if (idle.origins.empty()) {  // (or left empty by a bad_alloc above)
        by_sender_.erase(std::string_view(idle.name));
        senders_lru_.pop_back();
      }
    }
    return origins.front().window;
  }

  bool take_token(std::string_view sender) {
    if (senders_.size() >= kMaxSenders && senders_.find(std::string(sender)) == senders_.end()) senders_.clear();
    const auto now = clock::now();
    const double burst = limits_.rate_per_sec;
    auto [it, fresh] = senders_.try_emplace(std::string(sender), bucket{burst, now});
    bucket& b = it->second;
    if (!fresh) {
      const double elapsed = std::chrono::duration<double>(now - b.last).count();
      b.tokens = std::min(burst, b.tokens + elapsed * limits_.rate_per_sec);
      b.last = now;
    }
    if (b.tokens < 1.0) return false;
    b.tokens -= 1.0;
    return true;
  }

  notify_limits limits_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;  ///< take() with a wait sleeps on it
  std::size_t waiters_ = 0;          ///< such take() calls (a push notifies only then)
  std::deque<notify_desc> q_;
  std::atomic<std::size_t> queued_{0};  ///< q_.size(), for has_messages() (written under mu_)
  std::function<void()> on_arrival_;     ///< while watches_ != 0
  std::size_t watches_ = 0;
  std::size_t bytes_ = 0;
  std::unordered_map<std::string, bucket> senders_;
  // Duplicate windows: senders most recently used first, each with its
  // origins most recently used first; by_sender_'s keys view the names.
  struct origin_window {
    std::uint64_t origin = 0;
    seq_window window;
  };
  struct sender_windows {
    std::string name;
    std::list<origin_window> origins;
  };
  using sender_list = std::list<sender_windows>;
  sender_list senders_lru_;
  std::unordered_map<std::string_view, sender_list::iterator> by_sender_;
  std::size_t windows_ = 0;  ///< origin windows in all senders_lru_
  notify_stats stats_;
};

}  // namespace detail
}  // namespace tide
