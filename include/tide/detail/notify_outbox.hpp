#pragma once
// The engine's outgoing transfer-bound notifications (issue 18): one per
// submit that carried a tide::notification.  Each is a task_group over that
// submit's tasks (rdma/detail/batch.hpp); when the last task turns final the
// lane hands it here, and the outbox sends it if every task COMPLETED, or
// drops and counts it if any did not.
//
// Threads: the thread that retires the last task must not block, and the
// TCP send is an exchange with the peer's handshake port (Mooncake's notify
// message, which tide and Mooncake peers both accept) that can take the
// connect plus receive timeouts (5 s + 30 s) when the peer is dead or
// black-holed.  So:
//  - the hand-off (requeue) is an intrusive list under a mutex: a lane
//    takes the mutex for a pointer swap and never allocates;
//  - one dispatcher thread takes what was handed over, counts what needs
//    no send, offers fresh items to the RDMA path, and files the rest in a
//    queue per target;
//  - sender threads (started as targets with queued sends outnumber idle
//    senders, up to options::max_senders) each run one exchange at a time,
//    and a target has at most one exchange under way: a dead target holds
//    one sender and its own queue, never the notifications to others (one
//    thread sent everything in order before: review 1ab3d99, finding 2).
// Order: per target, notifications go out in the order their submits
// ended; between targets there is none.
//
// Bounds: at most options::max_queued sends wait for a sender in all; one
// past it is dropped and counted (dropped_overflow).  stop() gives what is
// queued options::stop_grace to go out, then aborts the exchanges under
// way (the send function gets the abort flag; net::request_options::abort
// ends a request within net::kAbortPoll) and drops the rest, counted
// (dropped_at_stop): an engine going away waits about half a second for
// its notifications, not the timeouts of every one queued to a dead peer.
//
// RDMA (between tide peers that both advertised it, rdma/detail/notify_qp.hpp):
// when an endpoint to the target is connected at submit, the item carries
// the lane that owns its QP 0 (notify_send::sink) and the thread that
// retires the last task hands it there directly; otherwise, with an rdma
// function set, the dispatcher offers the ready item to the transport,
// which picks such a lane then.  The lane owns it until notify_send::sent(),
// which counts a delivered one (sent_rdma) on the lane and queues any other
// here again (no credit in time, QP error, teardown): it goes over TCP as
// before (rdma_fallbacks).  A submit that is one WRITE offers its item to
// ride behind it (task_group::message): lane 0 may post the SEND right after
// the WRITE, and the item settles once both its tasks and that SEND are
// done (rdma/detail/batch.hpp, notify_send; counted in sent_with_data).  A
// SEND whose QP failed after the target took it but before its ack came
// back is sent again over TCP; each item carries a notify_id (this outbox's
// random origin, a sequence number) on both paths, and the target's inbox
// drops the copy.
//
// Thread safety: make(), rdma_on() and stats() any thread; done() the retiring lane;
// sent() lane 0 of a context; set_rdma()/disable_rdma() the owner (the rdma
// function runs under rdma_mu_, so once disable_rdma() returns it never runs
// again); stop() once, by the owner, after no task can turn final any more
// and after disable_rdma().  The send function runs on sender threads, several
// at once (for different targets).

#include <tide/detail/log.hpp>
#include <tide/errc.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/notify_send.hpp>
#include <tide/wire/descriptors.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

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
  /// Of sent_rdma: posted right behind the submit's one WRITE, on its QP,
  /// instead of after the initiator saw it complete.
  std::uint64_t sent_with_data = 0;
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
  /// Not sent: the queue of TCP sends was full (notify_outbox::options::max_queued).
  std::uint64_t dropped_overflow = 0;
  /// Not sent: still queued (or its exchange aborted) when the engine went
  /// away and the stop grace had passed.
  std::uint64_t dropped_at_stop = 0;
  std::size_t pending = 0;  ///< submitted, not yet sent, dropped or refused
  std::size_t queued = 0;   ///< of pending: TCP sends waiting for a sender
};

