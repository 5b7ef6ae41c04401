// JSON codecs of the handshake, notify and rpc_meta messages, GIDs, and the
// metadata keys (segment_codec.cpp has the segment descriptor); nlohmann
// stays out of headers.

#include <tide/wire/descriptors.hpp>

#include "json_util.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>
#include <sys/time.h>

namespace tide {

using nlohmann::json;
using detail::json_field;
using detail::malformed;

// ---------------------------------------------------------------- GID

result<gid_bytes> parse_gid(std::string_view text) {
  gid_bytes out;
  std::size_t pos = 0;
  for (std::size_t i = 0; i < out.raw.size(); ++i) {
    if (i > 0) {
      if (pos >= text.size() || text[pos] != ':') {
        return malformed("gid", "expected 16 colon-separated hex bytes, got \"" +
                                    std::string(text.substr(0, 64)) + "\"");
      }
      ++pos;
    }
    unsigned value = 0;
    std::size_t digits = 0;
    while (pos < text.size() && digits < 3) {
      const char c = text[pos];
      unsigned d;
      if (c >= '0' && c <= '9') {
        d = static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<unsigned>(c - 'A' + 10);
      } else {
        break;
      }
      value = value * 16 + d;
      ++digits;
      ++pos;
    }
    if (digits == 0 || digits > 2) {
      return malformed("gid", "byte " + std::to_string(i) + " of \"" +
                                  std::string(text.substr(0, 64)) +
                                  "\" is not 1-2 hex digits (16 colon-separated bytes expected)");
    }
    out.raw[i] = static_cast<std::uint8_t>(value);
  }
  if (pos != text.size()) {
    return malformed("gid", "trailing data after 16 bytes in \"" +
                                std::string(text.substr(0, 64)) + "\"");
  }
  return out;
}

std::string format_gid(const gid_bytes& gid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(47);
  for (std::size_t i = 0; i < gid.raw.size(); ++i) {
    if (i > 0) s.push_back(':');
    s.push_back(kHex[gid.raw[i] >> 4]);
    s.push_back(kHex[gid.raw[i] & 0xf]);
  }
  return s;
}

// ---------------------------------------------------------------- handshake

std::string encode_handshake(const handshake_desc& d) {
  json j = json::object();
  j["payload"] = d.payload;
  j["local_nic_path"] = d.local_nic_path;
  j["peer_nic_path"] = d.peer_nic_path;
  j["local_lid"] = d.local_lid;
  j["local_gid"] = d.local_gid ? format_gid(*d.local_gid) : std::string();
  j["qp_num"] = detail::u32_array_json(d.qp_num);
  if (d.ready_ack) j["ready_ack"] = *d.ready_ack;
  j["reply_msg"] = d.reply_msg;
  if (d.mtu) j["mtu"] = *d.mtu;
  if (d.psn) j["psn"] = detail::u32_array_json(*d.psn);
  if (d.notify_credits) j["notify_credits"] = *d.notify_credits;
  return detail::dump_line(j);
}

result<handshake_desc> decode_handshake(std::string_view text) try {
  json root;
  TIDE_TRY_ASSIGN(root, detail::parse_object(text));
  handshake_desc d;
  json_field f{root, ""};
  if (f.find("payload")) TIDE_TRY_ASSIGN(d.payload, f.string("payload"));
  TIDE_TRY_ASSIGN(d.local_nic_path, f.string("local_nic_path"));
  TIDE_TRY_ASSIGN(d.peer_nic_path, f.string("peer_nic_path"));
  std::uint64_t lid = 0;
  TIDE_TRY_ASSIGN(lid, f.unsigned_int("local_lid", UINT16_MAX));
  d.local_lid = static_cast<std::uint16_t>(lid);
  std::string gid_text;
  TIDE_TRY_ASSIGN(gid_text, f.string("local_gid"));
  if (!gid_text.empty()) {
    auto gid = parse_gid(gid_text);
    if (!gid) return malformed("local_gid", gid.error().detail.substr(5));
    d.local_gid = *gid;
  }
  const json* qps = nullptr;
  TIDE_TRY_ASSIGN(qps, f.require("qp_num"));
  TIDE_TRY_ASSIGN(d.qp_num, detail::read_u32_array(*qps, "qp_num"));
  if (const json* v = f.find("ready_ack")) {
    if (!v->is_boolean()) return detail::wrong_type(*v, "ready_ack", "a boolean");
    d.ready_ack = v->get<bool>();
  }
  if (f.find("reply_msg")) TIDE_TRY_ASSIGN(d.reply_msg, f.string("reply_msg"));
  if (f.find("mtu")) {
    std::uint64_t mtu = 0;
    TIDE_TRY_ASSIGN(mtu, f.unsigned_int("mtu", UINT32_MAX));
    if (mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096) {
      return malformed("mtu", "must be 256, 512, 1024, 2048 or 4096, got " + std::to_string(mtu));
    }
    d.mtu = static_cast<std::uint32_t>(mtu);
  }
  if (const json* v = f.find("psn")) {
    std::vector<std::uint32_t> psn;
    TIDE_TRY_ASSIGN(psn, detail::read_u32_array(*v, "psn"));
    for (auto x : psn)
      if (x > 0xffffffu) return malformed("psn", "a PSN has 24 bits, got " + std::to_string(x));
    if (psn.size() != d.qp_num.size())
      return malformed("psn", std::to_string(psn.size()) + " PSNs for " + std::to_string(d.qp_num.size()) + " QPs");
    d.psn = std::move(psn);
  }
  if (f.find("notify_credits")) {
    std::uint64_t n = 0;
    TIDE_TRY_ASSIGN(n, f.unsigned_int("notify_credits", UINT32_MAX));
    if (n < 1 || n > kMaxNotifyCredits)
      return malformed("notify_credits", "must be 1.." + std::to_string(kMaxNotifyCredits) + ", got " + std::to_string(n));
    d.notify_credits = static_cast<std::uint32_t>(n);
  }
  return d;
} catch (const std::exception& e) {
  return malformed("handshake", std::string("cannot decode: ") + e.what());
}

// ---------------------------------------------------------------- notify

std::string encode_notify(const notify_desc& d) {
  json j{{"name", d.name}, {"notify_msg", d.notify_msg}};
  if (d.id) j["tide_id"] = json{{"origin", d.id->origin}, {"seq", d.id->seq}};
  return detail::dump_line(j);
}

result<notify_desc> decode_notify(std::string_view text) try {
  json root;
  TIDE_TRY_ASSIGN(root, detail::parse_object(text));
  notify_desc d;
  json_field f{root, ""};
  TIDE_TRY_ASSIGN(d.name, f.string("name"));
  TIDE_TRY_ASSIGN(d.notify_msg, f.string("notify_msg"));
  if (const json* v = f.find("tide_id")) {
    if (!v->is_object()) return detail::wrong_type(*v, "tide_id", "an object");
    json_field idf{*v, "tide_id"};
    notify_id id;
    TIDE_TRY_ASSIGN(id.origin, idf.unsigned_int("origin", UINT64_MAX));
    TIDE_TRY_ASSIGN(id.seq, idf.unsigned_int("seq", UINT64_MAX));
    d.id = id;
  }
  return d;
} catch (const std::exception& e) {
  return malformed("notify", std::string("cannot decode: ") + e.what());
}

// ---------------------------------------------------------------- misc

status validate_json(std::string_view text) try {
  if (detail::json_depth(text, detail::kMaxJsonDepth) < 0) {
    return malformed("json", "nested deeper than " + std::to_string(detail::kMaxJsonDepth) + " levels");
  }
  if (!json::accept(text.begin(), text.end())) {
    // Parse again for the position and reason; only on the error path.
    try {
      const json ignored = json::parse(text.begin(), text.end());
      (void)ignored;
    } catch (const json::exception& e) {
      return malformed("json", e.what());
    }
    return malformed("json", "not valid JSON");
  }
  return {};
} catch (const std::exception& e) {
  return malformed("json", e.what());
}

std::optional<std::size_t> find_buffer_index(const segment_desc& desc, std::uint64_t addr,
                                             std::uint64_t length) noexcept {
  if (length == 0) return std::nullopt;
  for (std::size_t i = 0; i < desc.buffers.size(); ++i) {
    const buffer_desc& b = desc.buffers[i];
    if (addr >= b.addr && length <= b.length && addr - b.addr <= b.length - length) return i;
  }
  return std::nullopt;
}

std::string current_timestamp() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  std::tm tm{};
  localtime_r(&tv.tv_sec, &tm);
  char date[32];
  const std::size_t n = std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%.*s.%06ld", static_cast<int>(n), date,
                static_cast<long>(tv.tv_usec));
  return out;
}

