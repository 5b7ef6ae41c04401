#pragma once
// Member definitions of transfer_engine<P> (included by engine.hpp).

#include <tide/detail/deferred_publisher.hpp>
#include <tide/detail/handshake_address.hpp>
#include <tide/detail/log.hpp>
#include <tide/detail/publish_group.hpp>
#include <tide/detail/tcp_route.hpp>
#include <tide/metrics.hpp>
#include <tide/net/address.hpp>
#include <tide/net/handshake_client.hpp>
#include <tide/net/handshake_server.hpp>
#include <tide/topology/cpu_list.hpp>
#include <tide/wire/auth.hpp>

#include <atomic>
#include <map>
#include <type_traits>
#include <optional>

namespace tide {
namespace detail {

/// One INFO line: which file, variables and program keys set the
/// configuration, and what local_server_name became (config.cpp).
void log_config_sources(const config_report& report);

/// "eviction sieve, shard_hash ..., idle ..., path ..., metadata p2p": the
/// policy set as its policies name themselves.
template <class P>
std::string policy_names() {
  std::string s;
  auto add = [&s](std::string_view what, std::string_view name) {
    if (!s.empty()) s += ", ";
    s += what;
    s += ' ';
    s += name;
  };
  if constexpr (requires { P::eviction::kName; }) add("eviction", P::eviction::kName);
  if constexpr (requires { P::shard_hash::kName; }) add("shard_hash", P::shard_hash::kName);
  if constexpr (requires { P::idle::kName; }) add("idle", P::idle::kName);
  if constexpr (requires { P::path::kName; }) add("path", P::path::kName);
  if constexpr (requires { metadata_of<P>::type::kName; }) add("metadata", metadata_of<P>::type::kName);
  return s;
}

/// `r`, or when a store write failed its error as the caller who waited for
/// it is told: what was not stored, the store's reason, what becomes of the
/// change.
inline status descriptor_not_stored(status r, std::string_view what, std::string_view after_failure) {
  if (r) return r;
  const auto& e = r.error();
  return fail(e.code, std::string(what) + ": the descriptor was not stored (" +
                          (e.detail.empty() ? e.message() : e.detail) + "); " + std::string(after_failure));
}

}  // namespace detail

template <class P>
struct transfer_engine<P>::impl {
  std::optional<net::handshake_server> server;
  std::atomic<rdma::rdma_transport<P>*> transport{nullptr};
  std::mutex desc_mu;
  std::string desc_json;  ///< under desc_mu: what peers are answered
  /// Under desc_mu (p2p): a publish since desc_json was encoded; the next
  /// peer asking encodes the transport's current descriptor.
  bool desc_stale = false;
  std::atomic<std::uint64_t> desc_encodes{0};
  /// etcd/http: the registrations and unregistrations waiting for one store
  /// write (group commit); a write carries the descriptor as it is when it
  /// starts, so every change made before its members joined.
  detail::publish_group publisher;
  /// etcd/http with publish_delay: registrations leave their store write to
  /// this thread (one per window).  Made by create() after the first
  /// publish; reset first in ~transfer_engine, as its writes use the transport.
  std::unique_ptr<detail::deferred_publisher> deferred;
  explicit impl(notify_limits limits) : inbox(limits) {}
  detail::notify_inbox inbox;
  std::shared_ptr<const wire::cluster_secret> secret;  ///< null: no authentication
  std::string rpc_meta_key;  ///< published (etcd/http mode); "" = nothing to withdraw
  /// Peers' handshake addresses read from their rpc_meta entries (etcd/http
  /// mode), by server name; dropped with a segment refresh or a failed
  /// handshake so the next one reads the store again.
  std::mutex rpc_mu;
  std::map<std::string, net::peer_address, std::less<>> rpc_addr;
  /// Notifications of submits; emplaced by create() once the metadata cache exists.
  std::optional<detail::notify_outbox> outbox;

