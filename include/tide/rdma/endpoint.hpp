#pragma once
/// rdma::endpoint — the RC queue pairs from one local NIC to one peer NIC
/// (Mooncake's RdmaEndPoint): exactly one QP per lane of the context, in
/// lane order (QP i belongs to lane i and completes on lane i's CQ).  The
/// handshake carries the QP numbers in that order, so a peer pairs its QP i
/// with ours; a peer with another QP count is rejected (qp_count_mismatch).
///
/// Who touches what:
///  - QP i, its posted ring and its credits (`lane_qp`): lane i's thread
///    only.  Every QP transition (RESET -> INIT -> RTR -> RTS, -> ERR) runs
///    there, asked for by a lane message; the handshake and connector
///    threads never move a QP's state.
///  - the state: connector / handshake threads under setup_mutex(); lanes
///    only CAS it (unconnected -> connecting to ask for a connect;
///    connected_wait_ready_ack -> connected when the ack is overdue) and
///    read it (acquire).
///  - outstanding(): WRs posted and not yet retired plus lane messages not
///    yet handled that name this endpoint; the store destroys the endpoint
///    (any thread, usually the monitor's reclaim) only once it is 0.
///
/// States: initializing -> unconnected -> connecting (active handshake in
/// flight) -> establishing (lanes move their QPs to RTS) ->
/// [connected_wait_ready_ack ->] connected -> destroying -> destroyed.
/// A passive accept goes unconnected|connecting -> establishing directly.

#include <tide/metadata/descriptors.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/notify_qp.hpp>
#include <tide/rdma/detail/posted_ring.hpp>
#include <tide/result.hpp>
#include <tide/verbs/cq.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/pd.hpp>
#include <tide/verbs/qp.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tide::rdma {

class endpoint;

/// What every endpoint of one context shares.
struct endpoint_params {
  const verbs::protection_domain* pd = nullptr;
  std::string local_nic_path;      ///< "<server>@<device>"
  std::uint8_t port = 1;
  std::uint8_t traffic_class = 0;  ///< GRH traffic class of every QP (RTR)
  std::uint8_t service_level = 0;  ///< address vector SL of every QP (RTR)
  std::uint16_t pkey_index = 0;    ///< P_Key index of every QP (INIT)
  int gid_index = 0;
  verbs::gid local_gid;
  std::uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_4096;      ///< the local active MTU, capped by the config
  std::uint32_t num_qp = 2;        ///< = lanes per context (Mooncake's MC_NUM_QP_PER_EP)
  verbs::qp_caps caps;
  verbs::rc_params rc;
  std::uint32_t signal_interval = 16;  ///< every Nth WR signaled (and the last of a post)
  std::chrono::milliseconds ready_ack_timeout{10000};
  /// Called from on_evict(): hands "QP to ERR" to every lane.
  std::function<void(endpoint&)> retire;
  /// Receives to advertise for RDMA notifications (0: none, the peer sends
  /// them over TCP).  Each advertising endpoint takes notify_credits +
  /// kCreditReserve entries of lane 0's CQ out of `notify_budget` (shared by
  /// the context's endpoints) for its life; with too few left it does not
  /// advertise, so receives can never crowd the data path out of the CQ.
  std::uint32_t notify_credits = 0;
  std::shared_ptr<std::atomic<std::int64_t>> notify_budget;
};

/// Sends a Connection frame to the process that owns `peer_nic_path` and
/// returns its reply (transport errors as handshake_failed/peer_unreachable).
using handshake_sender = std::function<result<handshake_desc>(std::string_view peer_nic_path, const handshake_desc&)>;

enum class endpoint_state : std::uint8_t {
  initializing, unconnected, connecting, establishing, connected_wait_ready_ack, connected, destroying, destroyed
};
[[nodiscard]] std::string_view to_string(endpoint_state s) noexcept;

