#pragma once
// Member definitions of rdma_transport<P>, part one (included by
// rdma_transport.hpp): setup and teardown, remote segments, and the
// resolution of a submit's requests.  Local memory is in
// transport_memory.hpp; planning, rail choice, dispatch and retry in
// transport_dispatch.hpp; the passive handshake in transport_connect.hpp.

namespace tide::rdma {

template <class P>
result<std::unique_ptr<rdma_transport<P>>> rdma_transport<P>::create(const transport_config& cfg,
                                                                     handshake_sender send, publish_fn publish,
                                                                     refresh_fn refresh, peer_gid_fn peer_gid) {
  if (cfg.slice_size == 0 || cfg.slice_size > (1u << 30))
    return fail(errc::config_invalid, "slice_size must be 1..1 GiB, got " + std::to_string(cfg.slice_size));
  if (cfg.fragment_limit > cfg.slice_size)
    return fail(errc::config_invalid, "fragment_limit must be <= slice_size");
  // A slice counts its retries in 8 bits (saturating); Mooncake's MC_RETRY_CNT takes up to 127.
  if (cfg.max_retry > 255) return fail(errc::config_invalid, "max_retry must be <= 255");
  auto batches = batch_table::create(cfg.max_batches, cfg.max_tasks_per_batch);
  if (!batches) return fail(batches.error());
  std::unique_ptr<rdma_transport> t(new rdma_transport(cfg));
  t->batches_ = std::move(*batches);
  t->publish_ = std::move(publish);
  t->refresh_ = std::move(refresh);
  t->peer_gid_ = std::move(peer_gid);
  std::map<std::string, int> hca_numa;  // device -> sysfs numa_node (finding 17)
  if (auto hcas = topology::scan_hcas(cfg.context.sysfs_root))
    for (const auto& h : *hcas) hca_numa[h.name] = h.numa_node;
  if (!cfg.rdma) {
    // No context: the descriptor lists no device and the carrier takes every request.
  } else if (!cfg.custom_topology_json.empty()) {
    auto m = topology::priority_matrix::from_json(cfg.custom_topology_json);
    if (!m) return fail(errc::config_invalid, "custom topology: " + m.error().detail);
    t->matrix_ = std::move(*m);
  } else {
    auto hcas = topology::scan_hcas(cfg.context.sysfs_root);
    if (!hcas) return fail(hcas.error());
    std::vector<topology::hca_info> use;
    for (auto& h : *hcas)
      if (cfg.devices.empty() || std::find(cfg.devices.begin(), cfg.devices.end(), h.name) != cfg.devices.end())
        use.push_back(h);
    for (const auto& want : cfg.devices)
      if (std::none_of(use.begin(), use.end(), [&](const auto& h) { return h.name == want; }))
        return fail(errc::device_not_found, "device " + want + " is not an RDMA device of this host");
    if (use.empty() && !cfg.allow_no_devices) return fail(errc::no_device, "no RDMA device on this host");
    if (!use.empty())
      t->matrix_ = topology::priority_matrix::from_hcas(use, topology::scan_numa_nodes(cfg.context.sysfs_root),
                                                        memory::locate_cuda_gpus(cfg.context.sysfs_root));
  }
  if (t->matrix_.devices().size() > kMaxContexts)
    return fail(errc::config_invalid, "at most " + std::to_string(kMaxContexts) + " devices");
  t->plan_cfg_.slice_size = cfg.slice_size;
  t->plan_cfg_.fragment_limit = cfg.fragment_limit;
  t->plan_cfg_.max_wrs_write = cfg.max_wrs_write;
  t->plan_cfg_.max_wrs_read = cfg.max_wrs_read;
  t->plan_cfg_.max_msg_size = cfg.max_msg_size;
  t->plan_cfg_.inline_limit = cfg.inline_limit;
  t->plan_cfg_.coalesce = cfg.coalesce;
  if (auto r = t->plan_cfg_.validate(); !r) return fail(r.error());
  // The carrier has no device limit on a WR's size, and nothing goes inline.
  t->carrier_plan_cfg_ = t->plan_cfg_;
  t->carrier_plan_cfg_.slice_size = std::max<std::size_t>(cfg.carrier_slice_size, cfg.slice_size);
  t->carrier_plan_cfg_.inline_limit = 0;
  if (auto r = t->carrier_plan_cfg_.validate(); !r) return fail(errc::config_invalid, "tcp slicing: " + r.error().detail);
  if (auto r = cfg.rail.validate(); !r) return fail(r.error());
  // Prior bandwidth of each NIC: its port's rate in sysfs (speed x width).
  const std::size_t ndev = t->matrix_.devices().size();
  t->loads_.reset(new plan::nic_load[ndev]);
  if (auto hcas = topology::scan_hcas(cfg.context.sysfs_root)) {
    for (std::size_t i = 0; i < ndev; ++i)
      for (const auto& h : *hcas)
        if (h.name == t->matrix_.devices()[i])
          for (const auto& port : h.ports)
            if (port.number == cfg.context.port) t->loads_[i].set_prior(plan::rate_text_to_bps(port.rate));
  }
  t->paths_.emplace(t->rails_, std::span<plan::nic_load>(t->loads_.get(), ndev));
  rdma_transport* self = t.get();
  for (std::size_t i = 0; i < t->matrix_.devices().size(); ++i) {
    context_config cc = cfg.context;
    cc.device = t->matrix_.devices()[i];
    typename context_type::hooks h{send, [self](detail::slice& s, errc e) { self->on_failed(s, e); }, cfg.on_notify};
    // A receive completion must wake the lane: an idle strategy that sleeps
    // without watching the CQ (hybrid) would sit on a notification for up to
    // its sleep, so its endpoints advertise none (the peer uses TCP).
    if (!cfg.on_notify || !detail::kIdleWaitsOnCq<P>) cc.notify_credits = 0;
    if (hca_numa.count(cc.device) != 0) cc.numa_node = hca_numa[cc.device];  // lanes run on their NIC's node
    auto c = context_type::create(cc, static_cast<std::uint16_t>(i), std::move(h));
    if (!c) return fail(c.error());
    if (cfg.slice_size > (*c)->max_msg_size())
      return fail(errc::config_invalid, "slice_size " + std::to_string(cfg.slice_size) + " is above " + cc.device +
                                            "'s max_msg_sz " + std::to_string((*c)->max_msg_size()));
    t->contexts_.push_back(std::move(*c));
  }
  // No WR longer than any device takes.
  for (const auto& c : t->contexts_) t->plan_cfg_.max_msg_size = std::min<std::uint64_t>(t->plan_cfg_.max_msg_size, c->max_msg_size());
  if (auto r = t->plan_cfg_.validate(); !r) return fail(r.error());
  // A staged WR fits one chunk: slices never grow past it, and no tail joins one.
  t->stage_plan_cfg_ = t->plan_cfg_;
  t->stage_plan_cfg_.slice_size = std::min<std::uint64_t>(cfg.context.stage_chunk_size, t->plan_cfg_.max_msg_size);
  t->stage_plan_cfg_.fragment_limit = 0;
  t->stage_plan_cfg_.max_wrs_write = t->stage_plan_cfg_.max_wrs_read = std::numeric_limits<std::uint32_t>::max();
  if (auto r = t->stage_plan_cfg_.validate(); !r) return fail(errc::config_invalid, "stage_chunk_size: " + r.error().detail);
  return t;
}

template <class P>
void rdma_transport<P>::shutdown() noexcept {
  // Retries stop first, and every context turns inactive before any of them
  // shuts down: a slice flushed while the lanes drain is retired, never
  // handed to a lane (of this context or another) that has stopped or is
  // about to (review turn 3, finding 2).  Parked slices retire now, with
  // their failures, instead of waiting out their backoff; the timer's
  // thread is joined first, so a retry it was handing to a lane got there
  // before any lane stops.
  stopping_.store(true, std::memory_order_release);
  retry_timer_.close();
  for (auto& c : contexts_) c->begin_stop();
  for (auto& c : contexts_) c->shutdown();
}

template <class P>
rdma_transport<P>::~rdma_transport() {
  // Workers stop and endpoints go first (nothing touches batches or MRs
  // afterwards), then the MRs, then the PDs and devices.
  shutdown();
  local_.clear();
  withdrawn_.clear();
  contexts_.clear();
}

// ---------------------------------------------------------------- segments

template <class P>
status rdma_transport<P>::set_segment(segment_id id, const segment_desc& d) {
  auto seg = remote_segment::resolve(d);
  if (!seg) return fail(seg.error());
  std::unique_lock lock(seg_mu_);
  while (segments_.size() <= id) segments_.push_back(std::make_unique<segment_slot>());
  segment_slot& slot = *segments_[id];
  set_rail_map(slot, **seg, d);
  if (!slot.view) slot.opened_incarnation = (*seg)->incarnation;  // opened (again)
  slot.view = std::move(*seg);
  return {};
}

template <class P>
std::size_t rdma_transport<P>::segment_inflight(segment_id id) const noexcept {
  std::shared_lock lock(seg_mu_);
  return id < segments_.size() ? segments_[id]->inflight.load(std::memory_order_acquire) : 0;
}

template <class P>
status rdma_transport<P>::quiesce_segment(segment_id id, in_flight mode) noexcept {
  segment_slot* slot = nullptr;
  {
    std::shared_lock lock(seg_mu_);
    if (id < segments_.size()) slot = segments_[id].get();
  }
  if (slot == nullptr) return {};
  const std::size_t n = slot->inflight.load(std::memory_order_acquire);
  if (n == 0) return {};
  try {
    if (mode == in_flight::reject)
      return fail(errc::busy, "close_segment: " + std::to_string(n) + " slice(s) of submitted transfers to segment " +
                                  std::to_string(id) + " in flight; wait for them, or pass tide::in_flight::drain or "
                                  "in_flight::cancel");
    if (mode == in_flight::cancel) {
      const std::atomic<std::size_t>* counter = &slot->inflight;
      batches_->cancel_where([counter](const detail::task_state& t) { return t.segment_inflight == counter; });
    }
    if (!drain(slot->inflight))
      return fail(errc::busy, "close_segment: " + std::to_string(slot->inflight.load()) + " slice(s) to segment " +
                                  std::to_string(id) + " did not finish within transfer_timeout + 10 s");
  } catch (const std::bad_alloc&) {
    return fail(error{errc::busy, {}});
  }
  return {};
}

template <class P>
void rdma_transport<P>::drop_segment(segment_id id) {
  std::shared_ptr<const remote_segment> old;
  std::vector<const std::string*> unused;  // paths of `old` no other open segment has
  {
    std::unique_lock lock(seg_mu_);
    if (id < segments_.size()) old = std::move(segments_[id]->view);
    if (old)
      for (const auto& path : old->nic_paths) {
        // Another open segment with the same rdma_server_name reaches the
        // same NICs: closing this one must not flush its traffic (finding 21).
        bool shared = false;
        for (std::size_t j = 0; j < segments_.size() && !shared; ++j)
          if (const auto& v = segments_[j]->view; v)
            shared = std::find(v->nic_paths.begin(), v->nic_paths.end(), path) != v->nic_paths.end();
        if (!shared) unused.push_back(&path);
      }
  }
  // Its endpoints go too (those with work in flight drain first).
  for (auto& c : contexts_)
    for (const std::string* path : unused) c->close_endpoint(*path);
}

// ---------------------------------------------------------------- batches

template <class P>
status rdma_transport<P>::submit(batch_id id, std::span<const transfer_request> requests,
                                 detail::task_group* group) noexcept {
  try {
    return submit_or_throw(id, requests, group);
  } catch (const std::bad_alloc&) {
    // Every allocation happens before the batch or a counter changes, so
    // nothing was submitted.  No detail: building one could throw again.
    return fail(error{errc::out_of_memory, {}});
  } catch (...) {
    return fail(error{errc::out_of_memory, {}});
  }
}

// May throw std::bad_alloc, and only before it changes anything: the scratch
// vector and the tasks' slice vectors are sized before the first task or
// in-flight counter is touched.
template <class P>
status rdma_transport<P>::submit_or_throw(batch_id id, std::span<const transfer_request> requests,
                                          detail::task_group* group) {
  detail::batch_state* b = batches_->lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "submit: unknown batch " + std::to_string(id));
  std::lock_guard submit_lock(b->submit_mu);
  if (!batch_table::still(*b, id)) return fail(errc::unknown_batch, "submit: batch " + std::to_string(id) + " was freed");
  // Its tasks would be dropped as CANCELED without a word (finding 13).
  if (b->canceled.load(std::memory_order_acquire))
    return fail(errc::canceled, "submit: batch " + std::to_string(id) + " was canceled; free it and allocate another");
  const std::size_t used = b->used.load(std::memory_order_relaxed);
  if (requests.size() > b->capacity - used)
    return fail(errc::batch_full, "submit: " + std::to_string(requests.size()) + " request(s) but the batch has room for " +
                                      std::to_string(b->capacity - used));
  if (requests.empty()) return {};

