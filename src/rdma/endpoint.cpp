#include <tide/detail/log.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/verbs/device.hpp>

#include <algorithm>

namespace tide::rdma {
namespace {

constexpr std::size_t kMaxChain = 32;  // WRs per ibv_post_send

}  // namespace

std::string_view to_string(endpoint_state s) noexcept {
  switch (s) {
    case endpoint_state::initializing: return "INITIALIZING";
    case endpoint_state::unconnected: return "UNCONNECTED";
    case endpoint_state::connecting: return "CONNECTING";
    case endpoint_state::connected_wait_ready_ack: return "CONNECTED_WAIT_READY_ACK";
    case endpoint_state::connected: return "CONNECTED";
    case endpoint_state::destroying: return "DESTROYING";
    case endpoint_state::destroyed: return "DESTROYED";
  }
  return "?";
}

endpoint::endpoint(const endpoint_params& params, std::string peer, std::uint32_t cq_index)
    : params_(params), peer_nic_path_(std::move(peer)), cq_index_(cq_index) {}

result<std::unique_ptr<endpoint>> endpoint::create(const endpoint_params& params, const verbs::completion_queue& cq,
                                                   std::string peer_nic_path, std::uint32_t cq_index) {
  if (params.num_qp == 0 || params.num_qp > 255)
    return fail(errc::config_invalid, "num_qp_per_ep must be 1..255, got " + std::to_string(params.num_qp));
  std::unique_ptr<endpoint> ep(new endpoint(params, std::move(peer_nic_path), cq_index));
  ep->qps_.reserve(params.num_qp);
  for (std::uint32_t i = 0; i < params.num_qp; ++i) {
    auto qp = verbs::queue_pair::create(*params.pd, cq, cq, params.caps);
    if (!qp) return fail(qp.error());
    ep->qps_.push_back(std::move(*qp));
  }
  ep->qp_depth_.reset(new std::atomic<std::uint32_t>[params.num_qp]);
  for (std::uint32_t i = 0; i < params.num_qp; ++i) ep->qp_depth_[i].store(0, std::memory_order_relaxed);
  ep->state_.store(endpoint_state::unconnected, std::memory_order_release);
  return ep;
}

endpoint::~endpoint() {
  if (outstanding() != 0)
    TIDE_LOG_WARN("endpoint " << params_.local_nic_path << " -> " << peer_nic_path_ << " destroyed with "
                              << outstanding() << " WRs outstanding");
  {
    std::lock_guard lock(qp_mu_);
    for (auto& qp : qps_)
      if (auto r = qp.to_error(); !r) TIDE_LOG_DEBUG("endpoint " << peer_nic_path_ << ": " << r.error().message());
  }
  state_.store(endpoint_state::destroyed, std::memory_order_release);
}

void endpoint::on_evict() noexcept {
  std::lock_guard lock(qp_mu_);
  const auto s = state_.load(std::memory_order_acquire);
  if (s != endpoint_state::destroyed) state_.store(endpoint_state::destroying, std::memory_order_release);
}

std::vector<std::uint32_t> endpoint::qp_nums() const {
  std::vector<std::uint32_t> v;
  v.reserve(qps_.size());
  for (const auto& qp : qps_) v.push_back(qp.qp_num());
  return v;
}

bool endpoint::owns_qp(std::uint32_t qp_num) const noexcept {
  return std::any_of(qps_.begin(), qps_.end(), [&](const auto& qp) { return qp.qp_num() == qp_num; });
}

handshake_desc endpoint::local_desc(bool with_ready_ack) const {
  handshake_desc d;
  d.local_nic_path = params_.local_nic_path;
  d.peer_nic_path = peer_nic_path_;
  d.local_lid = params_.lid;
  gid_bytes g;
  g.raw = params_.local_gid.raw;
  d.local_gid = g;
  d.qp_num = qp_nums();
  if (with_ready_ack) d.ready_ack = false;
  d.mtu = static_cast<std::uint32_t>(verbs::mtu_bytes(params_.mtu));
  return d;
}

status endpoint::prepare_locked() {
  for (auto& qp : qps_) {
    if (auto r = qp.to_reset(); !r) return r;
    if (auto r = qp.to_init(params_.port); !r) return r;
  }
  for (std::uint32_t i = 0; i < qps_.size(); ++i) qp_depth_[i].store(0, std::memory_order_relaxed);
  return {};
}

status endpoint::connect_qps_locked(const handshake_desc& peer) {
  if (peer.qp_num.size() != qps_.size())
    return fail(errc::qp_count_mismatch, "QP count mismatch: " + params_.local_nic_path + " has " +
                                             std::to_string(qps_.size()) + ", " + peer.local_nic_path + " has " +
                                             std::to_string(peer.qp_num.size()));
  if (!peer.local_gid)
    return fail(errc::handshake_rejected, "peer " + peer.local_nic_path + " sent no GID");
  const ibv_mtu peer_mtu = peer.mtu ? verbs::mtu_from_bytes(static_cast<int>(*peer.mtu)).value_or(params_.mtu) : params_.mtu;
  const ibv_mtu mtu = verbs::path_mtu(params_.mtu, peer_mtu);
  verbs::remote_qp rq;
  rq.dgid.raw = peer.local_gid->raw;
  rq.lid = peer.local_lid;
  rq.path_mtu = mtu;
  rq.sgid_index = params_.gid_index;
  rq.port = params_.port;
  for (std::size_t i = 0; i < qps_.size(); ++i) {
    rq.qp_num = peer.qp_num[i];
    if (auto r = qps_[i].to_rtr(rq, params_.rc); !r) return r;
    if (auto r = qps_[i].to_rts(params_.rc); !r) return r;
  }
  peer_qp_nums_ = peer.qp_num;
  agreed_mtu_.store(verbs::mtu_bytes(mtu), std::memory_order_relaxed);
  return {};
}

status endpoint::connect(const handshake_sender& send) {
  std::lock_guard setup(setup_mu_);
  handshake_desc request;
  {
    std::lock_guard lock(qp_mu_);
    const auto s = state_.load(std::memory_order_acquire);
    if (s == endpoint_state::connected || s == endpoint_state::connected_wait_ready_ack) return {};
    if (s == endpoint_state::destroying || s == endpoint_state::destroyed)
      return fail(errc::endpoint_closed, params_.local_nic_path + " -> " + peer_nic_path_ + " is closed");
    if (auto r = prepare_locked(); !r) return r;
    state_.store(endpoint_state::connecting, std::memory_order_release);
    request = local_desc(/*with_ready_ack=*/true);
  }
  auto reply = send(peer_nic_path_, request);
  bool send_ack = false;
  {
    std::lock_guard lock(qp_mu_);
    const auto s = state_.load(std::memory_order_acquire);
    // The peer's own request got here first and we accepted it (simultaneous open).
    if (s == endpoint_state::connected || s == endpoint_state::connected_wait_ready_ack) return {};
    if (s != endpoint_state::connecting)
      return fail(errc::endpoint_closed, params_.local_nic_path + " -> " + peer_nic_path_ + " closed while connecting");
    auto unconnected = [&] { state_.store(endpoint_state::unconnected, std::memory_order_release); };
    if (!reply) {
      unconnected();
      return fail(reply.error());
    }
    if (!reply->reply_msg.empty()) {
      unconnected();
      return fail(errc::handshake_rejected, peer_nic_path_ + " rejected the connection: " + reply->reply_msg);
    }
    if (reply->local_nic_path != peer_nic_path_ || reply->peer_nic_path != params_.local_nic_path) {
      unconnected();
      return fail(errc::handshake_rejected, "peer nic path inconsistency: expected " + peer_nic_path_ + " -> " +
                                                params_.local_nic_path + ", got " + reply->local_nic_path + " -> " +
                                                reply->peer_nic_path);
    }
    if (auto r = connect_qps_locked(*reply); !r) {
      unconnected();
      return r;
    }
    state_.store(endpoint_state::connected, std::memory_order_release);
    send_ack = reply->ready_ack.has_value();
  }
  if (send_ack) {
    auto ack = local_desc(true);
    ack.ready_ack = true;
    auto r = send(peer_nic_path_, ack);
    if (!r || !r->reply_msg.empty())
      TIDE_LOG_WARN("ready ack to " << peer_nic_path_ << " failed: "
                                    << (r ? r->reply_msg : r.error().message()) << " (the peer times out and proceeds)");
  }
  return {};
}

std::optional<handshake_desc> endpoint::accept(const handshake_desc& request) {
  std::lock_guard lock(qp_mu_);
  handshake_desc reply = local_desc(/*with_ready_ack=*/true);
  auto reject = [&](std::string why) {
    reply.reply_msg = std::move(why);
    return reply;
  };
  if (request.qp_num.size() != qps_.size())
    return reject("QP count mismatch: " + params_.local_nic_path + " has " + std::to_string(qps_.size()) + ", " +
                  request.local_nic_path + " sent " + std::to_string(request.qp_num.size()));
  const auto s = state_.load(std::memory_order_acquire);
  if (s == endpoint_state::destroying || s == endpoint_state::destroyed) return std::nullopt;
  if ((s == endpoint_state::connected || s == endpoint_state::connected_wait_ready_ack) &&
      request.qp_num == peer_qp_nums_)
    return reply;  // a duplicate: keep the connection
  if (s == endpoint_state::connecting && params_.local_nic_path < peer_nic_path_)
    return reject("simultaneous open: " + params_.local_nic_path + " connects as the active side");
  if ((s == endpoint_state::connected || s == endpoint_state::connected_wait_ready_ack) && outstanding() != 0)
    return std::nullopt;  // the peer reconnected with new QPs: retire this one
  if (auto r = prepare_locked(); !r) return reject(r.error().message());
  if (auto r = connect_qps_locked(request); !r) {
    state_.store(endpoint_state::unconnected, std::memory_order_release);
    return reject(r.error().message());
  }
  if (request.ready_ack.has_value()) {
    ack_deadline_ = std::chrono::steady_clock::now() + params_.ready_ack_timeout;
    state_.store(endpoint_state::connected_wait_ready_ack, std::memory_order_release);
  } else {
    state_.store(endpoint_state::connected, std::memory_order_release);
  }
  return reply;
}

std::string endpoint::on_ready_ack(const handshake_desc& ack) {
  std::lock_guard lock(qp_mu_);
  const auto s = state_.load(std::memory_order_acquire);
  if (s != endpoint_state::connected && s != endpoint_state::connected_wait_ready_ack)
    return "Received RDMA ready ACK for unconnected endpoint";
  if (ack.qp_num != peer_qp_nums_) return "Received stale RDMA ready ACK with mismatched peer QP numbers";
  state_.store(endpoint_state::connected, std::memory_order_release);
  return {};
}

bool endpoint::ready() noexcept {
  const auto s = state_.load(std::memory_order_acquire);
  if (s == endpoint_state::connected) [[likely]]
    return true;
  if (s != endpoint_state::connected_wait_ready_ack) return false;
  std::lock_guard lock(qp_mu_);
  if (std::chrono::steady_clock::now() < ack_deadline_) return false;
  TIDE_LOG_WARN("no ready ack from " << peer_nic_path_ << "; using the connection anyway");
  auto expected = endpoint_state::connected_wait_ready_ack;
  state_.compare_exchange_strong(expected, endpoint_state::connected, std::memory_order_acq_rel);
  return state_.load(std::memory_order_acquire) == endpoint_state::connected;
}

errc endpoint::post(detail::slice*& chain, std::size_t& posted_total, std::size_t& bytes) noexcept {
  if (state_.load(std::memory_order_acquire) != endpoint_state::connected) [[unlikely]]
    return errc::endpoint_closed;
  ibv_send_wr wrs[kMaxChain];
  ibv_sge sges[kMaxChain];
  const auto nqp = static_cast<std::uint32_t>(qps_.size());
  const std::uint32_t max_wr = params_.caps.max_send_wr;
  for (std::uint32_t tried = 0; chain != nullptr && tried < nqp; ++tried) {
    const std::uint32_t q = next_qp_;
    next_qp_ = (next_qp_ + 1) % nqp;
    const std::uint32_t depth = qp_depth_[q].load(std::memory_order_relaxed);
    if (depth >= max_wr) continue;
    std::size_t n = std::min<std::size_t>(kMaxChain, max_wr - depth);
    std::size_t k = 0;
    detail::slice* s = chain;
    for (; s != nullptr && k < n; s = s->next, ++k) {
      sges[k] = {s->local_addr, s->length, s->lkey};
      ibv_send_wr& wr = wrs[k];
      wr = {};
      wr.wr_id = reinterpret_cast<std::uint64_t>(s);
      wr.opcode = s->op == transfer_op::read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      wr.sg_list = &sges[k];
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = s->remote_addr;
      wr.wr.rdma.rkey = s->rkey;
      wr.next = nullptr;
      if (k != 0) wrs[k - 1].next = &wr;
      s->ep = this;
      s->qp = static_cast<std::uint8_t>(q);
    }
    // Count before posting: a completion may be polled before post_send returns.
    qp_depth_[q].fetch_add(static_cast<std::uint32_t>(k), std::memory_order_relaxed);
    outstanding_.fetch_add(k, std::memory_order_relaxed);
    ibv_send_wr* bad = nullptr;
    const errc e = qps_[q].post_send(wrs, &bad);
    if (e != errc::ok) [[unlikely]] {
      // WRs from `bad` on were not posted: give their accounting back and keep them queued.
      std::size_t posted = bad != nullptr ? static_cast<std::size_t>(bad - wrs) : 0;
      const std::size_t unposted = k - posted;
      qp_depth_[q].fetch_sub(static_cast<std::uint32_t>(unposted), std::memory_order_relaxed);
      outstanding_.fetch_sub(unposted, std::memory_order_relaxed);
      for (std::size_t i = 0; i < posted; ++i) {
        bytes += chain->length;
        chain = chain->next;
      }
      posted_total += posted;
      if (e == errc::would_block) continue;
      return e;
    }
    for (detail::slice* p = chain; p != s; p = p->next) bytes += p->length;
    posted_total += k;
    chain = s;
  }
  return errc::ok;
}

void endpoint::disable() noexcept {
  std::lock_guard lock(qp_mu_);
  const auto s = state_.load(std::memory_order_acquire);
  if (s == endpoint_state::destroyed || errored_) return;
  errored_ = true;
  state_.store(endpoint_state::destroying, std::memory_order_release);
  for (auto& qp : qps_) {
    if (auto r = qp.to_error(); !r) TIDE_LOG_WARN("endpoint " << peer_nic_path_ << ": " << r.error().message());
  }
}

}  // namespace tide::rdma
