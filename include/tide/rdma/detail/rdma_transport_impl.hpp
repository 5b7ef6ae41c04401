#pragma once
// Member definitions of rdma_transport<P> (included by rdma_transport.hpp).

namespace tide::rdma {

namespace detail {
inline batch_id make_batch_id(std::uint32_t slot, std::uint64_t generation) noexcept {
  return (generation << 32) | slot;
}
}  // namespace detail

template <class P>
result<std::unique_ptr<rdma_transport<P>>> rdma_transport<P>::create(const transport_config& cfg,
                                                                     handshake_sender send, publish_fn publish,
                                                                     refresh_fn refresh, peer_gid_fn peer_gid) {
  if (cfg.slice_size == 0 || cfg.slice_size > (1u << 30))
    return fail(errc::config_invalid, "slice_size must be 1..1 GiB, got " + std::to_string(cfg.slice_size));
  if (cfg.fragment_limit > cfg.slice_size)
    return fail(errc::config_invalid, "fragment_limit must be <= slice_size");
  if (cfg.max_batches == 0 || cfg.max_batches > (1u << 24))
    return fail(errc::config_invalid, "max_batches must be 1..2^24");
  if (cfg.max_retry > 64) return fail(errc::config_invalid, "max_retry must be <= 64");
  std::unique_ptr<rdma_transport> t(new rdma_transport(cfg));
  t->publish_ = std::move(publish);
  t->refresh_ = std::move(refresh);
  t->peer_gid_ = std::move(peer_gid);
  if (!cfg.custom_topology_json.empty()) {
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
    if (use.empty()) return fail(errc::no_device, "no RDMA device on this host");
    t->matrix_ = topology::priority_matrix::from_hcas(use, topology::scan_numa_nodes(cfg.context.sysfs_root));
  }
  if (t->matrix_.devices().size() > kMaxContexts)
    return fail(errc::config_invalid, "at most " + std::to_string(kMaxContexts) + " devices");
  rdma_transport* self = t.get();
  for (std::size_t i = 0; i < t->matrix_.devices().size(); ++i) {
    context_config cc = cfg.context;
    cc.device = t->matrix_.devices()[i];
    typename context_type::hooks h{send, [self](detail::slice& s, errc e) { self->on_failed(s, e); }};
    auto c = context_type::create(cc, static_cast<std::uint16_t>(i), std::move(h));
    if (!c) return fail(c.error());
    t->contexts_.push_back(std::move(*c));
  }
  t->slots_.reset(new std::unique_ptr<detail::batch_state>[cfg.max_batches]);
  return t;
}

template <class P>
rdma_transport<P>::~rdma_transport() {
  // Workers stop and endpoints go first (nothing touches batches or MRs
  // afterwards), then the MRs, then the PDs and devices.
  for (auto& c : contexts_) c->shutdown();
  local_.clear();
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
  auto b = std::make_unique<local_buffer>();
  b->addr = reinterpret_cast<std::uint64_t>(addr);
  b->length = len;
  b->location_text = std::string(location);
  b->access = access;
  b->chooser = device_chooser::make(*loc, matrix_);
  for (auto& c : contexts_) {
    auto mr = verbs::memory_region::register_memory(c->pd(), addr, len, mr_access(access));
    if (!mr) return fail(mr.error());
    b->lkeys.push_back(mr->lkey());
    b->mrs.push_back(std::move(*mr));
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
    local_.insert(it, std::move(b));
  }
  return do_publish ? publish() : status{};
}

template <class P>
status rdma_transport<P>::unregister_memory(void* addr, bool do_publish) {
  std::unique_ptr<local_buffer> gone;
  {
    std::unique_lock lock(local_mu_);
    const auto a = reinterpret_cast<std::uint64_t>(addr);
    auto it = std::find_if(local_.begin(), local_.end(), [&](const auto& x) { return x->addr == a; });
    if (it == local_.end())
      return fail(errc::not_registered, "unregister_memory: no buffer starts at " + std::to_string(a));
    gone = std::move(*it);
    local_.erase(it);
  }
  gone.reset();  // the MRs deregister here
  return do_publish ? publish() : status{};
}

template <class P>
std::size_t rdma_transport<P>::registered_buffers() const {
  std::shared_lock lock(local_mu_);
  return local_.size();
}

template <class P>
segment_desc rdma_transport<P>::local_segment() const {
  segment_desc d;
  d.name = cfg_.context.local_server_name;
  d.protocol = "rdma";
  for (const auto& c : contexts_) {
    device_desc dev;
    dev.name = c->name();
    dev.lid = c->lid();
    dev.gid.raw = c->gid().raw;
    d.devices.push_back(std::move(dev));
  }
  for (const auto& [key, lists] : matrix_.lists()) d.priority[key] = priority_entry{lists.first, lists.second};
  std::shared_lock lock(local_mu_);
  for (const auto& b : local_) {
    if (b->access == buffer_access::local_only) continue;  // never published
    buffer_desc bd;
    bd.access = b->access;
    bd.name = b->location_text;
    bd.addr = b->addr;
    bd.length = b->length;
    bd.lkey = b->lkeys;
    for (const auto& mr : b->mrs) bd.rkey.push_back(mr.rkey());
    d.buffers.push_back(std::move(bd));
  }
  d.timestamp = current_timestamp();
  return d;
}

template <class P>
status rdma_transport<P>::publish() {
  return publish_ ? publish_(local_segment()) : status{};
}

template <class P>
const local_buffer* rdma_transport<P>::find_local(std::uint64_t addr, std::uint64_t len) const noexcept {
  auto it = std::upper_bound(local_.begin(), local_.end(), addr,
                             [](std::uint64_t a, const auto& x) { return a < x->addr; });
  if (it == local_.begin()) return nullptr;
  const local_buffer& b = **(it - 1);
  if (len > b.length || addr - b.addr > b.length - len) return nullptr;
  return &b;
}

// ---------------------------------------------------------------- segments

template <class P>
status rdma_transport<P>::set_segment(segment_id id, const segment_desc& d) {
  auto seg = remote_segment::resolve(d);
  if (!seg) return fail(seg.error());
  std::unique_lock lock(seg_mu_);
  if (segments_.size() <= id) segments_.resize(id + 1);
  segments_[id] = std::move(*seg);
  return {};
}

template <class P>
void rdma_transport<P>::drop_segment(segment_id id) {
  std::shared_ptr<const remote_segment> old;
  {
    std::unique_lock lock(seg_mu_);
    if (id < segments_.size()) old = std::move(segments_[id]);
  }
  // Its endpoints go too (those with work in flight drain first).
  if (old)
    for (auto& c : contexts_)
      for (const auto& path : old->nic_paths) c->close_endpoint(path);
}

// ---------------------------------------------------------------- batches

template <class P>
detail::batch_state* rdma_transport<P>::lookup(batch_id id) const noexcept {
  const auto slot = static_cast<std::uint32_t>(id & 0xffffffffu);
  if (slot >= cfg_.max_batches) return nullptr;
  detail::batch_state* b = slots_[slot].get();
  if (b == nullptr || !b->live.load(std::memory_order_acquire) || b->generation != (id >> 32)) return nullptr;
  return b;
}

template <class P>
result<batch_id> rdma_transport<P>::allocate_batch(std::size_t capacity) {
  if (capacity == 0) return fail(errc::capacity_zero, "allocate_batch: capacity 0");
  std::lock_guard lock(batch_mu_);
  // Reuse a free slot whose batch is big enough (the bench allocates one size over and over).
  for (std::size_t i = free_slots_.size(); i-- > 0;) {
    detail::batch_state* b = slots_[free_slots_[i]].get();
    if (b->capacity >= capacity && b->capacity <= capacity * 2) {
      const std::uint32_t slot = free_slots_[i];
      free_slots_.erase(free_slots_.begin() + static_cast<std::ptrdiff_t>(i));
      b->live.store(true, std::memory_order_release);
      return detail::make_batch_id(slot, b->generation);
    }
  }
  std::uint32_t slot;
  if (slot_count_ < cfg_.max_batches) {
    slot = static_cast<std::uint32_t>(slot_count_++);
  } else if (!free_slots_.empty()) {
    slot = free_slots_.front();  // too small: replace it
    free_slots_.erase(free_slots_.begin());
  } else {
    return fail(errc::resource_exhausted, "allocate_batch: " + std::to_string(cfg_.max_batches) + " batches alive");
  }
  const std::uint64_t gen = slots_[slot] ? slots_[slot]->generation + 1 : 1;
  slots_[slot] = std::make_unique<detail::batch_state>(capacity);
  slots_[slot]->generation = gen;
  slots_[slot]->live.store(true, std::memory_order_release);
  return detail::make_batch_id(slot, gen);
}

template <class P>
status rdma_transport<P>::free_batch(batch_id id) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "free_batch: unknown batch " + std::to_string(id));
  if (b->unfinished.load(std::memory_order_acquire) != 0) expire(*b);
  if (b->unfinished.load(std::memory_order_acquire) != 0)
    return fail(errc::batch_busy, "free_batch: " + std::to_string(b->unfinished.load()) + " task(s) unfinished");
  // The worker retiring the last slice drops `inflight` right after finishing its task.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (b->inflight.load(std::memory_order_acquire) != 0) {
    if (std::chrono::steady_clock::now() > until)
      return fail(errc::batch_busy, "free_batch: " + std::to_string(b->inflight.load()) +
                                        " slice(s) of finished tasks still in flight");
    std::this_thread::yield();
  }
  std::lock_guard lock(batch_mu_);
  {
    std::lock_guard wl(b->mu);  // a notifier still inside finish_task leaves first
  }
  for (std::size_t i = 0; i < b->used.load(std::memory_order_relaxed); ++i) {
    auto& t = b->tasks[i];
    t.keep_alive.reset();
    t.state.store(transfer_state::waiting, std::memory_order_relaxed);
  }
  b->used.store(0, std::memory_order_relaxed);
  b->canceled.store(false, std::memory_order_relaxed);
  b->live.store(false, std::memory_order_release);
  ++b->generation;
  free_slots_.push_back(static_cast<std::uint32_t>(id & 0xffffffffu));
  return {};
}

