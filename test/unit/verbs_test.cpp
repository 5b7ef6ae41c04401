// Verbs-layer logic that needs no device: error translation, GID text forms,
// GID choice on fake sysfs trees, MTU helpers.
#include <tide/verbs/device.hpp>
#include <tide/verbs/error.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/qp.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using tide::errc;
namespace v = tide::verbs;

TEST_CASE("errno translation keeps the meaning and names the call") {
  CHECK(v::errc_from_errno(ENOMEM) == errc::resource_exhausted);
  CHECK(v::errc_from_errno(ENOSPC) == errc::resource_exhausted);
  CHECK(v::errc_from_errno(EPERM) == errc::permission_denied);
  CHECK(v::errc_from_errno(EACCES) == errc::permission_denied);
  CHECK(v::errc_from_errno(ENODEV) == errc::device_not_found);
  CHECK(v::errc_from_errno(EIO) == errc::device_fatal);
  CHECK(v::errc_from_errno(ETIMEDOUT) == errc::timed_out);
  CHECK(v::errc_from_errno(EINVAL) == errc::verbs_failed);
  CHECK(v::errc_from_errno(EINVAL, errc::qp_state_error) == errc::qp_state_error);

  const auto e = v::verbs_error("ibv_reg_mr", "rxe0", ENOMEM);
  CHECK(e.code == errc::resource_exhausted);
  CHECK(e.detail.find("ibv_reg_mr on rxe0: ") == 0);
  CHECK(e.detail.find("errno 12") != std::string::npos);
  CHECK(v::verbs_error("ibv_alloc_pd", "mlx5_0", 0).detail == "ibv_alloc_pd on mlx5_0: failed without an errno");
}

TEST_CASE("post return codes map for the hot path") {
  CHECK(v::errc_from_post(0) == errc::ok);
  CHECK(v::errc_from_post(ENOMEM) == errc::would_block);
  CHECK(v::errc_from_post(EINVAL) == errc::invalid_argument);
  CHECK(v::errc_from_post(EBADF) == errc::verbs_failed);
}

TEST_CASE("work completion statuses map to endpoint-level codes") {
  CHECK(v::errc_from_wc_status(IBV_WC_SUCCESS) == errc::ok);
  CHECK(v::errc_from_wc_status(IBV_WC_REM_ACCESS_ERR) == errc::remote_access_error);
  CHECK(v::errc_from_wc_status(IBV_WC_REM_OP_ERR) == errc::remote_operation_error);
  CHECK(v::errc_from_wc_status(IBV_WC_REM_INV_REQ_ERR) == errc::remote_operation_error);
  CHECK(v::errc_from_wc_status(IBV_WC_RETRY_EXC_ERR) == errc::transport_retry_exceeded);
  CHECK(v::errc_from_wc_status(IBV_WC_RNR_RETRY_EXC_ERR) == errc::rnr_retry_exceeded);
  CHECK(v::errc_from_wc_status(IBV_WC_WR_FLUSH_ERR) == errc::work_request_flushed);
  CHECK(v::errc_from_wc_status(IBV_WC_LOC_PROT_ERR) == errc::unregistered_source);
  CHECK(v::errc_from_wc_status(IBV_WC_LOC_LEN_ERR) == errc::completion_error);
  // Every failure lands in the endpoint group, except a local protection error.
  for (int s = IBV_WC_SUCCESS + 1; s <= IBV_WC_TM_RNDV_INCOMPLETE; ++s) {
    const errc e = v::errc_from_wc_status(static_cast<ibv_wc_status>(s));
    CAPTURE(s);
    CHECK((tide::group_of(e) == tide::errc_group::endpoint || e == errc::unregistered_source));
  }

  ibv_wc wc{};
  wc.status = IBV_WC_REM_ACCESS_ERR;
  wc.opcode = IBV_WC_RDMA_READ;
  wc.wr_id = 42;
  wc.qp_num = 17;
  const auto e = v::wc_error(wc, "rxe1");
  CHECK(e.code == errc::remote_access_error);
  CHECK(e.detail.find("wr_id=42 qp_num=17 on rxe1: remote access error") == 0);
}

TEST_CASE("GID text round-trips in Mooncake's format") {
  const auto g = v::parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01");
  REQUIRE(g);
  CHECK(g->is_ipv4_mapped());
  CHECK_FALSE(g->is_link_local());
  CHECK(g->raw[12] == 10);
  CHECK(g->raw[13] == 47);
  CHECK(g->to_string() == "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01");
  CHECK(g->to_string().size() == 47);
  // One-digit and upper-case parts parse (Mooncake's %hhx does); output is canonical.
  const auto h = v::parse_gid("FE:80:0:0:0:0:0:0:2:1:2:3:4:5:6:7");
  REQUIRE(h);
  CHECK(h->is_link_local());
  CHECK(h->to_string() == "fe:80:00:00:00:00:00:00:02:01:02:03:04:05:06:07");
  CHECK(v::gid::from_ibv(h->to_ibv()) == *h);
}

