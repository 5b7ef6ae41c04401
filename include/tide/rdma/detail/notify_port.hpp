#pragma once
/// notify_port<P> — lane 0's share of RDMA notifications (issue 18): it
/// posts the notifications the engine's outbox hands over as SENDs on QP 0
/// of an endpoint, takes the receive completions of QP 0 (a message goes to
/// the engine's inbox, a credit message to the endpoint's credits), reposts
/// the buffers and returns credits (notify_qp.hpp has the wire format and
/// why the credits cannot deadlock).  Not API.
///
/// Ownership and threads: the lane owns its port; only lane 0's port is
/// used (QP 0 of every endpoint is lane 0's).  submit() runs on the outbox
/// thread or on the thread that retired a notification's last task (a
/// lock-free push; the lane wakes); everything else on the lane's thread.
/// A notification in the queue or the waiting list is the lane's
/// until notify_send::sent() hands it back; an endpoint in `listed_` is
/// held by its posted receives (endpoint::release_recv), so a raw pointer is
/// safe until its last receive completes or the lane gives the holds up.

#include <tide/detail/log.hpp>
#include <tide/rdma/detail/notify_qp.hpp>
#include <tide/rdma/detail/notify_send.hpp>
#include <tide/rdma/detail/retire_wr.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/rdma/endpoint_store.hpp>
#include <tide/verbs/error.hpp>
#include <tide/wire/address.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tide::rdma {

template <class P>
class rdma_context;

namespace detail {

template <class P>
class notify_port {
 public:
  using handle = typename endpoint_store<endpoint, typename P::eviction>::handle;
  /// How long a notification waits for a credit (or a send slot) while
  /// none comes before it goes over TCP instead: a reader that stopped
  /// returning credits must not hold QP 0's notifications back for longer
  /// than the TCP path takes.  While credits keep coming it waits, up to
  /// kMaxWaitNs in all.
  static constexpr std::int64_t kCreditWaitNs = 50'000'000;
  static constexpr std::int64_t kMaxWaitNs = 1'000'000'000;

  /// What the port may touch of its lane for one call (lane thread).
  struct lane_view {
    rdma_context<P>& ctx;
    const ibv_cq* cq;              ///< the lane's CQ (an endpoint on another one is not ours)
    std::uint32_t& cq_used;        ///< the lane's send WRs on the CQ
    std::uint32_t cq_capacity;
    std::vector<handle>& posted;   ///< endpoints with WRs in the lane's rings
  };

  /// Queues `n` for the lane; false once stop() closed the queue (the
  /// caller keeps `n`).  Any thread; lock-free (one CAS).
  [[nodiscard]] bool submit(notify_send* n) noexcept {
    notify_send* head = queue_.load(std::memory_order_relaxed);
    do {
      if (head == closed_mark()) return false;
      n->next_send = head;
      // release: the lane's acquire exchange sees the notification's fields.
    } while (!queue_.compare_exchange_weak(head, n, std::memory_order_release, std::memory_order_relaxed));
    return true;
  }

  /// Receives posted on this lane's CQ (they take CQ entries too).
  [[nodiscard]] std::uint32_t rx_posted() const noexcept { return rx_posted_; }
  /// Notifications wait for a credit: the lane must not sleep (their wait is bounded).
  [[nodiscard]] bool busy() const noexcept { return wait_head_ != nullptr || credit_due_; }

  /// One pass: takes queued notifications, posts what credits allow, hands
  /// back what waited too long, sends owed credits.  True when it did work.
  bool pass(lane_view v) noexcept {
    bool did = false;
    if (notify_send* q = queue_.load(std::memory_order_relaxed); q != nullptr && q != closed_mark()) {
      // The stack is newest first: reversed, the waiting list keeps the
      // order the outbox handed them over in.
      notify_send* n = queue_.exchange(nullptr, std::memory_order_acquire);
      notify_send* rev = nullptr;
      while (n != nullptr) {
        notify_send* next = n->next_send;
        n->next_send = rev;
        rev = n;
        n = next;
      }
      for (n = rev; n != nullptr;) {
        notify_send* next = n->next_send;
        n->next_send = nullptr;
        n->waiting_since_ns = 0;
        if (wait_tail_ != nullptr) wait_tail_->next_send = n;
        else wait_head_ = n;
        wait_tail_ = n;
        n = next;
      }
      did = true;
    }
    if (wait_head_ != nullptr) did |= post_waiting(v);
    if (credit_due_) did |= send_due_credits(v);
    return did;
  }

