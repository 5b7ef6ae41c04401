// engine_config's precedence (defaults < TIDE_CONFIG < environment < program),
// Mooncake's MC_* variables with Mooncake's meaning, the warnings about names
// that are no setting, and docs/configuration.md against the code's table.
#include "support/process.hpp"

#include <tide/engine.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace tide;

namespace {

// Sets variables for one test and restores them after it.
class env_guard {
 public:
  env_guard() = default;
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;
  ~env_guard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) {
    remember(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    remember(name);
    ::unsetenv(name.c_str());
  }

 private:
  void remember(const std::string& name) {
    const char* v = std::getenv(name.c_str());
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string write_file(const test::temp_dir& dir, const std::string& name, const std::string& text) {
  const auto p = (dir.path() / name).string();
  std::ofstream(p) << text;
  return p;
}

const config_value& setting(const config_report& r, std::string_view key) {
  auto it = std::find_if(r.settings.begin(), r.settings.end(), [&](const auto& s) { return s.key == key; });
  REQUIRE(it != r.settings.end());
  return *it;
}

bool warned(const config_report& r, std::string_view needle) {
  return std::any_of(r.warnings.begin(), r.warnings.end(),
                     [&](const std::string& w) { return w.find(needle) != std::string::npos; });
}

std::string all_warnings(const config_report& r) {
  std::string s;
  for (const auto& w : r.warnings) s += w + "\n";
  return s;
}

}  // namespace

TEST_CASE("precedence: defaults < TIDE_CONFIG < environment < what the program set") {
  test::temp_dir dir;
  env_guard env;
  env.set("TIDE_CONFIG", write_file(dir, "tide.json",
                                    R"({"slice_size": 131072, "mtu": 1024, "tcp_io_threads": 3, "max_retry": 9})"));
  env.set("TIDE_SLICE_SIZE", "262144");
  env.set("MC_MTU", "2048");
  env.set("TIDE_MAX_RETRY", "11");

  engine_config c;
  c.mtu = 512;  // differs from the default: the program set it
  c.max_retry = engine_config{}.max_retry;  // equal to the default: not counted ...
  config_report r;
  auto eff = c.resolve(&r);
  REQUIRE(eff);
  CHECK(eff->slice_size == 262144);   // the environment beats the file
  CHECK(eff->mtu == 512);             // the program beats both
  CHECK(eff->tcp_io_threads == 3);    // the file beats the default
  CHECK(eff->max_retry == 11);        // ... so the environment's value stands
  CHECK(eff->num_qp_per_ep == 2);     // the default
  CHECK(r.file == std::getenv("TIDE_CONFIG"));
  CHECK(setting(r, "slice_size").source == config_source::environment);
  CHECK(setting(r, "slice_size").origin == "TIDE_SLICE_SIZE");
  CHECK(setting(r, "mtu").source == config_source::program);
  CHECK(setting(r, "tcp_io_threads").source == config_source::file);
  CHECK(setting(r, "num_qp_per_ep").source == config_source::default_value);

  // ... unless the program names the key: set_keys, which apply_json fills.
  c.set_keys.insert("max_retry");
  CHECK(c.resolve()->max_retry == engine_config{}.max_retry);
  engine_config kw;  // what the Python module does with tide.Engine(slice_size=65536)
  REQUIRE(kw.apply_json(R"({"slice_size": 65536})", "tide.Engine"));
  CHECK(kw.set_keys.count("slice_size") == 1);
  auto k = kw.resolve(&r);
  REQUIRE(k);
  CHECK(k->slice_size == 65536);
  CHECK(setting(r, "slice_size").source == config_source::program);

  // The program's values get the same ranges, named by key.
  engine_config bad;
  bad.mtu = 9000;
  auto e = bad.resolve();
  REQUIRE_FALSE(e);
  CHECK(e.error().code == errc::config_invalid);
  CHECK(e.error().detail.find("mtu = 9000") != std::string::npos);
  engine_config unknown;
  unknown.set_keys.insert("slice_sise");
  CHECK(unknown.resolve().error().detail.find("set_keys: unknown key \"slice_sise\"") != std::string::npos);
}

TEST_CASE("TIDE_* variables: one name per key, strict values, former spellings warned") {
  env_guard env;
  env.set("TIDE_DEVICES", "rxe0, rxe1");
  env.set("TIDE_COALESCE_REQUESTS", "off");
  env.set("TIDE_TRANSFER_TIMEOUT_MS", "2500");
  env.set("TIDE_MAX_EP_PER_CTX", "77");  // endpoint_capacity's former name
  config_report r;
  auto eff = engine_config{}.resolve(&r);
  REQUIRE(eff);
  CHECK(eff->devices == std::vector<std::string>{"rxe0", "rxe1"});
  CHECK_FALSE(eff->coalesce_requests);
  CHECK(eff->transfer_timeout == std::chrono::milliseconds(2500));
  CHECK(eff->endpoint_capacity == 77);
  CHECK(warned(r, "TIDE_MAX_EP_PER_CTX is deprecated: tide reads it as TIDE_ENDPOINT_CAPACITY"));

  for (auto [var, value] : {std::pair{"TIDE_MTU", "9000"}, {"TIDE_QP_RETRY_CNT", "x"}, {"TIDE_COALESCE_REQUESTS", "maybe"},
                            {"TIDE_ENDPOINT_CAPACITY", "0"}}) {
    env_guard one;
    one.set(var, value);
    auto bad = engine_config{}.resolve();
    INFO(var);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == errc::config_invalid);
    CHECK(bad.error().detail.find(std::string(var) + "=\"" + value + "\"") != std::string::npos);
  }
}

TEST_CASE("comma lists: blanks trimmed; an empty item is skipped in a device list and refused as a transport") {
  env_guard env;
  env.set("TIDE_DEVICES", " rxe0 ,, rxe1 ,");
  auto eff = engine_config{}.resolve();
  REQUIRE(eff);
  CHECK(eff->devices == std::vector<std::string>{"rxe0", "rxe1"});

  auto both = parse_transports(" tcp , rdma ");
  REQUIRE(both);
  CHECK(both->rdma);
  CHECK(both->tcp);
  auto one = parse_transports("tcp");
  REQUIRE(one);
  CHECK_FALSE(one->rdma);
  CHECK(one->tcp);
  for (const std::string bad : {"rdma,,tcp", "", "rdma,", "rdma;tcp"}) {
    CAPTURE(bad);
    auto r = parse_transports(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::config_invalid);
    CHECK(r.error().detail.find("is not a transport") != std::string::npos);
  }
}

TEST_CASE("Mooncake's MC_* variables: Mooncake's values taken, the ones it ignores ignored with a warning") {
  struct mc_case {
    const char* var;
    const char* good;
    std::function<bool(const engine_config&)> applied;
    const char* bad;  // a value Mooncake warns about and ignores
  };
  const std::vector<mc_case> cases = {
      {"MC_NUM_QP_PER_EP", "4", [](const auto& c) { return c.num_qp_per_ep == 4; }, "256"},
      {"MC_SLICE_SIZE", "131072", [](const auto& c) { return c.slice_size == 131072; }, "0"},
      // Mooncake takes 1..8; tide runs num_qp_per_ep lanes whatever it says, and does not fail.
      {"MC_WORKERS_PER_CTX", "4", [](const auto& c) { return c.workers_per_context == 4; }, "9"},
      {"MC_MAX_EP_PER_CTX", "1000", [](const auto& c) { return c.endpoint_capacity == 1000; }, "70000"},
      {"MC_GID_INDEX", "3", [](const auto& c) { return c.gid_index == 3; }, "256"},
      {"MC_MTU", "1024", [](const auto& c) { return c.mtu == 1024; }, "1500"},
      {"MC_IB_PORT", "2", [](const auto& c) { return c.ib_port == 2; }, "0"},
      {"MC_RETRY_CNT", "100", [](const auto& c) { return c.max_retry == 100; }, "128"},
      {"MC_METADATA_CLUSTER_ID", "prod", [](const auto& c) { return c.cluster_id == "prod"; }, nullptr},
      {"MC_MAX_WR", "512", [](const auto& c) { return c.max_wr == 512; }, "0"},
      {"MC_MAX_INLINE", "128", [](const auto& c) { return c.max_inline == 128; }, "70000"},
      {"MC_IB_TC", "106", [](const auto& c) { return c.ib_traffic_class == 106; }, "256"},
      {"MC_IB_SL", "3", [](const auto& c) { return c.ib_service_level == 3; }, "16"},
      {"MC_PKEY_INDEX", "1", [](const auto& c) { return c.pkey_index == 1; }, "70000"},
      {"MC_MAX_CQE_PER_CTX", "8192", [](const auto& c) { return c.max_cqe == 8192; }, "0"},
      {"MC_HANDSHAKE_PORT", "12001", [](const auto& c) { return c.handshake_port == 12001; }, "0"},
      {"MC_HANDSHAKE_CONNECT_TIMEOUT", "7",
       [](const auto& c) { return c.handshake_connect_timeout == std::chrono::seconds(7); }, "3600"},
      {"MC_TCP_PROTO", "1", [](const auto& c) { return c.tcp_proto == 1; }, "3"},
      {"MC_TCP_BIND_ADDRESS", "10.1.2.3", [](const auto& c) { return c.local_server_name == "10.1.2.3"; }, nullptr},
  };
  const engine_config defaults;
  for (const auto& tc : cases) {
    INFO(tc.var);
    {
      env_guard env;
      env.set(tc.var, tc.good);
      config_report r;
      auto eff = defaults.resolve(&r);
      REQUIRE(eff);
      CHECK(tc.applied(*eff));
      CHECK_FALSE(warned(r, tc.var));
    }
    if (tc.bad != nullptr) {
      env_guard env;
      env.set(tc.var, tc.bad);
      config_report r;
      auto eff = defaults.resolve(&r);
      REQUIRE(eff);  // never config_invalid: Mooncake would have started
      CHECK_FALSE(tc.applied(*eff));
      INFO(all_warnings(r));
      CHECK(warned(r, std::string(tc.var) + "=\"" + tc.bad + "\""));
      CHECK(warned(r, "ignored"));
    }
  }

  SUBCASE("atoi-style numbers, TIDE_ wins over MC_, NCCL_IB_GID_INDEX as Mooncake's fallback") {
    env_guard env;
    env.set("MC_NUM_QP_PER_EP", "3x");
    env.set("MC_SLICE_SIZE", "abc");
    env.set("MC_MAX_WR", "300");
    env.set("TIDE_MAX_WR", "400");
    env.set("NCCL_IB_GID_INDEX", "5");
    config_report r;
    auto eff = defaults.resolve(&r);
    REQUIRE(eff);
    CHECK(eff->num_qp_per_ep == 3);
    CHECK(warned(r, "MC_NUM_QP_PER_EP=\"3x\": read as 3"));
    CHECK(eff->slice_size == defaults.slice_size);
    CHECK(warned(r, "MC_SLICE_SIZE=\"abc\" is not a number: ignored"));
    CHECK(eff->max_wr == 400);
    CHECK(eff->gid_index == 5);
    CHECK(setting(r, "gid_index").origin == "NCCL_IB_GID_INDEX");
    env.set("MC_GID_INDEX", "2");
    CHECK(defaults.resolve()->gid_index == 2);
  }

  SUBCASE("MC_FORCE_TCP set to anything means TCP alone, as in Mooncake") {
    for (const char* v : {"1", "true", "0"}) {
      env_guard env;
      env.set("MC_FORCE_TCP", v);
      config_report r;
      auto eff = defaults.resolve(&r);
      REQUIRE(eff);
      CHECK(eff->transports == "tcp");
      CHECK(warned(r, "Mooncake forces TCP whenever") == (std::string(v) == "0"));
    }
    env_guard env;
    env.set("MC_FORCE_TCP", "1");
    engine_config both;
    both.transports = "rdma";  // the program's choice wins
    CHECK(both.resolve()->transports == "rdma");
  }

  SUBCASE("MC_CUSTOM_TOPO_JSON names a file, as in Mooncake; one that cannot be read is ignored") {
    test::temp_dir dir;
    const std::string matrix = R"({"cpu:0": [["rxe0"], ["rxe1"]]})";
    env_guard env;
    env.set("MC_CUSTOM_TOPO_JSON", write_file(dir, "topo.json", matrix));
    config_report r;
    auto eff = defaults.resolve(&r);
    REQUIRE(eff);
    CHECK(eff->custom_topology_json == matrix);
    env.set("MC_CUSTOM_TOPO_JSON", (dir.path() / "missing.json").string());
    eff = defaults.resolve(&r);
    REQUIRE(eff);
    CHECK(eff->custom_topology_json.empty());
    CHECK(warned(r, "the device scan is used instead, as Mooncake does"));
    env.set("MC_CUSTOM_TOPO_JSON", write_file(dir, "bad.json", "{not json"));
    eff = defaults.resolve(&r);
    REQUIRE(eff);
    CHECK(eff->custom_topology_json.empty());
    // The same file named by the program or TIDE_* is an error.
    env.unset("MC_CUSTOM_TOPO_JSON");
    engine_config mine;
    mine.custom_topology_file = (dir.path() / "missing.json").string();
    auto e = mine.resolve();
    REQUIRE_FALSE(e);
    CHECK(e.error().code == errc::config_invalid);
    CHECK(e.error().detail.find("custom_topology_file") != std::string::npos);
  }
}

TEST_CASE("names that are no setting are warned about, once each in the log") {
  env_guard env;
  env.set("TIDE_TRANSFER_TIMEOUT", "5");  // a Mooncake user's guess for TIDE_TRANSFER_TIMEOUT_MS
  env.set("MC_LANE_CPUS", "0");           // an MC_ spelling earlier tide read; Mooncake has none
  env.set("TIDE_TEST_SOMETHING", "1");    // the test harness's own
  env.set("TIDE_LOG_LEVEL", "warn");
  config_report r;
  REQUIRE(engine_config{}.resolve(&r));
  INFO(all_warnings(r));
  CHECK(warned(r, "TIDE_TRANSFER_TIMEOUT is not a tide setting"));
  CHECK(warned(r, "MC_LANE_CPUS is not a Mooncake variable and tide does not read it: set TIDE_LANE_CPUS"));
  CHECK_FALSE(warned(r, "TIDE_TEST_SOMETHING"));
  CHECK_FALSE(warned(r, "TIDE_LOG_LEVEL"));
  CHECK_FALSE(warned(r, "TIDE_TRANSFER_TIMEOUT_MS"));

  // In the log once per process, whatever the number of engines.
  std::vector<std::string> lines;
  tide::set_log_sink([&](log_level, std::string_view m) { lines.emplace_back(m); });
  env.set("TIDE_NOT_A_SETTING_ONCE", "1");
  REQUIRE(engine_config{}.resolve());
  REQUIRE(engine_config{}.resolve());
  tide::set_log_sink({});
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
          return l.find("TIDE_NOT_A_SETTING_ONCE is not a tide setting") != std::string::npos;
        }) == 1);
}

