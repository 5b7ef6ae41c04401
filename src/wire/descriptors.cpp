// JSON codecs for the Mooncake-compatible descriptors (the only TU of the
// metadata layer that parses descriptor JSON; nlohmann stays out of headers).

#include <tide/wire/descriptors.hpp>

#include "hex.hpp"
#include "json_util.hpp"

#include <tide/wire/seal.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <sys/time.h>
#include <unordered_map>

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

// ---------------------------------------------------------------- validation

status validate_segment(const segment_desc& d) {
  if (d.name.empty()) return malformed("name", "must not be empty");
  if (d.protocol.empty()) return malformed("protocol", "must not be empty");
  // The caps come before any per-element work: a descriptor is input from
  // whoever can write the store.
  if (d.devices.size() > kMaxSegmentDevices)
    return malformed("devices", std::to_string(d.devices.size()) + " devices, at most " +
                                    std::to_string(kMaxSegmentDevices));
  if (d.buffers.size() > kMaxSegmentBuffers)
    return malformed("buffers", std::to_string(d.buffers.size()) + " buffers, at most " +
                                    std::to_string(kMaxSegmentBuffers));
  std::unordered_map<std::string_view, std::size_t> device_at;
  device_at.reserve(d.devices.size());
  for (std::size_t i = 0; i < d.devices.size(); ++i) {
    const std::string field = "devices[" + std::to_string(i) + "]";
    if (d.devices[i].name.empty()) return malformed(field + ".name", "must not be empty");
    if (auto [it, fresh] = device_at.try_emplace(d.devices[i].name, i); !fresh)
      return malformed(field + ".name", "\"" + d.devices[i].name + "\" duplicates devices[" +
                                            std::to_string(it->second) + "]");
  }
  const bool rdma = d.protocol == "rdma";
  const std::size_t ndev = d.devices.size();
  for (std::size_t i = 0; i < d.buffers.size(); ++i) {
    const buffer_desc& b = d.buffers[i];
    // Runs on every publish over every buffer: the field name is built only
    // on the error paths below.
    if (!b.name.empty() && b.addr != 0 && b.length != 0 && b.addr <= UINT64_MAX - b.length &&
        (!(rdma || !b.rkey.empty()) || (b.rkey.size() == ndev && b.lkey.size() == ndev)))
      continue;
    const std::string field = "buffers[" + std::to_string(i) + "]";
    if (b.name.empty()) return malformed(field + ".name", "must not be empty (a location such as cpu:0)");
    if (b.addr == 0) return malformed(field + ".addr", "must not be 0");
    if (b.length == 0) return malformed(field + ".length", "must not be 0 (zero-length buffer)");
    if (b.addr > UINT64_MAX - b.length) {
      return malformed(field, "addr " + std::to_string(b.addr) + " + length " +
                                  std::to_string(b.length) + " wraps past 2^64");
    }
    if (rdma || !b.rkey.empty()) {
      if (b.rkey.size() != ndev) {
        return malformed(field + ".rkey", "expected " + std::to_string(ndev) +
                                              " keys (one per device), got " +
                                              std::to_string(b.rkey.size()));
      }
      if (b.lkey.size() != ndev) {
        return malformed(field + ".lkey", "expected " + std::to_string(ndev) +
                                              " keys (one per device), got " +
                                              std::to_string(b.lkey.size()));
      }
    }
  }
  // A publisher's buffers usually come in address order (registration
  // order of one allocation after another): then one pass finds overlaps,
  // and the sort below is left for the others.
  // In address order the sorted walk below visits them in index order, so
  // the first overlap (and its message) is the same.
  bool by_addr = true;
  std::size_t first_overlap = 0;
  for (std::size_t k = 1; k < d.buffers.size() && by_addr; ++k) {
    const buffer_desc& prev = d.buffers[k - 1];
    const buffer_desc& cur = d.buffers[k];
    if (prev.addr > cur.addr) by_addr = false;
    else if (first_overlap == 0 && prev.addr + prev.length > cur.addr) first_overlap = k;
  }
  if (by_addr && first_overlap != 0)
    return malformed("buffers[" + std::to_string(first_overlap) + "]",
                     "overlaps buffers[" + std::to_string(first_overlap - 1) + "]");
  if (!by_addr) {
    std::vector<std::size_t> order(d.buffers.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return d.buffers[a].addr < d.buffers[b].addr ||
             (d.buffers[a].addr == d.buffers[b].addr && a < b);
    });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const buffer_desc& prev = d.buffers[order[k - 1]];
      const buffer_desc& cur = d.buffers[order[k]];
      if (prev.addr + prev.length > cur.addr) {
        const std::size_t lo = std::min(order[k - 1], order[k]);
        const std::size_t hi = std::max(order[k - 1], order[k]);
        return malformed("buffers[" + std::to_string(hi) + "]",
                         "overlaps buffers[" + std::to_string(lo) + "]");
      }
    }
  }
  for (const auto& [location, entry] : d.priority) {
    if (location.empty()) return malformed("priority_matrix", "empty location key");
    for (const auto* list : {&entry.preferred, &entry.available}) {
      for (const auto& nic : *list) {
        if (nic.empty()) return malformed("priority_matrix[\"" + location + "\"]", "empty NIC name");
      }
    }
  }
  return {};
}

