#include <tide/topology/cpu_list.hpp>
#include <tide/topology/gpu.hpp>
#include <tide/topology/hca.hpp>
#include <tide/topology/location.hpp>
#include <tide/topology/priority_matrix.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace fs = std::filesystem;
using namespace tide::topology;

namespace {

// A throw-away sysfs tree under /tmp.
struct fake_sysfs {
  fs::path root;
  fake_sysfs() {
    std::string tmpl = (fs::temp_directory_path() / "tide-sysfs-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    root = tmpl;
  }
  ~fake_sysfs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void write(const fs::path& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text << "\n";
  }
  // A device with one port; `pci` names a fake PCI function dir ("" = none, as rxe).
  void add_hca(const std::string& name, const std::string& pci, int numa, bool active = true) const {
    const fs::path dev = fs::path("class/infiniband") / name;
    if (!pci.empty()) {
      const fs::path fn = root / "devices/pci0000:00" / pci;
      fs::create_directories(fn);
      std::ofstream(fn / "numa_node") << numa << "\n";
      fs::create_directories(root / dev);
      fs::create_directory_symlink(fn, root / dev / "device");
    }
    write(dev / "ports/1/state", active ? "4: ACTIVE" : "1: DOWN");
    write(dev / "ports/1/link_layer", "Ethernet");
    write(dev / "ports/1/lid", "0x0");
    write(dev / "ports/1/rate", "100 Gb/sec (4X EDR)");
    write(dev / "ports/1/gids/0", "fe80:0000:0000:0000:5054:00ff:fe12:3456");
    write(dev / "ports/1/gids/1", "0000:0000:0000:0000:0000:ffff:0a2f:0001");
    write(dev / "ports/1/gids/2", "0000:0000:0000:0000:0000:0000:0000:0000");
    write(dev / "ports/1/gid_attrs/types/0", "RoCE v2");
    write(dev / "ports/1/gid_attrs/types/1", "RoCE v2");
    write(dev / "ports/1/gid_attrs/ndevs/1", "veth0");
  }
};

}  // namespace

TEST_CASE("location tags parse, print and reject garbage with bad_location") {
  auto any = location::parse("*");
  REQUIRE(any);
  CHECK(any->kind == location_kind::any);
  CHECK(any->key_at(12345) == "*");

  auto cpu = location::parse("cpu:3");
  REQUIRE(cpu);
  CHECK(cpu->kind == location_kind::cpu);
  CHECK(cpu->index == 3);
  CHECK(cpu->to_string() == "cpu:3");

  auto cuda = location::parse("cuda:0");
  REQUIRE(cuda);
  CHECK(cuda->key_at(0) == "cuda:0");

  auto seg = location::parse("segments:4096:1,3,5,7");
  REQUIRE(seg);
  CHECK(seg->kind == location_kind::segments);
  CHECK(seg->page_size == 4096);
  CHECK(seg->nodes == std::vector<int>{1, 3, 5, 7});
  CHECK(seg->key_at(0) == "cpu:1");
  CHECK(seg->key_at(4095) == "cpu:1");
  CHECK(seg->key_at(4096) == "cpu:3");
  CHECK(seg->key_at(3 * 4096 + 17) == "cpu:7");
  CHECK(seg->key_at(4 * 4096) == "cpu:1");  // the list repeats (interleave)
  CHECK(seg->to_string() == "segments:4096:1,3,5,7");
  CHECK(location::parse(seg->to_string()).value() == *seg);

  for (const char* bad : {"", "cpu", "cpu:", "cpu:x", "cpu:-1", "cpu:1x", "gpu:0", "segments:", "segments:4096",
                          "segments:0:1", "segments:4095:1", "segments:4096:", "segments:4096:1,,2",
                          "segments:4096:1,a", "segments:x:1", "**"}) {
    auto r = location::parse(bad);
    CAPTURE(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == tide::errc::bad_location);
    CHECK(r.error().detail.find(std::string("\"") + bad + "\"") != std::string::npos);
  }
}

TEST_CASE("sysfs scan reads NUMA node, PCI path, ports and GIDs from a fake tree") {
  fake_sysfs t;
  t.add_hca("mlx5_1", "0000:81:00.0", 1);
  t.add_hca("mlx5_0", "0000:01:00.0", 0);
  t.add_hca("rxe0", "", 0, /*active=*/false);
  t.write("devices/system/node/node0/cpulist", "0-3");
  t.write("devices/system/node/node1/cpulist", "4-7");
  t.write("devices/system/node/possible", "0-1");

  auto hcas = scan_hcas(t.root.string());
  REQUIRE(hcas);
  REQUIRE(hcas->size() == 3);
  CHECK((*hcas)[0].name == "mlx5_0");
  CHECK((*hcas)[0].numa_node == 0);
  CHECK((*hcas)[0].pci_path.find("0000:01:00.0") != std::string::npos);
  CHECK((*hcas)[1].name == "mlx5_1");
  CHECK((*hcas)[1].numa_node == 1);
  CHECK((*hcas)[2].name == "rxe0");
  CHECK((*hcas)[2].numa_node == -1);  // no device link: unknown
  CHECK((*hcas)[2].pci_path.empty());
  REQUIRE((*hcas)[2].ports.size() == 1);
  const auto& port = (*hcas)[2].ports[0];
  CHECK_FALSE(port.active);
  CHECK((*hcas)[0].ports[0].active);
  CHECK(port.link_layer == "Ethernet");
  CHECK(port.rate == "100 Gb/sec (4X EDR)");
  REQUIRE(port.gids.size() == 2);  // the zero GID is skipped
  CHECK(port.gids[0].index == 0);
  CHECK_FALSE(port.gids[0].is_ipv4_mapped());
  CHECK(port.gids[1].is_ipv4_mapped());
  CHECK(port.gids[1].netdev == "veth0");
  CHECK(port.gids[1].type == "RoCE v2");
  CHECK(port.gids[1].to_string() == "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01");

  CHECK(scan_numa_nodes(t.root.string()) == std::vector<int>{0, 1});
}

TEST_CASE("an empty sysfs tree means no HCA and one NUMA node, not an error") {
  fake_sysfs t;
  auto hcas = scan_hcas(t.root.string());
  REQUIRE(hcas);
  CHECK(hcas->empty());
  CHECK(scan_numa_nodes(t.root.string()) == std::vector<int>{0});
}

TEST_CASE("sysfs GID parsing rejects malformed text") {
  CHECK(parse_sysfs_gid("fe80:0000:0000:0000:5054:00ff:fe12:3456"));
  CHECK_FALSE(parse_sysfs_gid("fe80::1"));
  CHECK_FALSE(parse_sysfs_gid("fe80:0000:0000:0000:5054:00ff:fe12:34zz"));
  CHECK_FALSE(parse_sysfs_gid("fe80-0000:0000:0000:5054:00ff:fe12:3456"));
}

TEST_CASE("the matrix built from sysfs prefers NICs on the buffer's node") {
  fake_sysfs t;
  t.add_hca("mlx5_0", "0000:01:00.0", 0);
  t.add_hca("mlx5_1", "0000:81:00.0", 1);
  t.add_hca("mlx5_2", "0000:82:00.0", 1);
  auto hcas = scan_hcas(t.root.string()).value();
  auto m = priority_matrix::from_hcas(hcas, {0, 1});
  CHECK(m.to_json() == R"({"cpu:0":[["mlx5_0"],["mlx5_1","mlx5_2"]],"cpu:1":[["mlx5_1","mlx5_2"],["mlx5_0"]]})");
  CHECK(m.devices() == std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2"});
  const auto* e1 = m.find("cpu:1");
  REQUIRE(e1 != nullptr);
  std::set<int> seen;
  for (std::uint32_t r = 0; r < 64; ++r) seen.insert(e1->select(0, r));
  CHECK(seen == std::set<int>{1, 2});  // retry 0: only the preferred NICs
  // retry k: (k-1) mod |all| over preferred then available.
  CHECK(e1->select(1, 99) == 1);
  CHECK(e1->select(2, 99) == 2);
  CHECK(e1->select(3, 99) == 0);
  CHECK(e1->select(4, 99) == 1);
}

TEST_CASE("NICs whose NUMA node is unknown (rxe) are preferred everywhere") {
  fake_sysfs t;
  t.add_hca("rxe0", "", 0);
  t.add_hca("rxe1", "", 0);
  auto m = priority_matrix::from_hcas(scan_hcas(t.root.string()).value(), {0});
  CHECK(m.to_json() == R"({"cpu:0":[["rxe0","rxe1"],[]]})");
  std::set<int> seen;
  for (int i = 0; i < 200; ++i) seen.insert(m.select_device("cpu:0", 0).value());
  CHECK(seen == std::set<int>{0, 1});
}

TEST_CASE("device order follows Mooncake's rule: sorted keys, preferred before available, first appearance") {
  auto m = priority_matrix::from_json(
               R"({"cpu:1":[["mlx5_3"],["mlx5_0"]],"cpu:0":[["mlx5_2","mlx5_0"],["mlx5_3","mlx5_1"]],"cuda:0":[["mlx5_1"],[]]})")
               .value();
  CHECK(m.devices() == std::vector<std::string>{"mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"});
  CHECK(m.device_id("mlx5_1") == 3);
  CHECK(m.device_id("nope") == -1);
  const auto* c = m.find("cuda:0");
  REQUIRE(c != nullptr);
  CHECK(c->select(0, 7) == 3);
  // A key the matrix lacks and "*" fall back to every NIC.
  CHECK(m.find("cpu:9") == nullptr);
  CHECK(&m.resolve("cpu:9") == &m.any());
  CHECK(m.any().preferred.size() == 4);
  CHECK(m.any().select(2, 0) == 1);
  // JSON round trip.
  auto again = priority_matrix::from_json(m.to_json()).value();
  CHECK(again.devices() == m.devices());
  CHECK(again.to_json() == m.to_json());
}

TEST_CASE("malformed priority matrices are rejected with the key named") {
  for (const char* bad : {"[]", "{", R"({"cpu:0":[["a"]]})", R"({"cpu:0":[["a"],["b"],["c"]]})",
                          R"({"cpu:0":"a"})", R"({"cpu:0":[["a"],"b"]})", R"({"cpu:0":[[1],[]]})",
                          R"({"cpu:0":[[""],[]]})"}) {
    auto r = priority_matrix::from_json(bad);
    CAPTURE(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == tide::errc::metadata_malformed);
    CHECK(r.error().detail.find("priority_matrix") != std::string::npos);
  }
  priority_matrix empty;
  auto r = empty.select_device("cpu:0", 0);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == tide::errc::device_not_found);
}

TEST_CASE("CPU lists parse as taskset -c writes them; bad parts and absent CPUs are named") {
  CHECK(parse_cpu_list("3", 8).value() == std::vector<int>{3});
  CHECK(parse_cpu_list("0,2-4,7", 8).value() == std::vector<int>{0, 2, 3, 4, 7});
  CHECK(parse_cpu_list("4-5,1,5,4", 8).value() == std::vector<int>{1, 4, 5});  // sorted, each once
  CHECK(parse_cpu_list("0-7", 8).value().size() == 8);
  auto error_of = [](std::string_view text, int cpus = 8) {
    auto r = parse_cpu_list(text, cpus);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == tide::errc::config_invalid);
    return r.error().detail;
  };
  CHECK(error_of("") == "lane_cpus \"\": empty (expected CPUs such as \"0,2-3\")");
  CHECK(error_of("8").find("CPU 8 does not exist (this machine has 8, 0-7)") != std::string::npos);
  CHECK(error_of("2-9").find("CPU 9 does not exist") != std::string::npos);
  for (std::string_view bad : {"x", "1,", ",1", "3-2", "-1", "1-", " 1", "1 ", "+1", "1-2-3", "0x1"})
    CHECK_MESSAGE(error_of(bad).find("is not a CPU or a range lo-hi") != std::string::npos, bad);
  CHECK(error_of("1,x").find("\"x\" is not a CPU or a range lo-hi") != std::string::npos);
  CHECK(error_of("99999999999").find("is not a CPU") != std::string::npos);  // past int: not a number
  CHECK(configured_cpus() >= 1);
}

