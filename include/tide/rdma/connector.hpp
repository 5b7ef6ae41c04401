#pragma once
/// rdma::connector<P> — connection setup for one rdma_context, off the
/// lanes: the active handshake runs on the connector's own threads
/// (detail::setup_pool: one more whenever every thread is blocked on a
/// peer), the passive one on the handshake service's thread.  Neither moves a QP: both
/// send "connect QP i" to lane i and wait (bounded) for every lane's answer
/// before the endpoint becomes connected (and, passively, before replying).
///
/// Threads: start_active() from a lane (never blocks it: one post to the
/// pool); accept() from the handshake service; stop() from the owner.  An
/// endpoint's setup rounds are serialized by its setup_mutex(), which no
/// lane ever takes and which is never held across network I/O.
///
/// Simultaneous open (both ends connect at once) is settled by the NIC
/// paths: the end with the smaller local path stays active and rejects the
/// other's request; the other accepts, and its own attempt, rejected by the
/// peer, finds the endpoint no longer `connecting` and gives up quietly.
/// A request with new QP numbers for a connected endpoint (the peer
/// restarted, or re-handshakes) retires the old endpoint (its lanes flush
/// it) and accepts on a fresh one.
///
/// A rejection says whether another attempt may succeed.  The passive side
/// begins the reply_msg of a race in its endpoint store with kTryAgain and
/// that of a failed QP setup (ibv_modify_qp to RTR times out while the
/// kernel resolves the peer's address under load) with kQpSetupFailed; the
/// active side fails the endpoint's slices with busy or qp_state_error,
/// which the transport retries until the task's deadline, instead of
/// handshake_rejected, which fails a slice with no other rail at once.
/// Any other text (a malformed request, a Mooncake peer's reason) stays
/// handshake_rejected.
///
/// A peer path whose handshake failed slowly (a powered-off or hung peer:
/// the attempt ran into its connect or receive timeout) is held off for as
/// long as that attempt took, clamped to [kMinHoldOff, kMaxHoldOff]:
/// endpoints made for it meanwhile fail at once with the same error
/// instead of each queueing another attempt that holds a thread for
/// seconds.  A fast failure (connection
/// refused: the process is gone, the host answers) is not held off, so a
/// restarted peer is reached again at once.

#include <tide/detail/log.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/rdma/endpoint_store.hpp>
#include <tide/rdma/lane.hpp>

#include <tide/rdma/detail/setup_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace tide::rdma {

template <class P>
class rdma_context;

template <class P>
class connector {
 public:
  using handle = typename endpoint_store<endpoint, typename P::eviction>::handle;
  /// How long a setup thread waits for the lanes' answers.
  static constexpr std::chrono::milliseconds kLaneAnswerTimeout{10000};
  /// How a rejection for a lost simultaneous open begins.
  static constexpr std::string_view kLostRace = "simultaneous open: ";
  /// How a rejection for a race in the peer's endpoint store begins.
  static constexpr std::string_view kTryAgain = "try again: ";
  /// How a rejection for a failed QP setup at the peer begins.
  static constexpr std::string_view kQpSetupFailed = "cannot connect the QPs: ";

  /// What a connect rejected with `text` (a reply_msg, or an error detail
  /// holding one) fails with: ok for a lost simultaneous open (no failure:
  /// the peer's own request is on its way), busy or qp_state_error when the
  /// peer says another attempt may succeed, else handshake_rejected.
  [[nodiscard]] static constexpr errc rejection_code(std::string_view text) noexcept {
    if (text.find(kLostRace) != std::string_view::npos) return errc::ok;
    if (text.find(kTryAgain) != std::string_view::npos) return errc::busy;
    if (text.find(kQpSetupFailed) != std::string_view::npos) return errc::qp_state_error;
    return errc::handshake_rejected;
  }
  /// A failed attempt at least this long holds its peer path off.
  static constexpr std::chrono::milliseconds kSlowAttempt{1000};
  static constexpr std::chrono::milliseconds kMinHoldOff{1000};
  static constexpr std::chrono::milliseconds kMaxHoldOff{10000};

  connector(rdma_context<P>& ctx, handshake_sender send) : ctx_(ctx), send_(std::move(send)) {}
  connector(const connector&) = delete;
  connector& operator=(const connector&) = delete;
  ~connector() { stop(); }