TEST_CASE("malformed GID text is rejected with the reason") {
  auto bad = [](const char* s, const char* why) {
    const auto r = v::parse_gid(s);
    const std::string text = s;
    CAPTURE(text);
    REQUIRE_FALSE(r);
    CAPTURE(r.error().detail);
    CHECK(r.error().code == errc::invalid_argument);
    CHECK(r.error().detail.find(why) != std::string::npos);
  };
  bad("", "got 1");
  bad("fe80::1", "1 or 2 hex digits");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00", "got 15");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01:02", "more than 16");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01:", "more than 16");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:100", "part 15");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:0g:01", "not hex");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:+1:01", "not hex");
  bad(" 00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01", "part 0");
  bad("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01 ", "part 15");
}

TEST_CASE("sysfs GID text parses") {
  const auto g = v::parse_sysfs_gid("0000:0000:0000:0000:0000:ffff:0a2f:0002\n");
  REQUIRE(g);
  CHECK(g->to_string() == "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:02");
  CHECK_FALSE(v::parse_sysfs_gid("fe80::1"));
  CHECK_FALSE(v::parse_sysfs_gid("0000:0000:0000:0000:0000:ffff:0a2f:00x2"));
  CHECK_FALSE(v::parse_sysfs_gid("0000-0000:0000:0000:0000:ffff:0a2f:0002"));
}

namespace {

// A fake /sys with one device and port, written into a fresh temp dir.
class fake_sysfs {
 public:
  fake_sysfs() {
    std::string tmpl = (fs::temp_directory_path() / "tide-sysfs-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    root_ = tmpl;
  }
  ~fake_sysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fake_sysfs(const fake_sysfs&) = delete;
  fake_sysfs& operator=(const fake_sysfs&) = delete;

  /// type/ndev empty = the file is absent (as for an unpopulated slot).
  void add(const std::string& dev, int port, int index, const std::string& gid, const std::string& type,
           const std::string& ndev) {
    const fs::path p = root_ / "class/infiniband" / dev / "ports" / std::to_string(port);
    fs::create_directories(p / "gids");
    fs::create_directories(p / "gid_attrs/types");
    fs::create_directories(p / "gid_attrs/ndevs");
    write(p / "gids" / std::to_string(index), gid);
    if (!type.empty()) write(p / "gid_attrs/types" / std::to_string(index), type);
    if (!ndev.empty()) write(p / "gid_attrs/ndevs" / std::to_string(index), ndev);
  }
  [[nodiscard]] std::string root() const { return root_.string(); }

 private:
  static void write(const fs::path& p, const std::string& s) {
    std::ofstream(p) << s << '\n';
  }
  fs::path root_;
};

constexpr const char* kZero = "0000:0000:0000:0000:0000:0000:0000:0000";
constexpr const char* kLinkLocal = "fe80:0000:0000:0000:5054:00ff:fe12:3456";
constexpr const char* kV4 = "0000:0000:0000:0000:0000:ffff:0a2f:0001";
constexpr const char* kGlobal6 = "2001:0db8:0000:0000:0000:0000:0000:0001";

}  // namespace

TEST_CASE("GID choice prefers RoCE v2 IPv4 with a netdev") {
  fake_sysfs s;
  // The layout rxe gives: v1 and v2 link-local, then v1 and v2 IPv4, then empty slots.
  s.add("rxe0", 1, 0, kLinkLocal, "IB/RoCE v1", "veth0");
  s.add("rxe0", 1, 1, kLinkLocal, "RoCE v2", "veth0");
  s.add("rxe0", 1, 2, kV4, "IB/RoCE v1", "veth0");
  s.add("rxe0", 1, 3, kV4, "RoCE v2", "veth0");
  s.add("rxe0", 1, 4, kZero, "", "");
  const auto table = v::read_gid_table("rxe0", 1, s.root());
  REQUIRE(table);
  CHECK(table->size() == 4);
  CHECK(table->at(3).type == v::gid_type::roce_v2);
  CHECK(table->at(3).netdev == "veth0");
  const auto idx = v::select_gid_index("rxe0", 1, -1, s.root());
  REQUIRE(idx);
  CHECK(*idx == 3);
}

TEST_CASE("GID choice: IPv4-mapped without a netdev loses to a routable IPv6 one") {
  fake_sysfs s;
  s.add("mlx5_0", 1, 0, kLinkLocal, "RoCE v2", "eth0");
  s.add("mlx5_0", 1, 1, kV4, "RoCE v2", "");
  s.add("mlx5_0", 1, 2, kGlobal6, "RoCE v2", "eth0");
  const auto idx = v::select_gid_index("mlx5_0", 1, -1, s.root());
  REQUIRE(idx);
  CHECK(*idx == 2);
}

TEST_CASE("GID choice falls back to a link-local v2, then to the IB port GID") {
  fake_sysfs s;
  s.add("rxe0", 1, 0, kLinkLocal, "IB/RoCE v1", "veth0");
  s.add("rxe0", 1, 1, kLinkLocal, "RoCE v2", "veth0");
  CHECK(v::select_gid_index("rxe0", 1, -1, s.root()).value() == 1);

  s.add("mlx4_0", 2, 0, "fe80:0000:0000:0000:0002:c903:0001:0002", "IB/RoCE v1", "");
  CHECK(v::select_gid_index("mlx4_0", 2, -1, s.root()).value() == 0);
}

TEST_CASE("GID choice fails clearly when nothing is usable") {
  fake_sysfs s;
  s.add("rxe0", 1, 0, kLinkLocal, "IB/RoCE v1", "veth0");  // RoCE v1 only
  s.add("rxe0", 1, 1, kZero, "", "");
  auto r = v::select_gid_index("rxe0", 1, -1, s.root());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::gid_not_found);
  CHECK(r.error().detail.find("rxe0 port 1") == 0);