  /// Set first thing in ~transfer_engine: an active handshake under way (on
  /// a connector thread) gives up within net::kAbortPoll instead of holding
  /// the teardown for its connect and receive timeouts.  Notifications are
  /// not tied to it: the outbox still sends the ones the lanes hand back,
  /// for its stop grace, and then aborts with its own flag.
  std::atomic<bool> stopping_handshakes{false};
  /// Handshakes this engine initiated, by outcome (the metrics).
  std::atomic<std::uint64_t> handshakes_ok{0}, handshakes_failed{0}, handshakes_auth_failed{0};
  void count_handshake(const result<handshake_desc>& r) noexcept {
    auto& c = r ? handshakes_ok : r.error().code == errc::auth_failed ? handshakes_auth_failed : handshakes_failed;
    c.fetch_add(1, std::memory_order_relaxed);
  }
  /// The metrics endpoint (metrics_port != 0).  Owned here; stopped first in
  /// ~transfer_engine, before anything its thread reads goes away.
  std::unique_ptr<metrics::http_server> metrics_server;
  /// The TCP transport (null when not installed) and the route that joins
  /// it to the data path; the route outlives the transport, which calls it.
  std::unique_ptr<detail::tcp_route<P>> route = std::make_unique<detail::tcp_route<P>>();
  std::unique_ptr<tcp::transport> tcp;

