#include <tide/net/local_segments.hpp>

#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace tide::net {

namespace {

struct registry {
  std::shared_mutex mu;
  std::unordered_map<std::uint16_t, std::string> by_port;
};

registry& the_registry() {
  static registry r;  // constructed on first use; thread-safe initialization
  return r;
}

}  // namespace

void publish_local_segment(std::uint16_t port, std::string json) {
  auto& r = the_registry();
  std::unique_lock lock{r.mu};
  r.by_port[port] = std::move(json);
}

bool withdraw_local_segment(std::uint16_t port) {
  auto& r = the_registry();
  std::unique_lock lock{r.mu};
  return r.by_port.erase(port) != 0;
}

std::optional<std::string> local_segment(std::uint16_t port) {
  auto& r = the_registry();
  std::shared_lock lock{r.mu};
  auto it = r.by_port.find(port);
  if (it == r.by_port.end()) return std::nullopt;
  return it->second;
}

}  // namespace tide::net
