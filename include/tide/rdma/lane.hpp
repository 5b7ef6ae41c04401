#pragma once
/// rdma::lane<P> — one worker thread of a context that owns one CQ (and its
/// completion channel) and QP i of every endpoint of the context (i = the
/// lane's index).  Flow: dispatch -> submit queue -> lane groups the slices
/// by peer NIC -> posts on its QP within credits -> polls its CQ -> retires
/// the slices (the roll-up wakes wait() directly).
///
/// Ownership and threads:
///  - the CQ, QP i of every endpoint (its transitions, posts, posted ring),
///    the groups of queued slices and the credit counters: the lane thread.
///  - submit(): any thread (MPSC slice_queue push, then the idle wake).
///  - send(): any thread (mailbox under a mutex; control messages are rare:
///    connect/accept, retire, CQ error); the lane handles them at the top of
///    its next pass.
///  - memory the lane allocates (posted rings, group vector) is first
///    touched by the lane thread, which runs on its NIC's NUMA node.
///  - RDMA notifications (lane 0 only: QP 0 carries them): notify_port,
///    detail/notify_port.hpp; take_notify() from any thread.
///  - run_borrowed(): another thread runs the loop for a while, and owns
///    all of the above while it does (the lane thread waits meanwhile;
///    detail/lane_lending.hpp).
///
/// Credits: the lane posts on a QP only while the QP's send queue has room
/// and its CQ has a free entry per WR.  Every WR counts against the CQ, not
/// only the signaled ones: a QP in error flushes every WR with a completion,
/// signaled or not, so counting only signaled WRs could overrun the CQ
/// exactly when things go wrong.

#include <tide/detail/log.hpp>
#include <tide/rdma/detail/drop_stopped.hpp>
#include <tide/rdma/detail/lane_lending.hpp>
#include <tide/rdma/detail/lane_mail.hpp>
#include <tide/rdma/detail/lane_thread.hpp>
#include <tide/rdma/detail/notify_port.hpp>
#include <tide/rdma/detail/notify_send.hpp>
#include <tide/rdma/detail/policy_adapt.hpp>
#include <tide/rdma/detail/retire_wr.hpp>
#include <tide/rdma/detail/slice_queue.hpp>
#include <tide/rdma/detail/stage_pool.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/rdma/endpoint_store.hpp>
#include <tide/verbs/error.hpp>

#include <pthread.h>

#include <array>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tide::rdma {

template <class P>
class rdma_context;

template <class P>
class lane final : public detail::notify_sink {
 public:
  using handle = typename endpoint_store<endpoint, typename P::eviction>::handle;
  static constexpr int kPollBatch = 64;  ///< completions per ibv_poll_cq

  lane(rdma_context<P>& ctx, std::uint32_t index)
      : ctx_(ctx),
        index_(index),
        stage_(ctx.config().stage_chunk_size, ctx.config().stage_chunks, ctx.bytes_staged_counter()) {}
  lane(const lane&) = delete;
  lane& operator=(const lane&) = delete;
  ~lane() { stop(); }

  /// Attaches the idle strategy to the lane's CQ and starts the thread,
  /// bound to `numa_node` (-1: unbound), or to `cpus` when it names any
  /// (config_invalid when the kernel refuses them all).  Setup path; once.
  [[nodiscard]] status start(int numa_node, const std::vector<int>& cpus = {}) {
    auto idle = P::idle::create(typename P::idle::config{});
    if (!idle) return fail(idle.error());
    idle_.emplace(std::move(*idle));
    cq_ = ctx_.lane_cq(index_);
    if (auto r = idle_->attach(cq_->native_handle(), ctx_.channel(index_)); !r) return r;
    cq_capacity_ = static_cast<std::uint32_t>(std::max(1, cq_->capacity()));
    running_.store(true, std::memory_order_release);
    // Named CPUs rule: the NUMA binding would widen them again.
    thread_ = std::thread([this, node = cpus.empty() ? numa_node : -1] { run(node); });
    // Named here, not by the lane itself, so the name is there when start()
    // returns (a test reading /proc/self/task raced the lane's own call).
    pthread_setname_np(thread_.native_handle(), "tide-lane");  // for top -H, perf and taskset -p
    if (!cpus.empty())
      if (auto r = detail::run_lane_on(thread_.native_handle(), cpus); !r) {
        stop();
        return r;
      }
    return {};
  }

