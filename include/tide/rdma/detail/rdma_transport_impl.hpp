#pragma once
// Member definitions of rdma_transport<P>, part one (included by
// rdma_transport.hpp): setup and teardown, local memory, remote segments, and
// the resolution of a submit's requests.  Planning, rail choice, dispatch and
// retry are in transport_dispatch.hpp; the passive handshake in
// transport_connect.hpp.

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

// ---------------------------------------------------------------- memory

template <class P>
status rdma_transport<P>::register_memory(void* addr, std::size_t len, std::string_view location, bool do_publish,
                                          buffer_access access) {
  if (addr == nullptr) return fail(errc::invalid_argument, "register_memory: null address");
  if (len == 0) return fail(errc::zero_length, "register_memory: length 0");
  auto loc = topology::location::parse(location);
  if (!loc) return fail(loc.error());
  auto placed = memory::place(addr, len, *loc, location, cfg_.stage_host_memory);
  if (!placed) return fail(placed.error());
  if (placed->location != location) {
    loc = topology::location::parse(placed->location);
    if (!loc) return fail(loc.error());
  }
  auto b = std::make_unique<local_buffer>();
  b->addr = reinterpret_cast<std::uint64_t>(addr);
  b->length = len;
  b->location_text = std::move(placed->location);
  b->access = access;
  b->chooser = device_chooser::make(*loc, matrix_);
  b->kind = placed->info.kind;
  b->device = placed->info.device;
  b->stager = placed->stager;
  if (b->kind == memory::kind::host && cfg_.stage_host_memory && (carrier_ != nullptr || cfg_.rdma_staging) &&
      !contexts_.empty()) {
    // The staging switch: as GPU memory no NIC reaches (below).
    b->lkeys.assign(contexts_.size(), 0);
    b->nic_reachable = false;
  } else if (b->kind == memory::kind::host) {
    for (auto& c : contexts_) {
      auto mr = verbs::memory_region::register_memory(c->pd(), addr, len, mr_access(access));
      if (!mr) return fail(mr.error());
      b->lkeys.push_back(mr->lkey());
      b->mrs.push_back(std::move(*mr));
    }
  } else if (auto r = register_device_memory(*b, placed->info); !r) {
    return r;
  }
  {
    std::unique_lock lock(local_mu_);
    auto it = std::lower_bound(local_.begin(), local_.end(), b->addr,
                               [](const auto& x, std::uint64_t a) { return x->addr < a; });
    const bool overlaps_next = it != local_.end() && (*it)->addr < b->addr + len;
    const bool overlaps_prev = it != local_.begin() && (*(it - 1))->addr + (*(it - 1))->length > b->addr;
    if (overlaps_next || overlaps_prev)
      return fail(errc::already_registered, "register_memory: [" + std::to_string(b->addr) + ", +" +
                                                std::to_string(len) + ") overlaps a registered buffer");
    // Ids are never reused: a peer may still hold one of a buffer long gone.
    if (next_buffer_id_ == transfer_request::kRawAddress)
      return fail(errc::resource_exhausted, "register_memory: all 2^32-1 buffer ids of this engine are used");
    b->id = next_buffer_id_++;
    if (access != buffer_access::local_only) changes_.push_back({true, published_entry(*b)});
    local_.insert(it, std::move(b));
    ++local_gen_;
  }
  return do_publish ? publish() : status{};
}

