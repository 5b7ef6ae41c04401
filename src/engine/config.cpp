#include <tide/engine.hpp>

#include <charconv>
#include <cstdlib>

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
status number(std::string_view name, T& out, long long lo, long long hi) {
  std::string which;
  const char* v = env(name, which);
  if (v == nullptr) return {};
  long long x = 0;
  const std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc{} || p != s.data() + s.size() || x < lo || x > hi)
    return fail(errc::config_invalid, which + "=\"" + std::string(s) + "\": expected an integer in [" +
                                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = static_cast<T>(x);
  return {};
}

}  // namespace

status engine_config::apply_env() {
  std::string which;
  if (auto r = number("NUM_QP_PER_EP", num_qp_per_ep, 1, 255); !r) return r;
  if (auto r = number("SLICE_SIZE", slice_size, 1, 1LL << 30); !r) return r;
  if (auto r = number("WORKERS_PER_CTX", workers_per_context, 1, 64); !r) return r;
  if (auto r = number("MAX_EP_PER_CTX", endpoint_capacity, 1, 1 << 20); !r) return r;
  if (auto r = number("GID_INDEX", gid_index, -1, 255); !r) return r;
  if (auto r = number("MTU", mtu, 256, 4096); !r) return r;
  if (auto r = number("IB_PORT", ib_port, 1, 255); !r) return r;
  if (auto r = number("RETRY_CNT", max_retry, 0, 64); !r) return r;
  if (auto r = number("QP_RETRY_CNT", qp_retry_cnt, 0, 7); !r) return r;
  if (auto r = number("QP_TIMEOUT", qp_timeout, 0, 31); !r) return r;
  long long timeout_ms = transfer_timeout.count();
  if (auto r = number("TRANSFER_TIMEOUT_MS", timeout_ms, 1, 1LL << 40); !r) return r;
  transfer_timeout = std::chrono::milliseconds(timeout_ms);
  if (const char* v = env("CUSTOM_TOPO_JSON", which)) custom_topology_json = v;
  if (const char* v = env("METADATA_CLUSTER_ID", which)) cluster_id = v;
  if (const char* v = env("ETCD_CA_FILE", which)) etcd_ca_file = v;
  if (const char* v = env("ETCD_CERT_FILE", which)) etcd_cert_file = v;
  if (const char* v = env("ETCD_KEY_FILE", which)) etcd_key_file = v;
  if (auto r = number("ETCD_VERIFY_SERVER", etcd_verify_server, 0, 1); !r) return r;
  if (const char* v = env("ETCD_USER", which)) etcd_user = v;
  if (const char* v = env("ETCD_PASSWORD_FILE", which)) etcd_password_file = v;
  if (const char* v = env("METADATA_TOKEN_FILE", which)) metadata_token_file = v;
  return {};
}

}  // namespace tide
