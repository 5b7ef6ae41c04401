#include <tide/policy/http.hpp>

#include "http_client.hpp"

#include <tide/metadata/descriptors.hpp>
#include <tide/net/address.hpp>

#include <optional>

namespace tide::policy {

struct http::impl {
  metadata_config config;
  net::peer_address server;
  std::string path;
  std::optional<error> config_error;
  std::string bearer;  // "Bearer <token>" for PUT/DELETE; never logged

  explicit impl(const metadata_config& c) : config(c) {
    std::string_view s = config.connection;
    if (!s.starts_with("http://")) {
      config_error = error{errc::config_invalid, "HTTP metadata URL \"" + config.connection +
                                                     "\" must start with http:// (https is not supported)"};
      return;
    }
    s.remove_prefix(7);
    const auto slash = s.find('/');
    const std::string_view authority = s.substr(0, slash);
    path = slash == std::string_view::npos ? std::string("/") : std::string(s.substr(slash));
    if (path.find_first_of("?#") != std::string::npos) {
      config_error = error{errc::config_invalid, "HTTP metadata URL \"" + config.connection + "\" has a query"};
      return;
    }
    auto ep = net::parse_peer_address(authority, 80);
    if (!ep) {
      config_error = error{errc::config_invalid, "HTTP metadata URL \"" + config.connection + "\": " + ep.error().detail};
      return;
    }
    server = std::move(*ep);
    if (config.timeout.count() <= 0) {
      config_error = error{errc::config_invalid, "metadata timeout must be > 0"};
      return;
    }
    if (!config.token_file.empty()) {
      auto token = detail::read_secret_file("metadata_token_file", config.token_file);
      if (!token) {
        config_error = token.error();
        return;
      }
      bearer = "Bearer " + *token;
    }
  }

  result<detail::http_reply> request(std::string_view method, std::string_view key, std::string_view body) {
    if (config_error) return fail(*config_error);
    const std::string target = path + "?key=" + detail::url_escape(key);
    // GET stays open (Mooncake peers read without a token); writes carry it.
    detail::http_request_options options;
    if (method != "GET") options.authorization = bearer;
    return detail::http_request(server.host, server.port, method, target, body,
                                body.empty() ? std::string_view{} : std::string_view{"application/json"},
                                config.timeout, options);
  }

  error unexpected(std::string_view method, const detail::http_reply& r) const {
    std::string body = r.body.substr(0, 200);
    while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
    return error{errc::metadata_unavailable, std::string(method) + " " + net::format_peer_address(server.host, server.port) +
                                                 path + " answered HTTP " + std::to_string(r.status) + ": " + body};
  }
};

http::http(const metadata_config& config) : impl_(std::make_unique<impl>(config)) {}
http::http(http&&) noexcept = default;
http& http::operator=(http&&) noexcept = default;
http::~http() = default;

result<std::string> http::get_segment(std::string_view name) {
  return get_key(segment_key(impl_->config.cluster_id, name));
}

status http::put_segment(std::string_view name, std::string_view json) {
  return put_key(segment_key(impl_->config.cluster_id, name), json);
}

status http::remove_segment(std::string_view name) {
  return remove_key(segment_key(impl_->config.cluster_id, name));
}

result<std::string> http::get_key(std::string_view key) {
  auto r = impl_->request("GET", key, {});
  if (!r) return fail(r.error());
  if (r->status == 404) return fail(errc::segment_not_found, "no key " + std::string(key));
  if (r->status != 200) return fail(impl_->unexpected("GET", *r));
  return std::move(r->body);
}

status http::put_key(std::string_view key, std::string_view json) {
  auto r = impl_->request("PUT", key, json);
  if (!r) return fail(r.error());
  if (r->status != 200) return fail(impl_->unexpected("PUT", *r));
  return {};
}

status http::remove_key(std::string_view key) {
  auto r = impl_->request("DELETE", key, {});
  if (!r) return fail(r.error());
  if (r->status == 404) return fail(errc::segment_not_found, "no key " + std::string(key));
  if (r->status != 200) return fail(impl_->unexpected("DELETE", *r));
  return {};
}

}  // namespace tide::policy