template <class P>
int rdma_transport<P>::pick_local(const local_buffer& b, std::uint64_t offset, unsigned retry,
                                  std::uint32_t rnd) const noexcept {
  const auto& e = b.chooser.entry_at(offset);
  const std::size_t n = contexts_.size();
  for (std::size_t k = 0; k <= n; ++k) {
    const int id = e.select(retry + static_cast<unsigned>(k), rnd);
    if (id >= 0 && static_cast<std::size_t>(id) < n && contexts_[static_cast<std::size_t>(id)]->active()) return id;
    if (retry == 0 && k == 0) retry = 1;
  }
  return -1;
}

template <class P>
status rdma_transport<P>::submit(batch_id id, std::span<const transfer_request> requests) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "submit: unknown batch " + std::to_string(id));
  std::lock_guard submit_lock(b->submit_mu);
  const std::size_t used = b->used.load(std::memory_order_relaxed);
  if (requests.size() > b->capacity - used)
    return fail(errc::batch_full, "submit: " + std::to_string(requests.size()) + " request(s) but the batch has room for " +
                                      std::to_string(b->capacity - used));
  if (requests.empty()) return {};

  struct resolved {
    const local_buffer* local;
    std::shared_ptr<const remote_segment> seg;
    int peer_buffer;
    std::uint64_t remote_addr;
  };
  // Small batches resolve on the stack; big ones allocate once per submit.
  std::array<resolved, 32> small;
  std::vector<resolved> big;
  std::span<resolved> res;
  if (requests.size() <= small.size()) {
    res = std::span<resolved>(small.data(), requests.size());
  } else {
    big.resize(requests.size());
    res = big;
  }

  std::shared_lock local_lock(local_mu_);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    auto where = [&] { return "request " + std::to_string(i) + ": "; };
    if (r.length == 0) return fail(errc::zero_length, where() + "length 0");
    const auto src = reinterpret_cast<std::uint64_t>(r.source);
    res[i].local = find_local(src, r.length);
    if (res[i].local == nullptr)
      return fail(errc::unregistered_source, where() + "source [" + std::to_string(src) + ", +" +
                                                 std::to_string(r.length) + ") is not inside registered memory");
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        std::shared_lock seg_lock(seg_mu_);
        res[i].seg = r.target < segments_.size() ? segments_[r.target] : nullptr;
      }
      if (!res[i].seg) return fail(errc::unknown_segment, where() + "segment " + std::to_string(r.target) + " is not open");
      const remote_segment& seg = *res[i].seg;
      if (r.buffer != transfer_request::kRawAddress) {
        if (r.buffer >= seg.buffers.size())
          return fail(errc::out_of_bounds, where() + "segment " + seg.name + " has " + std::to_string(seg.buffers.size()) +
                                               " buffer(s), no buffer " + std::to_string(r.buffer));
        const auto& pb = seg.buffers[r.buffer];
        if (r.target_offset > pb.length || r.length > pb.length - r.target_offset)
          return fail(errc::out_of_bounds, where() + "offset " + std::to_string(r.target_offset) + " + length " +
                                               std::to_string(r.length) + " exceeds buffer " + std::to_string(r.buffer) +
                                               " of " + seg.name + " (" + std::to_string(pb.length) + " bytes)");
        res[i].peer_buffer = static_cast<int>(r.buffer);
        res[i].remote_addr = pb.addr + r.target_offset;
      } else {
        res[i].peer_buffer = seg.find(r.target_offset, r.length);
        res[i].remote_addr = r.target_offset;
      }
      if (res[i].peer_buffer >= 0) {
        // What the owner's descriptor grants; the NIC enforces the same through its MR.
        const buffer_access a = seg.buffers[static_cast<std::size_t>(res[i].peer_buffer)].access;
        if (!(r.op == transfer_op::write ? allows_write(a) : allows_read(a))) [[unlikely]]
          return fail(errc::remote_access_denied,
                      where() + (r.op == transfer_op::write ? "WRITE into" : "READ from") + " buffer " +
                          std::to_string(res[i].peer_buffer) + " of " + seg.name + ", which allows " +
                          std::string(to_string(a)) + " only");
        break;
      }
      // The seeds' forced refresh: the peer may have registered more memory since.
      if (attempt == 0 && refresh_ && refresh_(r.target)) continue;
      return fail(errc::out_of_bounds, where() + "[" + std::to_string(r.target_offset) + ", +" + std::to_string(r.length) +
                                           ") is outside every buffer of segment " + seg.name);
    }
  }

  // Build the slices and chain them per (context, shard): one push per chain.
  using chain = std::pair<detail::slice*, detail::slice*>;
  std::array<chain, kMaxContexts * shards::kShards> chains{};
  const auto now = std::chrono::steady_clock::now();
  std::size_t total = 0;
  const std::size_t ss = cfg_.slice_size;
  const std::size_t frag = cfg_.fragment_limit;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    detail::task_state& t = b->tasks[used + i];
    // Slices of slice_size; a tail up to fragment_limit joins the last one.
    const std::size_t q = r.length / ss;
    const std::size_t rem = r.length % ss;
    const std::size_t n = rem == 0 ? q : (rem <= frag && q >= 1 ? q : q + 1);
    t.slices.resize(n);
    t.target = r.target;
    t.deadline = now + cfg_.transfer_timeout;
    t.bytes.store(0, std::memory_order_relaxed);
    t.reason.store(errc::ok, std::memory_order_relaxed);
    t.any_failed.store(false, std::memory_order_relaxed);
    t.slices_left.store(static_cast<std::uint32_t>(n), std::memory_order_relaxed);
    t.state.store(transfer_state::pending, std::memory_order_relaxed);
    const local_buffer& lb = *res[i].local;
    const remote_segment& seg = *res[i].seg;
    const remote_buffer& pb = seg.buffers[static_cast<std::size_t>(res[i].peer_buffer)];
    const auto src = reinterpret_cast<std::uint64_t>(r.source);
    std::uint64_t off = 0;
    for (std::size_t k = 0; k < n; ++k) {
      detail::slice& s = t.slices[k];
      const std::uint64_t len = k + 1 == n ? r.length - off : ss;
      s = {};
      s.task = &t;
      s.local_addr = src + off;
      s.remote_addr = res[i].remote_addr + off;
      s.length = static_cast<std::uint32_t>(len);
      s.op = r.op;
      s.local_buffer = 0;
      s.peer_buffer = static_cast<std::uint32_t>(res[i].peer_buffer);
      const std::uint32_t rnd = topology::fast_random();
      const int ld = pick_local(lb, s.local_addr - lb.addr, 0, rnd);
      const int pd = seg.choose(pb, s.remote_addr - pb.addr, 0, rnd >> 8);
      if (ld < 0 || pd < 0) [[unlikely]] {
        // No usable NIC: retire as failed once the batch counts it (below).
        s.local_device = 0xffff;
      } else {
        s.local_device = static_cast<std::uint16_t>(ld);
        s.peer_device = static_cast<std::uint16_t>(pd);
        s.lkey = lb.lkeys[static_cast<std::size_t>(ld)];
        s.rkey = pb.rkeys[static_cast<std::size_t>(pd)];
        s.peer_path = &seg.nic_paths[static_cast<std::size_t>(pd)];
      }
      off += len;
    }
    t.keep_alive = res[i].seg;
    total += n;
  }
  local_lock.unlock();
  b->unfinished.fetch_add(requests.size(), std::memory_order_relaxed);
  b->inflight.fetch_add(total, std::memory_order_relaxed);
  b->used.store(used + requests.size(), std::memory_order_release);

  std::size_t nctx_used = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    detail::task_state& t = b->tasks[used + i];
    for (auto& s : t.slices) {
      if (s.local_device == 0xffff) [[unlikely]] {
        detail::retire_slice(s, errc::context_inactive);
        continue;
      }
      const std::size_t shard = shards::shard_of(t.target, s.peer_device, *s.peer_path);
      chain& c = chains[s.local_device * shards::kShards + shard];
      s.next = nullptr;
      if (c.first == nullptr) {
        c.first = c.second = &s;
      } else {
        c.second->next = &s;
        c.second = &s;
      }
      nctx_used = std::max<std::size_t>(nctx_used, s.local_device + 1u);
    }
  }
  for (std::size_t d = 0; d < nctx_used; ++d)
    for (std::size_t sh = 0; sh < shards::kShards; ++sh)
      if (chain& c = chains[d * shards::kShards + sh]; c.first != nullptr)
        contexts_[d]->pool().submit(sh, c.first, c.second);
  return {};
}

