// engine_config: environment overrides and the JSON configuration file.
// Both go through one table of settings (each_number / each_text below), so
// a setting has one range and one way of naming it in an error.
#include <tide/engine.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <type_traits>

namespace tide {
namespace {

// The value of TIDE_<name>, else MC_<name>; nullptr when neither is set.
const char* env(std::string_view name, std::string& which) {
  for (const char* prefix : {"TIDE_", "MC_"}) {
    which = std::string(prefix) + std::string(name);
    if (const char* v = std::getenv(which.c_str()); v != nullptr && *v != '\0') return v;
  }
  return nullptr;
}

template <class T>
struct is_duration : std::false_type {};
template <class R, class Per>
struct is_duration<std::chrono::duration<R, Per>> : std::true_type {};

template <class T>
void assign(T& field, long long x) {
  if constexpr (is_duration<T>::value) field = T(x);
  else field = static_cast<T>(x);
}

std::string range_text(long long lo, long long hi) {
  return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// Every numeric setting: the key in the file (the field's name; durations
// in ms end in _ms, in us in _us), the name after TIDE_/MC_ ("" = no variable), the field
// and its range.  f returns a status; the first error stops the walk.
template <class F>
status each_number(engine_config& c, F&& f) {
  constexpr long long kMaxMs = 1LL << 40;
  if (auto r = f("num_qp_per_ep", "NUM_QP_PER_EP", c.num_qp_per_ep, 1, 255); !r) return r;
  if (auto r = f("slice_size", "SLICE_SIZE", c.slice_size, 1, 1LL << 30); !r) return r;
  if (auto r = f("fragment_limit", "", c.fragment_limit, 0, 1LL << 30); !r) return r;
  if (auto r = f("workers_per_context", "WORKERS_PER_CTX", c.workers_per_context, 0, 64); !r) return r;
  if (auto r = f("endpoint_capacity", "MAX_EP_PER_CTX", c.endpoint_capacity, 1, 1 << 20); !r) return r;
  if (auto r = f("gid_index", "GID_INDEX", c.gid_index, -1, 255); !r) return r;
  if (auto r = f("mtu", "MTU", c.mtu, 256, 4096); !r) return r;
  if (auto r = f("ib_port", "IB_PORT", c.ib_port, 1, 255); !r) return r;
  if (auto r = f("max_retry", "RETRY_CNT", c.max_retry, 0, 64); !r) return r;
  if (auto r = f("qp_retry_cnt", "QP_RETRY_CNT", c.qp_retry_cnt, 0, 7); !r) return r;
  if (auto r = f("qp_timeout", "QP_TIMEOUT", c.qp_timeout, 0, 31); !r) return r;
  if (auto r = f("transfer_timeout_ms", "TRANSFER_TIMEOUT_MS", c.transfer_timeout, 1, kMaxMs); !r) return r;
  if (auto r = f("metadata_timeout_ms", "", c.metadata_timeout, 1, kMaxMs); !r) return r;
  if (auto r = f("handshake_connect_timeout_ms", "", c.handshake_connect_timeout, 1, kMaxMs); !r) return r;
  if (auto r = f("handshake_timeout_ms", "", c.handshake_timeout, 1, kMaxMs); !r) return r;
  if (auto r = f("ready_ack_timeout_ms", "", c.ready_ack_timeout, 1, kMaxMs); !r) return r;
  if (auto r = f("handshake_port", "", c.handshake_port, 0, 65535); !r) return r;
  if (auto r = f("max_batches", "", c.max_batches, 1, 1LL << 24); !r) return r;
  if (auto r = f("max_tasks_per_batch", "", c.max_tasks_per_batch, 1, 1LL << 30); !r) return r;
  if (auto r = f("max_cqe", "MAX_CQE", c.max_cqe, 1, 1 << 22); !r) return r;
  if (auto r = f("max_wr", "MAX_WR", c.max_wr, 1, 1 << 16); !r) return r;
  if (auto r = f("max_rd_atomic", "MAX_RD_ATOMIC", c.max_rd_atomic, 1, 255); !r) return r;
  if (auto r = f("max_inline", "MAX_INLINE", c.max_inline, 0, 1 << 16); !r) return r;
  if (auto r = f("signal_interval", "SIGNAL_INTERVAL", c.signal_interval, 1, 1 << 15); !r) return r;
  if (auto r = f("max_wrs_write", "", c.max_wrs_write, 1, 1 << 16); !r) return r;
  if (auto r = f("max_wrs_read", "", c.max_wrs_read, 1, 1 << 16); !r) return r;
  if (auto r = f("coalesce_requests", "", c.coalesce_requests, 0, 1); !r) return r;
  if (auto r = f("rail_cooldown_ms", "", c.rail_cooldown, 1, kMaxMs); !r) return r;
  if (auto r = f("rail_max_cooldown_ms", "", c.rail_max_cooldown, 1, kMaxMs); !r) return r;
  if (auto r = f("wait_spin_us", "WAIT_SPIN_US", c.wait_spin, 0, 1000000); !r) return r;
  if (auto r = f("metrics_port", "METRICS_PORT", c.metrics_port, 0, 65535); !r) return r;
  if (auto r = f("etcd_verify_server", "ETCD_VERIFY_SERVER", c.etcd_verify_server, 0, 1); !r) return r;
  if (auto r = f("notify_max_count", "", c.notify_max_count, 1, 1LL << 32); !r) return r;
  if (auto r = f("notify_max_bytes", "", c.notify_max_bytes, 1, 1LL << 40); !r) return r;
  if (auto r = f("notify_rate_per_peer", "", c.notify_rate_per_peer, 0, 1LL << 31); !r) return r;
  if (auto r = f("notify_rdma_credits", "NOTIFY_RDMA_CREDITS", c.notify_rdma_credits, 0, 64); !r) return r;
  if (auto r = f("tcp_port", "TCP_PORT", c.tcp_port, 0, 65535); !r) return r;
  if (auto r = f("tcp_io_threads", "TCP_IO_THREADS", c.tcp_io_threads, 1, 64); !r) return r;
  if (auto r = f("tcp_conns_per_peer", "TCP_CONNS_PER_PEER", c.tcp_conns_per_peer, 1, 64); !r) return r;
  if (auto r = f("tcp_slice_size", "TCP_SLICE_SIZE", c.tcp_slice_size, 4096, 1LL << 30); !r) return r;
  if (auto r = f("tcp_proto", "TCP_PROTO", c.tcp_proto, 1, 2); !r) return r;
  return {};
}

// Every text setting, as each_number.
template <class F>
status each_text(engine_config& c, F&& f) {
  if (auto r = f("local_server_name", "", c.local_server_name); !r) return r;
  if (auto r = f("metadata", "", c.metadata); !r) return r;
  if (auto r = f("cluster_id", "METADATA_CLUSTER_ID", c.cluster_id); !r) return r;
  if (auto r = f("bind_host", "HANDSHAKE_BIND", c.bind_host); !r) return r;
  if (auto r = f("metrics_bind", "METRICS_BIND", c.metrics_bind); !r) return r;
  if (auto r = f("custom_topology_json", "CUSTOM_TOPO_JSON", c.custom_topology_json); !r) return r;
  if (auto r = f("sysfs_root", "", c.sysfs_root); !r) return r;
  if (auto r = f("etcd_ca_file", "ETCD_CA_FILE", c.etcd_ca_file); !r) return r;
  if (auto r = f("etcd_cert_file", "ETCD_CERT_FILE", c.etcd_cert_file); !r) return r;
  if (auto r = f("etcd_key_file", "ETCD_KEY_FILE", c.etcd_key_file); !r) return r;
  if (auto r = f("etcd_user", "ETCD_USER", c.etcd_user); !r) return r;
  if (auto r = f("etcd_password_file", "ETCD_PASSWORD_FILE", c.etcd_password_file); !r) return r;
  if (auto r = f("metadata_token_file", "METADATA_TOKEN_FILE", c.metadata_token_file); !r) return r;
  if (auto r = f("auth_secret_file", "AUTH_SECRET_FILE", c.auth_secret_file); !r) return r;
  if (auto r = f("lane_cpus", "LANE_CPUS", c.lane_cpus); !r) return r;
  if (auto r = f("transports", "TRANSPORTS", c.transports); !r) return r;
  return {};
}

status read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errc::config_invalid, "config file " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return fail(errc::config_invalid, "config file " + path + ": read error");
  out = s.str();
  return {};
}

}  // namespace

status engine_config::apply_file(const std::string& path) {
  std::string text;
  if (auto r = read_file(path, text); !r) return r;
  return apply_json(text, "config file " + path);
}

status engine_config::apply_json(std::string_view text, const std::string& origin) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return fail(errc::config_invalid, origin + ": not JSON: " + e.what());
  }
  if (!root.is_object()) return fail(errc::config_invalid, origin + ": expected a JSON object");
  // Applied to a copy: a file with an error changes nothing.
  engine_config next = *this;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    const std::string where = origin + ": \"" + key + "\"";
    bool known = false;
    auto number = [&](std::string_view name, std::string_view, auto& field, long long lo, long long hi) -> status {
      if (name != key) return {};
      known = true;
      // A flag may be written true / false as well as 1 / 0.
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(field)>, bool>) {
        if (v.is_boolean()) {
          field = v.get<bool>();
          return {};
        }
        if (!v.is_number_integer())
          return fail(errc::config_invalid, where + ": expected true, false, 0 or 1, got " + v.dump());
      }
      if (!v.is_number_integer())
        return fail(errc::config_invalid, where + ": " + range_text(lo, hi) + ", got " + v.dump());
      const long long x = v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(hi)
                              ? hi + 1
                              : v.get<long long>();
      if (x < lo || x > hi) return fail(errc::config_invalid, where + ": " + range_text(lo, hi) + ", got " + v.dump());
      assign(field, x);
      return {};
    };
    auto textual = [&](std::string_view name, std::string_view, std::string& field) -> status {
      if (name != key) return {};
      known = true;
      if (!v.is_string()) return fail(errc::config_invalid, where + ": expected a string, got " + v.dump());
      field = v.get<std::string>();
      return {};
    };
    if (auto r = each_number(next, number); !r) return r;
    if (auto r = each_text(next, textual); !r) return r;
    if (key == "devices") {
      known = true;
      if (!v.is_array()) return fail(errc::config_invalid, where + ": expected an array of device names");
      next.devices.clear();
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string() || v[i].get<std::string>().empty())
          return fail(errc::config_invalid, where + "[" + std::to_string(i) + "]: expected a device name, got " +
                                                v[i].dump());
        next.devices.push_back(v[i].get<std::string>());
      }
    }
    if (!known) return fail(errc::config_invalid, origin + ": unknown key \"" + key + "\"");
  }
  *this = std::move(next);
  return {};
}

