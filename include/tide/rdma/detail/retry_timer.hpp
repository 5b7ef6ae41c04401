#pragma once
/// retry_timer: where a slice waits out its backoff before it is retried on
/// the only rail to its peer (rdma_transport<P>::on_failed,
/// transport_dispatch.hpp).  A loss burst on that rail fails every WR on
/// it, round after round; retried at once, a slice used up its retries
/// within a few rounds and failed although the link came back within the
/// transfer timeout (issue 17, item 7).  Waiting here spaces the rounds out
/// (retry_backoff) until the task's deadline.
///
/// Why a timer thread of the transport and not a delayed list in each lane:
/// the lanes sleep on their CQs (some idle strategies for long), so a lane
/// would have to wake for deadlines it does not otherwise have; and a slice
/// may be parked by one lane and be due on another (or on none: its task
/// was canceled).  One thread, started at the first park, costs nothing to
/// an engine that never retries this way.
///
/// Ownership: from park() returning `parked` until it hands the slice back,
/// the timer owns the slice and nothing else touches it.  It hands each
/// parked slice back exactly once:
///   - when due: its task still running -> `resume` (the transport
///     dispatches it again); its task marked to stop -> retire_wr with the
///     stop's error (timed_out / canceled);
///   - a task marked to stop while the slice waits -> retire_wr at once
///     (within one stop_poll: the thread looks whenever stop_marks() moved);
///   - close() -> retire_wr with the slice's own failure, at once, without
///     waiting out any backoff.
/// No retry through this queue starts after the task's deadline: park()
/// refuses a slice whose wait would end at or after it.
///
/// Threads: park() from any thread (the lanes, via on_failed); `resume`
/// and the retirements run on the timer thread (close(): on its caller,
/// after the timer thread has been joined).  close() from any thread but
/// the timer's own (resume must not call it); it is idempotent and runs in
/// the destructor too.  The heap is guarded by mu_; what the thread takes
/// out of it is the thread's alone until it has dealt with every one
/// (close() joins it first, so none is lost or retired twice).  A parked
/// slice keeps its failure in slice::retry_error, and slice::next chains
/// what the thread takes out of the heap: the thread never allocates.

#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/retire_wr.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tide::rdma::detail {

/// The wait before a slice's next retry on the same rail, by how many
/// retries it has had: the first goes at once (a single lost ACK, an
/// evicted endpoint: the fresh endpoint usually just works), then `first`,
/// doubling up to `cap`, so a long outage costs a retry round every `cap`,
/// and a task that is canceled or times out waits at most that long.
struct retry_backoff {
  std::chrono::nanoseconds first{std::chrono::milliseconds(4)};
  std::chrono::nanoseconds cap{std::chrono::milliseconds(200)};
  /// How often the timer thread looks for stopped tasks while slices wait.
  std::chrono::nanoseconds stop_poll{std::chrono::milliseconds(20)};

  /// The wait before retry number `retries_so_far + 1`.
  [[nodiscard]] constexpr std::chrono::nanoseconds delay(unsigned retries_so_far) const noexcept {
    if (retries_so_far == 0) return std::chrono::nanoseconds{0};
    std::chrono::nanoseconds d = first;
    for (unsigned i = 1; i < retries_so_far && d < cap; ++i) d *= 2;
    return std::min(d, cap);
  }
};

class retry_timer {
 public:
  /// Called on the timer thread with each slice that is due and whose task
  /// is still running, and the failure it was parked with.  It owns the
  /// slice from then on; it must not block or call close().
  using resume_fn = std::function<void(slice&, errc)>;

  enum class park_result {
    parked,         ///< the timer owns the slice now
    past_deadline,  ///< the retry would start at or after the task's deadline
    stopped,        ///< its task was marked to stop (should_drop): no retry
    closed,         ///< close() began: no more retries
    no_resources,   ///< the thread or the queue's memory could not be had
  };

  explicit retry_timer(resume_fn resume, retry_backoff backoff = {})
      : resume_(std::move(resume)), backoff_(backoff) {}
  retry_timer(const retry_timer&) = delete;
  retry_timer& operator=(const retry_timer&) = delete;
  ~retry_timer() { close(); }

  [[nodiscard]] const retry_backoff& backoff() const noexcept { return backoff_; }

  /// Whether a retry of slice `s` that starts `delay` from now starts
  /// before its task's deadline.  Any thread.
  [[nodiscard]] static bool before_deadline(const slice& s, std::chrono::nanoseconds delay) noexcept {
    return std::chrono::steady_clock::now() + delay < s.task->deadline.load(std::memory_order_relaxed);
  }

