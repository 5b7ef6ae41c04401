#pragma once
// Deferred descriptor publishes (publish_delay_ms > 0, etcd/http metadata).
//
// A store write carries the whole descriptor, so a registration that waits
// for its own write costs O(buffers) and N of them one by one O(N^2).  With
// a delay, a registration only marks the descriptor changed and returns; one
// thread stores it `delay` after the first change it has not stored, so a
// burst of registrations shares one write per window.  The price is the
// promise: a peer that opens the segment within the window may not see the
// newest buffers (tide and Mooncake peers re-fetch a descriptor on a miss),
// and flush() is how a caller makes the store current before it tells a
// peer about a buffer.
//
// A failed write is logged and tried again one window later (at least a
// second later, so a store that is down is not hammered); flush() returns
// the store's error to its caller.
//
// Thread safety: changed() and flush() from any thread.  The thread is the
// only one that runs the delayed writes; they go through the engine's
// publish_group, so they never overlap a synchronous write either.

#include <tide/detail/log.hpp>
#include <tide/result.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace tide::detail {

class deferred_publisher {
 public:
  using clock = std::chrono::steady_clock;
  /// `store` writes the descriptor as it stands when called (the engine's
  /// group commit); it runs on this object's thread.
  deferred_publisher(std::chrono::milliseconds delay, std::function<status()> store)
      : delay_(delay), store_(std::move(store)), thread_([this] { run(); }) {}

  /// Stops the thread: a write in flight ends first (bounded by the
  /// store's timeout); changes not yet stored are dropped, as the engine
  /// that owns this is going away and withdraws its descriptor.
  ~deferred_publisher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  deferred_publisher(const deferred_publisher&) = delete;
  deferred_publisher& operator=(const deferred_publisher&) = delete;

  /// The descriptor changed: it is stored within the delay.
  void changed() {
    std::lock_guard lock(mu_);
    if (due_) return;  // the window already open covers this change
    due_ = clock::now() + delay_;
    cv_.notify_one();
  }

  /// Stores every change made before the call now (one synchronous write,
  /// shared with concurrent ones) and returns the store's status.  The
  /// window's write is no longer needed for those changes: it is dropped,
  /// and opened again if this write fails.
  status flush() {
    {
      std::lock_guard lock(mu_);
      due_.reset();
    }
    auto r = store_();
    if (!r) changed();
    return r;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || due_; });
      if (stop_) return;
      // due_ only moves from empty to set, or back to empty (flush): wait
      // for the time it names, or for a flush that made it moot.
      cv_.wait_until(lock, *due_, [&] { return stop_ || !due_ || clock::now() >= *due_; });
      if (stop_) return;
      if (!due_ || clock::now() < *due_) continue;
      due_.reset();
      lock.unlock();
      auto r = store_();
      lock.lock();
      if (!r) {
        TIDE_LOG_WARN("deferred descriptor publish failed (tried again later): " << r.error().message());
        if (!due_) due_ = clock::now() + std::max<clock::duration>(delay_, std::chrono::seconds(1));
      }
    }
  }

  const std::chrono::milliseconds delay_;
  const std::function<status()> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<clock::time_point> due_;  ///< under mu_: when the open window's write runs
  bool stop_ = false;                     ///< under mu_
  std::thread thread_;                    ///< last: starts once the members above exist
};

}  // namespace tide::detail