  void forget_rpc_addresses() {
    std::lock_guard lock(rpc_mu);
    rpc_addr.clear();
  }
};


template <class P>
transfer_engine<P>::transfer_engine(engine_config cfg)
    : cfg_(std::move(cfg)),
      impl_(std::make_unique<impl>(
          notify_limits{cfg_.notify_max_count, cfg_.notify_max_bytes, cfg_.notify_rate_per_peer})) {}

template <class P>
transfer_engine<P>::~transfer_engine() {
  impl_->stopping_handshakes.store(true, std::memory_order_release);
  impl_->deferred.reset();  // joins its thread: no delayed write reaches the transport below
  impl_->metrics_server.reset();  // joins its thread: no scrape reads the transport below
  if (impl_->server) impl_->server->stop();
  impl_->transport.store(nullptr, std::memory_order_release);
  // No notification is handed to a lane from here on; the lanes give back
  // the ones they hold as they stop (the outbox sends those over TCP).
  if (impl_->outbox) impl_->outbox->disable_rdma();
  // The data path stops first (no WR goes to TCP afterwards), then TCP
  // ends its ops and its server reads no buffer: then both may go.
  if (transport_) transport_->shutdown();
  if (impl_->tcp) impl_->tcp->shutdown();
  transport_.reset();
  // Every task is final now: what the outbox holds is all it will get.
  if (impl_->outbox) impl_->outbox->stop();
  if (cache_) {
    if (auto r = cache_->unpublish(name_); !r) TIDE_LOG_DEBUG("unpublish " << name_ << ": " << r.error().message());
    if constexpr (metadata_key_store<metadata_backend_type>) {
      if (!impl_->rpc_meta_key.empty()) {
        if (auto r = cache_->backend().remove_key(impl_->rpc_meta_key); !r)
          TIDE_LOG_DEBUG("remove " << impl_->rpc_meta_key << ": " << r.error().message());
      }
    }
  }
}

template <class P>
std::uint64_t transfer_engine<P>::descriptor_encodes() const noexcept {
  return impl_->desc_encodes.load(std::memory_order_relaxed);
}

template <class P>
std::size_t transfer_engine<P>::registrations_waiting() const {
  return impl_->publisher.pending_members();
}

template <class P>
std::uint16_t transfer_engine<P>::handshake_port() const noexcept {
  return impl_->server ? impl_->server->port() : 0;
}

template <class P>
result<gid_bytes> transfer_engine<P>::peer_gid(std::string_view segment, std::string_view device) {
  // In p2p mode opening a segment dials the host its name holds, and this
  // name comes from a request off the network: only a segment already open
  // here may answer (review finding 10).  The other backends read the
  // configured store.
  if constexpr (std::is_same_v<metadata_backend_type, policy::p2p>) {
    auto d = cache_->cached(segment);
    if (!d)
      return fail(errc::segment_not_found, "segment " + std::string(segment) +
                                               " is not open here (p2p mode looks a missing GID up only in open segments)");
    for (const auto& dev : (*d)->devices)
      if (dev.name == device) return dev.gid;
    return fail(errc::device_not_found,
                std::string(segment) + "@" + std::string(device) + " not found in segment " + std::string(segment));
  }
  auto id = cache_->open(segment);
  if (!id) return fail(id.error().code, "cannot read segment " + std::string(segment) + ": " + id.error().detail);
  auto find = [&](const segment_desc& d) -> std::optional<gid_bytes> {
    for (const auto& dev : d.devices)
      if (dev.name == device) return dev.gid;
    return std::nullopt;
  };
  std::optional<gid_bytes> gid;
  if (auto d = cache_->get(*id)) gid = find(**d);
  // The peer may have opened the device after we cached its descriptor.
  if (!gid)
    if (auto d = cache_->refresh(*id)) gid = find(**d);
  (void)cache_->close(*id);
  if (!gid)
    return fail(errc::device_not_found,
                std::string(segment) + "@" + std::string(device) + " not found in segment " + std::string(segment));
  return *gid;
}

template <class P>
status transfer_engine<P>::publish(const segment_desc& d) {
  if constexpr (metadata_served_by_owner<metadata_backend_type>) {
    // Peers fetch the descriptor from this engine: it is encoded when one
    // asks (encode_if_stale), so a registration costs O(1) however many
    // buffers there are, and a burst of them one encode.  The cap is checked
    // here, where the caller can still be told.
    if (d.buffers.size() > kMaxSegmentBuffers)
      return fail(errc::metadata_malformed, "buffers: " + std::to_string(d.buffers.size()) + " buffers, at most " +
                                                std::to_string(kMaxSegmentBuffers));
    std::lock_guard lock(impl_->desc_mu);
    impl_->desc_stale = true;
    return {};
  }
  // One encode (and, with a secret, seals of the changed buffers only) serves
  // both the store and this engine's own metadata answers.
  auto json = cache_->publish_json(d);
  if (!json) return fail(json.error());
  impl_->desc_encodes.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(impl_->desc_mu);
  impl_->desc_json = std::move(*json);
  return {};
}

template <class P>
void transfer_engine<P>::encode_if_stale() {
  auto* t = impl_->transport.load(std::memory_order_acquire);
  if (t == nullptr) return;  // before create() published, or being destroyed
  // The transport's publish lock first, as publish() -> this->publish() takes
  // them: the descriptor cannot change while it is encoded.
  t->with_published([&](const segment_desc* d) {
    std::lock_guard lock(impl_->desc_mu);
    if (!impl_->desc_stale || d == nullptr) return;
    auto json = cache_->publish_json(*d);
    if (!json) {
      TIDE_LOG_WARN("segment " << name_ << ": cannot encode the descriptor a peer asked for: " << json.error().message());
      return;
    }
    impl_->desc_json = std::move(*json);
    impl_->desc_stale = false;
    impl_->desc_encodes.fetch_add(1, std::memory_order_relaxed);
  });
}

template <class P>
status transfer_engine<P>::store_changes(std::string_view what, std::string_view after_failure) {
  if constexpr (metadata_served_by_owner<metadata_backend_type>) {
    // Nothing is written: the publish marks the descriptor stale (publish()).
    return transport_->publish();
  } else {
    // Every change this caller made is in the transport's list before it
    // joins, so the round's publish (which takes the list when it starts)
    // stores it; callers at once share the round's one encode and PUT.
    return detail::descriptor_not_stored(impl_->publisher.commit([this] { return transport_->publish(); }), what,
                                         after_failure);
  }
}

template <class P>
status transfer_engine<P>::store_registrations(std::string_view what, std::string_view after_failure) {
  if (impl_->deferred) {
    impl_->deferred->changed();
    return {};
  }
  return store_changes(what, after_failure);
}

template <class P>
status transfer_engine<P>::flush_metadata() {
  if (!impl_->deferred) return {};
  return detail::descriptor_not_stored(impl_->deferred->flush(), "flush_metadata", "a delayed write tries again");
}

template <class P>
status transfer_engine<P>::register_memory(void* addr, std::size_t len, std::string_view location,
                                           buffer_access access) {
  if (auto r = transport_->register_memory(addr, len, location, false, access); !r) return r;
  return store_registrations("register_memory",
                             "the buffer is registered here and goes into the next descriptor the store takes");
}

template <class P>
status transfer_engine<P>::unregister_memory(void* addr, in_flight mode) {
  if (auto r = transport_->unregister_memory(addr, false, mode); !r) return r;
  return store_changes("unregister_memory",
                       "the buffer is unregistered here; peers may read it in the stored descriptor until the next "
                       "one the store takes");
}

template <class P>
status transfer_engine<P>::register_memory_batch(std::span<const buffer_entry> buffers, std::string_view location) {
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (auto r = transport_->register_memory(buffers[i].addr, buffers[i].length, location, false,
                                          buffers[i].access);
        !r) {
      for (std::size_t j = 0; j < i; ++j) (void)transport_->unregister_memory(buffers[j].addr, false);
      (void)store_changes("register_memory_batch", "");  // deregisters the rolled-back MRs
      return fail(r.error().code, "buffer " + std::to_string(i) + ": " + r.error().detail);
    }
  }
  return store_registrations("register_memory_batch",
                             "the buffers are registered here and go into the next descriptor the store takes");
}

