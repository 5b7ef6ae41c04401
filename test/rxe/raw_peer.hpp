#pragma once
// A hand-made peer for the notification tests: two RC QPs, one CQ and a
// 64 KiB MR on one device, with raw libibverbs (as interop_test's client).
// It connects to a tide engine through the engine's own handshake port
// (the engine is the passive side) and then does what a tide peer would not:
// advertise notification credits without posting receives, or hold its
// ready ack back.  Every step REQUIREs.

#include <doctest/doctest.h>

#include <tide/rdma/detail/notify_qp.hpp>
#include <tide/wire/descriptors.hpp>

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tide::test {

class raw_peer {
 public:
  static constexpr std::size_t kBuf = 64u << 10;  ///< first half: WRITE target; second: SEND/receive slots
  static constexpr std::size_t kSlots = kBuf / 2;
  static constexpr int kGidIndex = 1;  // RoCEv2 IPv4 in the VM, as interop_test
  static constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

  explicit raw_peer(const std::string& device) {
    int n = 0;
    ibv_device** list = ::ibv_get_device_list(&n);
    REQUIRE(list != nullptr);
    for (int i = 0; i < n; ++i)
      if (device == ::ibv_get_device_name(list[i])) ctx_ = ::ibv_open_device(list[i]);
    ::ibv_free_device_list(list);
    REQUIRE_MESSAGE(ctx_ != nullptr, "ibv_open_device " << device);
    REQUIRE((pd_ = ::ibv_alloc_pd(ctx_)) != nullptr);
    REQUIRE((cq_ = ::ibv_create_cq(ctx_, 256, nullptr, nullptr, 0)) != nullptr);
    buf = static_cast<char*>(std::aligned_alloc(4096, kBuf));
    REQUIRE(buf != nullptr);
    std::memset(buf, 0, kBuf);
    REQUIRE((mr = ::ibv_reg_mr(pd_, buf, kBuf, kAccess)) != nullptr);
    for (auto& qp : qps_) {
      ibv_qp_init_attr init{};
      init.send_cq = cq_;
      init.recv_cq = cq_;
      init.cap.max_send_wr = 64;
      init.cap.max_recv_wr = 16;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      init.qp_type = IBV_QPT_RC;
      REQUIRE((qp = ::ibv_create_qp(pd_, &init)) != nullptr);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qp_access_flags = kAccess;
      REQUIRE(::ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    }
    REQUIRE(::ibv_query_port(ctx_, 1, &port_) == 0);
    REQUIRE(::ibv_query_gid(ctx_, 1, kGidIndex, &gid_) == 0);
  }
  ~raw_peer() {
    for (auto* qp : qps_)
      if (qp != nullptr) ::ibv_destroy_qp(qp);
    if (mr != nullptr) ::ibv_dereg_mr(mr);
    if (cq_ != nullptr) ::ibv_destroy_cq(cq_);
    if (pd_ != nullptr) ::ibv_dealloc_pd(pd_);
    if (ctx_ != nullptr) ::ibv_close_device(ctx_);
    std::free(buf);
  }
  raw_peer(const raw_peer&) = delete;
  raw_peer& operator=(const raw_peer&) = delete;

  [[nodiscard]] tide::gid_bytes gid() const {
    tide::gid_bytes g;
    std::memcpy(g.raw.data(), gid_.raw, 16);
    return g;
  }

  /// A Connection request from NIC path `from` to `engine_path`, advertising
  /// `credits` notification receives (0: none) and announcing a ready ack.
  [[nodiscard]] tide::handshake_desc request(const std::string& from, const std::string& engine_path,
                                             std::uint32_t credits) const {
    tide::handshake_desc d;
    d.local_nic_path = from;
    d.peer_nic_path = engine_path;
    d.local_gid = gid();
    d.qp_num = {qps_[0]->qp_num, qps_[1]->qp_num};
    d.ready_ack = false;
    if (credits != 0) d.notify_credits = credits;
    return d;  // no psn: both ends start at 0 (Mooncake's way)
  }

  /// RTR/RTS against the engine's reply.
  void connect(const tide::handshake_desc& reply) {
    REQUIRE(reply.local_gid.has_value());
    REQUIRE(reply.qp_num.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = port_.active_mtu;
      a.dest_qp_num = reply.qp_num[i];
      a.max_dest_rd_atomic = 16;
      a.min_rnr_timer = 12;  // what this peer tells a sender in its RNR NAKs: 0.64 ms
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, reply.local_gid->raw.data(), 16);
      a.ah_attr.grh.sgid_index = kGidIndex;
      a.ah_attr.grh.hop_limit = 16;
      a.ah_attr.dlid = reply.local_lid;
      a.ah_attr.port_num = 1;
      REQUIRE(::ibv_modify_qp(qps_[i], &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
      a = {};
      a.qp_state = IBV_QPS_RTS;
      a.timeout = 14;
      a.retry_cnt = 6;
      a.rnr_retry = 7;
      a.max_rd_atomic = 16;
      REQUIRE(::ibv_modify_qp(qps_[i], &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC) == 0);
    }
  }

  /// Posts `n` receives of one notification slot each on QP 0.
  void post_recvs(std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t slot = next_rx_++ % 4;
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot_at(slot)), rdma::detail::kNotifySlot, mr->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = kRecvTag | slot;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      REQUIRE(::ibv_post_recv(qps_[0], &wr, &bad) == 0);
    }
  }

  /// SENDs `n` as a notification message on QP 0 and waits for its
  /// completion; returns its status (-1: none within 30 s).
  int send_notify(const tide::notify_desc& n) {
    std::byte* out = reinterpret_cast<std::byte*>(slot_at(5));
    const std::uint32_t len = rdma::detail::encode_notify_message(n, out);
    REQUIRE(len != 0);
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(out), len, mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    REQUIRE(::ibv_post_send(qps_[0], &wr, &bad) == 0);
    const auto wc = next_completion(std::chrono::seconds(30), false);
    return wc ? static_cast<int>(wc->status) : -1;
  }

  /// The next receive completion within `timeout`, decoded.
  std::optional<rdma::detail::notify_decoded> wait_recv(std::chrono::milliseconds timeout) {
    const auto wc = next_completion(timeout, true);
    if (!wc) return std::nullopt;
    REQUIRE(wc->status == IBV_WC_SUCCESS);
    return rdma::detail::decode_notify_send(reinterpret_cast<const std::byte*>(slot_at(wc->wr_id & 0xff)),
                                            wc->byte_len);
  }

  char* buf = nullptr;  ///< [0, kSlots): where the engine's WRITEs may land
  ibv_mr* mr = nullptr;

 private:
  static constexpr std::uint64_t kRecvTag = std::uint64_t{1} << 32;

  char* slot_at(std::size_t k) const { return buf + kSlots + k * rdma::detail::kNotifySlot; }

  // A completion of a receive (recv) or a send (!recv) within `timeout`;
  // completions of the other kind seen meanwhile are kept for later.
  std::optional<ibv_wc> next_completion(std::chrono::milliseconds timeout, bool recv) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (auto it = seen_.begin(); it != seen_.end(); ++it)
        if (((it->wr_id & kRecvTag) != 0) == recv) {
          const ibv_wc wc = *it;
          seen_.erase(it);
          return wc;
        }
      ibv_wc wc{};
      const int n = ::ibv_poll_cq(cq_, 1, &wc);
      REQUIRE(n >= 0);
      if (n == 1) {
        seen_.push_back(wc);
        continue;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qps_[2] = {nullptr, nullptr};
  ibv_port_attr port_{};
  ibv_gid gid_{};
  std::size_t next_rx_ = 0;
  std::vector<ibv_wc> seen_;
};

}  // namespace tide::test
