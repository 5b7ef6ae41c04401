// JSON codec of the segment descriptor (Mooncake's layout), its checks, and
// the seal that authenticates a published descriptor under the cluster secret.

#include <tide/wire/descriptors.hpp>

#include "hex.hpp"
#include "json_util.hpp"

#include <tide/wire/address.hpp>
#include <tide/wire/seal.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace tide {

using nlohmann::json;
using detail::json_field;
using detail::malformed;

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

json strings_json(const std::vector<std::string>& v) {
  json a = json::array();
  for (const auto& s : v) a.push_back(s);
  return a;
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
  if (f.find("reach") != nullptr) {
    std::string reach;
    TIDE_TRY_ASSIGN(reach, f.string("reach"));
    if (reach != "tcp") return malformed(field + ".reach", "expected \"tcp\", got \"" + reach + "\"");
    b.tcp_only = true;
  }
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
  if (const json* k = f.find("rkey")) TIDE_TRY_ASSIGN(b.rkey, detail::read_u32_array(*k, field + ".rkey"));
  if (const json* k = f.find("lkey")) TIDE_TRY_ASSIGN(b.lkey, detail::read_u32_array(*k, field + ".lkey"));
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

// 16 hex digits, most significant first: JSON numbers past 2^53 lose digits
// in some readers (jq, JavaScript), and an incarnation is random.
std::string incarnation_text(std::uint64_t inc) {
  std::array<std::uint8_t, 8> raw{};
  for (int i = 7; i >= 0; --i, inc >>= 8) raw[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(inc & 0xff);
  return wire::to_hex(raw);
}

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
  return encode_segment(d, seal, cache, std::string_view(d.timestamp));
}

result<std::string> encode_segment(const segment_desc& d, const wire::cluster_secret* seal, wire::seal_cache* cache,
                                   std::string_view timestamp) {
  return encode_segment(d, seal, cache, publish_marks{timestamp, {}, {}, {}});
}

result<std::string> encode_segment(const segment_desc& d, const wire::cluster_secret* seal, wire::seal_cache* cache,
                                   const publish_marks& marks) {
  const std::string_view timestamp = marks.timestamp;
  json j = json::object();
  j["name"] = d.name;
  j["protocol"] = d.protocol;
  j["tcp_data_port"] = d.tcp_data_port;
  j["tcp_proto_version"] = d.tcp_proto_version;
  j["timestamp"] = timestamp;
  if (d.rdma_server_name) j["rdma_server_name"] = *d.rdma_server_name;
  // tide's header fields; the header MAC covers them like every top-level field.
  if (auto inc = marks.incarnation ? marks.incarnation : d.incarnation) j["tide_incarnation"] = incarnation_text(*inc);
  if (auto stamp = marks.stamp ? marks.stamp : d.stamp) j["tide_stamp"] = *stamp;
  if (marks.handshake) {
    j["tide_handshake"] = std::string(*marks.handshake);
  } else if (d.handshake) {
    j["tide_handshake"] = *d.handshake;
  }
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
      if (b.tcp_only) e["reach"] = "tcp";
      if (seal != nullptr) {
        auto sealed = wire::seal_buffer(*seal, d.name, i, b);
        if (!sealed) return tl::unexpected(std::move(sealed.error()));
        e["sealed"] = std::move(*sealed);
      } else {
        e["addr"] = b.addr;
        e["rkey"] = detail::u32_array_json(b.rkey);
        e["lkey"] = detail::u32_array_json(b.lkey);
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
  if (f.find("tide_incarnation")) {
    std::string s;
    TIDE_TRY_ASSIGN(s, f.string("tide_incarnation"));
    std::array<std::uint8_t, 8> raw{};
    if (!wire::from_hex(s, raw)) return malformed("tide_incarnation", "expected 16 hex digits");
    std::uint64_t inc = 0;
    for (const auto byte : raw) inc = (inc << 8) | byte;
    d.incarnation = inc;
  }
  if (f.find("tide_stamp")) TIDE_TRY_ASSIGN(d.stamp, f.unsigned_int("tide_stamp", UINT64_MAX));
  if (f.find("tide_handshake")) {
    std::string s;
    TIDE_TRY_ASSIGN(s, f.string("tide_handshake"));
    auto a = wire::parse_peer_address(s, 0);
    if (!a || a->port == 0)
      return malformed("tide_handshake", "expected \"host:port\", got \"" + s.substr(0, 64) + "\"");
    d.handshake = std::move(s);
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

}  // namespace tide
