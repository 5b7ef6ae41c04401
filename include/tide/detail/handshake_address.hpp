#pragma once
/// Where a peer's handshake listener is (not API).  Mooncake peers in
/// etcd/http mode listen on a port of their own and publish it under
/// rpc_meta/<server name> as {"ip_or_host_name":...,"rpc_port":...}; their
/// segment name's port (if any) is not the handshake port.
///
/// Threads: any; the cache is guarded by the caller's mutex.

#include <tide/metadata/backend.hpp>
#include <tide/metadata/descriptors.hpp>
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
}  // namespace detail

}  // namespace tide
