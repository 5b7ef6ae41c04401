#pragma once
/// RAII owner of an RC queue pair and its RESET -> INIT -> RTR -> RTS transitions.

#include <tide/errc.hpp>
#include <tide/result.hpp>
#include <tide/verbs/cq.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/pd.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <string_view>

namespace tide::verbs {

/// Work queue sizes of a QP (Mooncake's defaults: 256 WRs, 4 SGEs, 64 B inline).
struct qp_caps {
  std::uint32_t max_send_wr = 256;
  std::uint32_t max_recv_wr = 256;
  std::uint32_t max_send_sge = 4;
  std::uint32_t max_recv_sge = 1;
  std::uint32_t max_inline_data = 64;
};

/// Transport timing of an RC connection. The defaults are Mooncake's, so that a
/// tide QP behaves like the peer it talks to: ACK timeout 4.096 us * 2^14 (~67 ms),
/// 7 retries, infinite RNR retries (7), 16 outstanding READs each way.
struct rc_params {
  std::uint8_t timeout = 14;
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t min_rnr_timer = 12;
  std::uint8_t max_rd_atomic = 16;
  std::uint8_t max_dest_rd_atomic = 16;
  std::uint8_t hop_limit = 16;
  std::uint32_t sq_psn = 0;  ///< Mooncake never exchanges PSNs: both are 0
};

/// What RTR needs: the peer's QP address plus the local choices that go with it.
struct remote_qp {
  std::uint32_t qp_num = 0;         ///< the peer's QP number (dest_qp_num)
  gid dgid;                         ///< the peer's GID (GRH is always used, as Mooncake does)
  std::uint16_t lid = 0;            ///< the peer's LID (0 on RoCE)
  ibv_mtu path_mtu = IBV_MTU_1024;  ///< path_mtu(local active, peer active): see device.hpp
  int sgid_index = 0;               ///< the LOCAL GID index (select_gid_index)
  std::uint8_t port = 0;            ///< the LOCAL port; 0 = the port given to to_init
  std::uint8_t traffic_class = 0;  ///< GRH traffic class (on RoCE the IP header's DSCP << 2 | ECN)
  std::uint8_t service_level = 0;  ///< the address vector's SL, 0..15
  std::uint32_t rq_psn = 0;         ///< the peer's send PSN
};

/// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN".
[[nodiscard]] std::string_view to_string(ibv_qp_state s) noexcept;

/// An RC queue pair (ibv_qp). Move-only; destroyed in the destructor, which
/// logs (never throws) on failure. Destroy it before its CQs and PD.
/// Transitions are setup-path calls from one thread at a time; post_send and
/// post_recv may be called from one thread at a time per queue.
class queue_pair {
 public:
  /// ibv_create_qp(RC) with `caps`; the QP starts in RESET.
  /// Errors: invalid_argument (caps the device refuses; the detail has them),
  /// resource_exhausted, verbs_failed.
  [[nodiscard]] static result<queue_pair> create(const protection_domain& pd, const completion_queue& send_cq,
                                                 const completion_queue& recv_cq, const qp_caps& caps = {});

  queue_pair(queue_pair&& o) noexcept;
  queue_pair& operator=(queue_pair&& o) noexcept;
  queue_pair(const queue_pair&) = delete;
  queue_pair& operator=(const queue_pair&) = delete;
  ~queue_pair();

  [[nodiscard]] ibv_qp* native_handle() const noexcept { return qp_; }
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return qp_->qp_num; }
  /// The port set by to_init (0 before).
  [[nodiscard]] std::uint8_t port() const noexcept { return port_; }
  /// The capacities the device granted (may exceed the requested ones).
  [[nodiscard]] const qp_caps& caps() const noexcept { return caps_; }

  /// RESET -> INIT on `port` with `access` (default local write, remote
  /// read/write; Mooncake also grants REMOTE_ATOMIC, which nothing in tide
  /// uses, so tide does not) and the P_Key at `pkey_index` of the port's
  /// table. Errors: qp_state_error (detail: errno text, port, pkey index).
  [[nodiscard]] status to_init(std::uint8_t port,
                               int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
                               std::uint16_t pkey_index = 0);
  /// INIT -> RTR towards `peer` (GRH with hop limit, traffic class and SL
  /// from `peer`; rq_psn, min_rnr_timer, max_dest_rd_atomic from `params`).
  /// Errors: invalid_argument (zero GID, qp_num 0, MTU outside the enum, SL
  /// above 15), qp_state_error (detail names the peer qp_num, MTU and sgid index).
  [[nodiscard]] status to_rtr(const remote_qp& peer, const rc_params& params = {});
  /// RTR -> RTS (timeout, retry_cnt, rnr_retry, sq_psn, max_rd_atomic). Errors: qp_state_error.
  [[nodiscard]] status to_rts(const rc_params& params = {});
  /// Any state -> ERR: outstanding WRs complete with WR_FLUSH_ERR. Errors: qp_state_error.
  [[nodiscard]] status to_error();
  /// Any state -> RESET (the QP can be connected again). Errors: qp_state_error.
  [[nodiscard]] status to_reset();
  /// The current state (ibv_query_qp). Errors: verbs_failed.
  [[nodiscard]] result<ibv_qp_state> state() const;

  /// ibv_post_send of a chain of WRs. Returns ok, would_block (send queue full),
  /// invalid_argument, or verbs_failed; on failure `*bad` (when given) names the
  /// first WR not posted. Hot path: noexcept, no allocation.
  [[nodiscard]] errc post_send(ibv_send_wr* wr, ibv_send_wr** bad = nullptr) noexcept;
  /// ibv_post_recv, same contract as post_send.
  [[nodiscard]] errc post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad = nullptr) noexcept;

 private:
  queue_pair(ibv_qp* qp, const qp_caps& caps) noexcept : qp_(qp), caps_(caps) {}
  [[nodiscard]] status modify(ibv_qp_attr& attr, int mask, std::string_view what, std::string_view extra);
  void reset() noexcept;
  ibv_qp* qp_ = nullptr;
  std::uint8_t port_ = 0;
  qp_caps caps_;
};

}  // namespace tide::verbs
