#include <tide/topology/location.hpp>

#include <charconv>

namespace tide::topology {
namespace {

// Parses a whole decimal number (no sign, no trailing text).
template <class T>
bool parse_number(std::string_view s, T& out) {
  if (s.empty()) return false;
  const auto* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc{} && p == end;
}

tl::unexpected<error> bad(std::string_view text, std::string_view why) {
  return fail(errc::bad_location, "\"" + std::string(text) + "\": " + std::string(why));
}

}  // namespace

result<location> location::parse(std::string_view text) {
  location l;
  if (text == "*") return l;
  const auto colon = text.find(':');
  if (colon == std::string_view::npos)
    return bad(text, "expected \"*\", \"cpu:N\", \"cuda:N\" or \"segments:<page_size>:<n0>,<n1>,...\"");
  const auto kind = text.substr(0, colon);
  const auto rest = text.substr(colon + 1);
  if (kind == "cpu" || kind == "cuda") {
    int n = -1;
    if (!parse_number(rest, n) || n < 0) return bad(text, "the index after ':' must be a number >= 0");
    l.kind = kind == "cpu" ? location_kind::cpu : location_kind::cuda;
    l.index = n;
    return l;
  }
  if (kind != "segments")
    return bad(text, "unknown kind \"" + std::string(kind) + "\" (expected cpu, cuda, segments or *)");
  const auto colon2 = rest.find(':');
  if (colon2 == std::string_view::npos) return bad(text, "expected segments:<page_size>:<n0>,<n1>,...");
  std::uint64_t page = 0;
  if (!parse_number(rest.substr(0, colon2), page)) return bad(text, "the page size is not a number");
  if (page == 0) return bad(text, "the page size must be > 0");
  if ((page & (page - 1)) != 0) return bad(text, "the page size must be a power of two");
  auto list = rest.substr(colon2 + 1);
  if (list.empty()) return bad(text, "the node list is empty");
  while (true) {
    const auto comma = list.find(',');
    const auto item = list.substr(0, comma);
    int n = -1;
    if (!parse_number(item, n) || n < 0)
      return bad(text, "node \"" + std::string(item) + "\" is not a number >= 0");
    l.nodes.push_back(n);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  l.kind = location_kind::segments;
  l.page_size = page;
  return l;
}

std::string location::to_string() const {
  switch (kind) {
    case location_kind::any: return "*";
    case location_kind::cpu: return "cpu:" + std::to_string(index);
    case location_kind::cuda: return "cuda:" + std::to_string(index);
    case location_kind::segments: {
      std::string s = "segments:" + std::to_string(page_size) + ":";
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        if (i != 0) s += ',';
        s += std::to_string(nodes[i]);
      }
      return s;
    }
  }
  return "*";
}

int location::index_at(std::uint64_t offset) const noexcept {
  switch (kind) {
    case location_kind::any: return -1;
    case location_kind::cpu:
    case location_kind::cuda: return index;
    case location_kind::segments: return nodes[(offset / page_size) % nodes.size()];
  }
  return -1;
}

std::string location::key_at(std::uint64_t offset) const {
  switch (kind) {
    case location_kind::any: return "*";
    case location_kind::cuda: return "cuda:" + std::to_string(index);
    case location_kind::cpu:
    case location_kind::segments: return "cpu:" + std::to_string(index_at(offset));
  }
  return "*";
}

}  // namespace tide::topology
