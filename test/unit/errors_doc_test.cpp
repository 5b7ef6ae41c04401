// docs/errors.md against include/tide/errc.hpp: every code has its row, with
// its number, and the page names no code the enum lacks.  The enum is walked
// through to_string (src/core/errc.cpp's switch, which -Wswitch under -Werror
// keeps complete), so a code added without a row fails here.
#include <tide/errc.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace {

// The rows of the page's tables that start with a code: "| `name` | number | ...".
std::map<std::string, int> documented_codes(const std::string& text) {
  std::map<std::string, int> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const auto name_end = line.find('`', 3);
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(3, name_end - 3);
    const auto cell = line.find('|', name_end);
    if (cell == std::string::npos) continue;
    const auto cell_end = line.find('|', cell + 1);
    const std::string number = line.substr(cell + 1, cell_end == std::string::npos ? std::string::npos : cell_end - cell - 1);
    char* end = nullptr;
    const long v = std::strtol(number.c_str(), &end, 10);
    // A row whose second cell is no number is no code row (e.g. the group table).
    if (end == number.c_str()) continue;
    rows[name] = static_cast<int>(v);
  }
  return rows;
}

}  // namespace

TEST_CASE("docs/errors.md has a row for every tide::errc, with its number, and no other code") {
  const char* root = std::getenv("TIDE_TEST_SOURCE_ROOT");
  REQUIRE_MESSAGE(root != nullptr, "meson sets TIDE_TEST_SOURCE_ROOT");
  const std::string path = std::string(root) + "/docs/errors.md";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream text;
  text << in.rdbuf();
  auto rows = documented_codes(text.str());

  int codes = 0;
  for (int v = 1; v < 500; ++v) {  // 0 is ok, which the page mentions in prose
    const auto e = static_cast<tide::errc>(v);
    const std::string name(tide::to_string(e));
    if (name == "unknown") continue;
    ++codes;
    const auto it = rows.find(name);
    if (it == rows.end()) {
      FAIL_CHECK(path << " has no row for " << name << " (" << v << "): add \"| `" << name << "` | " << v
                      << " | meaning | what to do |\" to its group's table");
      continue;
    }
    CHECK_MESSAGE(it->second == v, path << ": " << name << " is " << v << ", the page says " << it->second);
    rows.erase(it);
  }
  CHECK(codes > 50);
  for (const auto& [name, v] : rows)
    FAIL_CHECK(path << " documents " << name << " (" << v << "), which include/tide/errc.hpp does not have");
}
