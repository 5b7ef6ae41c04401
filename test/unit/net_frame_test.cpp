// Mooncake's framing without sockets, and the names on the handshake network.

#include <tide/net/address.hpp>
#include <tide/net/frame.hpp>

#include <doctest/doctest.h>

#include <random>
#include <string>

using namespace tide;
using namespace tide::net;

namespace {

std::string le64(std::uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

}  // namespace

TEST_CASE("frames are a little-endian length counting the type byte, the type, the body") {
  const std::string f = encode_frame(message_type::probe, "{}\n");
  REQUIRE(f.size() == 8 + 1 + 3);
  CHECK(f.substr(0, 8) == le64(4));
  CHECK(f[8] == '\x03');
  CHECK(f.substr(9) == "{}\n");
  CHECK(encode_frame(message_type::connect, "x")[8] == '\0');
  CHECK(encode_frame(message_type::metadata, "x")[8] == '\x01');
  CHECK(encode_frame(message_type::notify, "x")[8] == '\x02');
  const std::string legacy = encode_legacy_frame("{\"a\":1}\n");
  CHECK(legacy.substr(0, 8) == le64(8));
  CHECK(legacy.substr(8) == "{\"a\":1}\n");
}

TEST_CASE("decode_frame inverts encode_frame for every type, and legacy frames are connects") {
  for (auto t : {message_type::connect, message_type::metadata, message_type::notify, message_type::probe}) {
    auto f = decode_frame(encode_frame(t, "{\"k\":\"v\"}\n"));
    REQUIRE(f.has_value());
    CHECK(f->type == t);
    CHECK_FALSE(f->legacy);
    CHECK(f->body == "{\"k\":\"v\"}\n");
  }
  auto empty_body = decode_frame(encode_frame(message_type::probe, ""));
  REQUIRE(empty_body.has_value());
  CHECK(empty_body->body.empty());

  auto legacy = decode_frame(encode_legacy_frame("{\"local_nic_path\":\"a\"}\n"));
  REQUIRE(legacy.has_value());
  CHECK(legacy->legacy);
  CHECK(legacy->type == message_type::connect);
  CHECK(legacy->body == "{\"local_nic_path\":\"a\"}\n");
}

TEST_CASE("bad frames: zero length, over the bound, 2^63, unknown type, truncated, trailing bytes") {
  auto zero = decode_frame(le64(0));
  REQUIRE_FALSE(zero.has_value());
  CHECK(zero.error().code == errc::frame_too_large);

  auto huge = decode_frame(le64(std::uint64_t{1} << 63) + std::string("\0{}", 3));
  REQUIRE_FALSE(huge.has_value());
  CHECK(huge.error().code == errc::frame_too_large);
  CHECK(huge.error().detail.find("9223372036854775808") != std::string::npos);

  auto over = decode_frame(encode_frame(message_type::probe, std::string(100, 'x')), 100);
  REQUIRE_FALSE(over.has_value());
  CHECK(over.error().code == errc::frame_too_large);
  CHECK(decode_frame(encode_frame(message_type::probe, std::string(99, 'x')), 100).has_value());

  auto unknown = decode_frame(le64(3) + "\x80{}");
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.error().code == errc::protocol_error);
  CHECK(unknown.error().detail.find("0x80") != std::string::npos);
  CHECK(decode_frame(le64(3) + "\xff{}").error().code == errc::protocol_error);

  auto truncated = decode_frame(encode_frame(message_type::connect, "{\"a\":1}").substr(0, 12));
  REQUIRE_FALSE(truncated.has_value());
  CHECK(truncated.error().code == errc::protocol_error);
  CHECK(truncated.error().detail.find("truncated") != std::string::npos);
  CHECK(decode_frame("abc").error().detail.find("truncated") != std::string::npos);

  auto trailing = decode_frame(encode_frame(message_type::probe, "{}") + "!");
  REQUIRE_FALSE(trailing.has_value());
  CHECK(trailing.error().detail.find("trailing") != std::string::npos);
}

