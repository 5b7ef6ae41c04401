#pragma once
/// rdma::endpoint — N RC queue pairs from one local NIC to one peer NIC
/// (Mooncake's RdmaEndPoint), connected lazily through the handshake.
///
/// States as Mooncake's: initializing -> unconnected -> connecting ->
/// [connected_wait_ready_ack ->] connected -> destroying -> destroyed.
///
/// Connection:
///  - active (`connect`, from the worker that first needs it): moves its QPs
///    to INIT, sends its QP numbers, GID, LID and MTU; on the reply moves them
///    to RTR/RTS at the smaller of both MTUs and sends the ready ack when the
///    peer announced support for it.
///  - passive (`accept`, from the handshake service): answers with its own QP
///    numbers after moving its QPs to RTS; waits for the ready ack (bounded).
///  - simultaneous open (both ends connecting at once) is settled by the NIC
///    paths: the end with the smaller local path stays active and rejects
///    the other's request; the other accepts, and its own rejected attempt
///    finds the endpoint connected.
///
/// Posting: one ibv_post_send per chain of WRs per QP; every WR signaled,
/// one SGE, wr_id = the slice; per-QP accounting against max_send_wr.
/// Teardown is two-phase: `disable()` moves the QPs to ERR (in-flight WRs
/// complete flushed), the owner drains `outstanding()` to 0, then destroys.

#include <tide/metadata/descriptors.hpp>
#include <tide/rdma/detail/batch.hpp>
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
#include <string>
#include <string_view>
#include <vector>

namespace tide::rdma {

/// What every endpoint of one context shares.
struct endpoint_params {
  const verbs::protection_domain* pd = nullptr;
  std::string local_nic_path;      ///< "<server>@<device>"
  std::uint8_t port = 1;
  int gid_index = 0;
  verbs::gid local_gid;
  std::uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_4096;      ///< the local active MTU, capped by the config
  std::uint32_t num_qp = 2;        ///< Mooncake's MC_NUM_QP_PER_EP
  verbs::qp_caps caps;
  verbs::rc_params rc;
  std::chrono::milliseconds ready_ack_timeout{10000};
};

/// Sends a Connection frame to the process that owns `peer_nic_path` and
/// returns its reply (transport errors as handshake_failed/peer_unreachable).
using handshake_sender = std::function<result<handshake_desc>(std::string_view peer_nic_path, const handshake_desc&)>;

enum class endpoint_state : std::uint8_t {
  initializing, unconnected, connecting, connected_wait_ready_ack, connected, destroying, destroyed
};
[[nodiscard]] std::string_view to_string(endpoint_state s) noexcept;

class endpoint {
 public:
  /// Creates the QPs (RESET) on `cq`.  Errors: those of queue_pair::create.
  /// Setup path, any thread.
  [[nodiscard]] static result<std::unique_ptr<endpoint>> create(const endpoint_params& params,
                                                                const verbs::completion_queue& cq,
                                                                std::string peer_nic_path, std::uint32_t cq_index);

  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;
  /// Destroys the QPs (moving them to ERR first if still connected).  The
  /// owner must have drained `outstanding()` to 0.  Never throws.
  ~endpoint();

  /// Active connect (lazy; idempotent when connected).  Blocks for one or
  /// two handshake round trips.  Errors: handshake_failed, peer_unreachable,
  /// handshake_rejected (the peer's reply_msg in the detail), qp_count_mismatch,
  /// qp_state_error, endpoint_closed.  One caller at a time per endpoint
  /// (serialized inside); any thread.
  [[nodiscard]] status connect(const handshake_sender& send);

  /// Passive side of a Connection request for this endpoint.  Returns the
  /// reply (reply_msg set on rejection), or nothing when the endpoint cannot
  /// take the request without dropping in-flight work (it was connected to
  /// other peer QPs and still has WRs out): the caller then retires it and
  /// accepts on a fresh endpoint.  Handshake-service thread.
  [[nodiscard]] std::optional<handshake_desc> accept(const handshake_desc& request);