  /// Parks slice `s` (failed with `e`) for `delay`.  Anything but `parked`
  /// leaves the slice with the caller, untouched.  Any thread.
  [[nodiscard]] park_result park(slice& s, errc e, std::chrono::nanoseconds delay) noexcept {
    if (!before_deadline(s, delay)) return park_result::past_deadline;
    const std::int64_t due = steady_now_ns() + delay.count();
    std::lock_guard lock(mu_);
    if (closed_) return park_result::closed;
    // Under mu_: a stop marked after this check moves stop_marks(), and the
    // thread sweeps the heap, this slice in it, when it next looks.
    if (should_drop(s) != errc::ok) return park_result::stopped;
    try {
      if (heap_.size() == heap_.capacity()) heap_.reserve(std::max<std::size_t>(64, heap_.size() * 2));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    } catch (...) {
      return park_result::no_resources;
    }
    s.retry_error = e;
    const bool new_first = heap_.empty() || due < heap_.front().due_ns;
    heap_.push_back({due, &s});
    std::push_heap(heap_.begin(), heap_.end(), later);
    if (new_first) cv_.notify_one();
    return park_result::parked;
  }

  /// Retires every parked slice with its failure, at once, and stops the
  /// thread; later parks are refused (`closed`).  Idempotent; any thread
  /// but the timer's.
  void close() noexcept {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    // The thread is gone and parks are refused: the heap is ours alone.
    std::vector<entry> left;
    {
      std::lock_guard lock(mu_);
      left.swap(heap_);
    }
    for (const entry& x : left) retire_wr(*x.s, x.s->retry_error);
  }

  /// Slices parked now (tests).  Any thread.
  [[nodiscard]] std::size_t parked() const {
    std::lock_guard lock(mu_);
    return heap_.size();
  }

 private:
  struct entry {
    std::int64_t due_ns;
    slice* s;
  };
  // std::push_heap keeps the greatest first: "greatest" = due soonest.
  static bool later(const entry& a, const entry& b) noexcept { return a.due_ns > b.due_ns; }

  void run() noexcept {
    std::unique_lock lock(mu_);
    // Marks made before the thread ran are swept at once (park() checks
    // each slice against the marks made before it took mu_).
    std::uint64_t seen_marks = ~stop_marks();
    while (!closed_) {
      if (heap_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const std::int64_t now = steady_now_ns();
      // What leaves the heap is chained through slice::next (free while a
      // slice is parked): handing off allocates nothing.
      // In due order: what came due together goes out oldest first.
      slice* out = nullptr;
      slice** out_tail = &out;
      auto hand_off = [&out_tail](slice* s) {
        s->next = nullptr;
        *out_tail = s;
        out_tail = &s->next;
      };
      // A task marked to stop must not wait out its slices' backoff.
      if (const std::uint64_t marks = stop_marks(); marks != seen_marks) {
        seen_marks = marks;
        auto dropped = std::partition(heap_.begin(), heap_.end(), [](const entry& x) { return should_drop(*x.s) == errc::ok; });
        if (dropped != heap_.end()) {
          for (auto it = dropped; it != heap_.end(); ++it) hand_off(it->s);
          heap_.erase(dropped, heap_.end());
          std::make_heap(heap_.begin(), heap_.end(), later);
        }
      }
      while (!heap_.empty() && heap_.front().due_ns <= now) {
        std::pop_heap(heap_.begin(), heap_.end(), later);
        hand_off(heap_.back().s);
        heap_.pop_back();
      }
      if (out == nullptr) {
        const std::int64_t wake = std::min(heap_.front().due_ns, now + backoff_.stop_poll.count());
        cv_.wait_until(lock, std::chrono::steady_clock::time_point{std::chrono::nanoseconds{wake}});
        continue;
      }
      // Out of the lock: parks from the lanes go on meanwhile, and what
      // resume and retire_wr call (lanes' queues, batch waiters) never
      // waits behind the timer.
      lock.unlock();
      while (out != nullptr) {
        slice* s = out;
        out = s->next;
        s->next = nullptr;
        if (const errc why = should_drop(*s); why != errc::ok) retire_wr(*s, why);
        else resume_(*s, s->retry_error);
      }
      lock.lock();
    }
  }

  const resume_fn resume_;
  const retry_backoff backoff_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<entry> heap_;  ///< under mu_: parked slices, soonest due first
  bool closed_ = false;      ///< under mu_
  std::thread thread_;       ///< started by the first park (under mu_), joined by close()
};

}  // namespace tide::rdma::detail
