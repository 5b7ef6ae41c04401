#pragma once
/// Where a peer's handshake listener is (not API).  Mooncake peers in
/// etcd/http mode listen on a port of their own and publish it under
/// rpc_meta/<server name> as {"ip_or_host_name":...,"rpc_port":...}; their
/// segment name's port (if any) is not the handshake port.
///
/// With a cluster secret rpc_meta is not read: anyone who can write the
/// store can write it, and an address there would send our handshakes to a
/// black hole or through a relay.  The address then comes from the peer's
/// descriptor ("tide_handshake"), which its header MAC binds and whose stamp
/// the segment cache checks against replays.
///
/// Threads: any; the cache is guarded by the caller's mutex.

#include <tide/metadata/backend.hpp>
#include <tide/metadata/descriptors.hpp>
#include <tide/metadata/segment_cache.hpp>
#include <tide/net/address.hpp>
#include <tide/result.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace tide {

namespace detail {
/// Where to send a handshake for `server` (the <server> of a NIC path):
/// in etcd/http mode the address in Mooncake's rpc_meta/<server> entry when
/// the store has one (cached), else the server name itself.  `fresh` skips
/// the cache.
template <class Backend>
result<net::peer_address> handshake_address(Backend& backend, std::string_view cluster_id, std::string_view server,
                                            std::mutex& mu, std::map<std::string, net::peer_address, std::less<>>& cache,
                                            bool fresh) {
  if constexpr (metadata_key_store<Backend>) {
    if (!fresh) {
      std::lock_guard lock(mu);
      if (auto it = cache.find(server); it != cache.end()) return it->second;
    }
    auto value = backend.get_key(rpc_meta_key(cluster_id, server));
    if (value) {
      auto meta = decode_rpc_meta(*value);
      if (!meta) return fail(meta.error().code, "rpc_meta of " + std::string(server) + ": " + meta.error().detail);
      net::peer_address a{meta->host, meta->port};
      std::lock_guard lock(mu);
      cache.insert_or_assign(std::string(server), a);
      return a;
    }
    if (value.error().code != errc::segment_not_found) return fail(value.error());
  }
  return net::parse_peer_address(server);
}

/// As above, over the engine's segment cache: with a secret (etcd/http
/// mode) the address is the "tide_handshake" of `server`'s descriptor (the
/// open one unless `fresh`, else read from the store and checked), never
/// rpc_meta; without one, rpc_meta as above.  Errors (with a secret): the
/// descriptor's (segment_not_found, metadata_malformed, ...), and
/// metadata_malformed when it has no tide_handshake.
template <class Backend>
result<net::peer_address> handshake_address(segment_cache<Backend>& segments, std::string_view cluster_id,
                                            std::string_view server, std::mutex& mu,
                                            std::map<std::string, net::peer_address, std::less<>>& cache, bool fresh) {
  if constexpr (metadata_key_store<Backend>) {
    if (segments.sealed()) {
      auto d = segments.descriptor_of(server, fresh);
      if (!d)
        return fail(d.error().code, "the handshake address of " + std::string(server) + ": " + d.error().detail);
      if (!(*d)->handshake)
        return fail(errc::metadata_malformed,
                    "segment " + std::string(server) + ": tide_handshake: missing; with a cluster secret the "
                    "handshake address is read only from the authenticated descriptor (published by an older tide?)");
      return net::parse_peer_address(*(*d)->handshake, 0);
    }
  }
  return handshake_address(segments.backend(), cluster_id, server, mu, cache, fresh);
}
}  // namespace detail

}  // namespace tide
