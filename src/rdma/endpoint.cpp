#include <tide/detail/log.hpp>
#include <tide/rdma/detail/retire_wr.hpp>
#include <tide/rdma/detail/task_telemetry.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/verbs/device.hpp>
#include <tide/wire/address.hpp>

#include <algorithm>
#include <random>

namespace tide::rdma {
namespace {

constexpr std::size_t kMaxChain = 32;  // WRs per ibv_post_send

// Takes back detail::note_posted_wr for a WR that ibv_post_send did not take
// (it stays queued and is counted when it is posted).  The first-post stamp
// stays: the post was attempted then.
void unnote_posted_wr(const detail::slice& s) noexcept {
  s.task->wrs.fetch_sub(1, std::memory_order_relaxed);
  for (const detail::slice* r = s.rider; r != nullptr; r = r->rider) r->task->wrs.fetch_sub(1, std::memory_order_relaxed);
}

// A random 24-bit initial PSN (finding 19: a QP reused with PSN 0 could accept
// a stale packet of its previous life).  Setup path.
std::uint32_t random_psn() {
  thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xffffffu;
}

}  // namespace

std::string_view to_string(endpoint_state s) noexcept {
  switch (s) {
    case endpoint_state::initializing: return "INITIALIZING";
    case endpoint_state::unconnected: return "UNCONNECTED";
    case endpoint_state::connecting: return "CONNECTING";
    case endpoint_state::establishing: return "ESTABLISHING";
    case endpoint_state::connected_wait_ready_ack: return "CONNECTED_WAIT_READY_ACK";
    case endpoint_state::connected: return "CONNECTED";
    case endpoint_state::destroying: return "DESTROYING";
    case endpoint_state::destroyed: return "DESTROYED";
  }
  return "?";
}

endpoint::endpoint(const endpoint_params& params, std::string peer)
    : params_(params), peer_nic_path_(std::move(peer)) {}

result<std::unique_ptr<endpoint>> endpoint::create(const endpoint_params& params,
                                                   std::span<const std::shared_ptr<verbs::completion_queue>> cqs,
                                                   std::string peer_nic_path) {
  if (params.num_qp == 0 || params.num_qp > 255 || cqs.size() != params.num_qp)
    return fail(errc::config_invalid, "num_qp_per_ep (lanes) must be 1..255 with one CQ per lane, got " +
                                          std::to_string(params.num_qp) + " QPs and " + std::to_string(cqs.size()) +
                                          " CQs");
  std::unique_ptr<endpoint> ep(new endpoint(params, std::move(peer_nic_path)));
  ep->cqs_.assign(cqs.begin(), cqs.end());
  ep->qps_.reserve(params.num_qp);
  verbs::qp_caps caps = params.caps;
  caps.max_send_wr += kDrainMarkerSlots;
  for (std::uint32_t i = 0; i < params.num_qp; ++i) {
    auto qp = verbs::queue_pair::create(*params.pd, *cqs[i], *cqs[i], caps);
    if (!qp) return fail(qp.error());
    ep->qp_nums_.push_back(qp->qp_num());
    ep->local_psn_.push_back(random_psn());
    ep->qps_.push_back(std::move(*qp));
  }
  ep->lanes_ = std::make_unique<lane_qp[]>(params.num_qp);
  if (params.notify_credits != 0 && params.notify_budget) {
    const std::int64_t need = params.notify_credits + detail::kCreditReserve;
    if (params.notify_budget->fetch_sub(need, std::memory_order_relaxed) >= need) ep->advertised_ = true;
    else params.notify_budget->fetch_add(need, std::memory_order_relaxed);
  }
  ep->state_.store(endpoint_state::unconnected, std::memory_order_release);
  return ep;
}

endpoint::~endpoint() {
  if (outstanding() != 0)
    TIDE_LOG_WARN("endpoint " << params_.local_nic_path << " -> " << peer_nic_path_ << " destroyed with "
                              << outstanding() << " WRs or lane messages outstanding");
  state_.store(endpoint_state::destroyed, std::memory_order_release);
  if (advertised_)
    params_.notify_budget->fetch_add(params_.notify_credits + detail::kCreditReserve, std::memory_order_relaxed);
}

void endpoint::on_evict() noexcept {
  state_.store(endpoint_state::destroying, std::memory_order_release);
  if (params_.retire) params_.retire(*this);
}

std::vector<std::uint32_t> endpoint::qp_nums() const { return qp_nums_; }

int endpoint::lane_of_qp(std::uint32_t qp_num) const noexcept {
  for (std::size_t i = 0; i < qp_nums_.size(); ++i)
    if (qp_nums_[i] == qp_num) return static_cast<int>(i);
  return -1;
}

handshake_desc endpoint::local_desc(bool with_ready_ack) const {
  handshake_desc d;
  d.local_nic_path = params_.local_nic_path;
  d.peer_nic_path = peer_nic_path_;
  d.local_lid = params_.lid;
  gid_bytes g;
  g.raw = params_.local_gid.raw;
  d.local_gid = g;
  d.qp_num = qp_nums_;
  if (with_ready_ack) d.ready_ack = false;
  d.mtu = static_cast<std::uint32_t>(verbs::mtu_bytes(params_.mtu));
  d.psn = local_psn_;
  if (advertised_) d.notify_credits = params_.notify_credits;
  return d;
}

result<peer_route> endpoint::route_to(const handshake_desc& peer) const {
  if (peer.qp_num.size() != qps_.size())
    return fail(errc::qp_count_mismatch, "QP count mismatch: " + params_.local_nic_path + " has " +
                                             std::to_string(qps_.size()) + " (num_qp_per_ep = lanes), " +
                                             peer.local_nic_path + " has " + std::to_string(peer.qp_num.size()));
  if (!peer.local_gid) return fail(errc::handshake_rejected, "peer " + peer.local_nic_path + " sent no GID");
  // A peer without tide's mtu field (Mooncake) sends at its own active MTU,
  // unnegotiated; assuming 1024 (finding 19's suggestion) makes our responder
  // drop its larger packets (the interop suite showed it), so such a peer is
  // assumed to run ours, as Mooncake itself assumes.
  const ibv_mtu peer_mtu =
      peer.mtu ? verbs::mtu_from_bytes(static_cast<int>(*peer.mtu)).value_or(params_.mtu) : params_.mtu;
  peer_route r;
  r.base.dgid.raw = peer.local_gid->raw;
  r.base.lid = peer.local_lid;
  r.base.path_mtu = verbs::path_mtu(params_.mtu, peer_mtu);
  r.base.sgid_index = params_.gid_index;
  r.base.port = params_.port;
  r.base.traffic_class = params_.traffic_class;
  r.base.service_level = params_.service_level;
  r.qp_num = peer.qp_num;
  r.own_psn = peer.psn.has_value() && peer.psn->size() == peer.qp_num.size();
  r.rq_psn = r.own_psn ? *peer.psn : std::vector<std::uint32_t>(peer.qp_num.size(), 0);
  r.peer_notify_credits = peer.notify_credits.value_or(0);
  return r;
}

status endpoint::prepare_notify(const peer_route& r) {
  if (!advertised_ || r.peer_notify_credits == 0) return {};
  return notify_.prepare(*params_.pd, params_.notify_credits, r.peer_notify_credits);
}

errc endpoint::post_notify_recv(std::uint32_t slot) noexcept {
  ibv_sge sge{reinterpret_cast<std::uint64_t>(notify_.rx_buf(slot)), detail::kNotifySlot, notify_.lkey()};
  ibv_recv_wr wr{};
  // Bit 0 tags a receive: slices (and the notify_qp's send slices) are
  // 8-aligned, so the lane tells the two apart before touching anything.
  wr.wr_id = (std::uint64_t{slot} << 1) | 1u;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  const errc e = qps_[0].post_recv(&wr);
  if (e == errc::ok) {
    ++notify_.rx_posted;
    rx_outstanding_.fetch_add(1, std::memory_order_relaxed);
  }
  return e;
}

errc endpoint::post_notify_send(std::uint32_t slot, std::uint32_t len, bool credit) noexcept {
  lane_qp& l = lanes_[0];
  const endpoint_state st = state_.load(std::memory_order_acquire);
  if (!l.rts || (credit ? !credits_may_go_out(st) : st != endpoint_state::connected)) [[unlikely]]
    return errc::endpoint_closed;
  detail::slice& s = notify_.tx_wr(slot);
  ibv_sge sge{reinterpret_cast<std::uint64_t>(notify_.tx_buf(slot)), len, notify_.lkey()};
  ibv_send_wr wr{};
  wr.wr_id = reinterpret_cast<std::uint64_t>(&s);
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  // Signaled: its completion frees the buffer and says it was delivered;
  // an unsignaled one would be retired by a later slice's completion.
  wr.send_flags = IBV_SEND_SIGNALED;
  if (len <= qps_[0].caps().max_inline_data) wr.send_flags |= IBV_SEND_INLINE;
  s.ep = this;
  s.qp = 0;
  s.next = nullptr;
  if (const errc e = post_signaled(0, wr, s); e != errc::ok) [[unlikely]] return e;
  l.since_signal = 0;
  return errc::ok;
}

void endpoint::set_peer(const peer_route& r) {
  peer_qp_nums_ = r.qp_num;
  agreed_mtu_.store(verbs::mtu_bytes(r.base.path_mtu), std::memory_order_relaxed);
}

status endpoint::lane_connect(std::uint32_t i, const peer_route& r) {
  lane_qp& l = lanes_[i];
  auto& qp = qps_[i];
  if (auto s = qp.to_reset(); !s) return s;
  l.rts = false;
  l.errored = false;
  l.left_reset = false;
  // A marker still in the ring is the same slice: never push it twice.
  l.drain_posted = l.drain_posted && in_ring(i, &l.drain);
  if (auto s = qp.to_init(params_.port, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
                          params_.pkey_index);
      !s)
    return s;
  l.left_reset = true;
  if (i == 0 && notify_.enabled()) {
    // Before RTR: a SEND from the peer can only meet a posted receive.  A
    // reset dropped earlier ones without completions: their holds go.
    rx_outstanding_.fetch_sub(notify_.rx_posted, std::memory_order_relaxed);
    notify_.rx_posted = 0;
    for (std::uint32_t k = 0; k < notify_.rx_slots(); ++k)
      if (auto e = post_notify_recv(k); e != errc::ok)
        return fail(e, "post_recv on QP 0 for notifications of " + peer_nic_path_);
  }
  verbs::remote_qp rq = r.base;
  rq.qp_num = r.qp_num[i];
  rq.rq_psn = r.rq_psn[i];
  verbs::rc_params rc = params_.rc;
  rc.sq_psn = r.own_psn ? local_psn_[i] : 0;
  // QP 0 carries notification SENDs, which a peer that advertised credits
  // but posts no receives answers with RNR NAKs.  With infinite RNR retries
  // (7) that SEND, and every data WR behind it, never completed or flushed
  // (review 1ab3d99, finding 3); with a count the QP fails within a few of
  // the peer's RNR timers (at most 7 x 491 ms), its WRs flush and are
  // redone, and the notification goes over TCP.  Only a SEND can draw an
  // RNR NAK, so QPs without notifications keep Mooncake's 7.
  if (i == 0 && notify_.enabled()) rc.rnr_retry = std::min(rc.rnr_retry, kNotifyRnrRetry);
  if (auto s = qp.to_rtr(rq, rc); !s) return s;
  if (auto s = qp.to_rts(rc); !s) return s;
  l.since_signal = 0;
  l.rts = true;
  return {};
}

void endpoint::lane_error(std::uint32_t i) noexcept {
  lane_qp& l = lanes_[i];
  if (l.errored) return;
  l.errored = true;
  l.rts = false;
  if (!l.left_reset) return;  // never connected: nothing to flush
  if (auto r = qps_[i].to_error(); !r) TIDE_LOG_WARN("endpoint " << peer_nic_path_ << ": " << r.error().message());
}

namespace {
// The drain marker's owner: its completion retires the ring in front of it,
// and the marker itself carries no transfer.
struct drain_marker_hook final : detail::wr_hook {
  void wr_done(detail::slice&, errc) noexcept override {}
};
drain_marker_hook g_drain_hook;
}  // namespace

errc endpoint::post_signaled(std::uint32_t i, ibv_send_wr& wr, detail::slice& s) noexcept {
  lane_qp& l = lanes_[i];
  // In the ring before the post: its completion may be polled at once.
  l.ring.reserve(params_.caps.max_send_wr + kDrainMarkerSlots);
  l.ring.push(&s);
  outstanding_.fetch_add(1, std::memory_order_relaxed);
  const errc e = qps_[i].post_send(&wr);
  if (e != errc::ok) [[unlikely]] {
    l.ring.unpush(1);
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
  }
  return e;
}

drain_post endpoint::post_drain_marker(std::uint32_t i) noexcept {
  lane_qp& l = lanes_[i];
  if (!l.errored || !l.left_reset || l.drain_posted || l.ring.empty()) return drain_post::not_needed;
  detail::slice& s = l.drain;
  s = detail::slice{};
  s.hook = &g_drain_hook;
  s.ep = this;
  s.qp = static_cast<std::uint8_t>(i);
  // A zero-length WRITE needs no memory key at either end; in ERR it
  // flushes, and if the QP could not leave RTS it completes, which says
  // that everything before it did too (RC completes in order).
  ibv_send_wr wr{};
  wr.wr_id = reinterpret_cast<std::uint64_t>(&s);
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.num_sge = 0;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (post_signaled(i, wr, s) != errc::ok) [[unlikely]] return drain_post::retry;
  l.drain_posted = true;
  return drain_post::posted;
}

status endpoint::check_request(const handshake_desc& req, std::uint32_t num_qp) {
  const std::string& path = req.local_nic_path;
  constexpr std::size_t kMaxPath = 512;
  if (wire::nic_path_split(path) == std::string::npos || path.size() > kMaxPath ||
      std::any_of(path.begin(), path.end(), [](char c) { return static_cast<unsigned char>(c) <= 0x20; }))
    return fail(errc::handshake_rejected, "Invalid argument: local_nic_path is not <server>@<nic> (at most " +
                                              std::to_string(kMaxPath) + " printable characters)");
  if (req.qp_num.size() != num_qp)
    return fail(errc::qp_count_mismatch, "QP count mismatch: " + req.peer_nic_path + " has " + std::to_string(num_qp) +
                                             " (num_qp_per_ep = lanes), " + path + " has " +
                                             std::to_string(req.qp_num.size()));
  for (const std::uint32_t q : req.qp_num)
    if (q == 0 || q > 0xffffffu) return fail(errc::handshake_rejected, "Invalid argument: QP number " + std::to_string(q));
  if (req.psn && req.psn->size() != req.qp_num.size())
    return fail(errc::handshake_rejected, "Invalid argument: " + std::to_string(req.psn->size()) + " PSNs for " +
                                              std::to_string(req.qp_num.size()) + " QPs");
  if (!req.local_gid || std::all_of(req.local_gid->raw.begin(), req.local_gid->raw.end(), [](auto b) { return b == 0; }))
    return fail(errc::handshake_rejected, "Invalid peer GID: " + path + " sent none (or all zero)");
  return {};
}

bool endpoint::ready() noexcept {
  const auto s = state_.load(std::memory_order_acquire);
  if (s == endpoint_state::connected) [[likely]]
    return true;
  if (s != endpoint_state::connected_wait_ready_ack) return false;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < ack_deadline_ns_.load(std::memory_order_acquire)) return false;
  if (transition(endpoint_state::connected_wait_ready_ack, endpoint_state::connected))
    TIDE_LOG_WARN("no ready ack from " << peer_nic_path_ << "; using the connection anyway");
  return state_.load(std::memory_order_acquire) == endpoint_state::connected;
}