namespace {
std::string key_prefix(std::string_view cluster_id) {
  std::string key = "mooncake/";
  if (!cluster_id.empty()) {
    key.append(cluster_id);
    if (cluster_id.back() != '/') key.push_back('/');
  }
  return key;
}
}  // namespace

std::string segment_key(std::string_view cluster_id, std::string_view name) {
  std::string key = key_prefix(cluster_id);
  if (name.find('/') == std::string_view::npos) key.append("ram/");
  key.append(name);
  return key;
}

std::string rpc_meta_key(std::string_view cluster_id, std::string_view server_name) {
  std::string key = key_prefix(cluster_id);
  key.append("rpc_meta/");
  key.append(server_name);
  return key;
}

result<rpc_meta> decode_rpc_meta(std::string_view text) try {
  json root;
  TIDE_TRY_ASSIGN(root, detail::parse_object(text));
  json_field f{root, ""};
  rpc_meta m;
  TIDE_TRY_ASSIGN(m.host, f.string("ip_or_host_name"));
  if (m.host.empty()) return malformed("ip_or_host_name", "must not be empty");
  std::uint64_t port = 0;
  TIDE_TRY_ASSIGN(port, f.unsigned_int("rpc_port", UINT16_MAX));
  if (port == 0) return malformed("rpc_port", "must be 1..65535");
  m.port = static_cast<std::uint16_t>(port);
  return m;
} catch (const std::exception& e) {
  return fail(errc::metadata_malformed, std::string("rpc_meta: ") + e.what());
}

std::string encode_rpc_meta(std::string_view host, std::uint16_t port) {
  json j;
  j["ip_or_host_name"] = std::string(host);
  j["rpc_port"] = port;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tide
