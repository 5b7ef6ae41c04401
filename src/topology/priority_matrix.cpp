#include <tide/topology/gpu.hpp>
#include <tide/topology/hca.hpp>
#include <tide/topology/priority_matrix.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace tide::topology {

using lists_t = std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>, std::less<>>;

void priority_matrix::index() {
  devices_.clear();
  entries_.clear();
  // Mooncake's order: first appearance walking sorted keys, preferred before available.
  for (const auto& [key, lists] : lists_) {
    for (const auto* l : {&lists.first, &lists.second})
      for (const auto& name : *l)
        if (std::find(devices_.begin(), devices_.end(), name) == devices_.end()) devices_.push_back(name);
  }
  for (const auto& [key, lists] : lists_) {
    matrix_entry e;
    for (const auto& n : lists.first) e.preferred.push_back(static_cast<std::uint16_t>(device_id(n)));
    for (const auto& n : lists.second) {
      const auto id = static_cast<std::uint16_t>(device_id(n));
      // A NIC listed in both lists counts once, as preferred.
      if (std::find(e.preferred.begin(), e.preferred.end(), id) == e.preferred.end()) e.available.push_back(id);
    }
    entries_.emplace(key, std::move(e));
  }
  any_ = {};
  for (std::size_t i = 0; i < devices_.size(); ++i) any_.preferred.push_back(static_cast<std::uint16_t>(i));
}

result<priority_matrix> priority_matrix::from_json(std::string_view text) {
  const auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(errc::metadata_malformed, "priority_matrix: not valid JSON");
  if (!j.is_object()) return fail(errc::metadata_malformed, "priority_matrix: expected an object");
  priority_matrix m;
  for (const auto& [key, value] : j.items()) {
    const std::string where = "priority_matrix[\"" + key + "\"]";
    if (!value.is_array() || value.size() != 2)
      return fail(errc::metadata_malformed, where + ": expected [[preferred NICs],[available NICs]]");
    std::pair<std::vector<std::string>, std::vector<std::string>> lists;
    for (std::size_t i = 0; i < 2; ++i) {
      const auto& arr = value[i];
      if (!arr.is_array()) return fail(errc::metadata_malformed, where + "[" + std::to_string(i) + "]: expected an array");
      auto& dst = i == 0 ? lists.first : lists.second;
      for (const auto& n : arr) {
        if (!n.is_string() || n.get_ref<const std::string&>().empty())
          return fail(errc::metadata_malformed, where + "[" + std::to_string(i) + "]: NIC names must be non-empty strings");
        dst.push_back(n.get<std::string>());
      }
    }
    m.lists_.emplace(key, std::move(lists));
  }
  m.index();
  return m;
}

priority_matrix priority_matrix::from_hcas(const std::vector<hca_info>& hcas, const std::vector<int>& numa_nodes,
                                           const std::vector<gpu_info>& gpus) {
  priority_matrix m;
  for (int node : numa_nodes) {
    std::pair<std::vector<std::string>, std::vector<std::string>> lists;
    for (const auto& h : hcas) (h.numa_node == node || h.numa_node < 0 ? lists.first : lists.second).push_back(h.name);
    m.lists_.emplace("cpu:" + std::to_string(node), std::move(lists));
  }
  for (const auto& g : gpus) {
    // Candidates: the NICs on the GPU's node (or of unknown node), else all.
    auto near_node = [&](const hca_info& h) { return g.numa_node < 0 || h.numa_node < 0 || h.numa_node == g.numa_node; };
    const bool any_near = std::any_of(hcas.begin(), hcas.end(), near_node);
    int best = -1;
    for (const auto& h : hcas) {
      const int d = pci_distance(g.pci_path, h.pci_path);
      if ((!any_near || near_node(h)) && d >= 0 && (best < 0 || d < best)) best = d;
    }
    std::pair<std::vector<std::string>, std::vector<std::string>> lists;
    for (const auto& h : hcas) {
      const bool candidate = !any_near || near_node(h);
      const int d = pci_distance(g.pci_path, h.pci_path);
      const bool preferred = candidate && (best < 0 || d == best || d < 0);
      (preferred ? lists.first : lists.second).push_back(h.name);
    }
    m.lists_.emplace("cuda:" + std::to_string(g.ordinal), std::move(lists));
  }
  m.index();
  return m;
}

priority_matrix priority_matrix::from_lists(
    const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>>& lists) {
  priority_matrix m;
  for (const auto& kv : lists) m.lists_.emplace(kv.first, kv.second);
  m.index();
  return m;
}

std::string priority_matrix::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, lists] : lists_) j[key] = nlohmann::json::array({lists.first, lists.second});
  return j.dump();
}

int priority_matrix::device_id(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i] == name) return static_cast<int>(i);
  return -1;
}

const matrix_entry* priority_matrix::find(std::string_view key) const noexcept {
  const auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

const matrix_entry& priority_matrix::resolve(std::string_view key) const noexcept {
  const auto* e = find(key);
  return e != nullptr ? *e : any_;
}

result<int> priority_matrix::select_device(std::string_view key, unsigned retry) const {
  const int id = resolve(key).select(retry, fast_random());
  if (id < 0) return fail(errc::device_not_found, "priority matrix lists no NIC for \"" + std::string(key) + "\"");
  return id;
}

std::uint32_t fast_random() noexcept {
  static std::atomic<std::uint64_t> seed_source{
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  thread_local std::uint64_t state = [] {
    std::uint64_t s = seed_source.fetch_add(0x9e3779b97f4a7c15ULL, std::memory_order_relaxed);
    return s == 0 ? 1 : s;
  }();
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return static_cast<std::uint32_t>(state >> 16);
}

}  // namespace tide::topology