  /// Stops and joins the thread (it drains first, bounded), then retires
  /// what reached the queue after the thread's last look and answers the
  /// mail it left.  From then on submit() retires and send() answers at
  /// once.  The idle strategy stays until the
  /// lane is destroyed: a late wake() must find it.  Idempotent.
  void stop() noexcept {
    if (running_.exchange(false, std::memory_order_acq_rel)) {
      idle_->wake();
      if (thread_.joinable()) thread_.join();
    }
    std::vector<lane_message> left;
    {
      std::lock_guard lock(mail_mu_);
      closed_.store(true, std::memory_order_release);
      left.swap(mail_);
      has_mail_.store(false, std::memory_order_relaxed);
    }
    for (auto& m : left) answer_closed(m);
    retire_chain(queue_.take_all(), errc::endpoint_closed);
    if (idle_ && cq_ && !detached_) {
      idle_->detach(cq_->native_handle());
      detached_ = true;
    }
  }

  /// Queues the chain first..last (linked by next) and wakes the lane; once
  /// the lane has stopped, retires the chain instead (endpoint_closed).
  /// Hot path, any thread: one load and one CAS plus the idle wake (a
  /// relaxed load, or a futex/eventfd write when the lane sleeps).  The
  /// transport stops retrying before it stops any lane, so nothing submits
  /// while stop() runs.
  void submit(detail::slice* first, detail::slice* last) noexcept {
    // acquire: pairs with the release store in stop().
    if (closed_.load(std::memory_order_acquire)) [[unlikely]] {
      last->next = nullptr;
      retire_chain(first, errc::endpoint_closed);
      return;
    }
    queue_.push(first, last);
    idle_->wake();
  }

  /// Queues a control message and wakes the lane; once the lane has
  /// stopped, answers it at once (a connect fails).  Any thread.
  void send(lane_message m) {
    bool queued = false;
    {
      std::lock_guard lock(mail_mu_);
      if (!closed_.load(std::memory_order_relaxed)) {
        mail_.push_back(std::move(m));
        // release: pairs with the acquire load in pass().
        has_mail_.store(true, std::memory_order_release);
        queued = true;
      }
    }
    if (!queued) {
      answer_closed(m);
      return;
    }
    idle_->wake();
  }

  /// Hands a notification to this lane (lane 0 of a context) to go out as
  /// a SEND on QP 0 of the endpoint to n->peer_path; it comes back through
  /// n->sent().  False once the lane has stopped (the caller keeps it).
  /// Any thread (the outbox's, or a lane retiring the notification's last
  /// task); lock-free.
  [[nodiscard]] bool take_notify(detail::notify_send* n) noexcept override {
    if (closed_.load(std::memory_order_acquire) || !notify_.submit(n)) return false;
    idle_->wake();
    return true;
  }

  void wake() noexcept { idle_->wake(); }
  /// After making a run_borrowed caller's done() true: wakes it wherever it
  /// waits (for the lane, or running it).  Any thread.
  void wake_borrower() {
    idle_->wake();
    lender_.poke();
  }