TEST_CASE("PCI distance: components below the deepest common ancestor, -1 when a path is unknown") {
  CHECK(pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                     "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0") == 0);
  CHECK(pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                     "/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0") == 2);
  CHECK(pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                     "/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0") == 4);
  CHECK(pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                     "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0") == 6);
  // A shared prefix of characters is not a shared component.
  CHECK(pci_distance("/sys/devices/pci0000:00/0000:00:01.0", "/sys/devices/pci0000:00/0000:00:01.1") == 2);
  CHECK(pci_distance("", "/sys/devices/pci0000:00") == -1);
}

TEST_CASE("cuda:N keys prefer the NICs nearest the GPU on the PCI tree, among those on its NUMA node") {
  fake_sysfs t;
  // Node 0: switch A holds GPU 0 and mlx5_0; switch B holds GPU 1 and mlx5_1.
  // Node 1: mlx5_2 under its own root; GPU 2 there has it alone.
  auto function = [&](const std::string& rel, int numa) {
    fs::create_directories(t.root / "devices" / rel);
    std::ofstream(t.root / "devices" / rel / "numa_node") << numa << "\n";
    const std::string bdf = fs::path(rel).filename().string();
    fs::create_directories(t.root / "bus/pci/devices");
    fs::create_directory_symlink(t.root / "devices" / rel, t.root / "bus/pci/devices" / bdf);
  };
  function("pci0000:00/0000:00:01.0/0000:01:00.0", 0);  // mlx5_0
  function("pci0000:00/0000:00:01.0/0000:02:00.0", 0);  // GPU 0
  function("pci0000:00/0000:00:03.0/0000:05:00.0", 0);  // mlx5_1
  function("pci0000:00/0000:00:03.0/0000:06:00.0", 0);  // GPU 1
  function("pci0000:80/0000:80:01.0/0000:81:00.0", 1);  // mlx5_2
  function("pci0000:80/0000:80:02.0/0000:82:00.0", 1);  // GPU 2
  std::vector<hca_info> hcas(3);
  const std::string names[] = {"mlx5_0", "mlx5_1", "mlx5_2"};
  const std::string bdfs[] = {"0000:01:00.0", "0000:05:00.0", "0000:81:00.0"};
  for (int i = 0; i < 3; ++i) {
    hcas[i].name = names[i];
    hcas[i].pci_path = fs::canonical(t.root / "bus/pci/devices" / bdfs[i]).string();
    hcas[i].numa_node = i < 2 ? 0 : 1;
  }
  // The driver names bus ids in upper case; sysfs in lower.
  const std::vector<gpu_info> gpus = {locate_gpu(0, "0000:02:00.0", t.root.string()),
                                      locate_gpu(1, "0000:06:00.0", t.root.string()),
                                      locate_gpu(2, "0000:82:00.0", t.root.string()),
                                      locate_gpu(3, "0000:AA:00.0", t.root.string())};
  CHECK(gpus[1].numa_node == 0);
  CHECK(gpus[2].numa_node == 1);
  CHECK(gpus[3].pci_path.empty());  // not in sysfs: no distance, every NIC preferred
  auto m = priority_matrix::from_hcas(hcas, {0, 1}, gpus);
  CHECK(m.to_json() ==
        R"({"cpu:0":[["mlx5_0","mlx5_1"],["mlx5_2"]],"cpu:1":[["mlx5_2"],["mlx5_0","mlx5_1"]],)"
        R"("cuda:0":[["mlx5_0"],["mlx5_1","mlx5_2"]],"cuda:1":[["mlx5_1"],["mlx5_0","mlx5_2"]],)"
        R"("cuda:2":[["mlx5_2"],["mlx5_0","mlx5_1"]],"cuda:3":[["mlx5_0","mlx5_1","mlx5_2"],[]]})");
}