namespace detail {

class notify_outbox {
 public:
  /// Sends `n` to the owner of segment `segment` (its name); runs on a
  /// sender thread, for different targets on several at once.  `abort`
  /// turns true when stop() gives up: the exchange should end within a
  /// moment (errc::canceled).  handshake_rejected = the peer did not take it.
  using send_fn = std::function<status(const std::string& segment, const notify_desc& n, const std::atomic<bool>& abort)>;
  /// Offers a notification to the RDMA path: true = a lane took it (and
  /// will call sent()); false = send it over TCP.  Dispatcher thread.
  using rdma_fn = std::function<bool(segment_id target, rdma::detail::notify_send* n)>;

  struct options {
    /// TCP sends waiting for a sender, at most; one more is dropped (dropped_overflow).
    std::size_t max_queued = 16384;
    /// Sender threads at most (each in one exchange at a time).
    std::size_t max_senders = 8;
    /// How long stop() lets what is queued go out before it aborts.
    std::chrono::milliseconds stop_grace{500};
  };

  struct item final : rdma::detail::task_group, rdma::detail::notify_send {
    enum class stage : std::uint8_t { fresh, rdma_returned };
    notify_outbox* owner = nullptr;
    std::string segment;
    segment_id target = kInvalidSegment;
    item* next = nullptr;
    bool all_completed = false;
    stage at = stage::fresh;  ///< written by whoever holds the item, read by the dispatcher after the queue's mutex
    bool ride_delivered = false;          ///< the riding SEND's fate, written before its arrival
    std::atomic<std::uint8_t> arrivals{0};  ///< of a riding SEND: done() and sent(), the second settles

    void done(bool ok) noexcept override {
      all_completed = ok;
      if (rides.load(std::memory_order_acquire)) {
        if (second_to_arrive()) settle_ride();
        return;
      }
      hand_on();
    }
    void sent(bool delivered) noexcept override {
      if (rides.load(std::memory_order_acquire)) {
        ride_delivered = delivered;
        if (second_to_arrive()) settle_ride();
        return;
      }
      // Delivered is the end of it: counted and freed on the lane, with no
      // dispatcher to wake while the target's reader wants a CPU.
      if (delivered) {
        owner->settle_delivered(this, false);
        return;
      }
      at = stage::rdma_returned;
      owner->requeue(this);
    }

   private:
    // The tasks ended: the lane picked at submit takes it straight from the
    // retiring thread (one thread hop less before the SEND), else the dispatcher.
    void hand_on() noexcept {
      if (all_completed && sink != nullptr && sink->take_notify(this)) return;
      owner->requeue(this);
    }
    // acq_rel: the second sees what the first wrote before it arrived.
    bool second_to_arrive() noexcept { return arrivals.fetch_add(1, std::memory_order_acq_rel) == 1; }
    // Both events of a riding SEND are in (this thread owns the item).  A
    // delivered one went with the data: its WRITE was placed first, so the
    // target has the bytes even when the task ended otherwise (canceled or
    // timed out after the post).  Flushed: the usual path, as if it never rode.
    void settle_ride() noexcept {
      rides.store(false, std::memory_order_relaxed);
      if (ride_delivered) {
        owner->settle_delivered(this, true);
        return;
      }
      hand_on();
    }
  };

  explicit notify_outbox(send_fn send) : notify_outbox(std::move(send), options{}) {}
  notify_outbox(send_fn send, options opt) : send_(std::move(send)), opt_(opt) {
    if (opt_.max_senders == 0) opt_.max_senders = 1;
    dispatcher_ = std::thread([this] { dispatch(); });
  }
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