template <class P>
status transfer_engine<P>::unregister_memory_batch(std::span<void* const> addrs) {
  status first{};
  for (void* a : addrs)
    if (auto r = transport_->unregister_memory(a, false); !r && first) first = r;
  if (auto r = store_changes("unregister_memory_batch",
                             "the buffers are unregistered here; peers may read them in the stored descriptor until "
                             "the next one the store takes");
      !r && first)
    first = r;
  return first;
}

template <class P>
result<segment_id> transfer_engine<P>::open_segment(std::string_view name) {
  {
    std::lock_guard lock(impl_->rpc_mu);  // a reopened peer may listen elsewhere now
    if (auto it = impl_->rpc_addr.find(name); it != impl_->rpc_addr.end()) impl_->rpc_addr.erase(it);
  }
  auto id = cache_->open(name);
  if (!id) return fail(id.error());
  auto d = cache_->get(*id);
  if (!d) return fail(d.error());
  if (auto r = transport_->set_segment(*id, **d); !r) {
    (void)cache_->close(*id);
    return fail(r.error());
  }
  return *id;
}

template <class P>
status transfer_engine<P>::close_segment(segment_id id, in_flight mode) {
  if (auto d = cache_->get(id); !d) return fail(d.error());
  if (auto q = transport_->quiesce_segment(id, mode); !q) return q;
  if (auto r = cache_->close(id); !r) return r;
  if (!cache_->get(id)) transport_->drop_segment(id);
  return {};
}

template <class P>
result<std::shared_ptr<const segment_desc>> transfer_engine<P>::segment_descriptor(segment_id id) const {
  return cache_->get(id);
}

template <class P>
status transfer_engine<P>::send_notify(segment_id target, std::string_view msg, std::string_view sender) {
  auto name = cache_->name_of(target);
  if (!name) return fail(name.error());
  auto addr = net::parse_peer_address(*name);
  if (!addr) return fail(addr.error());
  net::request_options ro;
  ro.connect_timeout = cfg_.handshake_connect_timeout;
  ro.receive_timeout = cfg_.handshake_timeout;
  ro.secret = impl_->secret;
  ro.identity = name_;
  return net::send_notify(addr->host, addr->port,
                          notify_desc{sender.empty() ? name_ : std::string(sender), std::string(msg)}, ro);
}

template <class P>
status transfer_engine<P>::submit(batch_id b, std::span<const transfer_request> requests,
                                  const notification& n) noexcept {
  try {
    return submit_notified(b, requests, n);
  } catch (...) {  // bad_alloc before anything was submitted (the transport's own submit catches its own)
    return fail(error{errc::out_of_memory, {}});
  }
}

template <class P>
status transfer_engine<P>::submit_notified(batch_id b, std::span<const transfer_request> requests,
                                           const notification& n) {
  if (requests.empty())
    return fail(errc::invalid_argument, "submit: a notification needs at least one request (send_notify sends one alone)");
  const segment_id target = requests[0].target;
  for (std::size_t i = 1; i < requests.size(); ++i)
    if (requests[i].target != target)
      return fail(errc::invalid_argument, "submit: request " + std::to_string(i) + " goes to segment " +
                                              std::to_string(requests[i].target) + ", request 0 to segment " +
                                              std::to_string(target) +
                                              ": a notification follows one target's requests; submit per segment");
  if (n.name.size() + n.message.size() > notification::kMaxBytes)
    return fail(errc::invalid_argument, "submit: notification name + message is " +
                                            std::to_string(n.name.size() + n.message.size()) + " bytes, above " +
                                            std::to_string(notification::kMaxBytes));
  auto segment = cache_->name_of(target);
  if (!segment) return fail(segment.error().code, "submit: " + segment.error().detail);
  auto item = impl_->outbox->make(std::move(*segment), notify_desc{n.name.empty() ? name_ : n.name, n.message},
                                  requests.size(), target);
  if (impl_->outbox->rdma_on()) item->sink = transport_->notify_lane_for(target, item.get());
  if (item->sink != nullptr) item->message = item.get();  // may ride behind a lone WRITE (rdma/detail/batch.hpp)
  if (auto st = transport_->submit(b, requests, item.get()); !st) {
    impl_->outbox->discard(std::move(item));
    return st;
  }
  (void)item.release();  // its last task hands it to the outbox, which frees it
  return {};
}

