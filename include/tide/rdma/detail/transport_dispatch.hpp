#pragma once
// Member definitions of rdma_transport<P>, the data path after resolution
// (included by rdma_transport.hpp):
//   plan (plan::plan) -> path (P::path through plan::path_selector, rail
//   health) -> slices -> dispatch to the lanes of each local NIC;
//   on_failed: the rail learns, the slice goes to the next healthy rail, or,
//   when the failure is transient and no other rail reaches the peer, to the
//   same rail after a backoff (detail/retry_timer.hpp) until its deadline.
// Threads: plan_and_dispatch runs on the submitting thread (under the batch's
// submit mutex and the local buffer table's shared lock); on_failed on the
// lane that saw the failure (or on the retry timer's thread, for a parked
// slice whose NIC went away); resume_parked on the retry timer's thread, or
// inline in on_failed for a retry that waits for nothing.  Shared state: the rail table and the NIC loads
// (atomics), the path policy (thread-safe by its concept).

namespace tide::rdma {

template <class P>
std::uint32_t rdma_transport<P>::active_mask() const noexcept {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < contexts_.size(); ++i)
    if (contexts_[i]->active()) m |= 1u << i;
  return m;
}

template <class P>
void rdma_transport<P>::fill_candidates(const local_buffer& lb, std::uint64_t local_addr, const remote_segment& seg,
                                        const remote_buffer& pb, std::uint64_t remote_addr,
                                        candidate_lists& out) const noexcept {
  const auto& le = lb.chooser.entry_at(local_addr - lb.addr);
  out.nlp = out.nla = out.npp = out.npa = 0;
  for (auto d : le.preferred)
    if (out.nlp < out.local_preferred.size()) out.local_preferred[out.nlp++] = d;
  for (auto d : le.available)
    if (out.nla < out.local_available.size()) out.local_available[out.nla++] = d;
  // The peer's matrix numbers its NICs its own way: map to descriptor indices.
  const auto& pe = pb.chooser.entry_at(remote_addr - pb.addr);
  auto map = [&](std::uint16_t id, std::array<std::uint16_t, 64>& to, std::size_t& n) {
    if (id < seg.to_desc.size() && seg.to_desc[id] >= 0 && n < to.size())
      to[n++] = static_cast<std::uint16_t>(seg.to_desc[id]);
  };
  for (auto id : pe.preferred) map(id, out.peer_preferred, out.npp);
  for (auto id : pe.available) map(id, out.peer_available, out.npa);
}

template <class P>
void rdma_transport<P>::bind_rail(detail::slice& s, const local_buffer& lb, const remote_segment& seg,
                                  const remote_buffer& pb, plan::rail r, std::int64_t now_ns) noexcept {
  s.local_device = r.local;
  s.peer_device = r.peer;
  s.lkey = lb.lkeys[r.local];
  s.stager = lb.nic_reachable ? nullptr : lb.stager;  // the lane stages it through a chunk
  s.rkey = pb.rkeys[r.peer];
  s.peer_path = &seg.nic_paths[r.peer];
  s.peer_nic = s.rails != nullptr && r.peer < s.rails->peer_ids.size() ? s.rails->peer_ids[r.peer]
                                                                        : plan::rail_table::kNoPeer;
  s.rail = s.peer_nic != plan::rail_table::kNoPeer ? &rails_.at(r.local, s.peer_nic) : nullptr;
  s.probe = r.probe;
  s.charged = &loads_[r.local];
  s.charged->dispatched(s.length, now_ns);
}

template <class P>
void rdma_transport<P>::dispatch_one(detail::slice& s) noexcept {
  s.ep = nullptr;
  s.next = nullptr;
  contexts_[s.local_device]->dispatch(&s, &s, 1);
}