  /// Lets what is queued go out for up to options::stop_grace, then aborts
  /// the exchanges under way, drops (and counts) what is left and joins the
  /// threads: returns within the grace plus net::kAbortPoll or so, however
  /// many notifications wait for dead peers.  Call after every task that
  /// belongs to an item is final (the transport shut down).  Idempotent.
  void stop() noexcept {
    {
      std::unique_lock lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      inbound_cv_.notify_all();
      // Done when the dispatcher has filed what it was handed and left, and
      // the senders have sent what it filed.
      drained_.wait_for(lock, opt_.stop_grace, [&] { return drained(); });
      aborting_.store(true, std::memory_order_release);
      ready_cv_.notify_all();
    }
    if (dispatcher_.joinable()) dispatcher_.join();
    // Only the dispatcher starts senders: senders_ is stable once it is gone.
    for (auto& t : senders_)
      if (t.joinable()) t.join();
    // Left only if a sender could not be started, or handed over after the
    // dispatcher left (the contract says never): counted, not sent.
    std::lock_guard lock(mu_);
    for (item* left = inbound_head_; left != nullptr;) {
      item* next = left->next;
      if (settle(*left) == route::tcp) count_dropped_at_stop();
      finish(left);
      left = next;
    }
    inbound_head_ = inbound_tail_ = nullptr;
    for (auto& tg : targets_)
      for (item* left = tg.head; left != nullptr;) {
        item* next = left->next;
        count_dropped_at_stop();
        finish(left);
        left = next;
      }
    by_name_.clear();
    targets_.clear();
    ready_head_ = ready_tail_ = nullptr;
    ready_count_ = queued_ = 0;
    queued_count_.store(0, std::memory_order_relaxed);
    if (const auto n = at_stop_.load(std::memory_order_relaxed); n != 0)
      TIDE_LOG_WARN("notification outbox: " << n << " notification(s) not sent: still queued, or their exchange "
                                             "under way, " << opt_.stop_grace.count() << " ms after stop");
  }

  [[nodiscard]] notify_outbox_stats stats() const noexcept {
    notify_outbox_stats s;
    s.submitted = submitted_.load(std::memory_order_relaxed);
    s.sent_rdma = sent_rdma_.load(std::memory_order_relaxed);
    s.sent_tcp = sent_.load(std::memory_order_relaxed);
    s.sent_with_data = sent_with_data_.load(std::memory_order_relaxed);
    s.sent = s.sent_rdma + s.sent_tcp;
    s.rdma_fallbacks = fallbacks_.load(std::memory_order_relaxed);
    s.dropped_failed = dropped_.load(std::memory_order_relaxed);
    s.refused = refused_.load(std::memory_order_relaxed);
    s.send_errors = errors_.load(std::memory_order_relaxed);
    s.dropped_overflow = overflow_.load(std::memory_order_relaxed);
    s.dropped_at_stop = at_stop_.load(std::memory_order_relaxed);
    s.pending = pending_.load(std::memory_order_relaxed);
    s.queued = queued_count_.load(std::memory_order_relaxed);
    return s;
  }

  /// Sender threads started so far (tests).
  [[nodiscard]] std::size_t senders() const {
    std::lock_guard lock(mu_);
    return senders_.size();
  }

 private:
  // A target's TCP sends, oldest first; `busy` while a sender runs one of
  // them.  Owned by targets_ (a list: its elements never move), found by
  // name through by_name_; erased once empty and not busy.
  struct target {
    std::string name;
    item* head = nullptr;
    item* tail = nullptr;
    bool busy = false;
    bool listed = false;       ///< in the ready list
    target* next_ready = nullptr;
    std::list<target>::iterator self;
  };

  // Into the hand-off list: ready, or back from a lane.  Any thread; no allocation.
  void requeue(item* it) noexcept {
    {
      std::lock_guard lock(mu_);
      it->next = nullptr;
      if (inbound_tail_ != nullptr) inbound_tail_->next = it;
      else inbound_head_ = it;
      inbound_tail_ = it;
    }
    inbound_cv_.notify_one();
  }

  // An item a lane delivered (only a COMPLETED submit's reaches a lane).
  // That lane; no lock, no allocation.
  void settle_delivered(item* it, bool rode) noexcept {
    sent_rdma_.fetch_add(1, std::memory_order_relaxed);
    if (rode) sent_with_data_.fetch_add(1, std::memory_order_relaxed);
    finish(it);
  }

  // Nothing handed over, in the dispatcher's hands, queued or under way (under mu_).
  [[nodiscard]] bool drained() const noexcept {
    return inbound_head_ == nullptr && dispatcher_done_ && ready_head_ == nullptr && busy_ == 0;
  }

  void finish(item* it) noexcept {
    delete it;
    pending_.fetch_sub(1, std::memory_order_relaxed);
  }
  void count_dropped_at_stop() noexcept {
    at_stop_.fetch_add(1, std::memory_order_relaxed);
  }