/// Where lane i's QP connects to: computed once per handshake from the
/// peer's descriptor, read by every lane.
struct peer_route {
  verbs::remote_qp base;                ///< GID, LID, path MTU, sgid index, port
  std::vector<std::uint32_t> qp_num;    ///< the peer's QP i for our QP i
  std::vector<std::uint32_t> rq_psn;    ///< the peer's initial send PSNs (0 for Mooncake)
  bool own_psn = false;                 ///< the peer carries PSNs: send from ours, else from 0
  std::uint32_t peer_notify_credits = 0;  ///< the peer's handshake_desc::notify_credits (0: absent)
};

/// Lane i's part of an endpoint.  Lane i's thread only.
struct lane_qp {
  detail::posted_ring ring;           ///< posted slices, in post order
  std::uint32_t since_signal = 0;     ///< unsignaled WRs since the last signaled one
  bool rts = false;                   ///< this lane moved the QP to RTS
  bool left_reset = false;            ///< the QP left RESET (ERR from RESET is refused)
  bool errored = false;               ///< this lane moved the QP to ERR
  bool drain_posted = false;          ///< `drain` went out after errored (once)
  /// The drain marker: one signaled WR posted after the QP went to ERR.  Its
  /// completion (flushed, or successful if the QP never left RTS) retires
  /// everything posted before it, which an unsignaled last WR would
  /// otherwise leave in the ring for good.  Its
  /// hook makes it no transfer's WR.
  detail::slice drain;
};

/// Send queue slots a QP has beyond the `max_send_wr` the lanes fill: the
/// drain marker's, which must find room behind a full queue.
inline constexpr std::uint32_t kDrainMarkerSlots = 1;

/// RNR retries of a QP 0 that carries RDMA notifications (7 would be
/// infinite): endpoint::lane_connect.
inline constexpr std::uint8_t kNotifyRnrRetry = 6;

/// What endpoint::post_drain_marker did.
enum class drain_post : std::uint8_t {
  posted,      ///< in the ring: its completion retires the rest
  not_needed,  ///< the ring is empty, the QP never left RESET, or a marker is out
  retry,       ///< the send queue refused it for now (try on a later pass)
};

class endpoint {
 public:
  /// Creates one QP (RESET) per lane, QP i on `cqs[i]` (kept alive with the
  /// QPs).  Errors: config_invalid (0 or > 255 lanes), those of
  /// queue_pair::create.  Any thread; no QP transition.
  [[nodiscard]] static result<std::unique_ptr<endpoint>> create(
      const endpoint_params& params, std::span<const std::shared_ptr<verbs::completion_queue>> cqs,
      std::string peer_nic_path);

  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;
  /// Destroys the QPs.  The store calls it once outstanding() is 0.
  ~endpoint();

  // ---- state (setup path) ----
  [[nodiscard]] endpoint_state state() const noexcept { return state_.load(std::memory_order_acquire); }
  /// Serializes the connector's and the handshake thread's setup rounds.
  /// Never held across network I/O; lanes never take it.
  [[nodiscard]] std::mutex& setup_mutex() noexcept { return setup_mu_; }
  /// unconnected -> connecting.  True when the caller won and must start the
  /// active handshake.  Any thread (a lane); one CAS.
  [[nodiscard]] bool begin_connect() noexcept {
    auto expected = endpoint_state::unconnected;
    return state_.compare_exchange_strong(expected, endpoint_state::connecting, std::memory_order_acq_rel);
  }
  /// CAS of the state (setup threads under setup_mutex(), lanes for the ack).
  bool transition(endpoint_state from, endpoint_state to) noexcept {
    return state_.compare_exchange_strong(from, to, std::memory_order_acq_rel);
  }
  /// Sets the state (setup threads under setup_mutex()).
  void set_state(endpoint_state s) noexcept { state_.store(s, std::memory_order_release); }
  /// A connect failed for good: the lanes fail this endpoint's queued slices
  /// with `e` (instead of retrying on a fresh endpoint).  Before the state
  /// becomes destroying.
  void set_connect_error(errc e) noexcept { connect_error_.store(e, std::memory_order_release); }
  [[nodiscard]] errc connect_error() const noexcept { return connect_error_.load(std::memory_order_acquire); }