  /// Runs the lane's loop on the calling thread (the lane thread waits)
  /// until `done()`, `deadline` or stop(), so that a thread waiting for
  /// what the lane produces is the one the kernel wakes
  /// (detail/lane_lending.hpp).  False when the lane was not to be had
  /// (stopped, another thread has it, or done() or the deadline came while
  /// waiting for it); true once the caller ran it.  `done` must not throw;
  /// it runs between the lane's passes and in its idle re-check; whoever
  /// makes it true calls wake_borrower().  Any thread but the lane's.
  template <class Done>
  bool run_borrowed(std::chrono::steady_clock::time_point deadline, Done&& done) {
    if (!running_.load(std::memory_order_acquire)) return false;
    if (!lender_.borrow(deadline, [this] { idle_->wake(); }, done)) return false;
    auto leave = [&]() noexcept {
      return !running_.load(std::memory_order_relaxed) || done() || std::chrono::steady_clock::now() >= deadline;
    };
    while (!leave()) step(leave);
    lender_.give_back();
    return true;
  }
  /// Times the lane was lent to run_borrowed (tests).
  [[nodiscard]] unsigned long times_lent() const { return lender_.lends(); }
  [[nodiscard]] std::uint32_t index() const noexcept { return index_; }
  /// Data WRs this lane has posted (any thread may read).
  [[nodiscard]] std::uint64_t posted_wrs() const noexcept { return posted_wrs_.load(std::memory_order_relaxed); }
  /// The lane's current CQ (any thread may compare it; only the lane polls it).
  [[nodiscard]] ibv_cq* native_cq() const noexcept { return native_cq_.load(std::memory_order_acquire); }

 private:
  struct group {
    const std::string* path = nullptr;
    detail::slice* head = nullptr;
    detail::slice* tail = nullptr;
    handle ep;
  };

  // A message for a lane that has stopped: a connect fails, the hold ends.
  static void answer_closed(lane_message& m) noexcept {
    if (m.latch) m.latch->arrive(status{fail(error{errc::endpoint_closed, {}})});
    if (m.ep != nullptr) m.ep->release();
    m.ep = nullptr;
    m.latch.reset();
  }

  // Retires every WR of a chain linked by next (the lane has stopped).
  static void retire_chain(detail::slice* s, errc why) noexcept {
    while (s != nullptr) {
      detail::slice* next = s->next;
      s->next = nullptr;
      detail::retire_wr(*s, why);
      s = next;
    }
  }

  void run(int numa_node) noexcept {
    detail::bind_lane_to_node(numa_node);
    native_cq_.store(cq_->native_handle(), std::memory_order_release);
    groups_.reserve(16);  // first touch on the lane's node
    posted_.reserve(16);
    while (running_.load(std::memory_order_relaxed)) {
      if (lender_.wanted()) [[unlikely]] {
        lender_.lend([this] { idle_->wake(); });
        continue;
      }
      step([this]() noexcept { return !running_.load(std::memory_order_relaxed) || lender_.wanted(); });
    }
    lender_.close();
    drain_on_stop();
  }

  // One turn of the lane's loop: a pass, else a spin or the idle strategy's
  // sleep, which `leave` (re-checked after announcing it) ends early.
  template <class Leave>
  void step(Leave&& leave) noexcept {
    if (pass()) {
      idle_->on_work();
      return;
    }
    if ((cq_used_ != 0 && !detail::kIdleWaitsOnCq<P>) || notify_.busy()) {
      // (Or a notification waits for a credit: that wait is bounded by
      // time, which a sleep would not see pass.)
      // Completions are on their way and this idle strategy would sleep
      // past them: keep polling.
      detail::cpu_relax();
      return;
    }
    idle_->on_empty([&]() noexcept { return pass() || leave(); });
  }

  // One pass: control messages, queued slices, posts, completions.
  bool pass() noexcept {
    bool did = false;
    if (has_mail_.load(std::memory_order_acquire)) did |= handle_mail();
    if (detail::slice* chain = queue_.take_all()) {
      enqueue(chain);
      did = true;
    }
    did |= post_pending();
    did |= poll() > 0;
    if (!undrained_.empty()) [[unlikely]] did |= retry_drains();
    did |= notify_.pass(notify_view());
    return did;
  }

  [[nodiscard]] typename detail::notify_port<P>::lane_view notify_view() noexcept {
    return {ctx_, cq_->native_handle(), cq_used_, cq_capacity_, posted_};
  }