template <class P>
void rdma_transport<P>::set_rail_map(const segment_slot& slot, remote_segment& seg, const segment_desc& d) {
  // Caller holds seg_mu_ exclusively.
  std::vector<plan::gid_raw> local_gids, peer_gids;
  for (const auto& c : contexts_) local_gids.push_back(c->gid().raw);
  for (std::size_t i = 0; i < seg.nic_paths.size(); ++i)
    peer_gids.push_back(i < d.devices.size() ? d.devices[i].gid.raw : plan::gid_raw{});
  auto m = std::make_shared<const plan::rail_map>(plan::rail_map::build(rails_, local_gids, seg.nic_paths, peer_gids));
  // A refresh that changed no NIC keeps the map slices already point at
  // (finding 8); the new one gives its peer ids back as it goes.
  if (slot.view && slot.view->rails && slot.view->rails->peer_ids == m->peer_ids &&
      slot.view->rails->ranked == m->ranked) {
    seg.rails = slot.view->rails;
    return;
  }
  seg.rails = std::move(m);
  ++rail_maps_built_;
}

template <class P>
status rdma_transport<P>::plan_and_dispatch(detail::batch_state& b, std::size_t used,
                                            std::span<const transfer_request> requests,
                                            std::span<const resolved_request> res, detail::task_group* group) {
  // Per submitting thread, reused: planning allocates only when a submit is bigger than any before.
  thread_local std::vector<plan::request_extent> extents;
  thread_local plan::slice_plan planned;
  thread_local std::vector<std::uint32_t> wr_bytes;
  thread_local std::vector<plan::rail> wr_rails;
  thread_local std::vector<detail::slice*> heads;
  thread_local std::vector<const plan::rail_map*> maps;
  extents.resize(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    extents[i] = {reinterpret_cast<std::uint64_t>(r.source), res[i].remote_addr, r.length, r.op, r.target,
                  reinterpret_cast<std::uint64_t>(res[i].local), static_cast<std::uint32_t>(res[i].peer_buffer)};
  }
  // A submit that only the carrier can take is sliced for it.
  bool carrier_all = carrier_ != nullptr;
  for (std::size_t i = 0; i < requests.size() && carrier_all; ++i) carrier_all = carrier_only(res[i]);
  bool any_staged = false;
  for (std::size_t i = 0; i < requests.size() && !any_staged; ++i) any_staged = staged(res[i]);
  const plan::planner_config& pc = carrier_all ? carrier_plan_cfg_ : (any_staged ? stage_plan_cfg_ : plan_cfg_);
  if (auto r = plan::plan(pc, extents, planned); !r) return r;
  // The map of the view each task keeps alive (keep_alive below): slices
  // point at it for retries, and it holds their peer ids in the rail table.
  maps.assign(requests.size(), nullptr);
  for (std::size_t i = 0; i < requests.size(); ++i) maps[i] = res[i].seg ? res[i].seg->rails.get() : nullptr;

  // Every allocation before the first task or counter changes (submit's
  // promise: a bad_alloc leaves nothing submitted).  The slice vectors keep
  // their capacity across reuses, so this is free in the steady state.
  std::uint32_t widest_group = 0;
  for (const auto& g : planned.groups) widest_group = std::max(widest_group, g.wr_count);
  wr_bytes.reserve(widest_group);
  wr_rails.reserve(widest_group);
  heads.clear();
  heads.reserve(planned.wrs.size());
  for (std::size_t i = 0; i < requests.size(); ++i) b.tasks[used + i].slices.reserve(planned.requests[i].piece_count);

  const auto now = std::chrono::steady_clock::now();
  const std::int64_t now_ns = detail::steady_now_ns();
  const std::int64_t now_us = now_ns / 1000;
  std::size_t total = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    detail::task_state& t = b.tasks[used + i];
    const std::uint32_t n = planned.requests[i].piece_count;
    detail::reset_task(t, n, requests[i].target, now + cfg_.transfer_timeout);
    t.group = group;
    detail::start_telemetry(t, requests[i].op, requests[i].length, now_ns);
    t.keep_alive = res[i].seg;
    // Counted under the local table's shared lock: unregister_memory sees it.
    t.local_inflight = &res[i].local->inflight;
    t.segment_inflight = &res[i].slot->inflight;
    t.local_inflight->fetch_add(n, std::memory_order_relaxed);
    t.segment_inflight->fetch_add(n, std::memory_order_relaxed);
    total += n;
  }

  const std::uint32_t active = active_mask();
  candidate_lists cands;
  for (const auto& g : planned.groups) {
    const std::size_t fr = g.first_request;
    const local_buffer& lb = *res[fr].local;
    const remote_segment& seg = *res[fr].seg;
    const remote_buffer& pb = seg.buffers[static_cast<std::size_t>(res[fr].peer_buffer)];
    const plan::rail_map* rm = maps[fr];
    wr_bytes.resize(g.wr_count);
    wr_rails.resize(g.wr_count);
    for (std::uint32_t k = 0; k < g.wr_count; ++k) wr_bytes[k] = planned.wrs[g.first_wr + k].length;
    // Where no rail can go: the carrier, when the peer serves it (checked
    // at resolution for a peer only it reaches).  With every rail paused,
    // the carrier takes all but the one probe WR.
    const bool only_carrier = carrier_only(res[fr]);
    const bool may_carry = carrier_ != nullptr && (only_carrier || carrier_->reaches(seg));
    bool routed = false, healthy = true;
    if (!only_carrier) {
      fill_candidates(lb, reinterpret_cast<std::uint64_t>(requests[fr].source), seg, pb, res[fr].remote_addr, cands);
      routed = rm != nullptr && paths_->choose(cands.view(), *rm, active, wr_bytes, g.bytes, topology::fast_random(),
                                               now_us, wr_rails, &healthy);
    }
    for (std::uint32_t k = 0; k < g.wr_count; ++k) {
      const plan::planned_wr& w = planned.wrs[g.first_wr + k];
      detail::slice* head = nullptr;
      detail::slice* prev = nullptr;
      for (std::uint32_t q = 0; q < w.piece_count; ++q) {
        const plan::planned_piece& pc = planned.pieces[w.first_piece + q];
        detail::task_state& t = b.tasks[used + pc.request];
        detail::slice& s = t.slices[w.first_piece + q - planned.requests[pc.request].first_piece];
        s = {};
        s.task = &t;
        s.op = requests[pc.request].op;
        s.peer_buffer = static_cast<std::uint32_t>(res[pc.request].peer_buffer);
        s.local_addr = reinterpret_cast<std::uint64_t>(requests[pc.request].source) + pc.offset;
        s.remote_addr = res[pc.request].remote_addr + pc.offset;
        s.length = pc.length;
        if (head == nullptr) {
          head = &s;
        } else {
          prev->rider = &s;
        }
        prev = &s;
      }
      // The head carries the whole WR; its own share comes back at retirement (retire_wr).
      if (w.length != head->length) head->share = head->length;
      head->local_addr = w.local_addr;
      head->remote_addr = w.remote_addr;
      head->length = w.length;
      head->inline_data = w.inline_data;
      head->rails = rm;
      if (may_carry && (!routed || (!healthy && !wr_rails[k].probe))) {
        head->local_device = kViaCarrier;  // handed over once the batch counts it (below)
      } else if (routed) {
        bind_rail(*head, lb, seg, pb, wr_rails[k], now_ns);
      } else {
        head->local_device = kNoRoute;  // no NIC can reach the target: fails once the batch counts it (below)
      }
      heads.push_back(head);
    }
  }
  // A submit that is one WRITE on a NIC: its notification may ride right
  // behind it (detail::notify_send).  A READ's would not wait for the
  // responses, and a submit of several WRs has no one QP to order it on.
  if (group != nullptr && group->message != nullptr && heads.size() == 1 && heads[0]->op == transfer_op::write &&
      heads[0]->local_device != kViaCarrier && heads[0]->local_device != kNoRoute)
    heads[0]->then_notify = group->message;
  b.unfinished.fetch_add(requests.size(), std::memory_order_relaxed);
  b.inflight.fetch_add(total, std::memory_order_relaxed);
  b.used.store(used + requests.size(), std::memory_order_release);

  // Chain per context: one dispatch per context (the context picks the lane).
  using chain = std::pair<detail::slice*, detail::slice*>;
  std::array<chain, kMaxContexts> chains{};
  std::size_t nctx_used = 0, chains_used = 0;
  for (detail::slice* s : heads) {
    if (s->local_device == kViaCarrier) {
      to_carrier(*s);
      continue;
    }
    if (s->local_device == kNoRoute) [[unlikely]] {
      detail::retire_wr(*s, errc::context_inactive);
      continue;
    }
    chain& c = chains[s->local_device];
    s->next = nullptr;
    if (c.first == nullptr) {
      c.first = c.second = s;
      ++chains_used;
    } else {
      c.second->next = s;
      c.second = s;
    }
    nctx_used = std::max<std::size_t>(nctx_used, s->local_device + 1u);
  }
  // A submit spread over k NICs uses num_qp_per_ep / k lanes of each (at
  // least one): as many lane threads and QPs at once as on one NIC.  Where
  // the CPU, not the links, is the bottleneck, the extra lanes cost more
  // than the second NIC gives (bench/multi-nic's one-rail row); one QP per
  // NIC still fills a link.  Narrow chains rotate over the lanes
  // (lane_pool::dispatch), so concurrent submits still use them all.
  const std::size_t width = (cfg_.context.num_qp_per_ep + chains_used - 1) / std::max<std::size_t>(chains_used, 1);
  for (std::size_t d = 0; d < nctx_used; ++d)
    if (chain& c = chains[d]; c.first != nullptr) contexts_[d]->dispatch(c.first, c.second, width);
  return {};
}