template <class P>
void rdma_transport<P>::on_failed(detail::slice& s, errc e) noexcept {
  detail::task_state& t = *s.task;
  const bool final = is_final(t.state.load(std::memory_order_acquire));
  const bool retriable = e != errc::canceled && e != errc::timed_out && !final;
  if (!retriable || s.retries >= cfg_.max_retry) {
    detail::retire_slice(s, e);
    return;
  }
  ++s.retries;
  const auto* seg = static_cast<const remote_segment*>(t.keep_alive.get());
  int ld = -1;
  std::uint32_t lkey = 0;
  {
    std::shared_lock lock(local_mu_);
    if (const local_buffer* lb = find_local(s.local_addr, s.length)) {
      ld = pick_local(*lb, s.local_addr - lb->addr, s.retries, 0);
      if (ld >= 0) lkey = lb->lkeys[static_cast<std::size_t>(ld)];
    }
  }
  const remote_buffer& pb = seg->buffers[s.peer_buffer];
  const int pd = seg->choose(pb, s.remote_addr - pb.addr, s.retries, 0);
  if (ld < 0 || pd < 0) {
    detail::retire_slice(s, e);
    return;
  }
  TIDE_LOG_DEBUG("slice " << &s << " failed (" << to_string(e) << "), retry " << int(s.retries) << " on "
                          << contexts_[static_cast<std::size_t>(ld)]->name() << " -> "
                          << seg->nic_paths[static_cast<std::size_t>(pd)]);
  s.local_device = static_cast<std::uint16_t>(ld);
  s.peer_device = static_cast<std::uint16_t>(pd);
  s.lkey = lkey;
  s.rkey = pb.rkeys[static_cast<std::size_t>(pd)];
  s.peer_path = &seg->nic_paths[static_cast<std::size_t>(pd)];
  s.ep = nullptr;
  s.next = nullptr;
  const std::size_t shard = shards::shard_of(t.target, s.peer_device, *s.peer_path);
  contexts_[static_cast<std::size_t>(ld)]->pool().submit(shard, &s, &s);
}

