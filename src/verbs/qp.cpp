#include <tide/verbs/qp.hpp>

#include <tide/detail/log.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/error.hpp>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace tide::verbs {

std::string_view to_string(ibv_qp_state s) noexcept {
  switch (s) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "UNKNOWN";
  }
}

result<queue_pair> queue_pair::create(const protection_domain& pd, const completion_queue& send_cq,
                                      const completion_queue& recv_cq, const qp_caps& caps) {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq.native_handle();
  init.recv_cq = recv_cq.native_handle();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = caps.max_send_wr;
  init.cap.max_recv_wr = caps.max_recv_wr;
  init.cap.max_send_sge = caps.max_send_sge;
  init.cap.max_recv_sge = caps.max_recv_sge;
  init.cap.max_inline_data = caps.max_inline_data;
  errno = 0;
  ibv_qp* qp = ::ibv_create_qp(pd.native_handle(), &init);
  if (qp == nullptr) {
    const int err = errno;
    return fail(verbs_error("ibv_create_qp(RC, send_wr " + std::to_string(caps.max_send_wr) + ", recv_wr " +
                                std::to_string(caps.max_recv_wr) + ", send_sge " + std::to_string(caps.max_send_sge) +
                                ", recv_sge " + std::to_string(caps.max_recv_sge) + ", inline " +
                                std::to_string(caps.max_inline_data) + ")",
                            device_name_of(pd.context_handle()), err, errc::invalid_argument));
  }
  // ibv_create_qp writes back what the device granted.
  const qp_caps granted{init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge, init.cap.max_recv_sge,
                        init.cap.max_inline_data};
  return queue_pair{qp, granted};
}

queue_pair::queue_pair(queue_pair&& o) noexcept
    : qp_(std::exchange(o.qp_, nullptr)), port_(o.port_), caps_(o.caps_) {}

queue_pair& queue_pair::operator=(queue_pair&& o) noexcept {
  if (this != &o) {
    reset();
    qp_ = std::exchange(o.qp_, nullptr);
    port_ = o.port_;
    caps_ = o.caps_;
  }
  return *this;
}

queue_pair::~queue_pair() { reset(); }

void queue_pair::reset() noexcept {
  if (qp_ == nullptr) return;
  const std::uint32_t num = qp_->qp_num;
  if (const int rc = ::ibv_destroy_qp(qp_); rc != 0)
    TIDE_LOG_ERROR("ibv_destroy_qp(qp_num " << num << ") on " << device_name_of(qp_->context)
                                             << " failed: " << std::strerror(rc));
  qp_ = nullptr;
}

status queue_pair::modify(ibv_qp_attr& attr, int mask, std::string_view what, std::string_view extra) {
  if (const int rc = ::ibv_modify_qp(qp_, &attr, mask); rc != 0) {
    std::string call = "ibv_modify_qp(qp_num " + std::to_string(qp_->qp_num) + " -> ";
    call.append(what);
    if (!extra.empty()) call.append(", ").append(extra);
    call.append(")");
    auto e = verbs_error(call, device_name_of(qp_->context), rc, errc::qp_state_error);
    // A refused transition is a connection problem whatever errno says about it.
    if (e.code == errc::invalid_argument) e.code = errc::qp_state_error;
    return fail(std::move(e));
  }
  return {};
}

status queue_pair::to_init(std::uint8_t port, int access, std::uint16_t pkey_index) {
  if (port == 0) return fail(errc::invalid_argument, "to_init: port numbers start at 1");
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = port;
  attr.pkey_index = pkey_index;
  attr.qp_access_flags = static_cast<unsigned>(access);
  auto r = modify(attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT",
                  "port " + std::to_string(port) + ", pkey index " + std::to_string(pkey_index));
  if (r) port_ = port;
  return r;
}

status queue_pair::to_rtr(const remote_qp& peer, const rc_params& params) {
  const std::uint8_t port = peer.port != 0 ? peer.port : port_;
  if (port == 0) return fail(errc::invalid_argument, "to_rtr: no port (call to_init first or set remote_qp::port)");
  if (peer.qp_num == 0) return fail(errc::invalid_argument, "to_rtr: peer qp_num is 0");
  if (peer.dgid.is_zero()) return fail(errc::invalid_argument, "to_rtr: peer GID is all zero");
  if (mtu_bytes(peer.path_mtu) == 0)
    return fail(errc::invalid_argument, "to_rtr: path_mtu " + std::to_string(static_cast<int>(peer.path_mtu)) +
                                            " is not an ibv_mtu value");
  if (peer.service_level > 15)
    return fail(errc::invalid_argument, "to_rtr: service level " + std::to_string(peer.service_level) + " outside 0..15");
  if (peer.sgid_index < 0 || peer.sgid_index > 255)
    return fail(errc::invalid_argument, "to_rtr: sgid_index " + std::to_string(peer.sgid_index) + " outside 0..255");
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = peer.path_mtu;
  attr.dest_qp_num = peer.qp_num;
  attr.rq_psn = peer.rq_psn;
  attr.max_dest_rd_atomic = params.max_dest_rd_atomic;
  attr.min_rnr_timer = params.min_rnr_timer;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = peer.dgid.to_ibv();
  attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(peer.sgid_index);
  attr.ah_attr.grh.hop_limit = params.hop_limit;
  attr.ah_attr.grh.traffic_class = peer.traffic_class;
  attr.ah_attr.grh.flow_label = 0;
  attr.ah_attr.dlid = peer.lid;
  attr.ah_attr.sl = peer.service_level;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.static_rate = 0;
  attr.ah_attr.port_num = port;
  return modify(attr,
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                "RTR",
                "peer qp_num " + std::to_string(peer.qp_num) + ", peer gid " + peer.dgid.to_string() + ", mtu " +
                    std::to_string(mtu_bytes(peer.path_mtu)) + ", sgid_index " + std::to_string(peer.sgid_index) +
                    ", traffic class " + std::to_string(peer.traffic_class) + ", sl " +
                    std::to_string(peer.service_level));
}

status queue_pair::to_rts(const rc_params& params) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = params.timeout;
  attr.retry_cnt = params.retry_cnt;
  attr.rnr_retry = params.rnr_retry;
  attr.sq_psn = params.sq_psn;
  attr.max_rd_atomic = params.max_rd_atomic;
  return modify(attr,
                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                    IBV_QP_MAX_QP_RD_ATOMIC,
                "RTS", {});
}

status queue_pair::to_error() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return modify(attr, IBV_QP_STATE, "ERR", {});
}

status queue_pair::to_reset() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  auto r = modify(attr, IBV_QP_STATE, "RESET", {});
  if (r) port_ = 0;
  return r;
}

result<ibv_qp_state> queue_pair::state() const {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (const int rc = ::ibv_query_qp(qp_, &attr, IBV_QP_STATE, &init); rc != 0)
    return fail(verbs_error("ibv_query_qp(qp_num " + std::to_string(qp_->qp_num) + ")", device_name_of(qp_->context), rc));
  return attr.qp_state;
}

errc queue_pair::post_send(ibv_send_wr* wr, ibv_send_wr** bad) noexcept {
  ibv_send_wr* b = nullptr;
  const errc e = errc_from_post(::ibv_post_send(qp_, wr, &b));
  if (bad != nullptr) *bad = b;
  return e;
}

errc queue_pair::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad) noexcept {
  ibv_recv_wr* b = nullptr;
  const errc e = errc_from_post(::ibv_post_recv(qp_, wr, &b));
  if (bad != nullptr) *bad = b;
  return e;
}

}  // namespace tide::verbs
