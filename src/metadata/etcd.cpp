#include <tide/policy/etcd.hpp>

#include "etcd_codec.hpp"
#include "http_client.hpp"

#include <tide/detail/log.hpp>
#include <tide/metadata/descriptors.hpp>
#include <tide/net/address.hpp>

#include <atomic>
#include <optional>
#include <vector>

namespace tide::policy {

struct etcd::impl {
  metadata_config config;
  std::vector<net::peer_address> endpoints;
  std::optional<error> config_error;
  std::atomic<std::size_t> preferred{0};  // the endpoint that answered last

  explicit impl(const metadata_config& c) : config(c) {
    std::string_view s = config.connection;
    if (s.starts_with("etcd://")) s.remove_prefix(7);
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
    } else if (config.timeout.count() <= 0) {
      config_error = error{errc::config_invalid, "metadata timeout must be > 0"};
    }
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
      auto reply = detail::http_request(ep.host, ep.port, "POST", path, body, "application/json", config.timeout);
      std::string why;
      if (!reply) {
        why = reply.error().detail;
      } else if (reply->status != 200) {
        why = net::format_peer_address(ep.host, ep.port) + " answered HTTP " + std::to_string(reply->status) + ": " +
              reply->body.substr(0, 200);
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