template <class P>
notify_outbox_stats transfer_engine<P>::outbox_stats() const noexcept {
  return impl_->outbox ? impl_->outbox->stats() : notify_outbox_stats{};
}

template <class P>
status transfer_engine<P>::probe(std::string_view segment, std::chrono::milliseconds timeout) {
  // A name without a port means Mooncake's default handshake port (12001), as its send_probe.
  auto addr = detail::handshake_address(*cache_, cfg_.cluster_id, segment, impl_->rpc_mu, impl_->rpc_addr, false);
  if (!addr) return fail(errc::invalid_argument, "probe: " + addr.error().message());
  net::request_options ro;
  ro.connect_timeout = std::min(timeout, cfg_.handshake_connect_timeout);
  ro.receive_timeout = timeout;
  ro.secret = impl_->secret;
  ro.identity = name_;
  return net::probe(addr->host, addr->port, ro);
}

template <class P>
std::vector<notify_desc> transfer_engine<P>::take_notifies(std::chrono::milliseconds wait) {
  auto& inbox = impl_->inbox;
  // Lane 0 takes RDMA notifications only where its idle strategy sleeps on
  // the completion channel (not busy_poll's or hybrid's: a reader running
  // such a lane would spin) and notify_rdma_credits is not 0.
  if (P::idle::wakes_on_completion && cfg_.notify_wait_on_lane && cfg_.notify_rdma_credits != 0 &&
      wait.count() > 0 && transport_->context_count() != 0 &&
      transport_->context(0).lanes().size() != 0) {
    // Wait on lane 0 of the first NIC, which takes RDMA notifications
    // (detail/lane_lending.hpp): the SEND's completion then wakes this
    // thread, not the lane that would wake it next.  A notification that
    // comes another way (TCP, another NIC's lane) wakes it through the inbox.
    // Handing the lane over costs two wake-ups of its own, which pay only
    // when the message is not already on its way: the first millisecond of
    // the wait is the inbox's (bench/notify-latency, reader caller).
    const auto deadline = std::chrono::steady_clock::now() + wait;
    constexpr std::chrono::milliseconds kInboxFirst{1};
    if (auto got = inbox.take(std::min(wait, kInboxFirst)); !got.empty() || wait <= kInboxFirst) return got;
    auto& lane = transport_->context(0).lanes().at(0);
    inbox.watch([&lane] { lane.wake_borrower(); });
    (void)lane.run_borrowed(deadline, [&inbox]() noexcept { return inbox.has_messages(); });
    inbox.unwatch();
    // What is left of the wait (all of it when another reader has the lane).
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    wait = std::max(std::chrono::milliseconds{0}, left);
  }
  return inbox.take(wait);
}

template <class P>
notify_stats transfer_engine<P>::notification_stats() const {
  return impl_->inbox.stats();
}

template <class P>
std::string transfer_engine<P>::metrics_text() const {
  metrics::inputs in;
  in.transport = transport_->stats(true);
  for (std::size_t i = 0; i < transport_->context_count(); ++i)
    in.nic_active.push_back(transport_->context(i).active() ? 1 : 0);
  in.tasks = transport_->meter();
  in.server = handshake_stats();
  in.client = {impl_->handshakes_ok.load(std::memory_order_relaxed),
               impl_->handshakes_failed.load(std::memory_order_relaxed),
               impl_->handshakes_auth_failed.load(std::memory_order_relaxed)};
  in.notify = notification_stats();
  if (impl_->tcp) in.tcp = impl_->tcp->stats();
  return metrics::format(in);
}

template <class P>
std::uint16_t transfer_engine<P>::metrics_port() const noexcept {
  return impl_->metrics_server ? impl_->metrics_server->port() : 0;
}

template <class P>
net::handshake_server_stats transfer_engine<P>::handshake_stats() const noexcept {
  return impl_->server ? impl_->server->stats() : net::handshake_server_stats{};
}

template <class P>
std::uint16_t transfer_engine<P>::tcp_port() const noexcept {
  return impl_->tcp ? impl_->tcp->port() : 0;
}

template <class P>
tcp::stats transfer_engine<P>::tcp_stats() const noexcept {
  return impl_->tcp ? impl_->tcp->stats() : tcp::stats{};
}

}  // namespace tide

#include <tide/detail/engine_create.hpp>