  // Small batches resolve on the stack; big ones allocate once per submit.
  std::array<resolved_request, 32> small;
  std::vector<resolved_request> big;
  std::span<resolved_request> res;
  if (requests.size() <= small.size()) {
    res = std::span<resolved_request>(small.data(), requests.size());
  } else {
    big.resize(requests.size());
    res = big;
  }

  // A forced refresh is a metadata round trip (in p2p mode a TCP exchange
  // with the peer, bounded by metadata_timeout): at most one per target per
  // submit, and never with the local buffer table locked, which would stall
  // every register/unregister meanwhile (review turn 3, finding 8).  The
  // batch's submit mutex stays held: the batch cannot go away under us.
  std::vector<segment_id> wanted;
  for (int pass = 0;; ++pass) {
    std::shared_lock local_lock(local_mu_);
    const bool may_refresh = pass == 0 && refresh_;
    if (auto st = resolve_all(requests, res, may_refresh ? &wanted : nullptr); !st) return st;
    // The local buffer table stays shared-locked through planning: res[].local points into it.
    if (wanted.empty()) return plan_and_dispatch(*b, used, requests, res, group);
    local_lock.unlock();
    // A failed refresh leaves the old view: the second pass then reports
    // what is wrong with the request against it.
    for (const segment_id target : wanted) (void)refresh_(target);
    wanted.clear();
  }
}