template <class P>
void rdma_transport<P>::on_failed(detail::slice& s, errc e) noexcept {
  detail::release_charge(s, true);
  // Teardown: the lanes are stopping one by one, so no retry may go to any
  // of them (acquire: pairs with the release store in shutdown()).
  if (stopping_.load(std::memory_order_acquire)) [[unlikely]] {
    detail::retire_wr(s, e);
    return;
  }
  const std::int64_t now_us = plan::steady_now_us();
  if (s.rail != nullptr && plan::counts_against_rail(e) && s.rail->fail(now_us, rails_.config())) [[unlikely]] {
    const auto snap = s.rail->snapshot();
    TIDE_LOG_WARN("rail " << contexts_[s.local_device]->name() << " -> " << *s.peer_path << " paused for "
                          << (snap.until_us - now_us) / 1000 << " ms after " << to_string(e));
  }
  detail::task_state& t = *s.task;
  // The first wire error is the task's cause even when a retry succeeds
  // for this slice (a later failure of another slice then names it).
  detail::note_cause(t, e, &s);
  if (e == errc::remote_access_error) {
    std::shared_lock lock(seg_mu_);
    if (t.target < segments_.size()) segments_[t.target]->stale.store(true, std::memory_order_relaxed);
  }
  // A task marked to stop (timeout, cancel) is not retried: it becomes
  // final once its slices have all retired.
  const bool stopping = detail::should_drop(s) != errc::ok;
  // timed_out on a task that is not marked to stop is the fresh endpoint's
  // connect timing out, not the task: ibv_modify_qp to RTR resolves the
  // peer's address and gets ETIMEDOUT while a loss burst eats the ARP
  // replies (seen in the retry suite under TSan: every slice of the burst
  // failed with it).  The peer lives on, so it is transient; a refused or
  // unanswered TCP handshake (peer_unreachable) still fails at once.
  const bool connect_timed_out = e == errc::timed_out && !stopping;
  // A rejected rkey is stale (the peer unregistered): no rail or retry can
  // make it valid, and each retry would cost an endpoint.
  const bool retriable = e != errc::canceled && (e != errc::timed_out || connect_timed_out) &&
                         e != errc::remote_access_error && !stopping;
  // A transient failure (the peer lives on) is retried past max_retry, for
  // as long as the retry starts before the task's deadline: a loss burst on
  // the only link outlasts any fixed count of rounds (issue 17, item 7).
  // Past max_retry it still hops to another rail when one is healthy (rail
  // health paces that: a rail that failed is paused); else it waits out a
  // backoff for the same rail.  max_retry = 0 still means no retry at all.
  const bool transient = plan::fresh_endpoint_may_help(e) || connect_timed_out;
  if (!retriable || cfg_.max_retry == 0 || s.rails == nullptr || (s.retries >= cfg_.max_retry && !transient) ||
      !detail::retry_timer::before_deadline(s, std::chrono::nanoseconds{0})) {
    detail::retire_wr(s, e);
    return;
  }
  const auto* seg = static_cast<const remote_segment*>(t.keep_alive.get());
  const remote_buffer& pb = seg->buffers[s.peer_buffer];
  const plan::rail failed{s.local_device, s.peer_device, false};
  plan::rail next{};
  bool found = false;
  // Not the rail's fault (eviction, a flushed victim, a remote access error) and the
  // rail still healthy: the same rail again.  Otherwise never the rail that failed.
  if (!plan::counts_against_rail(e) && s.rail != nullptr && s.rail->healthy() && contexts_[s.local_device]->active()) {
    retry_on_same_rail(s, e);
    return;
  }
  {
    std::shared_lock lock(local_mu_);
    if (const local_buffer* lb = find_local(s.local_addr, s.length)) {
      candidate_lists cands;
      fill_candidates(*lb, s.local_addr, *seg, pb, s.remote_addr, cands);
      found = paths_->next_rail(cands.view(), *s.rails, active_mask(), failed, now_us, next);
      if (found) bind_rail(s, *lb, *seg, pb, next, now_us * 1000);
    }
  }
  // No other rail: another transport, where the peer serves one, rather
  // than waiting for this rail to come back.
  if (!found && carrier_ != nullptr && carrier_->reaches(*seg)) {
    count_retry(s);
    TIDE_LOG_DEBUG("slice " << &s << " failed (" << to_string(e) << ") with no other healthy rail to "
                            << *s.peer_path << ": carried over TCP");
    to_carrier(s);
    return;
  }
  if (!found && transient && contexts_[s.local_device]->active()) {
    // No other rail: the failed one once more, on the fresh endpoint the
    // lane makes (the failed one was retired with its QPs).
    TIDE_LOG_DEBUG("slice " << &s << " failed (" << to_string(e) << "), retry " << int(s.retries) + 1
                            << " on the same rail: no other rail reaches " << *s.peer_path);
    retry_on_same_rail(s, e);
    return;
  }
  if (!found) {
    detail::retire_wr(s, e);
    return;
  }
  count_retry(s);
  TIDE_LOG_DEBUG("slice " << &s << " failed (" << to_string(e) << "), retry " << int(s.retries) << " on "
                          << contexts_[next.local]->name() << " -> " << *s.peer_path << (next.probe ? " (probe)" : ""));
  dispatch_one(s);
}

