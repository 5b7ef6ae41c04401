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
// RDMA (between tide peers that both advertised it, rdma/detail/notify_qp.hpp):
// when an endpoint to the target is connected at submit, the item carries
// the lane that owns its QP 0 (notify_send::sink) and the thread that
// retires the last task hands it there directly; otherwise, with an rdma
// function set, the outbox thread offers the ready item to the transport,
// which picks such a lane then.  The lane owns it until notify_send::sent(),
// which queues it here again: delivered -> counted (sent_rdma), else (no credit in time, QP
// error, teardown) it goes over TCP as before (rdma_fallbacks).  A SEND whose
// QP failed after the target took it but before its ack came back is sent
// again over TCP; each item carries a notify_id (this outbox's random origin,
// a sequence number) on both paths, and the target's inbox drops the copy.
//
// Thread safety: make(), rdma_on() and stats() any thread; done() the retiring lane;
// sent() lane 0 of a context; set_rdma()/disable_rdma() the owner (the rdma
// function runs under rdma_mu_, so once disable_rdma() returns it never runs
// again); stop() once, by the owner, after no task can turn final any more
// and after disable_rdma().

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
#include <random>
#include <string>
#include <thread>

namespace tide {

/// Counters of the notifications this engine sent with its submits
/// (transfer_engine::outbox_stats).
struct notify_outbox_stats {
  std::uint64_t submitted = 0;  ///< submits that carried a notification
  /// Delivered: over TCP, accepted by the target's inbox; over RDMA, in the
  /// target's receive buffer (its inbox bounds then count a refusal at the
  /// target only, in its notification_stats()).
  std::uint64_t sent = 0;
  std::uint64_t sent_rdma = 0;  ///< of sent: as a SEND on an endpoint's QP 0
  std::uint64_t sent_tcp = 0;   ///< of sent: Mooncake's notify message on the handshake port
  /// Handed to a lane but sent over TCP instead (no credit within the wait,
  /// endpoint gone, QP error, teardown).
  std::uint64_t rdma_fallbacks = 0;
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
  /// Offers a notification to the RDMA path: true = a lane took it (and
  /// will call sent()); false = send it over TCP.  Outbox thread.
  using rdma_fn = std::function<bool(segment_id target, rdma::detail::notify_send* n)>;

  struct item final : rdma::detail::task_group, rdma::detail::notify_send {
    enum class stage : std::uint8_t { fresh, rdma_delivered, rdma_returned };
    notify_outbox* owner = nullptr;
    std::string segment;
    segment_id target = kInvalidSegment;
    item* next = nullptr;
    bool all_completed = false;
    stage at = stage::fresh;  ///< written by whoever holds the item, read by the outbox thread after the queue's mutex
    void done(bool ok) noexcept override {
      // The lane picked at submit takes it straight from the retiring
      // thread: one thread hop less before the SEND (the latency).
      all_completed = ok;
      if (ok && sink != nullptr && sink->take_notify(this)) return;
      owner->requeue(this);
    }
    void sent(bool delivered) noexcept override {
      at = delivered ? stage::rdma_delivered : stage::rdma_returned;
      owner->requeue(this);
    }
  };

  explicit notify_outbox(send_fn send) : send_(std::move(send)), thread_([this] { run(); }) {}
  notify_outbox(const notify_outbox&) = delete;
  notify_outbox& operator=(const notify_outbox&) = delete;
  ~notify_outbox() { stop(); }

  /// A new item for a submit of `tasks` tasks to `segment`, counted as
  /// pending (before the submit: its tasks may end before submit returns).
  /// Hand it to the transport's submit and release() it; if the submit
  /// fails, give it back with discard().  Throws std::bad_alloc.
  [[nodiscard]] std::unique_ptr<item> make(std::string segment, notify_desc msg, std::size_t tasks,
                                           segment_id target = kInvalidSegment) {
    auto it = std::make_unique<item>();
    it->owner = this;
    it->segment = std::move(segment);
    it->target = target;
    it->wire_msg = std::move(msg);
    it->wire_msg.id = notify_id{origin_, next_seq_.fetch_add(1, std::memory_order_relaxed) + 1};
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

  /// Turns the RDMA path on (the owner, once the transport exists).
  void set_rdma(rdma_fn f) {
    std::lock_guard lock(rdma_mu_);
    rdma_ = std::move(f);
    rdma_on_.store(static_cast<bool>(rdma_), std::memory_order_release);
  }
  /// Whether the RDMA path is on (set_rdma and not disabled).  Any thread.
  [[nodiscard]] bool rdma_on() const noexcept { return rdma_on_.load(std::memory_order_acquire); }
  /// Turns it off for good: after return the rdma function is not running
  /// and never runs again (the owner, before the transport shuts down).
  void disable_rdma() noexcept {
    std::lock_guard lock(rdma_mu_);
    rdma_ = nullptr;
    rdma_on_.store(false, std::memory_order_release);
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
    s.sent_rdma = sent_rdma_.load(std::memory_order_relaxed);
    s.sent_tcp = sent_.load(std::memory_order_relaxed);
    s.sent = s.sent_rdma + s.sent_tcp;
    s.rdma_fallbacks = fallbacks_.load(std::memory_order_relaxed);
    s.dropped_failed = dropped_.load(std::memory_order_relaxed);
    s.refused = refused_.load(std::memory_order_relaxed);
    s.send_errors = errors_.load(std::memory_order_relaxed);
    s.pending = pending_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // Into the queue: ready, or back from a lane.  Any thread; no allocation.
  void requeue(item* it) noexcept {
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
      if (deliver(*it)) {
        (void)it.release();  // a lane has it now; it comes back through sent()
      } else {
        pending_.fetch_sub(1, std::memory_order_relaxed);
        it.reset();
      }
      lock.lock();
    }
  }

  // True when a lane took the item (do not touch it any more).
  bool deliver(item& it) noexcept {
    if (!it.all_completed) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (it.at == item::stage::rdma_delivered) {
      sent_rdma_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (it.at == item::stage::fresh) {
      std::lock_guard lock(rdma_mu_);
      // The lane may hand it back before this returns: `it` is not read after a true.
      if (rdma_ && it.target != kInvalidSegment && rdma_(it.target, &it)) return true;
    } else {
      fallbacks_.fetch_add(1, std::memory_order_relaxed);
    }
    send_tcp(it);
    return false;
  }

  void send_tcp(const item& it) noexcept {
    status st;
    try {
      st = send_(it.segment, it.wire_msg);
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

  /// Random, so that an engine restarted under the same name does not
  /// reuse the ids its previous run sent (the target would drop them).
  static std::uint64_t random_origin() {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
  }

  send_fn send_;
  const std::uint64_t origin_ = random_origin();
  std::atomic<std::uint64_t> next_seq_{0};
  std::mutex rdma_mu_;  ///< held while rdma_ runs (disable_rdma waits for it)
  rdma_fn rdma_;        ///< under rdma_mu_; empty: TCP only
  std::atomic<bool> rdma_on_{false};  ///< rdma_ is set (read without the mutex by submits)
  std::mutex mu_;
  std::condition_variable cv_;
  item* head_ = nullptr;  ///< under mu_: ready items, oldest first
  item* tail_ = nullptr;
  bool stopping_ = false;  ///< under mu_
  std::atomic<std::uint64_t> submitted_{0}, sent_{0}, dropped_{0}, refused_{0}, errors_{0};
  std::atomic<std::uint64_t> sent_rdma_{0}, fallbacks_{0};
  std::atomic<std::size_t> pending_{0};
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace detail
}  // namespace tide
