#pragma once
// A minimal RC queue pair connected to itself on the first RDMA device, for
// tests and benchmarks that need real completions (raw libibverbs: the
// verbs RAII layer lives elsewhere).  Every step reports what failed.

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tide::testing {

class loopback_qp {
 public:
  /// Number of RDMA devices on this host (0: the caller should skip).
  static int device_count() {
    int n = 0;
    ibv_device** list = ::ibv_get_device_list(&n);
    if (list != nullptr) ::ibv_free_device_list(list);
    return list == nullptr ? 0 : n;
  }

  loopback_qp() = default;
  loopback_qp(const loopback_qp&) = delete;
  loopback_qp& operator=(const loopback_qp&) = delete;
  ~loopback_qp() { close(); }

  /// Opens the first device, makes pd, completion channel, CQ (with the
  /// channel), a second CQ without one, an MR and the self-connected QP.
  /// Returns an empty string on success, else what failed.
  std::string open(int gid_index = 1) {
    int n = 0;
    ibv_device** list = ::ibv_get_device_list(&n);
    if (list == nullptr || n == 0) return "no RDMA device";
    ctx_ = ::ibv_open_device(list[0]);
    ::ibv_free_device_list(list);
    if (ctx_ == nullptr) return err("ibv_open_device");
    if ((pd_ = ::ibv_alloc_pd(ctx_)) == nullptr) return err("ibv_alloc_pd");
    if ((channel_ = ::ibv_create_comp_channel(ctx_)) == nullptr) return err("ibv_create_comp_channel");
    if ((cq_ = ::ibv_create_cq(ctx_, 256, nullptr, channel_, 0)) == nullptr) return err("ibv_create_cq");
    if ((plain_cq_ = ::ibv_create_cq(ctx_, 16, nullptr, nullptr, 0)) == nullptr) return err("ibv_create_cq (plain)");
    buf_ = static_cast<char*>(std::aligned_alloc(4096, kBuf));
    if (buf_ == nullptr) return "aligned_alloc";
    std::memset(buf_, 0, kBuf);
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if ((mr_ = ::ibv_reg_mr(pd_, buf_, kBuf, access)) == nullptr) return err("ibv_reg_mr");

    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.cap.max_send_wr = 128;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.qp_type = IBV_QPT_RC;
    if ((qp_ = ::ibv_create_qp(pd_, &init)) == nullptr) return err("ibv_create_qp");

    ibv_port_attr port{};
    if (::ibv_query_port(ctx_, 1, &port) != 0) return err("ibv_query_port");
    ibv_gid gid{};
    if (::ibv_query_gid(ctx_, 1, gid_index, &gid) != 0) return err("ibv_query_gid");

    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = access;
    if (::ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      return err("modify_qp INIT");
    }
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = port.active_mtu;
    a.dest_qp_num = qp_->qp_num;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index);
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (::ibv_modify_qp(qp_, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
      return err("modify_qp RTR");
    }
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (::ibv_modify_qp(qp_, &a,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
      return err("modify_qp RTS");
    }
    return {};
  }

  /// Posts one signaled 8-byte RDMA WRITE from the first half of the
  /// buffer to the second.  Returns ibv_post_send's result.
  int post_write(std::uint64_t wr_id = 0) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uintptr_t>(buf_);
    sge.length = 8;
    sge.lkey = mr_->lkey;
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(buf_ + kBuf / 2);
    wr.wr.rdma.rkey = mr_->rkey;
    ibv_send_wr* bad = nullptr;
    return ::ibv_post_send(qp_, &wr, &bad);
  }

  /// Destroys everything; returns false if a destroy call failed (e.g. the
  /// CQ still had unacknowledged events).
  bool close() {
    bool ok = true;
    if (qp_ != nullptr) ok &= ::ibv_destroy_qp(qp_) == 0;
    if (mr_ != nullptr) ok &= ::ibv_dereg_mr(mr_) == 0;
    if (cq_ != nullptr) ok &= ::ibv_destroy_cq(cq_) == 0;
    if (plain_cq_ != nullptr) ok &= ::ibv_destroy_cq(plain_cq_) == 0;
    if (channel_ != nullptr) ok &= ::ibv_destroy_comp_channel(channel_) == 0;
    if (pd_ != nullptr) ok &= ::ibv_dealloc_pd(pd_) == 0;
    if (ctx_ != nullptr) ok &= ::ibv_close_device(ctx_) == 0;
    std::free(buf_);
    qp_ = nullptr;
    mr_ = nullptr;
    cq_ = plain_cq_ = nullptr;
    channel_ = nullptr;
    pd_ = nullptr;
    ctx_ = nullptr;
    buf_ = nullptr;
    return ok;
  }

  ibv_cq* cq() const { return cq_; }
  ibv_cq* plain_cq() const { return plain_cq_; }
  ibv_comp_channel* channel() const { return channel_; }
  const char* device_name() const { return ctx_ != nullptr ? ::ibv_get_device_name(ctx_->device) : "?"; }

 private:
  static constexpr std::size_t kBuf = 4096;
  static std::string err(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_cq* plain_cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  char* buf_ = nullptr;
};

}  // namespace tide::testing