template <class P>
void rdma_transport<P>::to_carrier(detail::slice& s) noexcept {
  detail::release_charge(s, false);
  s.stager = nullptr;  // the carrier looks its stager up by address
  s.ep = nullptr;
  s.rail = nullptr;
  s.probe = false;
  s.next = nullptr;
  detail::note_carried_wr(s, detail::steady_now_ns());
  carrier_->carry(s);
}

template <class P>
void rdma_transport<P>::carried(detail::slice& s, errc e) noexcept {
  if (e == errc::ok) [[likely]] {
    detail::retire_wr(s, e);
    return;
  }
  detail::task_state& t = *s.task;
  if (e == errc::remote_access_error) {
    // As an rkey the peer rejected: its buffers may have changed.
    std::shared_lock lock(seg_mu_);
    if (t.target < segments_.size()) segments_[t.target]->stale.store(true, std::memory_order_relaxed);
  }
  // A connection that closed or stalled under the request: another one
  // may carry it, within the deadline and max_retry.
  const bool again = e == errc::connection_lost && !stopping_.load(std::memory_order_acquire) &&
                     detail::should_drop(s) == errc::ok && s.retries < cfg_.max_retry &&
                     detail::retry_timer::before_deadline(s, std::chrono::nanoseconds{0});
  if (again) {
    count_retry(s);
    detail::note_cause(t, e, nullptr);
    carrier_->carry(s);
    return;
  }
  const errc why = detail::should_drop(s);
  detail::retire_wr(s, why != errc::ok && e == errc::connection_lost ? why : e);
}