result<engine_config> engine_config::from_file(const std::string& path) {
  engine_config c;
  if (auto r = c.apply_file(path); !r) return fail(r.error());
  return c;
}

status engine_config::apply_env() {
  std::string which;
  if (const char* path = std::getenv("TIDE_CONFIG"); path != nullptr && *path != '\0')
    if (auto r = apply_file(path); !r) return fail(errc::config_invalid, "TIDE_CONFIG: " + r.error().detail);
  auto number = [&](std::string_view, std::string_view name, auto& field, long long lo, long long hi) -> status {
    if (name.empty()) return {};
    const char* v = env(name, which);
    if (v == nullptr) return {};
    long long x = 0;
    const std::string_view s(v);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc{} || p != s.data() + s.size() || x < lo || x > hi)
      return fail(errc::config_invalid, which + "=\"" + std::string(s) + "\": " + range_text(lo, hi));
    assign(field, x);
    return {};
  };
  auto textual = [&](std::string_view, std::string_view name, std::string& field) -> status {
    if (name.empty()) return {};
    if (const char* v = env(name, which)) field = v;
    return {};
  };
  if (auto r = each_number(*this, number); !r) return r;
  if (auto r = each_text(*this, textual); !r) return r;
  // Mooncake's switch to its TCP transport.
  if (const char* v = env("FORCE_TCP", which)) {
    std::string x(v);
    std::transform(x.begin(), x.end(), x.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (x == "1" || x == "true" || x == "yes" || x == "on") {
      transports = "tcp";
    } else if (x != "0" && x != "false" && x != "no" && x != "off") {
      return fail(errc::config_invalid, which + "=\"" + std::string(v) + "\": expected 1/true/yes/on or 0/false/no/off");
    }
  }
  return {};
}

result<transport_set> parse_transports(std::string_view text) {
  transport_set t;
  t.rdma = t.tcp = false;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    std::string_view word = text.substr(at, end - at);
    while (!word.empty() && word.front() == ' ') word.remove_prefix(1);
    while (!word.empty() && word.back() == ' ') word.remove_suffix(1);
    if (word == "rdma") t.rdma = true;
    else if (word == "tcp") t.tcp = true;
    else
      return fail(errc::config_invalid, "transports \"" + std::string(text) + "\": \"" + std::string(word) +
                                            "\" is not a transport (rdma, tcp, or both: \"rdma,tcp\")");
    at = end + 1;
  }
  return t;
}

}  // namespace tide
