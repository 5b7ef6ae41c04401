#pragma once
/// The metadata backend concept: where segment descriptors live.
///
/// A backend stores one JSON descriptor per segment name.  Keys on shared
/// stores follow Mooncake's scheme, `mooncake/[<cluster_id>/]ram/<segment>`,
/// so tide and Mooncake peers can share one etcd or HTTP metadata server.
/// Shipped models: tide::policy::p2p, etcd, http, in_process.

#include <tide/result.hpp>

#include <chrono>
#include <concepts>
#include <memory>
#include <string>
#include <string_view>

namespace tide {

namespace wire {
class cluster_secret;
}

/// How to reach the metadata store; one struct for every backend.
struct metadata_config {
  /// "P2PHANDSHAKE", "etcd://host:port[,host:port...]", "http://host:port/path",
  /// or empty for in_process.
  std::string connection;
  /// Optional key prefix: keys become mooncake/<cluster_id>/ram/<segment>.
  std::string cluster_id;
  /// Bound on every backend round trip (connect + request + reply).
  std::chrono::milliseconds timeout{3000};

  /// etcd over TLS (policy::etcd): used when the connection is
  /// "etcds://..." or any of the three files is set.  PEM files; an empty CA
  /// file means the system's CA store.  The server's certificate must name
  /// the endpoint's host or IP unless etcd_verify_server is false.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  bool etcd_verify_server = true;
  /// etcd user/password auth (with or without TLS); the file holds the
  /// password (a trailing newline is ignored).
  std::string etcd_user;
  std::string etcd_password_file;
  /// policy::http: a file holding the bearer token tide-metadata-server
  /// requires for PUT and DELETE (its --token-file).
  std::string token_file;
  /// The cluster secret (wire/auth.hpp); backends that speak the handshake
  /// protocol (p2p) authenticate with it.  Null = none.
  std::shared_ptr<const wire::cluster_secret> secret;
  /// This process's segment name, bound into authenticated requests.
  std::string identity;
};

/// Requires: B is constructible from a metadata_config (a bad connection
/// string is reported by the first call, as errc::config_invalid);
/// get_segment returns the stored JSON text, errc::segment_not_found when
/// nothing is stored under that name, errc::metadata_unavailable when the
/// store cannot be reached within the timeout; put/remove likewise.
/// Thread safety: every call may be made from several threads at once.
template <class B>
concept metadata_backend =
    std::constructible_from<B, const metadata_config&> &&
    requires(B& b, std::string_view name, std::string_view json) {
      { B::kName } -> std::convertible_to<std::string_view>;
      { b.get_segment(name) } -> std::same_as<result<std::string>>;
      { b.put_segment(name, json) } -> std::same_as<status>;
      { b.remove_segment(name) } -> std::same_as<status>;
    };

/// A backend on a shared key-value store (etcd, http) that also reads and
/// writes full keys, such as Mooncake's rpc_meta entries.  Optional: the
/// engine publishes rpc_meta only through backends that model it (p2p and
/// in_process have no shared store to put it in).
template <class B>
concept metadata_key_store = metadata_backend<B> && requires(B& b, std::string_view key, std::string_view json) {
  { b.get_key(key) } -> std::same_as<result<std::string>>;
  { b.put_key(key, json) } -> std::same_as<status>;
  { b.remove_key(key) } -> std::same_as<status>;
};

/// A backend whose descriptors peers fetch from the publishing engine
/// itself, over its handshake port (p2p): the engine encodes its descriptor
/// when a peer asks rather than on every publish, so a registration costs
/// the same with one buffer registered as with ten thousand.
template <class B>
concept metadata_served_by_owner = metadata_backend<B> && B::kServedByOwner;

}  // namespace tide