template <class P>
void rdma_transport<P>::count_retry(detail::slice& s) noexcept {
  // Saturates: past max_retry a transient failure retries until the
  // deadline, which may be more than 255 rounds.
  if (s.retries != std::numeric_limits<decltype(s.retries)>::max()) ++s.retries;
  detail::note_retry(*s.task);
}

template <class P>
void rdma_transport<P>::retry_on_same_rail(detail::slice& s, errc e) noexcept {
  const std::chrono::nanoseconds delay = retry_timer_.backoff().delay(s.retries);
  // Counted before the park: once parked, the slice is the timer's.
  const std::uint8_t retries_before = s.retries;
  count_retry(s);
  if (delay.count() == 0) {
    resume_parked(s, e);
    return;
  }
  detail::task_state& t = *s.task;
  switch (retry_timer_.park(s, e, delay)) {
    case detail::retry_timer::park_result::parked: return;
    case detail::retry_timer::park_result::past_deadline:
    case detail::retry_timer::park_result::stopped:
    case detail::retry_timer::park_result::closed:
    case detail::retry_timer::park_result::no_resources: break;
  }
  // Not retried after all: the counts say so.
  s.retries = retries_before;
  t.retries.fetch_sub(1, std::memory_order_relaxed);
  const errc why = detail::should_drop(s);
  detail::retire_wr(s, why != errc::ok ? why : e);
}