  /// This end's descriptor (QP numbers in lane order, GID, LID, MTU, PSNs).
  [[nodiscard]] handshake_desc local_desc(bool with_ready_ack) const;
  /// Checks the peer's descriptor (QP count, GID, MTU) and computes where
  /// each lane connects.  Errors: qp_count_mismatch, handshake_rejected.
  [[nodiscard]] result<peer_route> route_to(const handshake_desc& peer) const;
  /// Records the peer's QP numbers and the agreed MTU (setup thread, after
  /// every lane reached RTS).
  void set_peer(const peer_route& r);
  /// Sets up RDMA notifications when both ends advertised them (setup
  /// thread, before the lanes get the connect message).  Errors: those of
  /// ibv_reg_mr for the slab (the connect fails: the peer counts on it).
  [[nodiscard]] status prepare_notify(const peer_route& r);
  /// The peer QP numbers recorded by set_peer (setup threads).
  [[nodiscard]] const std::vector<std::uint32_t>& peer_qp_nums() const noexcept { return peer_qp_nums_; }
  /// Passive side: the ready ack deadline (setup thread, before the state
  /// becomes connected_wait_ready_ack).
  void set_ack_deadline(std::chrono::steady_clock::time_point t) noexcept {
    ack_deadline_ns_.store(t.time_since_epoch().count(), std::memory_order_release);
  }

  /// True when slices may be posted: connected, or waiting for a ready ack
  /// that is overdue.  Hot path: one atomic load.  Lanes.
  [[nodiscard]] bool ready() noexcept;

  // ---- lane i's QP (lane i's thread only) ----
  [[nodiscard]] lane_qp& lane(std::uint32_t i) noexcept { return lanes_[i]; }
  /// RESET -> INIT -> RTR -> RTS of QP i towards `r`.  Errors: qp_state_error.
  [[nodiscard]] status lane_connect(std::uint32_t i, const peer_route& r);
  /// QP i -> ERR (its WRs complete flushed).  Idempotent.
  void lane_error(std::uint32_t i) noexcept;
  /// After lane_error: posts QP i's drain marker (signaled, zero length)
  /// behind whatever is in its ring, in the send queue slot kept free for
  /// it, as the kernel's ib_drain_sq does.  Requires a free CQ entry (the
  /// caller counts it as posted).  Lane i's thread.
  [[nodiscard]] drain_post post_drain_marker(std::uint32_t i) noexcept;

  // ---- RDMA notifications on QP 0 (lane 0's thread; notify_qp.hpp) ----
  [[nodiscard]] detail::notify_qp& notify() noexcept { return notify_; }
  /// Notifications may go out here: both ends advertised and the endpoint
  /// is connected.  Any thread (enabled() is fixed before connected).
  [[nodiscard]] bool notify_ready() const noexcept {
    return state() == endpoint_state::connected && notify_.enabled();
  }
  /// A credit message may go out on QP 0 (once the lane has it RTS): the
  /// endpoint is up, also while the passive side still waits for the
  /// active side's ready ack.  Credits are owed only for messages the peer
  /// sent, so its QP is RTS by then; holding them back until the ack (or
  /// its 10 s deadline) kept lane 0 spinning.
  [[nodiscard]] static constexpr bool credits_may_go_out(endpoint_state s) noexcept {
    return s == endpoint_state::establishing || s == endpoint_state::connected_wait_ready_ack ||
           s == endpoint_state::connected;
  }
  /// Posts receive buffer `slot` on QP 0 (holds the endpoint until its
  /// completion).  Errors: the post's.
  [[nodiscard]] errc post_notify_recv(std::uint32_t slot) noexcept;
  /// Posts send buffer `slot` (its first `len` bytes) as one signaled SEND
  /// on QP 0, into the ring like a slice.  Requires a free SQ slot (the
  /// caller checks sq_room) and a CQ credit.  Errors: endpoint_closed (not
  /// RTS; a message when not connected, a credit message when not
  /// credits_may_go_out), the post's.
  [[nodiscard]] errc post_notify_send(std::uint32_t slot, std::uint32_t len, bool credit = false) noexcept;
  /// Free send queue slots on QP i.
  [[nodiscard]] std::uint32_t sq_room(std::uint32_t i) noexcept {
    const std::uint32_t depth = params_.caps.max_send_wr;
    lanes_[i].ring.reserve(depth + kDrainMarkerSlots);
    return depth - std::min(depth, lanes_[i].ring.size());
  }