template <class P>
status rdma_transport<P>::register_device_memory(local_buffer& b, const memory::range_info& info) {
  if (contexts_.empty()) return {};  // TCP alone: it stages through b.stager
  // Per NIC: dma-buf where the provider takes it (one export serves every
  // NIC: one BAR1 window), else ibv_reg_mr where a peer-memory module lets
  // the NIC pin device pages.  A NIC that can do neither cannot reach the
  // buffer, and the error says for each one what was tried.
  std::optional<memory::dmabuf> exported;
  std::string exported_error;
  std::string refusals;
  const bool peermem = memory::peermem_loaded();
  auto keep = [&b](verbs::memory_region& mr) {
    b.lkeys.push_back(mr.lkey());
    b.mrs.push_back(std::move(mr));
  };
  for (std::size_t i = 0; i < contexts_.size(); ++i) {
    auto& c = *contexts_[i];
    std::string why = c.name() + ": ";
    if (const verbs::dmabuf_support d = dmabuf_support(i); d.supported) {
      if (!exported && exported_error.empty()) {
        auto e = memory::dmabuf::export_range(info, b.addr, b.length);
        if (e) exported = std::move(*e);
        else exported_error = e.error().detail;
      }
      if (exported) {
        auto mr = verbs::memory_region::register_dmabuf(c.pd(), exported->fd(), exported->offset(), b.length, b.addr,
                                                        mr_access(b.access));
        if (mr) {
          keep(*mr);
          continue;
        }
        why += "dma-buf registration failed (" + mr.error().detail + ")";
      } else {
        why += "dma-buf export failed (" + exported_error + ")";
      }
    } else {
      why += std::string("no dma-buf support (probe: ") + std::strerror(d.error) + ")";
    }
    if (peermem) {
      auto mr = verbs::memory_region::register_memory(c.pd(), reinterpret_cast<void*>(b.addr), b.length,
                                                      mr_access(b.access));
      if (mr) {
        keep(*mr);
        continue;
      }
      why += "; ibv_reg_mr with nvidia_peermem failed (" + mr.error().detail + ")";
    } else {
      why += "; no nvidia_peermem module for ibv_reg_mr";
    }
    refusals += (refusals.empty() ? "" : "; ") + why;
  }
  if (refusals.empty()) return {};
  if (carrier_ != nullptr || cfg_.rdma_staging) {
    // Registered on no NIC and staged: this engine's requests go over RDMA
    // through the lanes' chunks (or TCP), peers reach it over TCP only.
    TIDE_LOG_WARN("register_memory: " << b.location_text << " buffer [" << b.addr << ", +" << b.length << ") is "
                                      << (cfg_.rdma_staging ? "staged through host chunks for RDMA" : "moved over TCP")
                                      << (carrier_ != nullptr ? "; peers reach it over TCP only: "
                                                              : "; peers cannot reach it (TCP is off): ")
                                      << refusals);
    b.mrs.clear();
    b.lkeys.assign(contexts_.size(), 0);
    b.nic_reachable = false;
    return {};
  }
  return fail(errc::memory_unsupported,
              "register_memory: " + b.location_text + " buffer [" + std::to_string(b.addr) + ", +" +
                  std::to_string(b.length) + ") cannot be registered on every NIC: " + refusals +
                  ", and both staged paths are off (rdma_staging=0, no tcp in transports): turn one on, or set "
                  "devices= the NICs that reach it");
}

template <class P>
verbs::dmabuf_support rdma_transport<P>::dmabuf_support(std::size_t context) const {
  // Probed once per NIC, on the first device-memory registration.
  std::lock_guard lock(dmabuf_mu_);
  if (dmabuf_probes_.size() < contexts_.size()) dmabuf_probes_.resize(contexts_.size());
  auto& p = dmabuf_probes_[context];
  if (!p) p = verbs::probe_dmabuf(contexts_[context]->pd());
  return *p;
}