  /// Posts `n` as a SEND on QP 0 of `h` right behind a WRITE just posted
  /// there (notify_send, "riding"); false when it cannot go now (no credit,
  /// send slot or queue room; notifications before it still queued here,
  /// which it must not pass): it then waits for its tasks as usual.  Lane
  /// thread, before any completion of that WRITE is polled.
  bool ride(lane_view v, const handle& h, notify_send* n) noexcept {
    if (wait_head_ != nullptr || queue_.load(std::memory_order_relaxed) != nullptr) return false;
    if (!h || !h->notify_ready() || h->lane_cq(0) != v.cq || !h->lane(0).rts) return false;
    notify_qp& q = h->notify();
    if (q.tx_credits == 0 || h->sq_room(0) == 0 || cq_free(v) == 0) return false;
    const int slot = q.take_tx(false);
    if (slot < 0) return false;
    const auto s = static_cast<std::uint32_t>(slot);
    const std::uint32_t len = encode_notify_message(n->wire_msg, q.tx_buf(s));
    if (len != 0) {
      q.set_item(s, n);
      // Set before the post, while no completion of the WRITE can have been
      // polled (this thread polls them): done() then sees it whatever comes first.
      n->rides.store(true, std::memory_order_release);
      if (post(v, h, s, len)) {
        --q.tx_credits;
        return true;
      }
      n->rides.store(false, std::memory_order_relaxed);
      q.set_item(s, nullptr);
    }
    q.give_back_tx(s);
    return false;
  }

  /// Lane 0 connected (or failed to connect) QP 0 of `e`; `before` = its
  /// rx_posted before lane_connect (a reset drops receives silently).
  void on_connect(endpoint& e, std::uint32_t before) noexcept {
    notify_qp& q = e.notify();
    rx_posted_ = rx_posted_ - std::min(rx_posted_, before) + q.rx_posted;
    if (q.rx_posted != 0 && !q.listed) {
      try {
        listed_.push_back(&e);
        q.listed = true;
      } catch (...) {
        // Cannot track its receives: kill the QP so nothing arrives, and give the holds up.
        e.lane_error(0);
        rx_posted_ -= q.rx_posted;
        e.release_recv(q.rx_posted);
        q.rx_posted = 0;
      }
    }
  }

  /// A completion whose wr_id has bit 0 set: a receive on QP 0.
  void on_recv(lane_view v, const ibv_wc& wc) noexcept {
    const auto slot = static_cast<std::uint32_t>(wc.wr_id >> 1);
    endpoint* e = nullptr;
    for (endpoint* c : listed_)
      if (c->qp_num(0) == wc.qp_num) {
        e = c;
        break;
      }
    if (e == nullptr || slot >= e->notify().rx_slots()) [[unlikely]] {
      TIDE_LOG_ERROR(v.ctx.name() << ": receive completion (" << ibv_wc_status_str(wc.status) << ") on QP "
                                  << wc.qp_num << " of no endpoint with notifications; ignored");
      return;
    }
    notify_qp& q = e->notify();
    --q.rx_posted;
    --rx_posted_;
    if (wc.status != IBV_WC_SUCCESS) {
      // A flush (QP to ERR: eviction, teardown) or a real error: the slot
      // is just released, nothing else was ever attached to it.
      if (wc.status != IBV_WC_WR_FLUSH_ERR)
        TIDE_LOG_WARN(v.ctx.name() << " <- " << e->peer_nic_path() << ": notification receive: "
                                   << ibv_wc_status_str(wc.status));
      v.ctx.retire_endpoint_ptr(e);
      finish_recv(*e);
      return;
    }
    bool repost = true;
    try {
      const notify_decoded d = decode_notify_send(q.rx_buf(slot), wc.byte_len);
      if (!d.ok) {
        TIDE_LOG_WARN(v.ctx.name() << " <- " << e->peer_nic_path() << ": malformed notification SEND ("
                                   << wc.byte_len << " bytes); dropped");
        if (d.kind == notify_kind::message) ++q.to_return;  // it took a message receive
      } else if (d.kind == notify_kind::credit) {
        q.tx_credits = std::min(q.tx_credits + d.credits, q.tx_slots() - kCreditReserve);
        q.progress_ns = steady_now_ns();
      } else {
        // The authenticated identity of the peer (with a secret the handshake
        // bound it to this NIC path's server) or the name it gave: the
        // context's hook decides, as the TCP path does.
        v.ctx.deliver_notify(d.msg, wire::nic_path_server(e->peer_nic_path()));
        ++q.to_return;
      }
    } catch (...) {
      ++q.to_return;  // bad_alloc in the copy: dropped, the buffer goes back
    }
    if (repost) {
      if (e->post_notify_recv(slot) == errc::ok) {
        ++rx_posted_;
      } else {
        TIDE_LOG_WARN(v.ctx.name() << " <- " << e->peer_nic_path() << ": cannot repost a notification receive");
        v.ctx.retire_endpoint_ptr(e);
      }
    }
    if (q.to_return >= std::max<std::uint32_t>(1, q.local_credits() / 2)) {
      credit_due_ = true;
      (void)send_due_credits(v);
    }
    finish_recv(*e);
  }