TEST_CASE("local_server_name: empty means this host's address, chosen and reported; a set one is kept") {
  config_report r;
  auto eff = engine_config{}.resolve(&r);
  REQUIRE(eff);
  CHECK_FALSE(eff->local_server_name.empty());
  CHECK(setting(r, "local_server_name").source == config_source::automatic);
  CHECK_FALSE(setting(r, "local_server_name").origin.empty());
  engine_config c;
  c.local_server_name = "127.0.0.1";
  CHECK(c.resolve()->local_server_name == "127.0.0.1");
}

TEST_CASE("every setting's reported value reads back through apply_json") {
  config_report r;
  REQUIRE(engine_config{}.resolve(&r));
  CHECK(r.settings.size() > 60);
  for (const auto& s : r.settings) {
    if (s.value.find("...") != std::string::npos) continue;  // shortened text
    engine_config c;
    INFO(s.key << " = " << s.value);
    CHECK(c.apply_json("{\"" + s.key + "\": " + s.value + "}", "round trip"));
  }
  CHECK(r.to_text().find("num_qp_per_ep = 2") != std::string::npos);
}

TEST_CASE("docs/configuration.md is what tide-config --markdown renders from the code") {
  const char* root = std::getenv("TIDE_TEST_SOURCE_ROOT");
  REQUIRE_MESSAGE(root != nullptr, "meson sets TIDE_TEST_SOURCE_ROOT");
  const std::string path = std::string(root) + "/docs/configuration.md";
  std::ifstream in(path);
  std::stringstream file;
  file << in.rdbuf();
  const std::string want = config_reference_markdown();
  if (file.str() == want) return;
  std::istringstream a(file.str()), b(want);
  std::string la, lb;
  int line = 0;
  while (true) {
    ++line;
    const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) break;
    if (!ga || !gb || la != lb) {
      FAIL_CHECK(path << " differs from the code's table at line " << line << ":\n  file: " << (ga ? la : "(end)")
                      << "\n  code: " << (gb ? lb : "(end)")
                      << "\nregenerate it: meson compile -C build tide-config && build/tools/tide-config/tide-config "
                         "--markdown > docs/configuration.md");
      break;
    }
  }
}