  // The dispatcher: takes what was handed over, settles what needs no send,
  // files the rest per target.
  void dispatch() noexcept {
    std::unique_lock lock(mu_);
    for (;;) {
      inbound_cv_.wait(lock, [&] { return inbound_head_ != nullptr || stopping_; });
      if (inbound_head_ == nullptr) {
        // Stopping with nothing handed over: the senders finish the queues
        // and leave once they are empty.
        dispatcher_done_ = true;
        ready_cv_.notify_all();
        if (drained()) drained_.notify_all();
        return;
      }
      item* in = inbound_head_;
      inbound_head_ = inbound_tail_ = nullptr;
      lock.unlock();
      item* tcp_head = nullptr;
      item** tcp_link = &tcp_head;
      while (in != nullptr) {
        item* next = in->next;
        in->next = nullptr;
        switch (settle(*in)) {
          case route::done: finish(in); break;
          case route::lane: break;  // a lane has it now; it comes back through sent()
          case route::tcp:
            *tcp_link = in;
            tcp_link = &in->next;
            break;
        }
        in = next;
      }
      lock.lock();
      file(tcp_head);
    }
  }

  enum class route : std::uint8_t { done, lane, tcp };
  // Counts an item that needs no send (done), hands a fresh one to a lane
  // when the RDMA path takes it (lane: do not touch it any more), or says
  // it goes over TCP.
  route settle(item& it) noexcept {
    if (!it.all_completed) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return route::done;
    }
    if (it.at == item::stage::rdma_returned) {
      fallbacks_.fetch_add(1, std::memory_order_relaxed);
      return route::tcp;
    }
    return offered_to_lane(it) ? route::lane : route::tcp;
  }

  // True when a lane took the item (do not touch it any more).  Dispatcher.
  bool offered_to_lane(item& it) noexcept {
    if (aborting_.load(std::memory_order_acquire)) return false;
    std::lock_guard lock(rdma_mu_);
    // The lane may hand it back before this returns: `it` is not read after a true.
    return rdma_ && it.target != kInvalidSegment && rdma_(it.target, &it);
  }

  // Files a chain of TCP sends in their targets' queues (under mu_).
  void file(item* chain) noexcept {
    while (chain != nullptr) {
      item* it = chain;
      chain = chain->next;
      it->next = nullptr;
      if (aborting_.load(std::memory_order_relaxed)) {
        count_dropped_at_stop();
        finish(it);
        continue;
      }
      if (queued_ >= opt_.max_queued) {
        overflow_.fetch_add(1, std::memory_order_relaxed);
        TIDE_LOG_DEBUG("notification to " << it->segment << " dropped: " << queued_ << " already queued");
        finish(it);
        continue;
      }
      target* tg = target_of(it->segment);
      if (tg == nullptr) {  // no memory for the target's queue
        errors_.fetch_add(1, std::memory_order_relaxed);
        finish(it);
        continue;
      }
      if (tg->tail != nullptr) tg->tail->next = it;
      else tg->head = it;
      tg->tail = it;
      ++queued_;
      queued_count_.store(queued_, std::memory_order_relaxed);
      if (!tg->busy && !tg->listed) list_ready(tg);
    }
    // A sender per ready target, up to the bound: a send may take the peer's
    // timeouts, so an idle sender is what a ready target needs.
    while (ready_count_ > idle_senders_ + starting_senders_ && senders_.size() < opt_.max_senders &&
           !aborting_.load(std::memory_order_relaxed)) {
      try {
        senders_.emplace_back([this] { send_loop(); });
        ++starting_senders_;
      } catch (...) {
        if (senders_.empty()) TIDE_LOG_ERROR("notification outbox: cannot start a sender thread");
        break;
      }
    }
    if (ready_count_ != 0) ready_cv_.notify_all();
  }

  target* target_of(const std::string& name) noexcept {
    if (auto f = by_name_.find(std::string_view(name)); f != by_name_.end()) return &*f->second;
    try {
      targets_.emplace_front();
      auto tg = targets_.begin();
      tg->self = tg;
      try {
        tg->name = name;
        by_name_.emplace(std::string_view(tg->name), tg);
      } catch (...) {
        targets_.erase(tg);
        return nullptr;
      }
      return &*tg;
    } catch (...) {
      return nullptr;
    }
  }

  void list_ready(target* tg) noexcept {
    tg->listed = true;
    tg->next_ready = nullptr;
    if (ready_tail_ != nullptr) ready_tail_->next_ready = tg;
    else ready_head_ = tg;
    ready_tail_ = tg;
    ++ready_count_;
  }