  /// Refuses new work and joins the pool: a queued handshake gives up at
  /// once, one in flight when the sender gives up (the engine's sender
  /// does within net::kAbortPoll once the engine is going away; any other
  /// within its own timeouts).  Idempotent; setup path.
  void stop() noexcept {
    stopping_.store(true, std::memory_order_release);
    pool_.join();
  }

  /// Starts the active handshake of `h` (already moved to connecting by the
  /// caller's begin_connect()).  Any thread; one post to the pool.
  void start_active(const handle& h) noexcept {
    if (stopping_.load(std::memory_order_acquire)) {
      fail_connect(*h, errc::endpoint_closed, "context stopping");
      return;
    }
    try {
      if (auto held = held_off(h->peer_nic_path())) {
        fail_connect(*h, held->code, held->detail);
        return;
      }
      if (!pool_.post([this, h]() mutable { run_active(h); })) fail_connect(*h, errc::endpoint_closed, "context stopping");
    } catch (...) {
      fail_connect(*h, errc::resource_exhausted, "cannot queue the handshake");
    }
  }

  /// The passive side of a Connection request (not a ready ack) for this
  /// context.  Returns the reply (reply_msg set on rejection).  Handshake
  /// service thread; blocks for the lanes' answers (bounded).
  [[nodiscard]] handshake_desc accept(const handshake_desc& req) {
    auto reject = [&](std::string why) {
      handshake_desc r;
      r.local_nic_path = ctx_.nic_path();
      r.peer_nic_path = req.local_nic_path;
      r.reply_msg = std::move(why);
      return r;
    };
    // Before the store is touched: a bad request must neither make QPs nor
    // evict an idle endpoint a real peer still uses.
    if (auto ok = endpoint::check_request(req, ctx_.params().num_qp); !ok) return reject(ok.error().message());
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto h = ctx_.endpoint_for(req.local_nic_path);
      if (!h) return reject(h.error().message());
      endpoint& e = **h;
      std::unique_lock setup(e.setup_mutex());
      auto st = e.state();
      const bool connected = st == endpoint_state::connected || st == endpoint_state::connected_wait_ready_ack;
      if (connected && req.qp_num == e.peer_qp_nums()) {
        // A duplicate: keep the connection.
        auto reply = e.local_desc(true);
        if (!req.psn) reply.psn.reset();
        if (!req.notify_credits) reply.notify_credits.reset();
        return reply;
      }
      if (st == endpoint_state::connecting && ctx_.nic_path() < req.local_nic_path)
        return reject(std::string(kLostRace) + ctx_.nic_path() + " connects as the active side");
      if (st != endpoint_state::unconnected && st != endpoint_state::connecting) {
        // Connected to older peer QPs (the peer restarted or re-handshakes),
        // half set up, or being evicted: a fresh endpoint takes the request.
        setup.unlock();
        ctx_.retire_endpoint(*h);
        continue;
      }
      auto route = e.route_to(req);
      if (!route) return reject(route.error().message());
      // Takes it from unconnected or from our own active attempt (which then
      // finds it no longer connecting); a lane may race us with begin_connect.
      if (!e.transition(st, endpoint_state::establishing)) {
        st = e.state();
        if (st == endpoint_state::connecting && e.transition(st, endpoint_state::establishing)) {
          // the lane just asked for a connect: ours wins, theirs gives up
        } else {
          setup.unlock();
          continue;
        }
      }
      auto shared_route = std::make_shared<const peer_route>(std::move(*route));
      if (auto r = establish(e, shared_route); !r) {
        e.set_state(endpoint_state::destroying);
        setup.unlock();
        ctx_.retire_endpoint(*h);
        return reject(std::string(kQpSetupFailed) + r.error().message());
      }
      if (req.ready_ack.has_value()) e.set_ack_deadline(std::chrono::steady_clock::now() + ctx_.ready_ack_timeout());
      // CAS: an eviction meanwhile (destroying) must not be undone.
      if (!e.transition(endpoint_state::establishing, req.ready_ack.has_value()
                                                         ? endpoint_state::connected_wait_ready_ack
                                                         : endpoint_state::connected)) {
        setup.unlock();
        ctx_.lanes().wake_all();
        return reject(std::string(kTryAgain) + "endpoint to " + req.local_nic_path + " was closed while connecting");
      }
      setup.unlock();
      ctx_.lanes().wake_all();
      forget_hold_off(req.local_nic_path);  // it is alive after all
      auto reply = e.local_desc(true);
      if (!req.psn) reply.psn.reset();  // a Mooncake peer: both ends start at PSN 0
      if (!req.notify_credits) reply.notify_credits.reset();  // it sends none: nothing to say
      return reply;
    }
    return reject(std::string(kTryAgain) + "endpoint to " + req.local_nic_path + " is busy");
  }

  /// Passive side of the ready ack.  Returns "" on success, else the reason.
  [[nodiscard]] std::string ready_ack(const handshake_desc& ack) {
    handle h = ctx_.find_endpoint(ack.local_nic_path);
    if (!h) return "Received RDMA ready ACK for unconnected endpoint";
    std::lock_guard setup(h->setup_mutex());
    const auto st = h->state();
    if (st != endpoint_state::connected && st != endpoint_state::connected_wait_ready_ack)
      return "Received RDMA ready ACK for unconnected endpoint";
    if (ack.qp_num != h->peer_qp_nums()) return "Received stale RDMA ready ACK with mismatched peer QP numbers";
    h->set_state(endpoint_state::connected);
    ctx_.lanes().wake_all();
    return {};
  }

 private:
  // Lanes move their QPs; the caller holds e's setup mutex.
  status establish(endpoint& e, std::shared_ptr<const peer_route> route) {
    // Before lane 0 posts its receives (in lane_connect).  A failure fails the
    // connect: the peer may already count on our receives, and a SEND to a
    // QP without them would retry RNR forever.
    if (auto r = e.prepare_notify(*route); !r) return r;
    auto latch = ctx_.lanes().send_connect(e, route);
    if (auto r = latch->wait(kLaneAnswerTimeout); !r) return r;
    e.set_peer(*route);
    return {};
  }

  // A rejection the peer marked as transient reads as one in the log: its
  // slices are retried (as `code`), not failed.
  static std::string with_retry_note(std::string why, errc sent, errc code) {
    if (code != sent) why += "; retried until the task's deadline (" + std::string(to_string(code)) + ")";
    return why;
  }

  void fail_connect(endpoint& e, errc code, const std::string& why) noexcept {
    if (code != errc::ok) {
      TIDE_LOG_WARN(ctx_.name() << ": connect to " << e.peer_nic_path() << " failed: " << why);
      e.set_connect_error(code);
    }
    e.set_state(endpoint_state::destroying);
    ctx_.retire_endpoint_ptr(&e);
    ctx_.lanes().wake_all();  // lanes with slices for it fail them with `code`
  }

  void run_active(const handle& h) noexcept {
    endpoint& e = *h;
    if (stopping_.load(std::memory_order_acquire)) {  // queued before stop(): no network round trip now
      std::unique_lock setup(e.setup_mutex());
      if (e.state() != endpoint_state::connecting) return;
      setup.unlock();
      fail_connect(e, errc::endpoint_closed, "context stopping");
      return;
    }
    handshake_desc request;
    {
      std::lock_guard setup(e.setup_mutex());
      if (e.state() != endpoint_state::connecting) return;  // accepted passively meanwhile
      request = e.local_desc(/*with_ready_ack=*/true);
    }
    result<handshake_desc> reply = fail(errc::handshake_failed, "not sent");
    const auto sent_at = std::chrono::steady_clock::now();
    try {
      reply = send_(e.peer_nic_path(), request);
    } catch (const std::exception& x) {
      reply = fail(errc::handshake_failed, x.what());
    }
    if (!reply) note_failed_attempt(e.peer_nic_path(), reply.error(), std::chrono::steady_clock::now() - sent_at);
    std::unique_lock setup(e.setup_mutex());
    if (e.state() != endpoint_state::connecting) return;  // the peer's request won, or evicted
    if (!reply) {
      setup.unlock();
      // net::exchange_handshake turns a reply_msg into handshake_rejected
      // with the text after "<host:port>: ", so a rejection arrives here.
      // A lost simultaneous open taken for a failure failed the slices
      // waiting for this endpoint (engine_test's simultaneous open, now and
      // then); a transient one taken for handshake_rejected failed, on a
      // single rail, a transfer a second attempt would have carried.
      const errc code = reply.error().code == errc::handshake_rejected ? rejection_code(reply.error().detail)
                                                                        : reply.error().code;
      fail_connect(e, code, with_retry_note(reply.error().message(), reply.error().code, code));
      return;
    }
    if (!reply->reply_msg.empty()) {
      setup.unlock();
      const errc code = rejection_code(reply->reply_msg);
      fail_connect(e, code,
                   with_retry_note(e.peer_nic_path() + " rejected the connection: " + reply->reply_msg,
                                   errc::handshake_rejected, code));
      return;
    }
    if (reply->local_nic_path != e.peer_nic_path() || reply->peer_nic_path != e.local_nic_path()) {
      setup.unlock();
      fail_connect(e, errc::handshake_rejected,
                   "peer nic path inconsistency: expected " + e.peer_nic_path() + " -> " + e.local_nic_path() +
                       ", got " + reply->local_nic_path + " -> " + reply->peer_nic_path);
      return;
    }
    auto route = e.route_to(*reply);
    if (!route) {
      setup.unlock();
      fail_connect(e, route.error().code, route.error().message());
      return;
    }
    // CAS: an eviction since the check above (on_evict sets destroying
    // without the setup mutex) must not be undone.
    if (!e.transition(endpoint_state::connecting, endpoint_state::establishing)) {
      setup.unlock();
      ctx_.lanes().wake_all();
      return;
    }
    auto shared_route = std::make_shared<const peer_route>(std::move(*route));
    if (auto r = establish(e, shared_route); !r) {
      setup.unlock();
      fail_connect(e, r.error().code, r.error().message());
      return;
    }
    // CAS: an eviction meanwhile (destroying) must not be undone.
    const bool up = e.transition(endpoint_state::establishing, endpoint_state::connected);
    setup.unlock();
    ctx_.lanes().wake_all();
    if (!up) return;
    forget_hold_off(e.peer_nic_path());
    if (reply->ready_ack.has_value()) {
      auto ack = e.local_desc(true);
      ack.ready_ack = true;
      if (!reply->psn) ack.psn.reset();
      result<handshake_desc> r = fail(errc::handshake_failed, "not sent");
      try {
        r = send_(e.peer_nic_path(), ack);
      } catch (const std::exception& x) {
        r = fail(errc::handshake_failed, x.what());
      }
      if (!r || !r->reply_msg.empty())
        TIDE_LOG_WARN("ready ack to " << e.peer_nic_path() << " failed: "
                                      << (r ? r->reply_msg : r.error().message()) << " (the peer times out and proceeds)");
    }
  }

  struct hold_off {
    std::chrono::steady_clock::time_point until;
    error why;
  };

  // The error an endpoint to `peer` fails with while its hold-off lasts.
  std::optional<error> held_off(const std::string& peer) {
    std::lock_guard lock(hold_mu_);
    auto it = hold_offs_.find(peer);
    if (it == hold_offs_.end()) return std::nullopt;
    const auto now = std::chrono::steady_clock::now();
    if (now >= it->second.until) {
      hold_offs_.erase(it);  // the next attempt goes out; its outcome decides
      return std::nullopt;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(it->second.until - now);
    return error{it->second.why.code, "not attempted for another " + std::to_string(left.count()) +
                                          " ms: the last handshake to " + peer + " failed (" +
                                          it->second.why.message() + ")"};
  }

  void note_failed_attempt(const std::string& peer, const error& why, std::chrono::steady_clock::duration took) {
    const bool slow = took >= kSlowAttempt;
    const bool network = why.code == errc::peer_unreachable || why.code == errc::handshake_failed;
    if (!slow || !network) return;
    const auto hold = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(took), kMinHoldOff, kMaxHoldOff);
    std::lock_guard lock(hold_mu_);
    hold_offs_.insert_or_assign(peer, hold_off{std::chrono::steady_clock::now() + hold, why});
  }

  void forget_hold_off(const std::string& peer) {
    std::lock_guard lock(hold_mu_);
    hold_offs_.erase(peer);
  }

  rdma_context<P>& ctx_;
  handshake_sender send_;
  std::atomic<bool> stopping_{false};
  /// Peer paths held off after a slow failure; entries go when they expire
  /// (looked up) or the peer turns out alive.  Any setup thread, a lane
  /// (start_active); never held across anything else.
  std::mutex hold_mu_;
  std::map<std::string, hold_off, std::less<>> hold_offs_;
  detail::setup_pool pool_;  // last: its threads go before the members they use
};

}  // namespace tide::rdma
