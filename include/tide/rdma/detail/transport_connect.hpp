#pragma once
// Member definitions of rdma_transport<P>, the passive handshake (included by
// rdma_transport.hpp): a Connection request is routed to the context of the
// NIC it names.

namespace tide::rdma {

template <class P>
handshake_desc rdma_transport<P>::on_connect(const handshake_desc& req, std::string_view peer_identity) {
  const std::string_view nic = wire::nic_path_device(req.peer_nic_path);
  auto reject = [&](std::string why) {
    handshake_desc r;
    r.local_nic_path = req.peer_nic_path;
    r.peer_nic_path = req.local_nic_path;
    r.reply_msg = std::move(why);
    return r;
  };
  // Identity binding (cluster secret set): a peer connects only its own NIC
  // paths.  A first-come ownership map let any member claim a victim's path
  // first (review turn 3, finding 14).
  if (!peer_identity.empty())
    if (auto ok = wire::check_peer_identity(peer_identity, req.local_nic_path); !ok)
      return reject("Invalid argument: " + ok.error().detail);
  for (auto& c : contexts_) {
    if (c->name() != nic) continue;
    // A ready ack carries no GID the passive side needs; only connects do.
    if (req.local_gid || req.ready_ack.value_or(false)) return c->handle_connect(req);
    // Mooncake peers may send local_gid "" and expect the GID to be read
    // from their published devices[] (RE:539-558): <segment>@<device>.
    const std::string_view path = req.local_nic_path;
    if (wire::nic_path_split(path) == std::string_view::npos)
      return reject("Invalid peer GID: no GID sent and local_nic_path \"" + req.local_nic_path +
                    "\" is not <segment>@<device>");
    if (!peer_gid_) return reject("Invalid peer GID: no GID sent and no metadata to look it up");
    auto gid = peer_gid_(wire::nic_path_server(path), wire::nic_path_device(path));
    if (!gid) return reject("Invalid peer GID: " + gid.error().detail);
    handshake_desc with_gid = req;
    with_gid.local_gid = *gid;
    return c->handle_connect(with_gid);
  }
  return reject("Local RDMA context not found: " + std::string(nic));
}

template <class P>
detail::notify_sink* rdma_transport<P>::notify_lane_for(segment_id target, detail::notify_send* n) noexcept {
  if (stopping_.load(std::memory_order_acquire)) return nullptr;
  std::shared_ptr<const remote_segment> view;
  {
    std::shared_lock lock(seg_mu_);
    if (target < segments_.size()) view = segments_[target]->view;
  }
  if (!view) return nullptr;
  // Any rail will do: the group is final by the time it goes out, so every
  // WR of it was acked and its bytes are at the target whichever QP
  // carries the message.
  for (auto& c : contexts_) {
    if (!c->active()) continue;
    for (const std::string& path : view->nic_paths) {
      auto h = c->find_endpoint(path);
      if (!h || !h->notify_ready()) continue;
      try {
        n->peer_path = path;
      } catch (...) {
        return nullptr;
      }
      return &c->lanes().at(0);
    }
  }
  return nullptr;
}

template <class P>
bool rdma_transport<P>::send_notify_rdma(segment_id target, detail::notify_send* n) noexcept {
  detail::notify_sink* lane = notify_lane_for(target, n);
  return lane != nullptr && lane->take_notify(n);
}

}  // namespace tide::rdma
