#pragma once
// transfer_engine<P>::create: the wiring of one engine (its handshake server,
// metadata cache, TCP transport, RDMA transport, notification outbox and
// metrics endpoint, in the order each needs the ones before).  Included at
// the end of engine_impl.hpp, which defines transfer_engine<P>::impl and the
// helpers used here.

namespace tide {

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
  tc.stage_host_memory = e->cfg_.stage_host_memory;
  tc.rdma_staging = e->cfg_.rdma_staging;
  tc.context.stage_chunk_size = e->cfg_.stage_chunk_size;
  tc.context.stage_chunks = e->cfg_.stage_chunks;
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
    if (e->cfg_.publish_delay.count() > 0)
      im->deferred = std::make_unique<detail::deferred_publisher>(e->cfg_.publish_delay, [self] {
        return self->impl_->publisher.commit([self] { return self->transport_->publish(); });
      });
  }
  if (e->cfg_.metrics_port != 0) {
    auto server = metrics::http_server::start(e->cfg_.metrics_bind, e->cfg_.metrics_port,
                                              [self] { return self->metrics_text(); });
    if (!server) return fail(server.error());
    im->metrics_server = std::move(*server);
  }
  return e;
}

}  // namespace tide