template <class P>
void rdma_transport<P>::expire(detail::batch_state& b) noexcept {
  const auto now = std::chrono::steady_clock::now();
  const std::size_t n = b.used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    auto& t = b.tasks[i];
    if (!is_final(t.state.load(std::memory_order_acquire)) && now > t.deadline) {
      t.reason.store(errc::timed_out, std::memory_order_relaxed);
      (void)detail::finish_task(t, transfer_state::timeout);
    }
  }
}

template <class P>
result<transfer_status> rdma_transport<P>::task_status(batch_id id, std::size_t task) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "status: unknown batch " + std::to_string(id));
  if (task >= b->used.load(std::memory_order_acquire))
    return fail(errc::unknown_task, "status: task " + std::to_string(task) + " was not submitted");
  auto& t = b->tasks[task];
  auto st = t.state.load(std::memory_order_acquire);
  if (!is_final(st) && std::chrono::steady_clock::now() > t.deadline) {
    t.reason.store(errc::timed_out, std::memory_order_relaxed);
    (void)detail::finish_task(t, transfer_state::timeout);
    st = t.state.load(std::memory_order_acquire);
  }
  return transfer_status{st, t.bytes.load(std::memory_order_relaxed),
                         st == transfer_state::completed ? errc::ok : t.reason.load(std::memory_order_relaxed)};
}