  /// Passive side of the ready ack.  Returns "" on success, else the reason.
  [[nodiscard]] std::string on_ready_ack(const handshake_desc& ack);

  /// True when slices may be posted: connected, or waiting for a ready ack
  /// that is overdue (a peer that never sends it).  Hot path: one atomic load
  /// (plus a clock read while waiting for an ack).
  [[nodiscard]] bool ready() noexcept;
  [[nodiscard]] endpoint_state state() const noexcept { return state_.load(std::memory_order_acquire); }

  /// Posts slices from the front of `chain` (linked by slice::next) and
  /// advances `chain` past those posted; adds their number and bytes to
  /// `posted` / `bytes`.  Stops when every QP is full (the rest stay in
  /// `chain`: returns ok), or on failure (returns the errc; the unposted
  /// slices stay in `chain`).  One ibv_post_send per QP chain.  Hot path:
  /// noexcept, no allocation.  One poster thread at a time.
  [[nodiscard]] errc post(detail::slice*& chain, std::size_t& posted, std::size_t& bytes) noexcept;

  /// Accounts for the completion of slice `s` (posted here).  Any thread.
  void on_completion(const detail::slice& s) noexcept {
    qp_depth_[s.qp].fetch_sub(1, std::memory_order_relaxed);
    outstanding_.fetch_sub(1, std::memory_order_release);
  }

  /// WRs posted and not yet completed (0 = safe to destroy once disabled).
  [[nodiscard]] std::size_t outstanding() const noexcept { return outstanding_.load(std::memory_order_acquire); }

  /// Phase one of teardown after a fault (QP fatal, device/port error, a
  /// failed completion): QPs to ERR, state destroying; in-flight WRs
  /// complete flushed.  Idempotent, noexcept; any thread.
  void disable() noexcept;

  /// endpoint_store's hook when the entry leaves the map (eviction, erase):
  /// no new posts (state destroying); WRs in flight still complete normally
  /// and the store destroys the endpoint once outstanding() is 0.
  void on_evict() noexcept;

  [[nodiscard]] const std::string& peer_nic_path() const noexcept { return peer_nic_path_; }
  [[nodiscard]] const std::string& local_nic_path() const noexcept { return params_.local_nic_path; }
  [[nodiscard]] std::uint32_t cq_index() const noexcept { return cq_index_; }
  /// The MTU agreed with the peer (bytes), 0 before connecting.
  [[nodiscard]] int agreed_mtu() const noexcept { return agreed_mtu_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::vector<std::uint32_t> qp_nums() const;
  /// True when this QP number belongs to this endpoint.
  [[nodiscard]] bool owns_qp(std::uint32_t qp_num) const noexcept;

 private:
  endpoint(const endpoint_params& params, std::string peer, std::uint32_t cq_index);

  handshake_desc local_desc(bool with_ready_ack) const;
  // Caller holds qp_mu_.  RESET -> INIT on every QP.
  status prepare_locked();
  // Caller holds qp_mu_.  INIT -> RTR -> RTS towards `peer`.
  status connect_qps_locked(const handshake_desc& peer);

  endpoint_params params_;
  std::string peer_nic_path_;
  std::uint32_t cq_index_;
  std::vector<verbs::queue_pair> qps_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> qp_depth_;
  std::atomic<std::size_t> outstanding_{0};
  std::atomic<endpoint_state> state_{endpoint_state::initializing};
  std::atomic<int> agreed_mtu_{0};
  std::uint32_t next_qp_ = 0;  ///< round robin; the poster thread only
  std::mutex setup_mu_;        ///< serializes active connects (held across the round trip)
  mutable std::mutex qp_mu_;   ///< QP transitions and the fields below; never held across I/O
  std::vector<std::uint32_t> peer_qp_nums_;
  bool errored_ = false;  ///< disable() ran
  std::chrono::steady_clock::time_point ack_deadline_{};
};

}  // namespace tide::rdma