  r = v::select_gid_index("rxe9", 1, -1, s.root());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::device_not_found);
  r = v::select_gid_index("rxe0", 2, -1, s.root());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::device_not_found);
  CHECK(v::select_gid_index("../etc", 1, -1, s.root()).error().code == errc::invalid_argument);
  CHECK(v::select_gid_index("rxe0", 0, -1, s.root()).error().code == errc::invalid_argument);
}

TEST_CASE("an explicit GID index overrides the choice, but must be populated") {
  fake_sysfs s;
  s.add("rxe0", 1, 0, kLinkLocal, "IB/RoCE v1", "veth0");
  s.add("rxe0", 1, 1, kV4, "RoCE v2", "veth0");
  s.add("rxe0", 1, 2, kZero, "", "");
  CHECK(v::select_gid_index("rxe0", 1, 0, s.root()).value() == 0);
  auto r = v::select_gid_index("rxe0", 1, 2, s.root());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::gid_not_found);
  CHECK(r.error().detail.find("GID index 2 is not populated") != std::string::npos);
  CHECK_FALSE(v::select_gid_index("rxe0", 1, 77, s.root()));
}

TEST_CASE("path MTU is the smaller end, capped") {
  CHECK(v::path_mtu(IBV_MTU_4096, IBV_MTU_1024) == IBV_MTU_1024);
  CHECK(v::path_mtu(IBV_MTU_1024, IBV_MTU_4096) == IBV_MTU_1024);
  CHECK(v::path_mtu(IBV_MTU_4096, IBV_MTU_4096, IBV_MTU_2048) == IBV_MTU_2048);
  CHECK(v::mtu_bytes(IBV_MTU_256) == 256);
  CHECK(v::mtu_bytes(IBV_MTU_4096) == 4096);
  CHECK(v::mtu_bytes(static_cast<ibv_mtu>(0)) == 0);
  CHECK(v::mtu_bytes(static_cast<ibv_mtu>(6)) == 0);
  CHECK(v::mtu_from_bytes(2048).value() == IBV_MTU_2048);
  CHECK(v::mtu_from_bytes(1500).error().code == errc::invalid_argument);
  static_assert(v::path_mtu(IBV_MTU_512, IBV_MTU_2048) == IBV_MTU_512);
}

TEST_CASE("QP state names") {
  CHECK(v::to_string(IBV_QPS_RTS) == "RTS");
  CHECK(v::to_string(IBV_QPS_ERR) == "ERR");
  CHECK(v::to_string(static_cast<ibv_qp_state>(99)) == "UNKNOWN");
}

TEST_CASE("opening a device that does not exist says what there is") {
  const auto r = v::context::open("no-such-device-xyz");
  REQUIRE_FALSE(r);
  CHECK((r.error().code == errc::no_device || r.error().code == errc::device_not_found));
  CHECK(r.error().detail.find("no-such-device-xyz") != std::string::npos);
}