  bool handle_mail() noexcept {
    std::vector<lane_message> mail;
    {
      std::lock_guard lock(mail_mu_);
      mail.swap(mail_);
      has_mail_.store(false, std::memory_order_relaxed);
    }
    for (auto& m : mail) {
      switch (m.what) {
        case lane_message::kind::connect: {
          // QP 0's receive count is lane 0's alone: other lanes must not read it.
          const std::uint32_t rx_before = index_ == 0 ? m.ep->notify().rx_posted : 0;
          status st = running_.load(std::memory_order_relaxed)
                          ? m.ep->lane_connect(index_, *m.route)
                          : status{fail(errc::endpoint_closed, "lane stopping")};
          if (index_ == 0) notify_.on_connect(*m.ep, rx_before);  // QP 0's receives complete here
          m.latch->arrive(st);
          break;
        }
        case lane_message::kind::fail_qp:
          m.ep->lane_error(index_);
          drain(*m.ep);
          break;
        case lane_message::kind::cq_error: on_cq_error("IBV_EVENT_CQ_ERR"); break;
      }
      if (m.ep != nullptr) m.ep->release();  // last touch of the endpoint for this message
    }
    return !mail.empty();
  }

  // Adds a chain taken from the queue to the groups (one per peer NIC path).
  void enqueue(detail::slice* s) noexcept {
    while (s != nullptr) {
      detail::slice* next = s->next;
      s->next = nullptr;
      stages_ |= s->stager != nullptr;
      group* g = nullptr;
      group* free_group = nullptr;
      for (auto& cand : groups_) {
        if (cand.path == s->peer_path) {
          g = &cand;
          break;
        }
        if (cand.head == nullptr && free_group == nullptr) free_group = &cand;
      }
      if (g == nullptr && free_group != nullptr) {
        g = free_group;
        g->ep.reset();
      }
      if (g == nullptr) {
        // Grows only when this lane talks to one more peer NIC at once.
        groups_.emplace_back();
        g = &groups_.back();
      }
      if (g->head == nullptr) {
        g->path = s->peer_path;
        g->head = g->tail = s;
      } else {
        g->tail->next = s;
        g->tail = s;
      }
      s = next;
    }
  }

  // Hands every slice of a group back to the transport with `e` (cold).
  void fail_group(group& g, errc e) noexcept {
    detail::slice* s = g.head;
    g.head = g.tail = nullptr;
    g.path = nullptr;
    g.ep.reset();
    while (s != nullptr) {
      detail::slice* next = s->next;
      s->next = nullptr;
      ctx_.on_slice_failed(*s, e);
      s = next;
    }
  }