errc endpoint::post(std::uint32_t i, detail::slice*& chain, std::uint32_t credits, std::size_t& posted_total,
                    std::size_t& bytes) noexcept {
  lane_qp& l = lanes_[i];
  if (!l.rts || state_.load(std::memory_order_acquire) != endpoint_state::connected) [[unlikely]]
    return errc::endpoint_closed;
  const std::uint32_t depth = params_.caps.max_send_wr;
  l.ring.reserve(depth + kDrainMarkerSlots);
  const std::uint32_t sq_free = depth - std::min(depth, l.ring.size());
  const std::size_t n = std::min<std::size_t>({kMaxChain, sq_free, credits});
  if (n == 0 || chain == nullptr) return errc::ok;
  const std::uint32_t max_inline = qps_[i].caps().max_inline_data;
  const std::uint32_t interval = params_.signal_interval;
  ibv_send_wr wrs[kMaxChain];
  ibv_sge sges[kMaxChain];
  detail::slice* slices[kMaxChain];
  std::size_t k = 0;
  std::size_t chain_bytes = 0;
  const std::uint32_t since_before = l.since_signal;
  const std::int64_t now_ns = detail::steady_now_ns();  // telemetry: first post
  detail::slice* s = chain;
  // Everything read from the slices is read here, before ibv_post_send: after
  // it the NIC (and, through a completion, the batch roll-up) owns them.
  for (; s != nullptr && k < n; s = s->next, ++k) {
    sges[k] = {s->local_addr, s->length, s->lkey};
    ibv_send_wr& wr = wrs[k];
    wr = {};
    wr.wr_id = reinterpret_cast<std::uint64_t>(s);
    const bool write = s->op != transfer_op::read;
    wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.sg_list = &sges[k];
    wr.num_sge = 1;
    if (++l.since_signal >= interval) {
      wr.send_flags = IBV_SEND_SIGNALED;
      l.since_signal = 0;
    }
    if (write && s->length <= max_inline) wr.send_flags |= IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = s->remote_addr;
    wr.wr.rdma.rkey = s->rkey;
    if (k != 0) wrs[k - 1].next = &wr;
    s->ep = this;
    s->qp = static_cast<std::uint8_t>(i);
    chain_bytes += s->length;
    detail::note_posted_wr(*s, now_ns);
    slices[k] = s;
    l.ring.push(s);
  }
  wrs[k - 1].send_flags |= IBV_SEND_SIGNALED;  // the last WR of a post retires the ones before it
  l.since_signal = 0;
  outstanding_.fetch_add(k, std::memory_order_relaxed);
  ibv_send_wr* bad = nullptr;
  const errc e = qps_[i].post_send(wrs, &bad);
  if (e != errc::ok) [[unlikely]] {
    // WRs from `bad` on were not posted: they leave the ring and stay queued.
    const std::size_t ok = bad != nullptr ? static_cast<std::size_t>(bad - wrs) : 0;
    const std::size_t unposted = k - ok;
    l.ring.unpush(static_cast<std::uint32_t>(unposted));
    outstanding_.fetch_sub(unposted, std::memory_order_relaxed);
    l.since_signal = since_before;
    for (std::size_t j = ok; j < k; ++j) unnote_posted_wr(*slices[j]);
    for (std::size_t j = 0; j < ok; ++j) bytes += sges[j].length;
    posted_total += ok;
    chain = slices[ok];  // never posted: still ours to read
    // Nothing posted and the queue was full: try later.  Anything else (a
    // prefix posted whose last WR may be unsignaled) fails the endpoint: its
    // QP goes to ERR and the flush completions retire the prefix.
    return e == errc::would_block && ok == 0 ? errc::ok : (e == errc::would_block ? errc::qp_state_error : e);
  }
  bytes += chain_bytes;
  posted_total += k;
  chain = s;
  return errc::ok;
}

bool endpoint::in_ring(std::uint32_t i, const detail::slice* s) const noexcept {
  const lane_qp& l = lanes_[i];
  for (std::uint32_t k = 0, m = l.ring.size(); k < m; ++k)
    if (l.ring.at(k) == s) return true;
  return false;
}

std::uint32_t endpoint::complete_through(std::uint32_t i, const detail::slice* s, detail::slice** unknown) noexcept {
  lane_qp& l = lanes_[i];
  std::uint32_t n = 0;
  detail::slice** link = unknown;
  while (!l.ring.empty()) {
    detail::slice* f = l.ring.pop();
    ++n;
    if (f == s) break;
    if (unknown == nullptr) {
      detail::retire_wr(*f, errc::ok);
    } else {
      f->next = nullptr;
      *link = f;
      link = &f->next;
    }
  }
  return n;
}

detail::slice* endpoint::take_ring(std::uint32_t i) noexcept {
  lane_qp& l = lanes_[i];
  detail::slice* head = nullptr;
  detail::slice** link = &head;
  while (!l.ring.empty()) {
    detail::slice* f = l.ring.pop();
    f->next = nullptr;
    *link = f;
    link = &f->next;
  }
  return head;
}

}  // namespace tide::rdma