TEST_CASE("the incremental decoder takes any split, rejects a bad length before buffering, and stops at the frame end") {
  const std::string wire = encode_frame(message_type::notify, R"({"name":"n","notify_msg":"m"})");
  std::mt19937 rng{42};
  for (int round = 0; round < 50; ++round) {
    frame_decoder dec;
    std::size_t off = 0;
    while (off < wire.size()) {
      CHECK(dec.current() == frame_decoder::state::need_more);
      const std::size_t chunk = 1 + rng() % 7;
      off += dec.feed(wire.data() + off, std::min(chunk, wire.size() - off));
    }
    REQUIRE(dec.current() == frame_decoder::state::complete);
    const frame f = dec.take();
    CHECK(f.type == message_type::notify);
    CHECK(f.body == R"({"name":"n","notify_msg":"m"})");
  }

  frame_decoder dec{1024};
  const std::string bad = le64(std::uint64_t{1} << 40);
  CHECK(dec.feed(bad.data(), 8) == 8);
  CHECK(dec.current() == frame_decoder::state::failed);
  CHECK(dec.failure().code == errc::frame_too_large);
  CHECK(dec.buffered() == 0);
  CHECK(dec.feed("more", 4) == 0);

  frame_decoder two;
  const std::string pair = encode_frame(message_type::probe, "{}") + encode_frame(message_type::probe, "[]");
  const std::size_t used = two.feed(pair.data(), pair.size());
  CHECK(used == pair.size() / 2);
  CHECK(two.current() == frame_decoder::state::complete);
  CHECK(two.bytes_wanted() == 0);
}

TEST_CASE("segment names parse as host:port, [v6]:port or a bare host") {
  CHECK(*parse_peer_address("10.0.0.2:16002") == peer_address{"10.0.0.2", 16002});
  CHECK(*parse_peer_address("node-a") == peer_address{"node-a", kDefaultHandshakePort});
  CHECK(*parse_peer_address("[fe80::1]:15001") == peer_address{"fe80::1", 15001});
  CHECK(*parse_peer_address("[::1]") == peer_address{"::1", kDefaultHandshakePort});
  CHECK(*parse_peer_address("fe80::1") == peer_address{"fe80::1", kDefaultHandshakePort});
  for (const char* bad : {"", ":80", "host:", "host:0", "host:65536", "host:12x", "[::1", "[::1]x", "[]:80"}) {
    auto r = parse_peer_address(bad);
    CHECK_MESSAGE(!r.has_value(), bad);
    if (!r) CHECK(r.error().code == errc::invalid_argument);
  }
  CHECK(format_peer_address("::1", 80) == "[::1]:80");
  CHECK(format_peer_address("h", 80) == "h:80");
}

// One splitter for every reader of a NIC path, at the last '@' (review
// 1ab3d99, finding 17: the identity check split at the first, the RDMA
// notification receiver and check_request at the last).
TEST_CASE("NIC paths split at the last @, the same for every reader") {
  CHECK(make_nic_path("10.0.0.1:15321", "mlx5_0") == "10.0.0.1:15321@mlx5_0");
  auto p = split_nic_path("a:1@dev@x");
  REQUIRE(p.has_value());
  CHECK(p->server == "a:1@dev");
  CHECK(p->device == "x");
  CHECK(tide::wire::nic_path_server("a:1@dev@x") == "a:1@dev");
  CHECK(tide::wire::nic_path_device("a:1@dev@x") == "x");
  CHECK(tide::wire::nic_path_server("nodevice").empty());
  CHECK(tide::wire::nic_path_device("srv@").empty());
  // The identity binding names the server the notification receiver files
  // under: member "a" may not claim member "a@b"'s path.
  CHECK(tide::wire::check_peer_identity("a@b", "a@b@mlx5_0").has_value());
  auto other = tide::wire::check_peer_identity("a", "a@b@mlx5_0");
  REQUIRE_FALSE(other.has_value());
  CHECK(other.error().code == tide::errc::auth_failed);
  CHECK_FALSE(split_nic_path("nodevice").has_value());
  CHECK_FALSE(split_nic_path("@dev").has_value());
  CHECK_FALSE(split_nic_path("srv@").has_value());
}
