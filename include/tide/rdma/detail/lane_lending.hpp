#pragma once
/// lane_lender — hands a lane's loop to a thread that waits for what the
/// lane will produce (issue 36, item 4), so that the kernel wakes that
/// thread, not the lane that would then wake it.  Not API.
///
/// A reader in take_notifies(wait) with an empty inbox used to sleep on the
/// inbox while lane 0 slept on its completion channel: a notification woke
/// the lane, and the lane's push woke the reader, two wake-ups one after the
/// other (about two one-way SENDs in the rxe VM).  Borrowing lane 0, the
/// reader runs the lane's own loop, sleeps where the lane sleeps, and takes
/// the SEND's completion itself.
///
/// Ownership: the lane's state has one owner at a time, the lane thread or
/// the borrower; the hand-over in both directions goes through mu_, which
/// orders everything the one did before it for the other.  The lane thread
/// waits in lend() while the lane is out, and is the borrower's alarm
/// clock: at the borrower's deadline it wakes the lane's idle strategy
/// (where the borrower may sleep for longer) until the lane comes back.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace tide::rdma::detail {

class lane_lender {
 public:
  using clock = std::chrono::steady_clock;

  /// Between the lane's passes: true when a borrower waits for the lane.
  /// Lane thread (and the lane's idle re-check); one load.
  [[nodiscard]] bool wanted() const noexcept { return wanted_.load(std::memory_order_acquire); }

  /// Borrower: asks for the lane and waits for it until `deadline` or
  /// `done()` (re-checked when poke() is called); true once the lane is the
  /// caller's.  False when another thread has it or waits for it, when the
  /// lane has stopped, at the deadline, or when done() came first (what the
  /// caller waits for was produced while the lane thread still had it).
  /// `wake_lane` gets a sleeping lane thread up to hand it over.
  template <class Wake, class Done>
  [[nodiscard]] bool borrow(clock::time_point deadline, Wake&& wake_lane, Done&& done) {
    std::unique_lock lock(mu_);
    if (closed_ || claimed_) return false;
    claimed_ = true;
    deadline_ = deadline;
    wanted_.store(true, std::memory_order_release);
    lock.unlock();
    wake_lane();
    lock.lock();
    changed_.wait_until(lock, deadline, [&] { return lent_ || closed_ || done(); });
    if (lent_) return true;  // (also when it came just as the deadline passed or done() turned true)
    claimed_ = false;
    wanted_.store(false, std::memory_order_relaxed);
    return false;
  }

  /// Any thread, after making done() true for a borrower waiting for the
  /// lane: it looks again.
  void poke() {
    std::lock_guard lock(mu_);
    changed_.notify_all();
  }

  /// Borrower: gives the lane back to its thread.
  void give_back() {
    std::lock_guard lock(mu_);
    lent_ = false;
    claimed_ = false;
    changed_.notify_all();
  }

  /// Lane thread, between passes, when wanted(): hands the lane over and
  /// waits until it comes back, calling `wake_borrower` at the borrower's
  /// deadline and every millisecond after it until then.
  template <class Wake>
  void lend(Wake&& wake_borrower) {
    std::unique_lock lock(mu_);
    wanted_.store(false, std::memory_order_relaxed);
    if (!claimed_) return;  // withdrawn at its deadline
    lent_ = true;
    ++lends_;
    changed_.notify_all();
    const auto deadline = deadline_;
    if (changed_.wait_until(lock, deadline, [&] { return !lent_; })) return;
    while (lent_) {
      lock.unlock();
      wake_borrower();
      lock.lock();
      changed_.wait_for(lock, std::chrono::milliseconds(1), [&] { return !lent_; });
    }
  }

  /// Lane thread, on its way out: no more lending; a borrower waiting for
  /// the lane is told it will not get it.
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    wanted_.store(false, std::memory_order_relaxed);
    changed_.notify_all();
  }

  /// Times the lane was lent (tests).
  [[nodiscard]] unsigned long lends() const {
    std::lock_guard lock(mu_);
    return lends_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::atomic<bool> wanted_{false};
  bool claimed_ = false;  ///< a borrower has asked (until it gives back or withdraws)
  bool lent_ = false;     ///< the borrower runs the lane
  bool closed_ = false;   ///< the lane thread has left its loop
  clock::time_point deadline_{};
  unsigned long lends_ = 0;
};

}  // namespace tide::rdma::detail
