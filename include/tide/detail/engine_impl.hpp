#pragma once
// Member definitions of transfer_engine<P> (included by engine.hpp).

#include <tide/detail/handshake_address.hpp>
#include <tide/detail/log.hpp>
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
std::uint16_t transfer_engine<P>::handshake_port() const noexcept {
  return impl_->server ? impl_->server->port() : 0;
}

template <class P>
result<std::unique_ptr<transfer_engine<P>>> transfer_engine<P>::create(engine_config given) {
  config_report report;
  auto resolved = given.resolve(&report);
  if (!resolved) return fail(resolved.error());
  engine_config cfg = std::move(*resolved);
  detail::log_config_sources(report);
  // The segment name is the server part of this engine's NIC paths
  // ("<name>@<device>"); one with an '@' would split elsewhere than it was
  // joined, and a peer would file its notifications under another name.
  if (cfg.local_server_name.find('@') != std::string::npos)
    return fail(errc::config_invalid, "local_server_name \"" + cfg.local_server_name +
                                          "\" contains '@', which separates the segment name from the device in "
                                          "a NIC path (<segment name>@<device>)");
  std::unique_ptr<transfer_engine> e(new transfer_engine(std::move(cfg)));
  impl* im = e->impl_.get();
  transfer_engine* self = e.get();  // the handlers below run while *e lives: it stops them first

  if (!e->cfg_.auth_secret_file.empty()) {
    auto secret = wire::cluster_secret::load(e->cfg_.auth_secret_file);
    if (!secret) return fail(secret.error());
    im->secret = std::move(*secret);
  }
  if (e->cfg_.notify_max_count == 0 || e->cfg_.notify_max_bytes == 0)
    return fail(errc::config_invalid, "notify_max_count and notify_max_bytes must be > 0");

  net::handshake_server_config sc;
  sc.host = e->cfg_.bind_host;
  sc.secret = im->secret;
  sc.port = e->cfg_.handshake_port;
  if (sc.port == 0) {
    sc.port_range_min = 15000;
    sc.port_range_max = 17000;
  }
  net::handshake_handlers hh;
  hh.on_connect_from = [im](const handshake_desc& req, std::string_view peer_identity) {
    if (auto* t = im->transport.load(std::memory_order_acquire)) return t->on_connect(req, peer_identity);
    handshake_desc r;
    r.local_nic_path = req.peer_nic_path;
    r.peer_nic_path = req.local_nic_path;
    r.reply_msg = "engine is not ready";
    return r;
  };
  hh.on_notify_from = [im](const notify_desc& n, std::string_view peer_identity) {
    if (peer_identity.empty()) return im->inbox.push(n, n.name);
    // Authenticated: the sender is who proved itself, whatever the body says.
    notify_desc from = n;
    if (from.name != peer_identity) {
      TIDE_LOG_WARN("notify from " << peer_identity << " claims to be \"" << from.name.substr(0, 64)
                                   << "\"; queued under " << peer_identity);
      from.name = std::string(peer_identity);
    }
    return im->inbox.push(from, peer_identity);
  };
  hh.local_segment = [self, im]() -> std::optional<std::string> {
    if constexpr (metadata_served_by_owner<metadata_backend_type>) self->encode_if_stale();
    std::lock_guard lock(im->desc_mu);
    if (im->desc_json.empty()) return std::nullopt;
    return im->desc_json;
  };
  auto server = net::handshake_server::start(sc, std::move(hh));
  if (!server) return fail(server.error());
  im->server.emplace(std::move(*server));

  // The segment name is how peers reach this engine's handshake port.  With
  // etcd/http (rpc_meta published) a name that gives a port is kept as it is,
  // as Mooncake does: peers read the real handshake port from rpc_meta.
  auto host = net::parse_peer_address(e->cfg_.local_server_name);
  if (!host) return fail(errc::config_invalid, "local_server_name: " + host.error().detail);
  e->name_ = net::format_peer_address(host->host, im->server->port());
  if constexpr (metadata_key_store<metadata_backend_type>) {
    if (auto explicit_port = net::parse_peer_address(e->cfg_.local_server_name, 0); explicit_port && explicit_port->port != 0)
      e->name_ = net::format_peer_address(explicit_port->host, explicit_port->port);
  }

  metadata_config mc;
  mc.connection = e->cfg_.metadata;
  mc.cluster_id = e->cfg_.cluster_id;
  mc.timeout = e->cfg_.metadata_timeout;
  mc.etcd_ca_file = e->cfg_.etcd_ca_file;
  mc.etcd_cert_file = e->cfg_.etcd_cert_file;
  mc.etcd_key_file = e->cfg_.etcd_key_file;
  mc.etcd_verify_server = e->cfg_.etcd_verify_server;
  mc.etcd_user = e->cfg_.etcd_user;
  mc.etcd_password_file = e->cfg_.etcd_password_file;
  mc.token_file = e->cfg_.metadata_token_file;
  mc.secret = im->secret;
  mc.identity = e->name_;
  e->cache_ = std::make_unique<segment_cache<metadata_backend_type>>(mc);
  // With a secret, peers read our handshake address from the MACed descriptor, not rpc_meta.
  if constexpr (metadata_key_store<metadata_backend_type>)
    e->cache_->set_handshake_address(net::format_peer_address(host->host, im->server->port()));

  net::request_options ro;
  ro.connect_timeout = e->cfg_.handshake_connect_timeout;
  ro.receive_timeout = e->cfg_.handshake_timeout;
  ro.secret = im->secret;
  ro.identity = e->name_;
  // Mooncake's notify message to the target's handshake port (its rpc_meta
  // address with etcd/http), as send_notify, but read afresh once when the
  // peer may have moved.  The outbox's abort flag ends an exchange when the
  // engine goes away and its stop grace has passed, instead of the
  // timeouts above (per dead peer, per notification).
  im->outbox.emplace([ro, self, im](const std::string& segment, const notify_desc& n,
                                    const std::atomic<bool>& abort) -> status {
    net::request_options opts = ro;
    opts.abort = &abort;
    auto& backend = *self->cache_;  // rpc_meta, or with a secret the MACed descriptor
    auto addr = detail::handshake_address(backend, self->cfg_.cluster_id, segment, im->rpc_mu, im->rpc_addr, false);
    if (!addr) return fail(addr.error());
    auto r = net::send_notify(addr->host, addr->port, n, opts);
    if (r || r.error().code != errc::peer_unreachable) return r;
    auto again = detail::handshake_address(backend, self->cfg_.cluster_id, segment, im->rpc_mu, im->rpc_addr, true);
    if (!again || *again == *addr) return r;
    return net::send_notify(again->host, again->port, n, opts);
  }, detail::notify_outbox::options{});
  net::request_options connect_ro = ro;
  connect_ro.abort = &im->stopping_handshakes;
  rdma::handshake_sender send = [ro = std::move(connect_ro), self, im](std::string_view peer_nic_path,
                                                                     const handshake_desc& d) -> result<handshake_desc> {
    auto path = net::split_nic_path(peer_nic_path);
    if (!path) return fail(path.error());
    auto& backend = *self->cache_;  // rpc_meta, or with a secret the MACed descriptor
    auto addr = detail::handshake_address(backend, self->cfg_.cluster_id, path->server, im->rpc_mu, im->rpc_addr, false);
    if (!addr) return fail(addr.error());
    auto r = net::exchange_handshake(addr->host, addr->port, d, ro);
    if (r || r.error().code != errc::peer_unreachable) {
      im->count_handshake(r);
      return r;
    }
    // The peer may have restarted on another port: read its rpc_meta again.
    auto again = detail::handshake_address(backend, self->cfg_.cluster_id, path->server, im->rpc_mu, im->rpc_addr, true);
    if (!again || *again == *addr) {
      im->count_handshake(r);
      return r;
    }
    auto second = net::exchange_handshake(again->host, again->port, d, ro);
    im->count_handshake(second);
    return second;
  };
  auto publish = [self](const segment_desc& d) { return self->publish(d); };
  auto refresh = [self, im](segment_id id) -> status {
    im->forget_rpc_addresses();  // refreshed with the descriptor
    auto d = self->cache_->refresh(id);
    if (!d) return fail(d.error());
    return self->transport_->set_segment(id, **d);
  };
  auto peer_gid = [self](std::string_view segment, std::string_view device) { return self->peer_gid(segment, device); };

  auto kinds = parse_transports(e->cfg_.transports);
  if (!kinds) return fail(kinds.error());
  if (kinds->tcp) {
    tcp::config tcfg;
    tcfg.bind_host = e->cfg_.bind_host;
    tcfg.port = e->cfg_.tcp_port;
    tcfg.io_threads = e->cfg_.tcp_io_threads;
    tcfg.conns_per_peer = e->cfg_.tcp_conns_per_peer;
    tcfg.force_v1 = e->cfg_.tcp_proto == 1;
    tcfg.connect_timeout = e->cfg_.handshake_connect_timeout;
    tcfg.secret = im->secret;
    tcfg.identity = e->name_;
    auto tt = tcp::transport::create(tcfg, *im->route);
    if (!tt) return fail(tt.error().code, "tcp transport: " + tt.error().detail);
    im->tcp = std::move(*tt);
  }

  rdma::transport_config tc;
  tc.rdma = kinds->rdma;
  tc.allow_no_devices = kinds->tcp;
  tc.tcp_data_port = im->tcp ? im->tcp->port() : 0;
  tc.carrier_slice_size = e->cfg_.tcp_slice_size;
  tc.context.local_server_name = e->name_;
  tc.context.port = e->cfg_.ib_port;
  tc.context.gid_index = e->cfg_.gid_index;
  tc.context.mtu_cap = e->cfg_.mtu;
  tc.context.traffic_class = e->cfg_.ib_traffic_class;
  tc.context.service_level = e->cfg_.ib_service_level;
  tc.context.pkey_index = e->cfg_.pkey_index;
  tc.context.num_qp_per_ep = e->cfg_.num_qp_per_ep;
  // Mooncake's workers per context: tide's lanes are its QPs per endpoint.
  if (e->cfg_.workers_per_context != 0 && e->cfg_.workers_per_context != e->cfg_.num_qp_per_ep)
    TIDE_LOG_INFO("workers_per_context " << e->cfg_.workers_per_context << ": tide runs num_qp_per_ep = "
                                         << e->cfg_.num_qp_per_ep
                                         << " lanes per device (a lane owns one QP of each endpoint); the value is not used");
  if (e->cfg_.max_cqe < 1) return fail(errc::config_invalid, "max_cqe must be >= 1");
  if (e->cfg_.max_wr < 1) return fail(errc::config_invalid, "max_wr must be >= 1");
  if (e->cfg_.max_rd_atomic < 1) return fail(errc::config_invalid, "max_rd_atomic must be >= 1");
  if (e->cfg_.signal_interval < 1) return fail(errc::config_invalid, "signal_interval must be >= 1");
  tc.context.max_cqe = e->cfg_.max_cqe;
  tc.context.caps.max_send_wr = e->cfg_.max_wr;
  tc.context.caps.max_inline_data = e->cfg_.max_inline;
  tc.context.rc.max_rd_atomic = e->cfg_.max_rd_atomic;
  tc.context.rc.max_dest_rd_atomic = e->cfg_.max_rd_atomic;
  tc.context.signal_interval = e->cfg_.signal_interval;
  tc.context.endpoint_capacity = e->cfg_.endpoint_capacity;
  tc.context.ready_ack_timeout = e->cfg_.ready_ack_timeout;
  if (e->cfg_.qp_retry_cnt > 7 || e->cfg_.qp_timeout > 31)
    return fail(errc::config_invalid, "qp_retry_cnt must be 0..7 and qp_timeout 0..31");
  tc.context.rc.retry_cnt = e->cfg_.qp_retry_cnt;
  tc.context.rc.timeout = e->cfg_.qp_timeout;
  tc.context.sysfs_root = e->cfg_.sysfs_root;
  if (!e->cfg_.lane_cpus.empty()) {
    auto cpus = topology::parse_cpu_list(e->cfg_.lane_cpus, topology::configured_cpus());
    if (!cpus) return fail(cpus.error());
    tc.context.lane_cpus = std::move(*cpus);
  }
  tc.devices = e->cfg_.devices;
  tc.slice_size = e->cfg_.slice_size;
  tc.fragment_limit = e->cfg_.fragment_limit;
  tc.max_retry = e->cfg_.max_retry;
  tc.transfer_timeout = e->cfg_.transfer_timeout;
  tc.custom_topology_json = e->cfg_.custom_topology_json;
  tc.max_batches = e->cfg_.max_batches;
  tc.max_tasks_per_batch = e->cfg_.max_tasks_per_batch;
  tc.max_wrs_write = e->cfg_.max_wrs_write;
  tc.max_wrs_read = e->cfg_.max_wrs_read;
  tc.coalesce = e->cfg_.coalesce_requests;
  tc.wait_spin = e->cfg_.wait_spin;
  tc.rail.initial_cooldown = e->cfg_.rail_cooldown;
  tc.rail.max_cooldown = e->cfg_.rail_max_cooldown;
  if (e->cfg_.notify_rdma_credits > kMaxNotifyCredits)
    return fail(errc::config_invalid, "notify_rdma_credits must be 0.." + std::to_string(kMaxNotifyCredits));
  tc.context.notify_credits = e->cfg_.notify_rdma_credits;
  // Notifications that came over RDMA: the same inbox, bounds and sender
  // rule as the TCP path's handler above (with a secret the sender is the
  // authenticated peer: the handshake bound the endpoint's NIC path to it).
  tc.on_notify = [im](const notify_desc& n, std::string_view peer_server) {
    if (!im->secret) {
      (void)im->inbox.push(n, n.name);
      return;
    }
    notify_desc from = n;
    from.name = std::string(peer_server);
    (void)im->inbox.push(from, peer_server);
  };
  auto t = rdma::rdma_transport<P>::create(tc, std::move(send), publish, refresh, peer_gid);
  if (!t) return fail(t.error());
  e->transport_ = std::move(*t);
  if (im->tcp) e->transport_->set_carrier(im->route.get());
  im->route->attach(e->transport_.get(), im->tcp.get());
  if (kinds->rdma && e->transport_->context_count() == 0)
    TIDE_LOG_WARN("no RDMA device on this host: " << e->name_ << " runs on TCP alone (data port "
                                                  << im->tcp->port() << ")");
  TIDE_LOG_INFO("engine " << e->name_ << ": handshake port " << im->server->port() << " on " << e->cfg_.bind_host
                          << ", metadata " << (e->cfg_.metadata.empty() ? "in-process" : e->cfg_.metadata)
                          << ", transports: "
                          << (e->transport_->context_count() != 0
                                  ? "rdma on " + std::to_string(e->transport_->context_count()) + " device(s)"
                                  : std::string("no rdma"))
                          << (im->tcp ? ", tcp data port " + std::to_string(im->tcp->port()) : std::string())
                          << "; policies " << detail::policy_names<P>()
                          << (im->secret ? "; cluster secret on" : "; no cluster secret"));
  im->transport.store(e->transport_.get(), std::memory_order_release);
  im->outbox->set_rdma([self](segment_id target, rdma::detail::notify_send* n) {
    return self->transport_->send_notify_rdma(target, n);
  });
  if (auto r = e->transport_->publish(); !r) return fail(r.error());
  // Mooncake peers in etcd/http mode look the handshake address up here, not
  // in the segment name (research/mooncake-wire.md §3).
  if constexpr (metadata_key_store<metadata_backend_type>) {
    const std::string key = rpc_meta_key(e->cfg_.cluster_id, e->name_);
    if (auto r = e->cache_->backend().put_key(key, encode_rpc_meta(host->host, im->server->port())); !r)
      return fail(r.error().code, "rpc_meta: " + r.error().detail);
    im->rpc_meta_key = key;
  }
  if (e->cfg_.metrics_port != 0) {
    auto server = metrics::http_server::start(e->cfg_.metrics_bind, e->cfg_.metrics_port,
                                              [self] { return self->metrics_text(); });
    if (!server) return fail(server.error());
    im->metrics_server = std::move(*server);
  }
  return e;
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
status transfer_engine<P>::register_memory(void* addr, std::size_t len, std::string_view location,
                                           buffer_access access) {
  return transport_->register_memory(addr, len, location, true, access);
}

template <class P>
status transfer_engine<P>::unregister_memory(void* addr, in_flight mode) {
  return transport_->unregister_memory(addr, true, mode);
}

template <class P>
status transfer_engine<P>::register_memory_batch(std::span<const buffer_entry> buffers, std::string_view location) {
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (auto r = transport_->register_memory(buffers[i].addr, buffers[i].length, location, false); !r) {
      for (std::size_t j = 0; j < i; ++j) (void)transport_->unregister_memory(buffers[j].addr, false);
      (void)transport_->publish();  // deregisters the rolled-back MRs
      return fail(r.error().code, "buffer " + std::to_string(i) + ": " + r.error().detail);
    }
  }
  return transport_->publish();
}

template <class P>
status transfer_engine<P>::unregister_memory_batch(std::span<void* const> addrs) {
  status first{};
  for (void* a : addrs)
    if (auto r = transport_->unregister_memory(a, false); !r && first) first = r;
  if (auto r = transport_->publish(); !r && first) first = r;
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
  return impl_->inbox.take(wait);
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