// ---------------------------------------------------------------- segment

std::string_view to_string(buffer_access a) noexcept {
  switch (a) {
    case buffer_access::local_only: return "local_only";
    case buffer_access::remote_read: return "remote_read";
    case buffer_access::remote_write: return "remote_write";
    case buffer_access::remote_read_write: return "remote_read_write";
  }
  return "unknown";
}

namespace {

json keys_json(const std::vector<std::uint32_t>& keys) {
  json a = json::array();
  for (auto k : keys) a.push_back(k);
  return a;
}

json strings_json(const std::vector<std::string>& v) {
  json a = json::array();
  for (const auto& s : v) a.push_back(s);
  return a;
}

std::string dump_line(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  s.push_back('\n');
  return s;
}

result<std::vector<std::uint32_t>> read_u32_array(const json& v, const std::string& field) {
  if (!v.is_array()) return detail::wrong_type(v, field, "an array of unsigned integers");
  std::vector<std::uint32_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto x = detail::read_unsigned(v[i], field + "[" + std::to_string(i) + "]", UINT32_MAX);
    if (!x) return tl::unexpected(std::move(x.error()));
    out.push_back(static_cast<std::uint32_t>(*x));
  }
  return out;
}

result<std::vector<std::string>> read_string_array(const json& v, const std::string& field) {
  if (!v.is_array()) return detail::wrong_type(v, field, "an array of strings");
  std::vector<std::string> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      return detail::wrong_type(v[i], field + "[" + std::to_string(i) + "]", "a string");
    }
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

#define TIDE_TRY_ASSIGN(lhs, expr)                                  \
  do {                                                              \
    auto tide_r_ = (expr);                                          \
    if (!tide_r_) return tl::unexpected(std::move(tide_r_.error())); \
    lhs = std::move(*tide_r_);                                      \
  } while (0)

result<device_desc> read_device(const json& v, const std::string& field) {
  if (!v.is_object()) return detail::wrong_type(v, field, "an object");
  device_desc d;
  json_field f{v, field};
  TIDE_TRY_ASSIGN(d.name, f.string("name"));
  std::uint64_t lid = 0;
  TIDE_TRY_ASSIGN(lid, f.unsigned_int("lid", UINT16_MAX));
  d.lid = static_cast<std::uint16_t>(lid);
  std::string gid_text;
  TIDE_TRY_ASSIGN(gid_text, f.string("gid"));
  auto gid = parse_gid(gid_text);
  if (!gid) return malformed(field + ".gid", gid.error().detail.substr(5));  // drop "gid: "
  d.gid = *gid;
  return d;
}