  /// Posts slices from the front of `chain` on QP i, at most `credits`
  /// (the lane's free CQ entries) and the send queue's free slots; advances
  /// `chain` past those posted and adds their number and bytes to
  /// `posted` / `bytes`.  Every signal_interval-th WR and the last one are
  /// signaled; payloads up to the QP's inline size go inline (WRITE).  A
  /// posted slice is never read again here (the ring holds it).  Returns ok
  /// (possibly with slices left: no credit) or the post's errc.  Hot path:
  /// noexcept, no allocation, one ibv_post_send.
  [[nodiscard]] errc post(std::uint32_t i, detail::slice*& chain, std::uint32_t credits, std::size_t& posted,
                          std::size_t& bytes) noexcept;

  /// A completion for `s` (posted on QP i) arrived: pops the ring through
  /// `s`.  On success (`unknown` null) the unsignaled slices before it
  /// completed too (RC completes a send queue in order) and are retired
  /// here.  On an error completion their fate is unknown (a QP in ERR may
  /// flush unsignaled WRs without a completion of their own, as Soft-RoCE
  /// does): they are linked into `*unknown` for the caller to redo (READ and
  /// WRITE are idempotent).  Returns how many entries left the ring (s
  /// included); `s` itself is the caller's.
  /// `s` must be in QP i's ring (in_ring).
  std::uint32_t complete_through(std::uint32_t i, const detail::slice* s, detail::slice** unknown = nullptr) noexcept;
  /// True when `s` is in QP i's ring (a completion may name only such a
  /// slice).  Compares pointers only: `s` is not read.  Lane i's thread.
  [[nodiscard]] bool in_ring(std::uint32_t i, const detail::slice* s) const noexcept;
  /// Takes every slice still in QP i's ring (CQ error: no completion will
  /// come); the caller fails them.  Returns the chain (linked by next).
  [[nodiscard]] detail::slice* take_ring(std::uint32_t i) noexcept;

  /// A lane message naming this endpoint was queued / handled (keeps it
  /// alive in between).  Any thread.
  void hold() noexcept { outstanding_.fetch_add(1, std::memory_order_relaxed); }
  /// Last access of the caller to the endpoint (release pairs with the
  /// store's acquire load of outstanding()).
  void release(std::size_t n = 1) noexcept { outstanding_.fetch_sub(n, std::memory_order_release); }
  /// The same for receives posted on QP 0 for notifications (lane 0): kept
  /// apart because they keep the endpoint alive but must not pin it (an
  /// idle endpoint always has them).
  void release_recv(std::size_t n = 1) noexcept { rx_outstanding_.fetch_sub(n, std::memory_order_release); }
  [[nodiscard]] std::size_t outstanding() const noexcept {
    return outstanding_.load(std::memory_order_acquire) + rx_outstanding_.load(std::memory_order_acquire);
  }
  /// The store passes over it when choosing a victim: a handshake is in
  /// flight, or WRs / lane messages are outstanding (evicting it would throw
  /// that work away and make the next insert start over).  A ready ack past
  /// its deadline no longer pins: a peer that crashed before its ack, or
  /// whose ack was lost, must not hold two RTS QPs and a store slot for
  /// good.  Any thread.
  [[nodiscard]] bool pinned() const noexcept {
    const auto st = state();
    if (st == endpoint_state::connected_wait_ready_ack && !ack_overdue()) return true;
    return st == endpoint_state::connecting || st == endpoint_state::establishing ||
           outstanding_.load(std::memory_order_acquire) != 0;
  }
  /// True once the ready ack's deadline has passed.  Any thread.
  [[nodiscard]] bool ack_overdue() const noexcept {
    return std::chrono::steady_clock::now().time_since_epoch().count() >=
           ack_deadline_ns_.load(std::memory_order_acquire);
  }
  /// Checks a Connection request before any endpoint is made or evicted for
  /// it: the sender's path is "<server>@<nic>",
  /// it has `num_qp` QP numbers (24-bit, non-zero) and PSNs to match, and a
  /// GID that is not all zero.  Errors: qp_count_mismatch,
  /// handshake_rejected naming the field.  Any thread.
  [[nodiscard]] static status check_request(const handshake_desc& req, std::uint32_t num_qp);

