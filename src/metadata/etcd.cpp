#include <tide/policy/etcd.hpp>

#include "etcd_codec.hpp"
#include "http_client.hpp"
#include "tls_context.hpp"

#include <tide/detail/log.hpp>
#include <tide/metadata/descriptors.hpp>
#include <tide/net/address.hpp>

#include <atomic>
#include <mutex>
#include <optional>
#include <vector>

namespace tide::policy {
namespace {

// The start of an error reply, for an error detail.
std::string snippet(const std::string& body) {
  std::string s = body.substr(0, 200);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

// Owned by the etcd object; every member but `token` is written only by the
// constructor, `token` is guarded by token_mu, so calls may come from any
// thread at once.
struct etcd::impl {
  metadata_config config;
  std::vector<net::peer_address> endpoints;
  std::optional<error> config_error;
  std::atomic<std::size_t> preferred{0};  // the endpoint that answered last
  std::shared_ptr<const detail::tls_client_context> tls;  // null: plain http
  std::string password;  // never logged or put in an error

  std::mutex token_mu;
  std::string token;  // etcd auth token; empty: authenticate first

  explicit impl(const metadata_config& c) : config(c) {
    std::string_view s = config.connection;
    bool want_tls = false;
    if (s.starts_with("etcds://")) {
      s.remove_prefix(8);
      want_tls = true;
    } else if (s.starts_with("etcd://")) {
      s.remove_prefix(7);
    }
    while (!s.empty()) {
      const auto comma = s.find(',');
      const std::string_view item = s.substr(0, comma);
      s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
      if (item.empty()) continue;
      auto ep = net::parse_peer_address(item, 2379);
      if (!ep) {
        config_error = error{errc::config_invalid, "etcd endpoint \"" + std::string(item) + "\": " + ep.error().detail};
        return;
      }
      endpoints.push_back(std::move(*ep));
    }
    if (endpoints.empty()) {
      config_error = error{errc::config_invalid, "no etcd endpoint in \"" + config.connection + "\""};
      return;
    }
    if (config.timeout.count() <= 0) {
      config_error = error{errc::config_invalid, "metadata timeout must be > 0"};
      return;
    }
    want_tls = want_tls || !config.etcd_ca_file.empty() || !config.etcd_cert_file.empty() ||
               !config.etcd_key_file.empty();
    if (want_tls) {
      auto ctx = detail::tls_client_context::load({.ca_file = config.etcd_ca_file,
                                                   .cert_file = config.etcd_cert_file,
                                                   .key_file = config.etcd_key_file,
                                                   .verify_server = config.etcd_verify_server,
                                                   .field_prefix = "etcd_"});
      if (!ctx) {
        config_error = ctx.error();
        return;
      }
      tls = std::move(*ctx);
      if (!config.etcd_verify_server) {
        TIDE_LOG_WARN("etcd: etcd_verify_server is off: the server's certificate is not checked, so anyone on the "
                      "path can pose as etcd");
      }
    }
    if (config.etcd_user.empty() != config.etcd_password_file.empty()) {
      config_error = error{errc::config_invalid, config.etcd_user.empty()
                                                     ? "etcd_password_file is set but etcd_user is not"
                                                     : "etcd_user is set but etcd_password_file is not"};
      return;
    }
    if (!config.etcd_user.empty()) {
      auto pw = detail::read_secret_file("etcd_password_file", config.etcd_password_file);
      if (!pw) {
        config_error = pw.error();
        return;
      }
      password = std::move(*pw);
    }
  }

  [[nodiscard]] bool uses_auth() const noexcept { return !config.etcd_user.empty(); }

  std::string current_token() {
    std::lock_guard lock{token_mu};
    return token;
  }

  // POST /v3/auth/authenticate on `ep`; stores and returns the new token.
  result<std::string> authenticate(const net::peer_address& ep) {
    const std::string where = net::format_peer_address(ep.host, ep.port);
    auto reply = detail::http_request(ep.host, ep.port, "POST", "/v3/auth/authenticate",
                                      detail::etcd_authenticate_request(config.etcd_user, password), "application/json",
                                      config.timeout, {.tls = tls, .authorization = {}});
    if (!reply) return fail(reply.error());
    if (reply->status != 200) {
      std::string why = "etcd authentication as user \"" + config.etcd_user + "\" at " + where + " failed: HTTP " +
                        std::to_string(reply->status) + ": " + snippet(reply->body);
      if (reply->body.find("CommonName of client") != std::string::npos) {
        why += " (with auth on, etcd's JSON gateway needs an etcd_cert_file without a Common Name)";
      }
      return fail(errc::metadata_unavailable, why);
    }
    auto t = detail::parse_etcd_token(reply->body);
    if (!t) return fail(errc::metadata_unavailable, "etcd authentication reply from " + where + ": " + t.error().detail);
    std::lock_guard lock{token_mu};
    token = *t;
    return std::move(*t);
  }

  // One request to one endpoint, authenticated when a user is configured:
  // a missing token is fetched first; a token etcd rejects (expired, or the
  // member restarted) is replaced once.
  result<detail::http_reply> post(const net::peer_address& ep, std::string_view path, const std::string& body) {
    detail::http_request_options options{.tls = tls, .authorization = {}};
    if (uses_auth()) {
      options.authorization = current_token();
      if (options.authorization.empty()) {
        auto t = authenticate(ep);
        if (!t) return fail(t.error());
        options.authorization = std::move(*t);
      }
    }
    auto reply = detail::http_request(ep.host, ep.port, "POST", path, body, "application/json", config.timeout, options);
    if (!uses_auth() || !reply || reply->status != 401) return reply;
    TIDE_LOG_DEBUG("etcd " << path << ": token rejected (" << reply->body.substr(0, 120) << "), authenticating again");
    auto t = authenticate(ep);
    if (!t) return fail(t.error());
    options.authorization = std::move(*t);
    return detail::http_request(ep.host, ep.port, "POST", path, body, "application/json", config.timeout, options);
  }

  // POSTs `body` to `path` on each endpoint in turn, starting with the last
  // that answered; returns the first 200 reply's body.
  result<std::string> call(std::string_view path, const std::string& body) {
    if (config_error) return fail(*config_error);
    const std::size_t n = endpoints.size();
    const std::size_t first = preferred.load(std::memory_order_relaxed) % n;
    std::string failures;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (first + k) % n;
      const auto& ep = endpoints[i];
      auto reply = post(ep, path, body);
      std::string why;
      if (!reply) {
        why = reply.error().detail;
      } else if (reply->status != 200) {
        why = net::format_peer_address(ep.host, ep.port) + " answered HTTP " + std::to_string(reply->status) + ": " +
              snippet(reply->body);
        if (reply->body.find("CommonName of client") != std::string::npos) {
          why += " (with auth on, etcd's JSON gateway needs an etcd_cert_file without a Common Name)";
        }
      } else {
        if (i != first) preferred.store(i, std::memory_order_relaxed);
        return std::move(reply->body);
      }
      TIDE_LOG_DEBUG("etcd " << path << ": " << why);
      if (!failures.empty()) failures += "; ";
      failures += why;
    }
    return fail(errc::metadata_unavailable, "etcd " + std::string(path) + " failed on every endpoint: " + failures);
  }
};

etcd::etcd(const metadata_config& config) : impl_(std::make_unique<impl>(config)) {}
etcd::etcd(etcd&&) noexcept = default;
etcd& etcd::operator=(etcd&&) noexcept = default;
etcd::~etcd() = default;

result<std::string> etcd::get_segment(std::string_view name) {
  return get_key(segment_key(impl_->config.cluster_id, name));
}

status etcd::put_segment(std::string_view name, std::string_view json) {
  return put_key(segment_key(impl_->config.cluster_id, name), json);
}

status etcd::remove_segment(std::string_view name) {
  return remove_key(segment_key(impl_->config.cluster_id, name));
}

result<std::string> etcd::get_key(std::string_view key) {
  auto body = impl_->call("/v3/kv/range", detail::etcd_key_request(key));
  if (!body) return fail(body.error());
  auto value = detail::parse_etcd_range(*body);
  if (!value) return fail(errc::metadata_unavailable, "etcd range reply: " + value.error().detail);
  if (!*value) return fail(errc::segment_not_found, "no etcd key " + std::string(key));
  return std::move(**value);
}

status etcd::put_key(std::string_view key, std::string_view json) {
  auto body = impl_->call("/v3/kv/put", detail::etcd_put_request(key, json));
  if (!body) return fail(body.error());
  if (auto ok = detail::parse_etcd_put(*body); !ok) {
    return fail(errc::metadata_unavailable, "etcd put reply: " + ok.error().detail);
  }
  return {};
}

status etcd::remove_key(std::string_view key) {
  auto body = impl_->call("/v3/kv/deleterange", detail::etcd_key_request(key));
  if (!body) return fail(body.error());
  auto deleted = detail::parse_etcd_deleted(*body);
  if (!deleted) return fail(errc::metadata_unavailable, "etcd deleterange reply: " + deleted.error().detail);
  if (*deleted == 0) return fail(errc::segment_not_found, "no etcd key " + std::string(key));
  return {};
}

}  // namespace tide::policy