  /// The lane's CQ failed: receives posted on it will never complete.  The
  /// endpoints are failed anyway (the context disconnects all); here the
  /// holds go.
  void on_cq_error() noexcept {
    for (endpoint* e : listed_) {
      e->lane_error(0);
      notify_qp& q = e->notify();
      const std::uint32_t n = q.rx_posted;
      q.rx_posted = 0;
      q.listed = false;
      e->release_recv(n);
    }
    listed_.clear();
    rx_posted_ = 0;
    credit_due_ = false;
  }

  /// The lane stops: notifications not posted go back (TCP), receives not
  /// completed after the lane's drain give their holds up.
  void stop() noexcept {
    // Closed for good: a retiring task that pushes later gets false and
    // sends its notification over TCP instead of leaving it here.
    notify_send* n = queue_.exchange(closed_mark(), std::memory_order_acquire);
    if (n == closed_mark()) n = nullptr;
    while (n != nullptr) {
      notify_send* next = n->next_send;
      n->sent(false);
      n = next;
    }
    give_back_waiting();
    on_cq_error();
  }

 private:
  // Releases the hold of one completed receive; last touch of `e` for it.
  void finish_recv(endpoint& e) noexcept {
    notify_qp& q = e.notify();
    if (q.rx_posted == 0 && q.listed) {
      q.listed = false;
      for (std::size_t k = 0; k < listed_.size(); ++k)
        if (listed_[k] == &e) {
          listed_[k] = listed_.back();
          listed_.pop_back();
          break;
        }
    }
    e.release_recv(1);
  }

  void give_back_waiting() noexcept {
    for (notify_send* n = wait_head_; n != nullptr;) {
      notify_send* next = n->next_send;
      n->sent(false);
      n = next;
    }
    wait_head_ = wait_tail_ = nullptr;
  }

  [[nodiscard]] std::uint32_t cq_free(const lane_view& v) const noexcept {
    const std::uint32_t used = v.cq_used + rx_posted_;
    return v.cq_capacity - std::min(v.cq_capacity, used);
  }

  // Posts a SEND of send buffer `slot` of `e`; the caller took the slot.
  bool post(lane_view& v, const handle& h, std::uint32_t slot, std::uint32_t len, bool credit = false) noexcept {
    endpoint& e = *h;
    const bool was_idle = e.lane(0).ring.empty();
    const errc pe = e.post_notify_send(slot, len, credit);
    if (pe != errc::ok) {
      if (pe != errc::endpoint_closed && pe != errc::would_block) {
        TIDE_LOG_WARN(v.ctx.name() << " -> " << e.peer_nic_path() << ": notification post failed: " << to_string(pe));
        v.ctx.retire_endpoint_ptr(&e);
      }
      return false;
    }
    ++v.cq_used;
    if (was_idle) {
      try {
        v.posted.push_back(h);  // keeps the endpoint while its ring is not empty
      } catch (...) {
        // Without it the completion is stray and the slot never frees: the
        // endpoint goes, its flush retires the WR here.
        v.ctx.retire_endpoint_ptr(&e);
      }
    }
    return true;
  }