  /// endpoint_store's hook when the entry leaves the map: state destroying,
  /// every lane gets "QP i to ERR" (in-flight WRs flush, then the store
  /// destroys it).  Once; no lock held.
  void on_evict() noexcept;

  [[nodiscard]] const std::string& peer_nic_path() const noexcept { return peer_nic_path_; }
  [[nodiscard]] const std::string& local_nic_path() const noexcept { return params_.local_nic_path; }
  [[nodiscard]] std::uint32_t lanes() const noexcept { return static_cast<std::uint32_t>(qps_.size()); }
  /// The MTU agreed with the peer (bytes), 0 before connecting.
  [[nodiscard]] int agreed_mtu() const noexcept { return agreed_mtu_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::vector<std::uint32_t> qp_nums() const;
  /// The lane whose QP has number `qp_num`, or -1.  Any thread.
  [[nodiscard]] int lane_of_qp(std::uint32_t qp_num) const noexcept;
  /// QP i's number (fixed at create).  Any thread.
  [[nodiscard]] std::uint32_t qp_num(std::uint32_t i) const noexcept { return qp_nums_[i]; }
  /// The CQ QP i completes on (fixed at create).  Any thread.
  [[nodiscard]] const ibv_cq* lane_cq(std::uint32_t i) const noexcept { return cqs_[i]->native_handle(); }
  /// QP i itself, for tests that post what a lane does not expect (a stray
  /// completion).  Whatever is posted here bypasses lane i's ring and
  /// credits: never on a QP with a full send queue.
  [[nodiscard]] ibv_qp* native_qp(std::uint32_t i) const noexcept { return qps_[i].native_handle(); }

 private:
  // Posts one signaled WR `wr` for slice `s` on QP i and counts it in the ring
  // and outstanding_; on failure neither.  Lane i only.
  [[nodiscard]] errc post_signaled(std::uint32_t i, ibv_send_wr& wr, detail::slice& s) noexcept;
  endpoint(const endpoint_params& params, std::string peer);

  endpoint_params params_;
  std::string peer_nic_path_;
  std::vector<std::shared_ptr<verbs::completion_queue>> cqs_;  // outlive qps_ (declared first)
  detail::notify_qp notify_;  // its slab outlives qps_ (declared first): posted receives point into it
  bool advertised_ = false;   // took notify_credits out of the budget (create; given back in ~endpoint)
  std::vector<verbs::queue_pair> qps_;
  std::vector<std::uint32_t> qp_nums_;    // read once at create: QPNs never change
  std::vector<std::uint32_t> local_psn_;  // random initial send PSN per QP
  std::unique_ptr<lane_qp[]> lanes_;
  std::atomic<std::size_t> outstanding_{0};
  std::atomic<std::size_t> rx_outstanding_{0};  ///< notification receives posted (post_notify_recv)
  std::atomic<endpoint_state> state_{endpoint_state::initializing};
  std::atomic<errc> connect_error_{errc::ok};
  std::atomic<int> agreed_mtu_{0};
  std::atomic<std::int64_t> ack_deadline_ns_{0};
  std::mutex setup_mu_;
  std::vector<std::uint32_t> peer_qp_nums_;  // setup threads, under setup_mu_
};

}  // namespace tide::rdma
