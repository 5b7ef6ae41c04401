#include <tide/rdma/segment.hpp>
#include <tide/wire/address.hpp>

#include <tide/rdma/plan/path_selector.hpp>  // rail_map: the member is destroyed here too

#include <algorithm>

namespace tide::rdma {

device_chooser device_chooser::make(const topology::location& loc, const topology::priority_matrix& m) {
  device_chooser c;
  c.loc = loc;
  if (loc.kind == topology::location_kind::segments) {
    for (std::size_t i = 0; i < loc.nodes.size(); ++i) c.entries.push_back(&m.resolve(loc.key_at(i * loc.page_size)));
  } else {
    c.entries.push_back(&m.resolve(loc.key_at(0)));
  }
  return c;
}

result<std::shared_ptr<remote_segment>> remote_segment::resolve(const segment_desc& d) {
  auto seg = std::make_shared<remote_segment>();
  seg->name = d.name;
  seg->server = d.rdma_server_name.value_or(d.name);
  if (d.tcp_data_port != 0) {
    if (auto host = wire::parse_peer_address(d.name)) {
      seg->tcp_host = host->host;
      seg->tcp_port = d.tcp_data_port;
      seg->tcp_version = d.tcp_proto_version;
    }
  }
  seg->incarnation = d.incarnation;
  for (const auto& dev : d.devices) seg->nic_paths.push_back(seg->server + "@" + dev.name);
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> lists;
  for (const auto& [key, e] : d.priority) lists.emplace(key, std::make_pair(e.preferred, e.available));
  seg->matrix = topology::priority_matrix::from_lists(lists);
  bool any_known = false;
  for (const auto& name : seg->matrix.devices()) {
    int idx = -1;
    for (std::size_t i = 0; i < d.devices.size(); ++i)
      if (d.devices[i].name == name) idx = static_cast<int>(i);
    seg->to_desc.push_back(idx);
    any_known |= idx >= 0;
  }
  if (!any_known) {
    // No usable matrix: every device of devices[] preferred, in that order.
    std::vector<std::string> names;
    for (const auto& dev : d.devices) names.push_back(dev.name);
    seg->matrix = topology::priority_matrix::from_lists({{"*", {names, {}}}});
    seg->to_desc.clear();
    for (std::size_t i = 0; i < d.devices.size(); ++i) seg->to_desc.push_back(static_cast<int>(i));
  }
  for (std::size_t i = 0; i < d.buffers.size(); ++i) {
    const auto& b = d.buffers[i];
    auto loc = topology::location::parse(b.name);
    // Mooncake's TCP peers name each buffer after their server, not a
    // location: for them (no NIC to choose) any name means "*".
    if (!loc && d.protocol != "rdma") loc = topology::location::parse("*");
    if (!loc)
      return fail(errc::metadata_malformed, "segment " + d.name + ": buffers[" + std::to_string(i) + "].name: " +
                                                loc.error().detail);
    if (b.rkey.size() != d.devices.size())
      return fail(errc::metadata_malformed, "segment " + d.name + ": buffers[" + std::to_string(i) +
                                                "].rkey: expected one key per device");
    remote_buffer rb;
    rb.addr = b.addr;
    rb.length = b.length;
    rb.rkeys = b.rkey;
    rb.access = b.access;
    rb.tcp_only = b.tcp_only;
    rb.chooser = device_chooser::make(*loc, seg->matrix);
    seg->buffers.push_back(std::move(rb));
    seg->by_addr.push_back(static_cast<std::uint32_t>(i));
    seg->by_id.emplace_back(b.id.value_or(static_cast<std::uint32_t>(i)), static_cast<std::uint32_t>(i));
  }
  std::sort(seg->by_id.begin(), seg->by_id.end());
  for (std::size_t k = 1; k < seg->by_id.size(); ++k)
    if (seg->by_id[k].first == seg->by_id[k - 1].first)
      return fail(errc::metadata_malformed, "segment " + d.name + ": buffers[" + std::to_string(seg->by_id[k].second) +
                                                "].id " + std::to_string(seg->by_id[k].first) + " is also the id of buffers[" +
                                                std::to_string(seg->by_id[k - 1].second) + "]");
  std::sort(seg->by_addr.begin(), seg->by_addr.end(),
            [&](std::uint32_t a, std::uint32_t b) { return seg->buffers[a].addr < seg->buffers[b].addr; });
  return seg;
}

int remote_segment::find(std::uint64_t addr, std::uint64_t len) const noexcept {
  if (len == 0) return -1;
  // The last buffer starting at or below addr (buffers do not overlap).
  auto it = std::upper_bound(by_addr.begin(), by_addr.end(), addr,
                             [&](std::uint64_t a, std::uint32_t i) { return a < buffers[i].addr; });
  if (it == by_addr.begin()) return -1;
  const auto& b = buffers[*(it - 1)];
  if (len > b.length || addr - b.addr > b.length - len) return -1;
  return static_cast<int>(*(it - 1));
}

int remote_segment::find_id(std::uint32_t id) const noexcept {
  auto it = std::lower_bound(by_id.begin(), by_id.end(), std::make_pair(id, std::uint32_t{0}));
  if (it == by_id.end() || it->first != id) return -1;
  return static_cast<int>(it->second);
}

}  // namespace tide::rdma