  // A sender: one exchange at a time, the oldest send of the target that
  // waited longest; a target is busy (unlisted) while its send runs.
  void send_loop() noexcept {
    std::unique_lock lock(mu_);
    --starting_senders_;
    for (;;) {
      if (ready_head_ == nullptr) {
        if (dispatcher_done_) return;  // nothing more will be filed
        ++idle_senders_;
        ready_cv_.wait(lock, [&] { return ready_head_ != nullptr || dispatcher_done_; });
        --idle_senders_;
        continue;
      }
      target* tg = ready_head_;
      ready_head_ = tg->next_ready;
      if (ready_head_ == nullptr) ready_tail_ = nullptr;
      --ready_count_;
      tg->listed = false;
      item* it = tg->head;
      tg->head = it->next;
      if (tg->head == nullptr) tg->tail = nullptr;
      it->next = nullptr;
      --queued_;
      queued_count_.store(queued_, std::memory_order_relaxed);
      tg->busy = true;
      ++busy_;
      lock.unlock();
      if (aborting_.load(std::memory_order_acquire)) count_dropped_at_stop();
      else send_tcp(*it);
      finish(it);
      lock.lock();
      tg->busy = false;
      --busy_;
      if (tg->head != nullptr) {
        list_ready(tg);
      } else {
        by_name_.erase(std::string_view(tg->name));
        targets_.erase(tg->self);
      }
      if (stopping_ && drained()) drained_.notify_all();
    }
  }

  void send_tcp(const item& it) noexcept {
    status st;
    try {
      st = send_(it.segment, it.wire_msg, aborting_);
    } catch (...) {
      st = fail(error{errc::out_of_memory, {}});
    }
    if (st) {
      sent_.fetch_add(1, std::memory_order_relaxed);
    } else if (aborting_.load(std::memory_order_acquire)) {
      count_dropped_at_stop();  // cut short by stop(): its fate is unknown, like one never sent
      TIDE_LOG_DEBUG("notification to " << it.segment << " abandoned at stop: " << st.error().message());
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
  options opt_;
  const std::uint64_t origin_ = random_origin();
  std::atomic<std::uint64_t> next_seq_{0};
  std::mutex rdma_mu_;  ///< held while rdma_ runs (disable_rdma waits for it)
  rdma_fn rdma_;        ///< under rdma_mu_; empty: TCP only
  std::atomic<bool> rdma_on_{false};  ///< rdma_ is set (read without the mutex by submits)
  /// Set by stop() once the grace has passed: exchanges give up, nothing new goes out.
  std::atomic<bool> aborting_{false};

  mutable std::mutex mu_;            ///< guards everything down to senders_
  std::condition_variable inbound_cv_;  ///< the dispatcher: something handed over, or stop
  std::condition_variable ready_cv_;    ///< idle senders: a target ready, or the dispatcher gone
  std::condition_variable drained_;     ///< stop(): nothing handed over, queued or under way
  item* inbound_head_ = nullptr;     ///< handed over, not yet seen by the dispatcher, oldest first
  item* inbound_tail_ = nullptr;
  std::list<target> targets_;
  std::unordered_map<std::string_view, std::list<target>::iterator> by_name_;  ///< keys view target::name
  target* ready_head_ = nullptr;     ///< targets with sends queued and none under way, oldest first
  target* ready_tail_ = nullptr;
  std::size_t ready_count_ = 0;
  std::size_t queued_ = 0;           ///< sends in the targets' queues
  std::size_t busy_ = 0;             ///< senders in an exchange
  std::size_t idle_senders_ = 0;
  std::size_t starting_senders_ = 0;
  bool stopping_ = false;
  bool dispatcher_done_ = false;     ///< it left: nothing more is filed
  std::vector<std::thread> senders_;  ///< grown by the dispatcher only (under mu_)

  std::atomic<std::uint64_t> submitted_{0}, sent_{0}, dropped_{0}, refused_{0}, errors_{0};
  std::atomic<std::uint64_t> sent_rdma_{0}, sent_with_data_{0}, fallbacks_{0}, overflow_{0}, at_stop_{0};
  std::atomic<std::size_t> pending_{0}, queued_count_{0};
  std::thread dispatcher_;  // last: started once every member above exists
};

}  // namespace detail
}  // namespace tide
