// tide-config: prints the configuration a tide engine would run with in this environment
// (defaults, TIDE_CONFIG, TIDE_* and MC_* variables) and where each value came from, or the
// configuration reference (--markdown, what docs/configuration.md holds).
#include <tide/engine.hpp>

#include <cstring>
#include <iostream>
#include <string_view>

namespace {

constexpr std::string_view kUsage =
    "usage: tide-config [--markdown] [--json FILE_OR_TEXT]\n"
    "  (no flag)     the effective configuration here, one setting per line with its source\n"
    "                (default, file, environment, program, automatic); warnings after it\n"
    "  --json X      as a program that passes X (a JSON object, or @FILE) to apply_json\n"
    "  --markdown    the configuration reference (docs/configuration.md)\n"
    "  -h, --help    this text\n"
    "exit status: 0, 1 when the configuration is invalid (the reason on stderr), 2 on a bad flag\n";

}  // namespace

int main(int argc, char** argv) {
  tide::engine_config cfg;
  bool markdown = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--markdown") {
      markdown = true;
    } else if (a == "--json" || a.starts_with("--json=")) {
      std::string value;
      if (a == "--json") {
        if (i + 1 >= argc) {
          std::cerr << "tide-config: --json needs a value\n" << kUsage;
          return 2;
        }
        value = argv[++i];
      } else {
        value = std::string(a.substr(7));
      }
      auto r = value.starts_with("@") ? cfg.apply_file(value.substr(1)) : cfg.apply_json(value, "--json");
      if (!r) {
        std::cerr << "tide-config: " << r.error().message() << "\n";
        return 1;
      }
    } else {
      std::cerr << "tide-config: unknown argument '" << a << "'\n" << kUsage;
      return 2;
    }
  }
  if (markdown) {
    std::cout << tide::config_reference_markdown();
    return 0;
  }
  tide::config_report report;
  auto r = cfg.resolve(&report);
  if (!r) {
    std::cerr << "tide-config: " << r.error().message() << "\n";
    return 1;
  }
  std::cout << report.to_text();
  return 0;
}
