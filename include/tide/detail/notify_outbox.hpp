#pragma once
// The engine's outgoing transfer-bound notifications (issue 18): one per
// submit that carried a tide::notification.  Each is a task_group over that
// submit's tasks (rdma/detail/batch.hpp); when the last task turns final the
// lane hands it here, and the outbox thread sends it if every task
// COMPLETED, or drops and counts it if any did not.
//
// Why a thread: the lane that retires the last task must not block, and the
// send is a TCP exchange with the peer's handshake port (Mooncake's notify
// message, which tide and Mooncake peers both accept).  The hand-off is an
// intrusive list under a mutex: a lane takes the mutex for a pointer swap
// and never allocates.
//
// Order: notifications are sent one at a time, in the order their submits
// ended; one to an unreachable peer delays the ones behind it by at most the
// handshake timeouts (the send function's).
//
// Thread safety: make() and stats() any thread; done() the retiring lane;
// stop() once, by the owner, after no task can turn final any more.

#include <tide/detail/log.hpp>
#include <tide/errc.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/wire/descriptors.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace tide {

/// Counters of the notifications this engine sent with its submits
/// (transfer_engine::outbox_stats).
struct notify_outbox_stats {
  std::uint64_t submitted = 0;  ///< submits that carried a notification
  std::uint64_t sent = 0;       ///< accepted by the target's inbox
  /// Not sent: a task of its submit ended FAILED, TIMEOUT or CANCELED (the
  /// task's status says why).
  std::uint64_t dropped_failed = 0;
  /// Sent but not taken: the peer answered that its inbox refused it (a
  /// bound), or the exchange failed (unreachable, auth, protocol).
  std::uint64_t refused = 0;
  std::uint64_t send_errors = 0;
  std::size_t pending = 0;  ///< submitted, not yet sent, dropped or refused
};

namespace detail {

class notify_outbox {
 public:
  /// Sends `n` to the owner of segment `segment` (its name); runs on the
  /// outbox thread.  handshake_rejected = the peer did not take it.
  using send_fn = std::function<status(const std::string& segment, const notify_desc& n)>;

  struct item final : rdma::detail::task_group {
    notify_outbox* owner = nullptr;
    std::string segment;
    notify_desc msg;
    item* next = nullptr;
    bool all_completed = false;
    void done(bool ok) noexcept override { owner->ready(this, ok); }
  };

  explicit notify_outbox(send_fn send) : send_(std::move(send)), thread_([this] { run(); }) {}
  notify_outbox(const notify_outbox&) = delete;
  notify_outbox& operator=(const notify_outbox&) = delete;
  ~notify_outbox() { stop(); }

  /// A new item for a submit of `tasks` tasks to `segment`, counted as
  /// pending (before the submit: its tasks may end before submit returns).
  /// Hand it to the transport's submit and release() it; if the submit
  /// fails, give it back with discard().  Throws std::bad_alloc.
  [[nodiscard]] std::unique_ptr<item> make(std::string segment, notify_desc msg, std::size_t tasks) {
    auto it = std::make_unique<item>();
    it->owner = this;
    it->segment = std::move(segment);
    it->msg = std::move(msg);
    it->left.store(tasks, std::memory_order_relaxed);
    submitted_.fetch_add(1, std::memory_order_relaxed);
    pending_.fetch_add(1, std::memory_order_relaxed);
    return it;
  }
  /// The submit refused the item's requests: it was never submitted.
  void discard(std::unique_ptr<item> it) noexcept {
    it.reset();
    submitted_.fetch_sub(1, std::memory_order_relaxed);
    pending_.fetch_sub(1, std::memory_order_relaxed);
  }

  /// Sends what is queued and joins the thread.  Call after every task that
  /// belongs to an item is final (the transport shut down).  Idempotent.
  void stop() noexcept {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  [[nodiscard]] notify_outbox_stats stats() const noexcept {
    notify_outbox_stats s;
    s.submitted = submitted_.load(std::memory_order_relaxed);
    s.sent = sent_.load(std::memory_order_relaxed);
    s.dropped_failed = dropped_.load(std::memory_order_relaxed);
    s.refused = refused_.load(std::memory_order_relaxed);
    s.send_errors = errors_.load(std::memory_order_relaxed);
    s.pending = pending_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // The last task of the item's submit turned final (the retiring lane).
  void ready(item* it, bool ok) noexcept {
    it->all_completed = ok;
    {
      std::lock_guard lock(mu_);
      it->next = nullptr;
      if (tail_ != nullptr) tail_->next = it;
      else head_ = it;
      tail_ = it;
    }
    cv_.notify_one();
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return head_ != nullptr || stopping_; });
      if (head_ == nullptr) return;  // stopping, and nothing left
      std::unique_ptr<item> it(head_);
      head_ = it->next;
      if (head_ == nullptr) tail_ = nullptr;
      lock.unlock();
      deliver(*it);
      pending_.fetch_sub(1, std::memory_order_relaxed);
      it.reset();
      lock.lock();
    }
  }

  void deliver(const item& it) noexcept {
    if (!it.all_completed) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    status st;
    try {
      st = send_(it.segment, it.msg);
    } catch (...) {
      st = fail(error{errc::out_of_memory, {}});
    }
    if (st) {
      sent_.fetch_add(1, std::memory_order_relaxed);
    } else if (st.error().code == errc::handshake_rejected) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      TIDE_LOG_DEBUG("notification to " << it.segment << " refused: " << st.error().message());
    } else {
      errors_.fetch_add(1, std::memory_order_relaxed);
      TIDE_LOG_WARN("notification to " << it.segment << " not delivered: " << st.error().message());
    }
  }

  send_fn send_;
  std::mutex mu_;
  std::condition_variable cv_;
  item* head_ = nullptr;  ///< under mu_: ready items, oldest first
  item* tail_ = nullptr;
  bool stopping_ = false;  ///< under mu_
  std::atomic<std::uint64_t> submitted_{0}, sent_{0}, dropped_{0}, refused_{0}, errors_{0};
  std::atomic<std::size_t> pending_{0};
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace detail
}  // namespace tide