TEST_CASE("tide-config prints the effective configuration with sources, and its reference") {
  const char* tool = std::getenv("TIDE_TEST_CONFIG_TOOL");
  REQUIRE_MESSAGE(tool != nullptr, "meson sets TIDE_TEST_CONFIG_TOOL");
  test::temp_dir dir;
  env_guard env;
  env.set("TIDE_SLICE_SIZE", "131072");
  env.set("TIDE_LOG_LEVEL", "verbose");  // unknown: said once, warn used
  const std::string log = (dir.path() / "out.log").string();
  test::child_process p({tool, "--json", R"({"mtu": 1024})"}, log);
  REQUIRE(p.wait_exit(std::chrono::seconds(60)) == 0);
  std::ifstream in(log);
  std::stringstream out;
  out << in.rdbuf();
  INFO(out.str());
  CHECK(out.str().find("slice_size = 131072") != std::string::npos);
  CHECK(out.str().find("(environment TIDE_SLICE_SIZE)") != std::string::npos);
  CHECK(out.str().find("mtu = 1024") != std::string::npos);
  CHECK(out.str().find("(program)") != std::string::npos);
  CHECK(out.str().find("TIDE_LOG_LEVEL=\"verbose\" is not a log level (error, warn, info, debug, off); using warn") !=
        std::string::npos);

  test::child_process bad({tool, "--frobnicate"}, log);
  CHECK(bad.wait_exit(std::chrono::seconds(60)) == 2);
  env.set("TIDE_MTU", "9000");
  test::child_process invalid({tool}, log);
  CHECK(invalid.wait_exit(std::chrono::seconds(60)) == 1);
}

// transfer_engine::create applies the rule (before, it applied TIDE_CONFIG and the environment
// over the config it was given), and takes Mooncake's values Mooncake takes.
TEST_CASE("create: the program's value beats the environment; Mooncake's MC_WORKERS_PER_CTX=4 starts an engine") {
  const auto ports = test::free_loopback_ports(2);
  env_guard env;
  env.set("TIDE_TCP_PORT", std::to_string(ports[1]));
  env.set("MC_WORKERS_PER_CTX", "4");
  env.set("MC_RETRY_CNT", "100");
  engine_config c;
  c.local_server_name = "127.0.0.1";
  c.bind_host = "127.0.0.1";
  c.transports = "tcp";  // no RDMA device needed
  c.tcp_port = ports[0];
  auto e = transfer_engine<>::create(c);
  REQUIRE_MESSAGE(e, (e ? std::string() : e.error().message()));
  CHECK((*e)->tcp_port() == ports[0]);
  e->reset();
  // Left at its default, the variable decides.
  c.tcp_port = 0;
  e = transfer_engine<>::create(c);
  REQUIRE_MESSAGE(e, (e ? std::string() : e.error().message()));
  CHECK((*e)->tcp_port() == ports[1]);
}