result<buffer_access> read_access(json_field& f, const std::string& field) {
  if (!f.find("access")) return buffer_access::remote_read_write;
  std::string text;
  TIDE_TRY_ASSIGN(text, f.string("access"));
  for (auto a : {buffer_access::remote_read, buffer_access::remote_write, buffer_access::remote_read_write})
    if (text == to_string(a)) return a;
  return malformed(field + ".access", "expected \"remote_read\", \"remote_write\" or \"remote_read_write\", got \"" +
                                          text.substr(0, 64) + "\"");
}

result<buffer_desc> read_buffer(const json& v, const std::string& field, std::string_view segment,
                                std::size_t index, const wire::cluster_secret* seal) {
  if (!v.is_object()) return detail::wrong_type(v, field, "an object");
  buffer_desc b;
  json_field f{v, field};
  TIDE_TRY_ASSIGN(b.name, f.string("name"));
  TIDE_TRY_ASSIGN(b.length, f.unsigned_int("length", UINT64_MAX));
  TIDE_TRY_ASSIGN(b.access, read_access(f, field));
  // Before the sealed branch: a sealed buffer keeps its id too (it is what
  // peers address; without it the id would fall back to the index).
  if (f.find("id") != nullptr) {
    std::uint64_t id = 0;
    TIDE_TRY_ASSIGN(id, f.unsigned_int("id", 0xfffffffeu));  // 0xffffffff is kRawAddress
    b.id = static_cast<std::uint32_t>(id);
  }
  if (f.find("sealed")) {
    std::string sealed;
    TIDE_TRY_ASSIGN(sealed, f.string("sealed"));
    if (seal == nullptr)
      return malformed(field + ".sealed", "the descriptor is sealed with a cluster secret; configure "
                                          "auth_secret_file (TIDE_AUTH_SECRET_FILE) to open it");
    if (auto ok = wire::open_buffer(*seal, segment, index, sealed, b); !ok) return tl::unexpected(std::move(ok.error()));
    return b;
  }
  if (seal != nullptr)
    return malformed(field, "not sealed, but a cluster secret is configured: an unsealed descriptor is "
                            "unauthenticated (anyone who can write the metadata store may have put it there)");
  TIDE_TRY_ASSIGN(b.addr, f.unsigned_int("addr", UINT64_MAX));
  // Buffers of non-RDMA protocols carry no keys; absent means none.
  if (const json* k = f.find("rkey")) TIDE_TRY_ASSIGN(b.rkey, read_u32_array(*k, field + ".rkey"));
  if (const json* k = f.find("lkey")) TIDE_TRY_ASSIGN(b.lkey, read_u32_array(*k, field + ".lkey"));
  return b;
}

result<priority_matrix> read_priority(const json& v, const std::string& field) {
  if (!v.is_object()) return detail::wrong_type(v, field, "an object");
  priority_matrix m;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string row = field + "[\"" + it.key() + "\"]";
    const json& e = it.value();
    if (!e.is_array() || e.size() != 2) {
      return malformed(row, std::string("expected [[preferred NICs],[available NICs]], got ") +
                                (e.is_array() ? "an array of " + std::to_string(e.size())
                                              : std::string(e.type_name())));
    }
    priority_entry pe;
    TIDE_TRY_ASSIGN(pe.preferred, read_string_array(e[0], row + "[0]"));
    TIDE_TRY_ASSIGN(pe.available, read_string_array(e[1], row + "[1]"));
    m.emplace(it.key(), std::move(pe));
  }
  return m;
}

// The sections of a sealed descriptor's "mac" object.  "header" is every
// top-level field but the other three (name, timestamp, protocol, ports,
// rdma_server_name, and any field a later version adds).
constexpr const char* kMacSections[] = {"header", "devices", "priority_matrix", "buffers"};

