#include <tide/policy/in_process.hpp>

#include <tide/metadata/descriptors.hpp>

#include <map>
#include <mutex>
#include <shared_mutex>

namespace tide::policy {

namespace {

struct store {
  std::shared_mutex mu;
  std::map<std::string, std::string, std::less<>> kv;
};

store& the_store() {
  static store s;
  return s;
}

}  // namespace

in_process::in_process(const metadata_config& config) : cluster_id_(config.cluster_id) {}

result<std::string> in_process::get_segment(std::string_view name) {
  const std::string key = segment_key(cluster_id_, name);
  auto& s = the_store();
  std::shared_lock lock{s.mu};
  auto it = s.kv.find(key);
  if (it == s.kv.end()) return fail(errc::segment_not_found, "no key " + key);
  return it->second;
}

status in_process::put_segment(std::string_view name, std::string_view json) {
  std::string key = segment_key(cluster_id_, name);
  auto& s = the_store();
  std::unique_lock lock{s.mu};
  s.kv.insert_or_assign(std::move(key), std::string(json));
  return {};
}

status in_process::remove_segment(std::string_view name) {
  const std::string key = segment_key(cluster_id_, name);
  auto& s = the_store();
  std::unique_lock lock{s.mu};
  auto it = s.kv.find(key);
  if (it == s.kv.end()) return fail(errc::segment_not_found, "no key " + key);
  s.kv.erase(it);
  return {};
}

}  // namespace tide::policy