  // What can go out of the waiting list, in order; the rest waits, or goes
  // back once it waited kCreditWaitNs.
  bool post_waiting(lane_view& v) noexcept {
    bool did = false;
    const std::int64_t now = steady_now_ns();
    notify_send** link = &wait_head_;
    notify_send* last = nullptr;
    while (notify_send* n = *link) {
      enum { keep, gone, back } what = back;
      handle h = v.ctx.find_endpoint(n->peer_path);
      if (h && h->notify_ready() && h->lane_cq(0) == v.cq && h->lane(0).rts) {
        notify_qp& q = h->notify();
        int slot = -1;
        if (q.tx_credits != 0 && h->sq_room(0) != 0 && cq_free(v) != 0) slot = q.take_tx(false);
        if (slot >= 0) {
          const auto s = static_cast<std::uint32_t>(slot);
          const std::uint32_t len = encode_notify_message(n->wire_msg, q.tx_buf(s));
          if (len != 0) {
            q.set_item(s, n);
            if (post(v, h, s, len)) {
              --q.tx_credits;
              what = gone;
            } else {
              q.set_item(s, nullptr);
            }
          }
          if (what != gone) q.give_back_tx(s);
        } else {
          if (n->waiting_since_ns == 0) n->waiting_since_ns = now;
          const std::int64_t since = std::max(n->waiting_since_ns, q.progress_ns);
          if (now - since < kCreditWaitNs && now - n->waiting_since_ns < kMaxWaitNs) what = keep;
        }
      }
      if (what == keep) {
        last = n;
        link = &n->next_send;
        continue;
      }
      *link = n->next_send;
      n->next_send = nullptr;
      did = true;
      if (what == back) n->sent(false);  // no endpoint, no credit in time, or a post that failed: TCP
    }
    wait_tail_ = last;
    return did;
  }

  bool send_due_credits(lane_view& v) noexcept {
    bool still_due = false, did = false;
    for (endpoint* e : listed_) {
      notify_qp& q = e->notify();
      if (q.to_return < std::max<std::uint32_t>(1, q.local_credits() / 2)) continue;
      handle h = v.ctx.find_endpoint(e->peer_nic_path());
      if (!h || h.get() != e) continue;  // evicted: its credits no longer matter
      // Not ready(): that waits for the ready ack, which nothing here wakes
      // the lane for (endpoint::credits_may_go_out).
      if (!endpoint::credits_may_go_out(h->state()) || !h->lane(0).rts || h->sq_room(0) == 0 || cq_free(v) == 0) {
        still_due = true;
        continue;
      }
      const int slot = q.take_tx(true);
      if (slot < 0) {
        still_due = true;  // both credit buffers in flight: their completions come
        continue;
      }
      const auto s = static_cast<std::uint32_t>(slot);
      if (post(v, h, s, encode_credit(q.to_return, q.tx_buf(s)), true)) {
        q.to_return = 0;
        did = true;
      } else {
        q.give_back_tx(s);
      }
    }
    credit_due_ = still_due;
    return did;
  }

  // The queue's value once stop() ran; compared, never dereferenced.
  static notify_send* closed_mark() noexcept {
    static char mark;
    return reinterpret_cast<notify_send*>(&mark);
  }

  std::atomic<notify_send*> queue_{nullptr};   ///< any thread -> lane (a Treiber stack)
  notify_send* wait_head_ = nullptr;           ///< lane: taken, not posted yet (FIFO)
  notify_send* wait_tail_ = nullptr;
  std::vector<endpoint*> listed_;              ///< lane: endpoints with receives posted on QP 0
  std::uint32_t rx_posted_ = 0;                ///< lane: their sum
  bool credit_due_ = false;                    ///< lane: a credit message could not go out yet
};

}  // namespace detail
}  // namespace tide::rdma