template <class P>
status rdma_transport<P>::resolve_all(std::span<const transfer_request> requests, std::span<resolved_request> res,
                                      std::vector<segment_id>* wanted) {
  auto want = [&](segment_id target) {
    if (std::find(wanted->begin(), wanted->end(), target) == wanted->end()) wanted->push_back(target);
  };
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    auto where = [&] { return "request " + std::to_string(i) + ": "; };
    if (r.length == 0) return fail(errc::zero_length, where() + "length 0");
    const auto src = reinterpret_cast<std::uint64_t>(r.source);
    res[i].local = find_local(src, r.length);
    if (res[i].local == nullptr)
      return fail(errc::unregistered_source, where() + "source [" + std::to_string(src) + ", +" +
                                                 std::to_string(r.length) + ") is not inside registered memory");
    std::optional<std::uint64_t> opened_incarnation;
    {
      std::shared_lock seg_lock(seg_mu_);
      res[i].slot = r.target < segments_.size() ? segments_[r.target].get() : nullptr;
      res[i].seg = res[i].slot != nullptr ? res[i].slot->view : nullptr;
      if (res[i].slot != nullptr) opened_incarnation = res[i].slot->opened_incarnation;
    }
    // The peer rejected one of this view's rkeys: read its descriptor again
    // first, so a buffer it unregistered is out_of_bounds here.
    if (wanted != nullptr && res[i].slot != nullptr && res[i].slot->stale.load(std::memory_order_relaxed) &&
        res[i].slot->stale.exchange(false, std::memory_order_relaxed)) {
      want(r.target);
      continue;
    }
    if (!res[i].seg) return fail(errc::unknown_segment, where() + "segment " + std::to_string(r.target) + " is not open");
    const remote_segment& seg = *res[i].seg;
    if (r.buffer != transfer_request::kRawAddress) {
      // Ids count from 0 in every incarnation: after a restart this id
      // names another buffer of another process, or none.
      if (seg.incarnation != opened_incarnation) [[unlikely]]
        return fail(errc::unknown_segment, where() + "segment " + seg.name + " restarted since segment " +
                                               std::to_string(r.target) + " was opened (another incarnation): its "
                                               "buffer ids name the new process's buffers now; close_segment and "
                                               "open_segment it again and use the new ids");
      const int idx = seg.find_id(r.buffer);
      // The forced refresh: the peer may have registered the buffer since.
      if (idx < 0 && wanted != nullptr) {
        want(r.target);
        continue;
      }
      if (idx < 0)
        return fail(errc::out_of_bounds, where() + "segment " + seg.name + " has no buffer with id " +
                                             std::to_string(r.buffer) + " (never registered, or unregistered)");
      const auto& pb = seg.buffers[static_cast<std::size_t>(idx)];
      if (r.target_offset > pb.length || r.length > pb.length - r.target_offset)
        return fail(errc::out_of_bounds, where() + "offset " + std::to_string(r.target_offset) + " + length " +
                                             std::to_string(r.length) + " exceeds buffer id " + std::to_string(r.buffer) +
                                             " of " + seg.name + " (" + std::to_string(pb.length) + " bytes)");
      res[i].peer_buffer = idx;
      res[i].remote_addr = pb.addr + r.target_offset;
    } else {
      res[i].peer_buffer = seg.find(r.target_offset, r.length);
      res[i].remote_addr = r.target_offset;
    }
    if (res[i].peer_buffer < 0) {
      // The seeds' forced refresh: the peer may have registered more memory since.
      if (wanted != nullptr) {
        want(r.target);
        continue;
      }
      return fail(errc::out_of_bounds, where() + "[" + std::to_string(r.target_offset) + ", +" + std::to_string(r.length) +
                                           ") is outside every buffer of segment " + seg.name);
    }
    // What the owner's descriptor grants; the NIC enforces the same through its MR.
    const buffer_access a = seg.buffers[static_cast<std::size_t>(res[i].peer_buffer)].access;
    if (!(r.op == transfer_op::write ? allows_write(a) : allows_read(a))) [[unlikely]]
      return fail(errc::remote_access_denied,
                  where() + (r.op == transfer_op::write ? "WRITE into" : "READ from") + " buffer " +
                      std::to_string(res[i].peer_buffer) + " of " + seg.name + ", which allows " +
                      std::string(to_string(a)) + " only");
    if (carrier_only(res[i]) && !carrier_only(seg) && (carrier_ == nullptr || !carrier_->reaches(seg))) [[unlikely]]
      return fail(errc::peer_unreachable,
                  where() + (seg.buffers[static_cast<std::size_t>(res[i].peer_buffer)].tcp_only
                                 ? "buffer " + std::to_string(res[i].peer_buffer) + " of " + seg.name +
                                       " is reachable over TCP only"
                                 : std::string("the local buffer is reachable over TCP only (rdma_staging=0)")) +
                      " (memory no NIC registers), and " +
                      (carrier_ == nullptr ? std::string("TCP is not installed here") : seg.name + " serves no TCP"));
    if (carrier_only(seg) && (carrier_ == nullptr || !carrier_->reaches(seg))) [[unlikely]]
      return fail(errc::peer_unreachable,
                  where() + "no transport reaches segment " + seg.name +
                      (contexts_.empty() ? ": this engine has no RDMA device, and the peer publishes no TCP data port"
                                         : ": the peer has no RDMA device, and TCP is not installed here"));
  }
  return {};
}

}  // namespace tide::rdma