template <class P>
bool rdma_transport<P>::drain(const std::atomic<std::size_t>& count) noexcept {
  const auto until = std::chrono::steady_clock::now() + cfg_.transfer_timeout + std::chrono::seconds(10);
  auto next_expiry = std::chrono::steady_clock::now();
  while (count.load(std::memory_order_acquire) != 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now > until) return false;
    // Tasks past their deadline stop (their unposted slices drop) even when
    // nobody polls their batch.
    if (now >= next_expiry) {
      batches_->expire_all();
      next_expiry = now + std::chrono::milliseconds(50);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

template <class P>
status rdma_transport<P>::unregister_memory(void* addr, bool do_publish, in_flight mode) {
  const auto a = reinterpret_cast<std::uint64_t>(addr);
  auto busy = [&](std::size_t n, const char* what) {
    return fail(errc::busy, "unregister_memory: " + std::to_string(n) + " slice(s) of submitted transfers " + what +
                                " buffer " + std::to_string(a) +
                                "; wait for them, or pass tide::in_flight::drain or in_flight::cancel");
  };
  local_buffer* b = nullptr;
  {
    std::unique_lock lock(local_mu_);
    auto it = std::find_if(local_.begin(), local_.end(), [&](const auto& x) { return x->addr == a; });
    if (it == local_.end() || (*it)->closing.load(std::memory_order_relaxed))
      return fail(errc::not_registered, "unregister_memory: no buffer starts at " + std::to_string(a));
    b = it->get();
    // Submits count under the shared lock, so this count is exact.
    const std::size_t n = b->inflight.load(std::memory_order_acquire);
    if (n != 0 && mode == in_flight::reject) return busy(n, "still use");
    b->closing.store(true, std::memory_order_relaxed);  // submit and retries treat it as gone
  }
  if (mode == in_flight::cancel) {
    const std::atomic<std::size_t>* counter = &b->inflight;
    batches_->cancel_where([counter](const detail::task_state& t) { return t.local_inflight == counter; });
  }
  if (!drain(b->inflight)) {
    b->closing.store(false, std::memory_order_relaxed);
    return busy(b->inflight.load(), "did not finish within transfer_timeout + 10 s on");
  }
  std::unique_ptr<local_buffer> gone;
  {
    std::unique_lock lock(local_mu_);
    auto it = std::find_if(local_.begin(), local_.end(), [&](const auto& x) { return x.get() == b; });
    gone = std::move(*it);
    local_.erase(it);
    ++local_gen_;
    if (gone->access != buffer_access::local_only) {
      buffer_change c;
      c.buffer.id = gone->id;
      changes_.push_back(std::move(c));
    }
  }
  {
    // No WR of ours uses the MRs any more; they deregister in the next
    // publish, after the descriptor without them is stored.
    std::lock_guard lock(publish_mu_);
    withdrawn_.push_back(std::move(gone));
  }
  return do_publish ? publish() : status{};
}

template <class P>
result<std::uint32_t> rdma_transport<P>::buffer_id(const void* addr) const {
  std::shared_lock lock(local_mu_);
  const auto a = reinterpret_cast<std::uint64_t>(addr);
  for (const auto& b : local_)
    if (b->addr == a && !b->closing.load(std::memory_order_relaxed)) return b->id;
  return fail(errc::not_registered, "buffer_id: no buffer starts at " + std::to_string(a));
}

template <class P>
std::size_t rdma_transport<P>::registered_buffers() const {
  std::shared_lock lock(local_mu_);
  return local_.size();
}

template <class P>
segment_desc rdma_transport<P>::local_segment() const {
  segment_desc d = local_header();
  std::shared_lock lock(local_mu_);
  // In id (= registration) order, so a peer that indexes buffers[] (no ids)
  // sees the order they were registered in.
  std::vector<const local_buffer*> by_id;
  for (const auto& b : local_) by_id.push_back(b.get());
  std::sort(by_id.begin(), by_id.end(), [](const local_buffer* x, const local_buffer* y) { return x->id < y->id; });
  for (const local_buffer* b : by_id) {
    if (b->access == buffer_access::local_only) continue;  // never published
    d.buffers.push_back(published_entry(*b));
  }
  d.timestamp = current_timestamp();
  return d;
}

template <class P>
segment_desc rdma_transport<P>::local_header() const {
  segment_desc d;
  d.name = cfg_.context.local_server_name;
  // Mooncake's initiators route by this field: "tcp" only where no NIC serves.
  d.protocol = contexts_.empty() ? "tcp" : "rdma";
  if (cfg_.tcp_data_port != 0) {
    d.tcp_data_port = cfg_.tcp_data_port;
    d.tcp_proto_version = cfg_.tcp_proto_version;
  }
  for (const auto& c : contexts_) {
    device_desc dev;
    dev.name = c->name();
    dev.lid = c->lid();
    dev.gid.raw = c->gid().raw;
    d.devices.push_back(std::move(dev));
  }
  for (const auto& [key, lists] : matrix_.lists()) d.priority[key] = priority_entry{lists.first, lists.second};
  return d;
}

template <class P>
buffer_desc rdma_transport<P>::published_entry(const local_buffer& b) {
  buffer_desc bd;
  bd.id = b.id;
  bd.access = b.access;
  bd.name = b.location_text;
  bd.addr = b.addr;
  bd.length = b.length;
  bd.lkey = b.lkeys;
  for (const auto& mr : b.mrs) bd.rkey.push_back(mr.rkey());
  if (!b.nic_reachable) {
    bd.rkey.assign(b.lkeys.size(), 0);  // one per device, as every reader expects
    bd.tcp_only = true;
  }
  return bd;
}

template <class P>
status rdma_transport<P>::publish() {
  std::lock_guard lock(publish_mu_);
  std::uint64_t gen = 0;
  std::vector<buffer_change> changes;
  {
    std::unique_lock local_lock(local_mu_);
    gen = local_gen_;
    changes.swap(changes_);
  }
  // The header is a few entries per NIC: taken anew, as the buffers once were.
  segment_desc head = local_header();
  if (published_) head.buffers = std::move(published_->buffers);
  published_ = std::move(head);
  // published_ holds every change up to `gen` even when the store refuses
  // it below: the next publish retries with the state as it is then.
  auto& list = published_->buffers;
  for (auto& c : changes) {
    if (c.added) {
      list.push_back(std::move(c.buffer));  // ids only grow: the list stays in id order
      continue;
    }
    auto at = std::lower_bound(list.begin(), list.end(), *c.buffer.id,
                               [](const buffer_desc& b, std::uint32_t id) { return *b.id < id; });
    if (at != list.end() && *at->id == *c.buffer.id) list.erase(at);
  }
  status r{};
  // A concurrent publish may already have stored this state (or a newer one).
  if (gen != published_gen_ && publish_) {
    published_->timestamp = current_timestamp();
    r = publish_(*published_);
    if (r) published_gen_ = gen;
  }
  // Whether or not the store took it: the caller of unregister_memory owns
  // the memory again when it returns.
  withdrawn_.clear();
  return r;
}

template <class P>
const local_buffer* rdma_transport<P>::find_local(std::uint64_t addr, std::uint64_t len) const noexcept {
  auto it = std::upper_bound(local_.begin(), local_.end(), addr,
                             [](std::uint64_t a, const auto& x) { return a < x->addr; });
  if (it == local_.begin()) return nullptr;
  const local_buffer& b = **(it - 1);
  if (len > b.length || addr - b.addr > b.length - len) return nullptr;
  if (b.closing.load(std::memory_order_relaxed)) return nullptr;
  return &b;
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

// ---------------------------------------------------------------- another transport

template <class P>
errc rdma_transport<P>::open_local_range(std::uint64_t addr, std::uint64_t len, transfer_op op, void*& handle,
                                         const memory::copy_engine*& stager) noexcept {
  std::shared_lock lock(local_mu_);
  const local_buffer* b = find_local(addr, len);
  if (b == nullptr) return errc::out_of_bounds;
  if (b->closing.load(std::memory_order_relaxed)) return errc::busy;
  if (!(op == transfer_op::write ? allows_write(b->access) : allows_read(b->access))) return errc::remote_access_denied;
  // Under the shared lock, as a submit counts: unregister_memory's count is exact.
  b->inflight.fetch_add(1, std::memory_order_relaxed);
  handle = const_cast<local_buffer*>(b);
  stager = b->stager;
  return errc::ok;
}

template <class P>
const memory::copy_engine* rdma_transport<P>::stager_of(std::uint64_t addr, std::uint64_t len) const noexcept {
  std::shared_lock lock(local_mu_);
  const local_buffer* b = find_local(addr, len);
  return b != nullptr ? b->stager : nullptr;
}

template <class P>
void rdma_transport<P>::close_local_range(void* handle) noexcept {
  // Release: the bytes moved happen before a drain sees 0 (acquire there).
  static_cast<local_buffer*>(handle)->inflight.fetch_sub(1, std::memory_order_release);
}

}  // namespace tide::rdma