template <class P>
result<transfer_status> rdma_transport<P>::batch_status(batch_id id) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "status: unknown batch " + std::to_string(id));
  expire(*b);
  transfer_status out{transfer_state::completed, 0, errc::ok};
  const std::size_t n = b->used.load(std::memory_order_acquire);
  if (n == 0) out.state = transfer_state::waiting;
  bool any_pending = false;
  for (std::size_t i = 0; i < n; ++i) {
    auto& t = b->tasks[i];
    const auto st = t.state.load(std::memory_order_acquire);
    out.transferred_bytes += t.bytes.load(std::memory_order_relaxed);
    if (!is_final(st)) any_pending = true;
    else if (st != transfer_state::completed && out.state == transfer_state::completed) {
      out.state = st;
      out.reason = t.reason.load(std::memory_order_relaxed);
    }
  }
  if (any_pending) out.state = transfer_state::pending;
  return out;
}

template <class P>
status rdma_transport<P>::wait(batch_id id, std::chrono::milliseconds timeout) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "wait: unknown batch " + std::to_string(id));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(b->mu);
  while (b->unfinished.load(std::memory_order_acquire) != 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return fail(errc::timed_out, "wait: " + std::to_string(b->unfinished.load()) + " task(s) unfinished after " +
                                       std::to_string(timeout.count()) + " ms");
    // Wake at least every 100 ms to expire tasks past their own deadline.
    b->cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)));
    lock.unlock();
    expire(*b);
    lock.lock();
  }
  return {};
}

