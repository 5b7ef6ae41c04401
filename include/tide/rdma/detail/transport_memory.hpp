#pragma once
// Member definitions of rdma_transport<P>, local memory (included by
// rdma_transport.hpp): registering a buffer on every context (host memory,
// or device memory by dma-buf or a peer-memory module), unregistering it
// once its transfers drain, the descriptor published for it, and the
// local ranges the TCP carrier opens.

namespace tide::rdma {

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