  // Posts what credits allow of every group.  True when it did work.
  bool post_pending() noexcept {
    bool did = false;
    // Start one group later each pass, so that with few credits every peer
    // gets its turn (no group can keep the CQ to itself).
    const std::size_t ng = groups_.size();
    if (ng != 0) rr_ = (rr_ + 1) % ng;
    // A task was marked to stop since the last sweep: every queued slice is
    // looked at once (its slices may wait behind a connect), else only the
    // window a post can take.
    const std::uint64_t marks = detail::stop_marks();
    const bool sweep = marks != swept_marks_;
    bool every_group = true;
    for (std::size_t k = 0; k < ng; ++k) {
      group& g = groups_[(rr_ + k) % ng];
      if (g.head == nullptr) continue;
      (void)detail::drop_stopped(g.head, g.tail, sweep ? std::numeric_limits<std::size_t>::max() : kDropWindow);
      if (g.head == nullptr) {
        g.path = nullptr;
        g.ep.reset();
        did = true;
        continue;
      }
      if (!ctx_.active()) [[unlikely]] {
        fail_group(g, errc::context_inactive);
        did = true;
        continue;
      }
      if (!g.ep) {
        auto ep = ctx_.endpoint_for(*g.path);
        if (!ep) [[unlikely]] {
          TIDE_LOG_WARN(ctx_.name() << ": no endpoint to " << *g.path << ": " << ep.error().message());
          fail_group(g, ep.error().code);
          did = true;
          continue;
        }
        g.ep = std::move(*ep);
      }
      endpoint& e = *g.ep;
      const auto st = e.state();
      if (st == endpoint_state::destroying || st == endpoint_state::destroyed) [[unlikely]] {
        const errc ce = e.connect_error();
        g.ep.reset();
        did = true;
        if (ce != errc::ok) fail_group(g, ce);  // the connect failed: another path, or FAILED
        continue;                               // evicted: the next pass makes a new endpoint
      }
      if (st == endpoint_state::unconnected) {
        // Never blocks: the handshake runs on the connector's pool and the
        // lanes are woken when it is done.
        if (e.begin_connect()) ctx_.start_connect(g.ep);
        continue;
      }
      if (!e.ready()) continue;
      if (e.lane_cq(index_) != cq_->native_handle()) [[unlikely]] {
        // Made from the CQ table just before this lane rebuilt its CQ: WRs
        // posted here would complete where nobody polls.
        ctx_.retire_endpoint_ptr(&e);
        g.ep.reset();
        did = true;
        continue;
      }
      lane_qp& l = e.lane(index_);
      if (!l.rts) continue;  // an older QP state this lane has not seen yet: the message is queued
      const std::uint32_t credits = cq_capacity_ - std::min(cq_capacity_, cq_used_ + notify_.rx_posted());
      if (credits == 0) {
        every_group = false;
        break;
      }
      const std::uint32_t ready = stages_ ? stage(g, credits) : credits;
      if (g.head == nullptr) {
        g.tail = nullptr;
        g.path = nullptr;
        g.ep.reset();
        did = true;
        continue;
      }
      const bool was_idle = l.ring.empty();
      std::size_t posted = 0;
      std::size_t bytes = 0;
      detail::slice* const first = g.head;
      const errc pe = e.post(index_, g.head, ready, posted, bytes);
      if (posted != 0) {
        did = true;
        cq_used_ += static_cast<std::uint32_t>(posted);
        if (was_idle) posted_.push_back(g.ep);  // keeps the endpoint while its ring is not empty
        ctx_.count_posted(posted, bytes);
        posted_wrs_.store(posted_wrs_.load(std::memory_order_relaxed) + posted, std::memory_order_relaxed);
        if (index_ == 0) ride_notifications(first, posted, g.ep);
      }
      if (g.head == nullptr) {
        g.tail = nullptr;
        g.path = nullptr;
        g.ep.reset();
      }
      if (pe != errc::ok && pe != errc::endpoint_closed) [[unlikely]] {
        TIDE_LOG_WARN(ctx_.name() << " -> " << e.peer_nic_path() << ": post failed: " << to_string(pe));
        ctx_.retire_endpoint_ptr(&e);
        fail_group(g, pe);
        did = true;
      }
    }
    if (every_group) swept_marks_ = marks;  // the groups after a break are swept next pass
    return did;
  }

  // Notifications that ride behind the WRITEs just posted on QP 0
  // (detail::notify_send).  The slices are read after their post: only this
  // lane retires what it posted, so they live until its next poll.
  void ride_notifications(detail::slice* s, std::size_t posted, const handle& ep) noexcept {
    for (; posted != 0 && s != nullptr; --posted, s = s->next) {
      if (s->then_notify == nullptr) continue;
      detail::notify_send* n = s->then_notify;
      s->then_notify = nullptr;  // one try: a retry of the WRITE goes without it
      (void)notify_.ride(notify_view(), ep, n);
    }
  }

  // How many slices at the front of g may be posted, given stage chunks:
  // the staged ones among the first `credits` get theirs (and a WRITE's
  // bytes).  A slice that can never be staged is retired here.
  std::uint32_t stage(group& g, std::uint32_t credits) noexcept {
    for (;;) {
      detail::slice* refused = nullptr;
      errc why = errc::ok;
      const std::uint32_t ready =
          stage_.prepare(g.head, std::min<std::uint32_t>(credits, kStageWindow), ctx_.pd(), refused, why);
      if (refused == nullptr) return ready;
      detail::retire_wr(*refused, why);
      if (g.head == nullptr) return 0;
    }
  }