template <class P>
status rdma_transport<P>::cancel(batch_id id) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "cancel: unknown batch " + std::to_string(id));
  b->canceled.store(true, std::memory_order_release);
  const std::size_t n = b->used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    b->tasks[i].reason.store(errc::canceled, std::memory_order_relaxed);
    (void)detail::finish_task(b->tasks[i], transfer_state::canceled);
  }
  return {};
}

template <class P>
handshake_desc rdma_transport<P>::on_connect(const handshake_desc& req, std::string_view peer_identity) {
  const auto at = req.peer_nic_path.find('@');
  const std::string_view nic = at == std::string::npos ? std::string_view{} : std::string_view(req.peer_nic_path).substr(at + 1);
  auto reject = [&](std::string why) {
    handshake_desc r;
    r.local_nic_path = req.peer_nic_path;
    r.peer_nic_path = req.local_nic_path;
    r.reply_msg = std::move(why);
    return r;
  };
  // Identity binding (cluster secret set): the first authenticated peer to
  // connect an endpoint path owns it; another identity may not re-handshake it.
  if (!peer_identity.empty()) {
    std::lock_guard lock(identity_mu_);
    auto [it, fresh] = peer_identity_.try_emplace(req.local_nic_path, peer_identity);
    if (!fresh && it->second != peer_identity)
      return reject("Invalid argument: endpoint " + req.local_nic_path + " belongs to another authenticated peer");
  }
  for (auto& c : contexts_) {
    if (c->name() != nic) continue;
    // A ready ack carries no GID the passive side needs; only connects do.
    if (req.local_gid || req.ready_ack.value_or(false)) return c->handle_connect(req);
    // Mooncake peers may send local_gid "" and expect the GID to be read
    // from their published devices[] (RE:539-558): <segment>@<device>.
    const auto peer_at = req.local_nic_path.find('@');
    if (peer_at == std::string::npos || peer_at == 0 || peer_at + 1 == req.local_nic_path.size())
      return reject("Invalid peer GID: no GID sent and local_nic_path \"" + req.local_nic_path +
                    "\" is not <segment>@<device>");
    if (!peer_gid_) return reject("Invalid peer GID: no GID sent and no metadata to look it up");
    const std::string_view path = req.local_nic_path;
    auto gid = peer_gid_(path.substr(0, peer_at), path.substr(peer_at + 1));
    if (!gid) return reject("Invalid peer GID: " + gid.error().detail);
    handshake_desc with_gid = req;
    with_gid.local_gid = *gid;
    return c->handle_connect(with_gid);
  }
  return reject("Local RDMA context not found: " + std::string(nic));
}

}  // namespace tide::rdma