std::string compact(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The name and timestamp the MACs bind, read as the encoder wrote them;
// fields that are missing or of another type bind as "" (the header MAC then
// fails, or the field's own check names it).
std::string string_or_empty(const json& root, const char* key) {
  auto it = root.find(key);
  return it != root.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// One buffer entry's MAC.  It binds the segment name but not the timestamp,
// so it stays valid (and cached) across publishes; the "buffers" section
// MAC binds the list of these to one publish.
std::array<std::uint8_t, 32> buffer_mac(const wire::cluster_secret& s, std::string_view segment,
                                        std::string_view entry_json) {
  return wire::descriptor_mac(s, "buffer", segment, "", entry_json);
}

// What a section's MAC covers: its compact JSON, except for "buffers",
// whose canonical text is its entries' MACs in order (32 bytes each), so a
// publish MACs 32 bytes per buffer rather than the whole list again.
std::string section_text(const json& root, std::string_view section, const wire::cluster_secret& s) {
  if (section == "header") {
    json h = json::object();
    for (auto it = root.begin(); it != root.end(); ++it)
      if (it.key() != "devices" && it.key() != "priority_matrix" && it.key() != "buffers" && it.key() != "mac")
        h[it.key()] = it.value();
    return compact(h);
  }
  auto it = root.find(section);
  if (section == "buffers") {
    if (it == root.end() || !it->is_array()) return "null";
    const std::string name = string_or_empty(root, "name");
    std::string macs;
    macs.reserve(32 * it->size());
    for (const auto& e : *it) {
      const auto m = buffer_mac(s, name, compact(e));
      macs.append(reinterpret_cast<const char*>(m.data()), m.size());
    }
    return macs;
  }
  return it == root.end() ? std::string("null") : compact(*it);
}

status check_mac(const json& root, const wire::cluster_secret& s, std::string_view section) {
  const std::string field = "mac." + std::string(section);
  auto macs = root.find("mac");
  if (macs == root.end() || !macs->is_object())
    return malformed("mac", "missing: with a cluster secret every descriptor carries MACs over its fields "
                            "(published by a tide older than the descriptor MACs, or not by tide)");
  auto mac = macs->find(section);
  if (mac == macs->end() || !mac->is_string()) return malformed(field, "missing");
  if (!wire::verify_descriptor_mac(s, section, string_or_empty(root, "name"), string_or_empty(root, "timestamp"),
                                   section_text(root, section, s), mac->get<std::string>())) {
    const char* what = section == "header"           ? "name, timestamp, protocol, rdma_server_name or ports"
                       : section == "devices"         ? "the device list (names, LIDs, GIDs)"
                       : section == "priority_matrix" ? "the priority matrix"
                                                      : "the buffer list (ids, order, blobs)";
    return malformed(field, std::string("does not verify: ") + what +
                                " changed after publishing, or published under another secret");
  }
  return {};
}

}  // namespace

std::string encode_segment(const segment_desc& d) { return *encode_segment(d, nullptr); }

result<std::string> encode_segment(const segment_desc& d, const wire::cluster_secret* seal) {
  return encode_segment(d, seal, nullptr);
}

result<std::string> encode_segment(const segment_desc& d, const wire::cluster_secret* seal,
                                   wire::seal_cache* cache) {
  return encode_segment(d, seal, cache, d.timestamp);
}

result<std::string> encode_segment(const segment_desc& d, const wire::cluster_secret* seal, wire::seal_cache* cache,
                                   std::string_view timestamp) {
  json j = json::object();
  j["name"] = d.name;
  j["protocol"] = d.protocol;
  j["tcp_data_port"] = d.tcp_data_port;
  j["tcp_proto_version"] = d.tcp_proto_version;
  j["timestamp"] = timestamp;
  if (d.rdma_server_name) j["rdma_server_name"] = *d.rdma_server_name;
  json devices = json::array();
  for (const auto& dev : d.devices) {
    devices.push_back({{"name", dev.name}, {"lid", dev.lid}, {"gid", format_gid(dev.gid)}});
  }
  j["devices"] = std::move(devices);
  // The buffer list is assembled from each entry's compact text (cached ones
  // are copied, not encoded again); nlohmann writes an array as its
  // elements' texts joined by ',', and keys sorted, with "buffers" first.
  // It is written straight into the output: on every publish this list is
  // the only part that grows with the buffers, so it is copied once.
  std::string out = "{\"buffers\":[";
  out.reserve(cache != nullptr ? cache->last_size() : 0);
  std::string entry_macs;
  if (seal != nullptr) entry_macs.reserve(32 * d.buffers.size());
  if (cache != nullptr) cache->begin(seal, d.name);
  for (std::size_t i = 0; i < d.buffers.size(); ++i) {
    const auto& b = d.buffers[i];
    const wire::seal_cache::entry* cached = cache != nullptr ? cache->find(i, b) : nullptr;
    wire::seal_cache::entry fresh;
    if (cached == nullptr) {
      json e = {{"name", b.name}, {"length", b.length}};
      if (b.id) e["id"] = *b.id;  // not secret: peers address buffers by it
      if (b.access != buffer_access::remote_read_write) e["access"] = std::string(to_string(b.access));
      if (seal != nullptr) {
        auto sealed = wire::seal_buffer(*seal, d.name, i, b);
        if (!sealed) return tl::unexpected(std::move(sealed.error()));
        e["sealed"] = std::move(*sealed);
      } else {
        e["addr"] = b.addr;
        e["rkey"] = keys_json(b.rkey);
        e["lkey"] = keys_json(b.lkey);
      }
      fresh.json = compact(e);
      if (seal != nullptr) fresh.mac = buffer_mac(*seal, d.name, fresh.json);
      cached = cache != nullptr ? &cache->store(i, b, std::move(fresh)) : &fresh;
    }
    if (i > 0) out.push_back(',');
    out += cached->json;
    if (seal != nullptr) entry_macs.append(reinterpret_cast<const char*>(cached->mac.data()), cached->mac.size());
  }
  out.append("],");
  if (cache != nullptr) cache->sweep();
  json pm = json::object();
  for (const auto& [loc, e] : d.priority) {
    pm[loc] = json::array({strings_json(e.preferred), strings_json(e.available)});
  }
  j["priority_matrix"] = std::move(pm);
  if (seal != nullptr) {
    json macs = json::object();
    for (const char* section : kMacSections) {
      const std::string text = std::string_view(section) == "buffers" ? entry_macs : section_text(j, section, *seal);
      macs[section] = wire::to_hex(wire::descriptor_mac(*seal, section, d.name, timestamp, text));
    }
    j["mac"] = std::move(macs);
  }
  // Every other key sorts after "buffers".
  const std::string rest = compact(j);
  out.append(rest, 1);
  out.push_back('\n');
  if (cache != nullptr) cache->set_last_size(out.size());
  return out;
}

result<segment_desc> decode_segment(std::string_view text) { return decode_segment(text, nullptr); }

result<segment_desc> decode_segment(std::string_view text, const wire::cluster_secret* seal) try {
  json root;
  TIDE_TRY_ASSIGN(root, detail::parse_object(text));
  // With a secret, nothing of the descriptor is used (or validated, at O(n)
  // cost) before its MACs verify; the buffers' MAC comes after the buffers'
  // own blobs, whose errors name the buffer.
  if (seal != nullptr)
    for (const char* section : {"header", "devices", "priority_matrix"})
      if (auto ok = check_mac(root, *seal, section); !ok) return tl::unexpected(std::move(ok.error()));
  segment_desc d;
  json_field f{root, ""};
  TIDE_TRY_ASSIGN(d.name, f.string("name"));
  TIDE_TRY_ASSIGN(d.protocol, f.string("protocol"));
  const bool rdma = d.protocol == "rdma";
  if (const json* v = f.find("timestamp")) {
    if (!v->is_string()) return detail::wrong_type(*v, "timestamp", "a string");
    d.timestamp = v->get<std::string>();
  }
  if (f.find("tcp_data_port")) {
    std::uint64_t port = 0;
    TIDE_TRY_ASSIGN(port, f.unsigned_int("tcp_data_port", UINT16_MAX));
    d.tcp_data_port = static_cast<std::uint16_t>(port);
  }
  if (f.find("tcp_proto_version")) {
    std::uint64_t version = 0;
    TIDE_TRY_ASSIGN(version, f.unsigned_int("tcp_proto_version", UINT32_MAX));
    d.tcp_proto_version = static_cast<std::uint32_t>(version);
  }
  if (f.find("rdma_server_name")) {
    std::string s;
    TIDE_TRY_ASSIGN(s, f.string("rdma_server_name"));
    d.rdma_server_name = std::move(s);
  }
  const json* devices = rdma ? nullptr : f.find("devices");
  if (rdma) TIDE_TRY_ASSIGN(devices, f.require("devices"));
  if (devices) {
    if (!devices->is_array()) return detail::wrong_type(*devices, "devices", "an array");
    if (devices->size() > kMaxSegmentDevices)
      return malformed("devices", std::to_string(devices->size()) + " devices, at most " +
                                      std::to_string(kMaxSegmentDevices));
    for (std::size_t i = 0; i < devices->size(); ++i) {
      device_desc dev;
      TIDE_TRY_ASSIGN(dev, read_device((*devices)[i], "devices[" + std::to_string(i) + "]"));
      d.devices.push_back(std::move(dev));
    }
  }
  const json* buffers = nullptr;
  TIDE_TRY_ASSIGN(buffers, f.require("buffers"));
  if (!buffers->is_array()) return detail::wrong_type(*buffers, "buffers", "an array");
  if (buffers->size() > kMaxSegmentBuffers)
    return malformed("buffers", std::to_string(buffers->size()) + " buffers, at most " +
                                    std::to_string(kMaxSegmentBuffers));
  d.buffers.reserve(buffers->size());
  for (std::size_t i = 0; i < buffers->size(); ++i) {
    buffer_desc b;
    TIDE_TRY_ASSIGN(b, read_buffer((*buffers)[i], "buffers[" + std::to_string(i) + "]", d.name, i, seal));
    d.buffers.push_back(std::move(b));
  }
  if (seal != nullptr)
    if (auto ok = check_mac(root, *seal, "buffers"); !ok) return tl::unexpected(std::move(ok.error()));
  const json* pm = rdma ? nullptr : f.find("priority_matrix");
  if (rdma) TIDE_TRY_ASSIGN(pm, f.require("priority_matrix"));
  if (pm) TIDE_TRY_ASSIGN(d.priority, read_priority(*pm, "priority_matrix"));
  if (auto ok = validate_segment(d); !ok) return tl::unexpected(std::move(ok.error()));
  return d;
} catch (const std::exception& e) {
  return malformed("segment", std::string("cannot decode: ") + e.what());
}

// ---------------------------------------------------------------- handshake

std::string encode_handshake(const handshake_desc& d) {
  json j = json::object();
  j["payload"] = d.payload;
  j["local_nic_path"] = d.local_nic_path;
  j["peer_nic_path"] = d.peer_nic_path;
  j["local_lid"] = d.local_lid;
  j["local_gid"] = d.local_gid ? format_gid(*d.local_gid) : std::string();
  j["qp_num"] = keys_json(d.qp_num);
  if (d.ready_ack) j["ready_ack"] = *d.ready_ack;
  j["reply_msg"] = d.reply_msg;
  if (d.mtu) j["mtu"] = *d.mtu;
  if (d.psn) j["psn"] = keys_json(*d.psn);
  if (d.notify_credits) j["notify_credits"] = *d.notify_credits;
  return dump_line(j);
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
  TIDE_TRY_ASSIGN(d.qp_num, read_u32_array(*qps, "qp_num"));
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
    TIDE_TRY_ASSIGN(psn, read_u32_array(*v, "psn"));
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
  return dump_line(json{{"name", d.name}, {"notify_msg", d.notify_msg}});
}

result<notify_desc> decode_notify(std::string_view text) try {
  json root;
  TIDE_TRY_ASSIGN(root, detail::parse_object(text));
  notify_desc d;
  json_field f{root, ""};
  TIDE_TRY_ASSIGN(d.name, f.string("name"));
  TIDE_TRY_ASSIGN(d.notify_msg, f.string("notify_msg"));
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