  // Drops the lane's hold on an endpoint whose ring on this lane is empty.
  void forget_if_idle(endpoint* e) noexcept {
    if (!e->lane(index_).ring.empty()) return;
    for (std::size_t k = 0; k < posted_.size(); ++k)
      if (posted_[k].get() == e) {
        posted_[k] = std::move(posted_.back());
        posted_.pop_back();
        return;
      }
  }

  // Polls the CQ once.  Returns the number of completions.
  int poll() noexcept {
    if (cq_used_ == 0 && notify_.rx_posted() == 0) return 0;
    std::array<ibv_wc, kPollBatch> wcs;
    const int n = cq_->poll(wcs);
    if (n < 0) [[unlikely]] {
      on_cq_error("ibv_poll_cq < 0");
      return 1;
    }
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[static_cast<std::size_t>(i)];
      if (wc.wr_id & 1u) [[unlikely]] {  // a receive (endpoint::post_notify_recv tags them): no slice
        notify_.on_recv(notify_view(), wc);
        continue;
      }
      auto* s = reinterpret_cast<detail::slice*>(wc.wr_id);
      // The QP names the endpoint, and its ring must hold the slice, before
      // the slice is touched at all: a completion for a slice that is not
      // there (stale, or for a WR since re-dispatched elsewhere) would
      // retire work still on the wire, twice.
      endpoint* e = owner_of(wc.qp_num);
      if (e == nullptr || !e->in_ring(index_, s)) [[unlikely]] {
        stray_completion(wc, e);
        continue;
      }
      if (wc.status == IBV_WC_SUCCESS) [[likely]] {
        const std::uint32_t done = e->complete_through(index_, s);
        cq_used_ -= std::min(cq_used_, done);
        // retire_wr: riders, NIC load and bandwidth sample, rail success.
        // Before the endpoint is let go: a slice may live in it (the drain
        // marker), and forget_if_idle can drop the last reference.
        detail::retire_wr(*s, errc::ok);
        e->release(done);
        forget_if_idle(e);
        continue;
      }
      const errc err = verbs::errc_from_wc_status(wc.status);
      if (err != errc::work_request_flushed)
        TIDE_LOG_WARN(ctx_.name() << " -> " << (s->peer_path != nullptr ? *s->peer_path : e->peer_nic_path()) << ": "
                                  << verbs::wc_error(wc, ctx_.name()).message());
      // The QP is in ERR now: retire the endpoint (every lane flushes its QP)
      // and redo the slice elsewhere.
      ctx_.retire_endpoint_ptr(e);
      detail::slice* unknown = nullptr;
      const std::uint32_t done = e->complete_through(index_, s, &unknown);
      cq_used_ -= std::min(cq_used_, done);
      for (detail::slice* u = unknown; u != nullptr;) {
        detail::slice* next = u->next;
        u->next = nullptr;
        ctx_.on_slice_failed(*u, errc::work_request_flushed);
        u = next;
      }
      ctx_.on_slice_failed(*s, err);
      e->release(done);  // last: the drain marker's slice lives in the endpoint
      forget_if_idle(e);
    }
    return n;
  }

  // After "QP to ERR": the drain marker behind the QP's ring, so that the
  // ring retires even when the last WR posted was unsignaled and no flush
  // completion would come for it.  Without a
  // free CQ entry (or send queue slot) it is tried again on later passes;
  // undrained_ holds the endpoint meanwhile.
  void drain(endpoint& e) noexcept {
    if (try_drain(e)) return;
    e.hold();
    undrained_.push_back(&e);
  }
  // True when nothing is left to do for `e`'s marker.
  bool try_drain(endpoint& e) noexcept {
    if (e.lane(index_).ring.empty()) return true;
    if (cq_used_ + notify_.rx_posted() >= cq_capacity_) return false;
    switch (e.post_drain_marker(index_)) {
      case drain_post::posted: ++cq_used_; return true;
      case drain_post::not_needed: return true;
      case drain_post::retry: return false;
    }
    return true;
  }
  // One more attempt for each marker that could not go out (cold).
  bool retry_drains() noexcept {
    const std::size_t before = undrained_.size();
    for (std::size_t k = 0; k < undrained_.size();) {
      endpoint* e = undrained_[k];
      if (!try_drain(*e)) {
        ++k;
        continue;
      }
      undrained_[k] = undrained_.back();
      undrained_.pop_back();
      e->release();
    }
    return undrained_.size() != before;
  }

  // The endpoint whose QP on this lane has number `qp_num`: one with WRs in
  // this lane's rings (posted_), or none.  Lane thread.
  [[nodiscard]] endpoint* owner_of(std::uint32_t qp_num) const noexcept {
    for (const auto& h : posted_)
      if (h->qp_num(index_) == qp_num) return h.get();
    return nullptr;
  }

  // A completion that names no slice of this lane's rings (cold): logged,
  // and nothing retired.  An error one still fails its QP's endpoint.
  void stray_completion(const ibv_wc& wc, endpoint* e) noexcept {
    TIDE_LOG_ERROR(ctx_.name() << ": lane " << index_ << ": completion (" << ibv_wc_status_str(wc.status)
                               << ") on QP " << wc.qp_num << " for a WR not in its ring; ignored");
    if (e != nullptr && wc.status != IBV_WC_SUCCESS) ctx_.retire_endpoint_ptr(e);
  }

  // Cold paths (detail/lane_teardown.hpp): a failed CQ; the drain on stop.
  void on_cq_error(const char* why) noexcept;
  void drain_on_stop() noexcept;

  rdma_context<P>& ctx_;
  const std::uint32_t index_;
  std::optional<typename P::idle> idle_;
  std::shared_ptr<verbs::completion_queue> cq_;  // the lane thread (start/stop: the owner)
  std::atomic<ibv_cq*> native_cq_{nullptr};
  std::uint32_t cq_capacity_ = 1;
  std::uint32_t cq_used_ = 0;  ///< WRs posted on this CQ's QPs, not yet retired
  std::atomic<std::uint64_t> posted_wrs_{0};  ///< written by the lane thread only
  std::atomic<bool> running_{false};
  /// Set once by stop() (under mail_mu_) after the thread is gone.
  std::atomic<bool> closed_{false};
  bool detached_ = false;  ///< stop() detached the idle strategy from cq_
  std::thread thread_;
  alignas(64) detail::slice_queue queue_;
  alignas(64) std::atomic<bool> has_mail_{false};
  std::mutex mail_mu_;
  std::vector<lane_message> mail_;
  std::vector<group> groups_;   ///< queued slices per peer NIC path
  std::size_t rr_ = 0;          ///< the group post_pending starts with
  std::uint64_t swept_marks_ = 0;  ///< detail::stop_marks() at the last full sweep
  static constexpr std::size_t kDropWindow = 64;  ///< >= the WRs one post takes
  /// Staged WRs readied per group and pass: what one post takes (endpoint.cpp's kMaxChain), so
  /// that a group whose send queue is full does not sit on chunks others could post.
  static constexpr std::uint32_t kStageWindow = 32;
  std::vector<handle> posted_;  ///< endpoints with WRs in this lane's rings
  std::vector<endpoint*> undrained_;  ///< QPs in ERR whose drain marker waits for room (each held)
  detail::notify_port<P> notify_;  ///< RDMA notifications (used on lane 0 only)
  detail::lane_lender lender_;     ///< hands the loop to run_borrowed's caller
  detail::stage_pool stage_;       ///< bounce chunks for staged slices (lane thread)
  bool stages_ = false;            ///< a staged slice has reached this lane (then post_pending stages)
};

}  // namespace tide::rdma

#include <tide/rdma/detail/lane_teardown.hpp>