template <class P>
void rdma_transport<P>::resume_parked(detail::slice& s, errc e) noexcept {
  if (stopping_.load(std::memory_order_acquire)) [[unlikely]] {
    detail::retire_wr(s, e);
    return;
  }
  // Its NIC went away while it waited: that is a failure of its own (the
  // rail learns it; another rail may take the slice).
  if (!contexts_[s.local_device]->active()) [[unlikely]] {
    on_failed(s, errc::context_inactive);
    return;
  }
  s.charged = &loads_[s.local_device];
  s.charged->dispatched(s.length, detail::steady_now_ns());
  dispatch_one(s);
}

template <class P>
plan::transport_stats rdma_transport<P>::stats(bool every_rail) const {
  plan::transport_stats out;
  for (std::size_t i = 0; i < contexts_.size(); ++i) {
    const plan::nic_load& l = loads_[i];
    out.nics.push_back({contexts_[i]->name(), l.bytes(), l.wrs(), l.errors(), l.inflight_bytes(), l.bandwidth(),
                        l.prior_bandwidth(), l.inflight_wrs(), contexts_[i]->bytes_staged()});
  }
  const auto peers = rails_.peer_names();
  for (std::uint32_t p = 0; p < peers.size(); ++p)
    for (std::size_t i = 0; i < contexts_.size(); ++i) {
      const auto snap = rails_.at(i, p).snapshot();
      if (every_rail || snap.failures != 0) out.rails.push_back({contexts_[i]->name(), peers[p], snap});
    }
  return out;
}

}  // namespace tide::rdma
