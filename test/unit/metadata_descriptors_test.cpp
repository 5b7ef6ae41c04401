// Descriptors and their JSON: Mooncake's own text decodes and re-encodes
// byte for byte; every validation rule rejects with the field named.

#include <tide/metadata/descriptors.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace tide;

namespace {

// research/mooncake-wire.md §3, as Mooncake's jsoncpp FastWriter emits it:
// compact, keys sorted (jsoncpp objects are std::map), '\n' at the end.
const std::string kMooncakeSegment =
    R"({"buffers":[{"addr":140230000000000,"length":1073741824,"lkey":[2099712],"name":"cpu:0","rkey":[2099712]}],)"
    R"("devices":[{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02","lid":0,"name":"mlx5_0"}],)"
    R"("name":"10.0.0.2:16002","priority_matrix":{"cpu:0":[["mlx5_0"],[]]},"protocol":"rdma",)"
    R"("tcp_data_port":0,"tcp_proto_version":1,"timestamp":"2026-01-01 12:00:00.123456"})"
    "\n";

// research/mooncake-wire.md §2, the example Connection request.
const std::string kMooncakeHandshake =
    R"({"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01","local_lid":0,)"
    R"("local_nic_path":"10.0.0.1:15321@mlx5_0","payload":"","peer_nic_path":"10.0.0.2:16002@mlx5_0",)"
    R"("qp_num":[1234,1235],"ready_ack":false,"reply_msg":""})"
    "\n";

segment_desc two_device_segment() {
  segment_desc d;
  d.name = "10.47.0.1:15001";
  d.devices = {{"rxe0", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01")},
               {"rxe1", 7, *parse_gid("fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02")}};
  d.buffers = {{"cpu:0", 0x7f0000000000, 1 << 20, {11, 12}, {21, 22}},
               {"cpu:1", 0x7f0000200000, 4096, {13, 14}, {23, 24}}};
  d.priority = {{"cpu:0", {{"rxe0"}, {"rxe1"}}}, {"cpu:1", {{"rxe1"}, {"rxe0"}}}};
  d.timestamp = "2026-11-29 10:00:00.000001";
  d.tcp_data_port = 0;
  d.rdma_server_name = "10.47.0.1:15001";
  return d;
}

// The segment above as JSON text with one substitution, for validation cases.
std::string segment_with(const std::string& from, const std::string& to) {
  std::string s = encode_segment(two_device_segment());
  const auto pos = s.find(from);
  REQUIRE_MESSAGE(pos != std::string::npos, "fixture lacks " << from << " in " << s);
  s.replace(pos, from.size(), to);
  return s;
}

void check_malformed(const result<segment_desc>& r, const std::string& field) {
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_malformed);
  CHECK_MESSAGE(r.error().detail.find(field) != std::string::npos,
                "detail \"" << r.error().detail << "\" does not name " << field);
}

}  // namespace

TEST_CASE("a Mooncake-written segment decodes and re-encodes byte for byte") {
  auto d = decode_segment(kMooncakeSegment);
  REQUIRE_MESSAGE(d.has_value(), d.error());
  CHECK(d->name == "10.0.0.2:16002");
  CHECK(d->protocol == "rdma");
  REQUIRE(d->devices.size() == 1);
  CHECK(d->devices[0].name == "mlx5_0");
  CHECK(d->devices[0].lid == 0);
  CHECK(d->devices[0].gid.raw[10] == 0xff);
  CHECK(d->devices[0].gid.raw[12] == 0x0a);
  CHECK(d->devices[0].gid.raw[15] == 0x02);
  REQUIRE(d->buffers.size() == 1);
  CHECK(d->buffers[0].addr == 140230000000000ULL);
  CHECK(d->buffers[0].length == 1073741824ULL);
  CHECK(d->buffers[0].rkey == std::vector<std::uint32_t>{2099712});
  CHECK(d->priority.at("cpu:0").preferred == std::vector<std::string>{"mlx5_0"});
  CHECK(d->priority.at("cpu:0").available.empty());
  CHECK(d->tcp_proto_version == 1);
  CHECK_FALSE(d->rdma_server_name.has_value());
  CHECK(encode_segment(*d) == kMooncakeSegment);
}

TEST_CASE("segment descriptors round-trip, rdma_server_name and all") {
  const segment_desc d = two_device_segment();
  const std::string text = encode_segment(d);
  CHECK(text.back() == '\n');
  CHECK(text.find(' ') == text.find("2026-11-29 ") + 10);  // compact: the only space is in the timestamp
  auto back = decode_segment(text);
  REQUIRE_MESSAGE(back.has_value(), back.error());
  CHECK(*back == d);

  segment_desc empty;
  empty.name = "fresh";
  auto e = decode_segment(encode_segment(empty));
  REQUIRE_MESSAGE(e.has_value(), e.error());
  CHECK(*e == empty);
}

TEST_CASE("tide's reach extension: a buffer no NIC registers says \"reach\":\"tcp\"; others, and Mooncake's, say nothing") {
  segment_desc d = two_device_segment();
  d.buffers[1].tcp_only = true;
  d.buffers[1].rkey = {0, 0};
  const std::string text = encode_segment(d);
  CHECK(text.find(R"("reach":"tcp")") != std::string::npos);
  CHECK(text.find(R"("reach")") == text.rfind(R"("reach")"));  // the one buffer only
  auto back = decode_segment(text);
  REQUIRE_MESSAGE(back.has_value(), back.error());
  CHECK(*back == d);
  CHECK_FALSE(back->buffers[0].tcp_only);
  CHECK(back->buffers[1].tcp_only);
  CHECK(encode_segment(two_device_segment()).find("reach") == std::string::npos);
  const std::string bad = [&] {
    std::string t = text;
    t.replace(t.find(R"("reach":"tcp")"), 13, R"("reach":"nic")");
    return t;
  }();
  check_malformed(decode_segment(bad), "buffers[1].reach");
}

TEST_CASE("decoding ignores unknown fields and tolerates whitespace") {
  auto d = decode_segment("  \n" + segment_with("\"name\":", "\"future_field\":{\"x\":[1,2]},\"name\":") + "\n\n");
  REQUIRE_MESSAGE(d.has_value(), d.error());
  CHECK(*d == two_device_segment());
}

TEST_CASE("optional segment fields have Mooncake's defaults") {
  auto d = decode_segment(R"({"name":"n","protocol":"rdma","devices":[],"buffers":[],"priority_matrix":{}})");
  REQUIRE_MESSAGE(d.has_value(), d.error());
  CHECK(d->timestamp.empty());
  CHECK(d->tcp_data_port == 0);
  CHECK(d->tcp_proto_version == 1);
  // A non-RDMA segment needs no devices, keys or matrix.
  auto t = decode_segment(R"({"name":"n","protocol":"tcp","buffers":[{"name":"cpu:0","addr":4096,"length":10}]})");
  REQUIRE_MESSAGE(t.has_value(), t.error());
  CHECK(t->buffers[0].rkey.empty());
}

TEST_CASE("every malformed segment is rejected with the field named") {
  SUBCASE("not JSON") { check_malformed(decode_segment("{\"name\": "), "json"); }
  SUBCASE("empty input") { check_malformed(decode_segment(""), "json"); }
  SUBCASE("not an object") { check_malformed(decode_segment("[1,2]"), "json: expected an object"); }
  SUBCASE("null") { check_malformed(decode_segment("null\n"), "json: expected an object"); }
  SUBCASE("nested too deep") {
    check_malformed(decode_segment(std::string(5000, '[') + std::string(5000, ']')), "nested deeper");
  }
  SUBCASE("name missing") { check_malformed(decode_segment(segment_with("\"name\":\"10.", "\"nome\":\"10.")), "name: missing"); }
  SUBCASE("name wrong type") {
    check_malformed(decode_segment(segment_with("\"name\":\"10.47.0.1:15001\"", "\"name\":5")), "name: expected a string");
  }
  SUBCASE("name empty") {
    check_malformed(decode_segment(segment_with("\"name\":\"10.47.0.1:15001\"", "\"name\":\"\"")), "name: must not be empty");
  }
  SUBCASE("protocol missing") { check_malformed(decode_segment(segment_with("\"protocol\"", "\"protocolx\"")), "protocol: missing"); }
  SUBCASE("devices missing") { check_malformed(decode_segment(segment_with("\"devices\"", "\"devicez\"")), "devices: missing"); }
  SUBCASE("devices not an array") {
    check_malformed(decode_segment(segment_with("\"devices\":[", "\"devices\":{\"a\":1},\"x\":[")), "devices: expected an array");
  }
  SUBCASE("device not an object") {
    check_malformed(decode_segment(segment_with("\"devices\":[", "\"devices\":[7,")), "devices[0]: expected an object");
  }
  SUBCASE("negative lid") { check_malformed(decode_segment(segment_with("\"lid\":7", "\"lid\":-7")), "devices[1].lid: must not be negative"); }
  SUBCASE("lid out of range") { check_malformed(decode_segment(segment_with("\"lid\":7", "\"lid\":65536")), "devices[1].lid: 65536 is out of range"); }
  SUBCASE("lid as float") { check_malformed(decode_segment(segment_with("\"lid\":7", "\"lid\":7.5")), "devices[1].lid: expected an unsigned integer"); }
  SUBCASE("lid as string") { check_malformed(decode_segment(segment_with("\"lid\":7", "\"lid\":\"7\"")), "devices[1].lid: expected an unsigned integer"); }
  SUBCASE("device name empty") { check_malformed(decode_segment(segment_with("\"name\":\"rxe1\"", "\"name\":\"\"")), "devices[1].name: must not be empty"); }
  SUBCASE("duplicate device") { check_malformed(decode_segment(segment_with("\"name\":\"rxe1\"", "\"name\":\"rxe0\"")), "devices[1].name"); }
  SUBCASE("gid in compressed IPv6 form") {
    check_malformed(decode_segment(segment_with("fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02", "fe80::250:56ff:fe3f:2")), "devices[1].gid");
  }
  SUBCASE("gid with 15 bytes") {
    check_malformed(decode_segment(segment_with("fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02", "fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00")), "devices[1].gid");
  }
  SUBCASE("gid with 17 bytes") {
    check_malformed(decode_segment(segment_with("fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02", "fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02:01")), "devices[1].gid");
  }
  SUBCASE("gid empty") {
    check_malformed(decode_segment(segment_with("\"fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02\"", "\"\"")), "devices[1].gid");
  }
  SUBCASE("buffers missing") { check_malformed(decode_segment(segment_with("\"buffers\"", "\"buffs\"")), "buffers: missing"); }
  SUBCASE("addr as string") {
    check_malformed(decode_segment(segment_with("\"addr\":139637976727552", "\"addr\":\"139637976727552\"")), "buffers[0].addr: expected an unsigned integer");
  }
  SUBCASE("addr negative") { check_malformed(decode_segment(segment_with("\"addr\":139637976727552", "\"addr\":-4096")), "buffers[0].addr: must not be negative"); }
  SUBCASE("addr above 2^64") {
    check_malformed(decode_segment(segment_with("\"addr\":139637976727552", "\"addr\":18446744073709551616")), "buffers[0].addr");
  }
  SUBCASE("addr 0") { check_malformed(decode_segment(segment_with("\"addr\":139637976727552", "\"addr\":0")), "buffers[0].addr: must not be 0"); }
  SUBCASE("zero-length buffer") { check_malformed(decode_segment(segment_with("\"length\":4096", "\"length\":0")), "buffers[1].length: must not be 0"); }
  SUBCASE("length missing") { check_malformed(decode_segment(segment_with("\"length\":4096", "\"len\":4096")), "buffers[1].length: missing"); }
  SUBCASE("buffer wraps past 2^64") {
    check_malformed(decode_segment(segment_with("\"addr\":139637978824704", "\"addr\":18446744073709550000")), "buffers[1]: addr");
  }
  SUBCASE("buffer name empty") { check_malformed(decode_segment(segment_with("\"name\":\"cpu:1\"", "\"name\":\"\"")), "buffers[1].name: must not be empty"); }
  SUBCASE("rkey count != device count") {
    check_malformed(decode_segment(segment_with("\"rkey\":[23,24]", "\"rkey\":[23]")), "buffers[1].rkey: expected 2 keys (one per device), got 1");
  }
  SUBCASE("lkey count != device count") {
    check_malformed(decode_segment(segment_with("\"lkey\":[13,14]", "\"lkey\":[13,14,15]")), "buffers[1].lkey: expected 2 keys (one per device), got 3");
  }
  SUBCASE("rkey above u32") { check_malformed(decode_segment(segment_with("\"rkey\":[23,24]", "\"rkey\":[23,4294967296]")), "buffers[1].rkey[1]"); }
  SUBCASE("rkey not an array") { check_malformed(decode_segment(segment_with("\"rkey\":[23,24]", "\"rkey\":23")), "buffers[1].rkey"); }
  SUBCASE("overlapping buffers") {
    check_malformed(decode_segment(segment_with("\"addr\":139637978824704", "\"addr\":139637977000000")), "buffers[1]: overlaps buffers[0]");
  }
  SUBCASE("priority_matrix missing") { check_malformed(decode_segment(segment_with("\"priority_matrix\"", "\"priority\"")), "priority_matrix: missing"); }
  SUBCASE("priority_matrix row of 3") {
    check_malformed(decode_segment(segment_with("[[\"rxe0\"],[\"rxe1\"]]", "[[\"rxe0\"],[\"rxe1\"],[]]")), "priority_matrix[\"cpu:0\"]");
  }
  SUBCASE("priority_matrix NIC not a string") {
    check_malformed(decode_segment(segment_with("[[\"rxe0\"],[\"rxe1\"]]", "[[\"rxe0\"],[1]]")), "priority_matrix[\"cpu:0\"][1][0]");
  }
  SUBCASE("timestamp wrong type") {
    check_malformed(decode_segment(segment_with("\"timestamp\":\"2026-11-29 10:00:00.000001\"", "\"timestamp\":1")), "timestamp: expected a string");
  }
  SUBCASE("tcp_data_port out of range") { check_malformed(decode_segment(segment_with("\"tcp_data_port\":0", "\"tcp_data_port\":70000")), "tcp_data_port"); }
  SUBCASE("rdma_server_name wrong type") {
    check_malformed(decode_segment(segment_with("\"rdma_server_name\":\"10.47.0.1:15001\"", "\"rdma_server_name\":[]")), "rdma_server_name");
  }
}

TEST_CASE("validate_segment applies the same rules to a built descriptor") {
  segment_desc d = two_device_segment();
  CHECK(validate_segment(d).has_value());
  d.buffers[1].addr = d.buffers[0].addr + d.buffers[0].length - 1;  // one byte of overlap
  auto r = validate_segment(d);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_malformed);
  CHECK(r.error().detail.find("overlaps") != std::string::npos);
  d.buffers[1].addr = d.buffers[0].addr + d.buffers[0].length;  // adjacent is fine
  CHECK(validate_segment(d).has_value());
  d.buffers[0].rkey.pop_back();
  CHECK(validate_segment(d).error().detail.find("buffers[0].rkey") != std::string::npos);
}

TEST_CASE("GIDs parse in Mooncake's form only and format as 47 lowercase characters") {
  auto g = parse_gid("FE:80:0:0:00:00:00:00:02:50:56:ff:fe:3f:00:2");
  REQUIRE(g.has_value());
  CHECK(format_gid(*g) == "fe:80:00:00:00:00:00:00:02:50:56:ff:fe:3f:00:02");
  CHECK(format_gid(*g).size() == 47);
  for (const char* bad : {"", ":", "fe80::1", "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:",
                          "000:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01", "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:0g",
                          " 00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01"}) {
    auto r = parse_gid(bad);
    CHECK_MESSAGE(!r.has_value(), bad);
    if (!r) CHECK(r.error().code == errc::metadata_malformed);
  }
}

TEST_CASE("a Mooncake handshake decodes and re-encodes byte for byte") {
  auto h = decode_handshake(kMooncakeHandshake);
  REQUIRE_MESSAGE(h.has_value(), h.error());
  CHECK(h->local_nic_path == "10.0.0.1:15321@mlx5_0");
  CHECK(h->peer_nic_path == "10.0.0.2:16002@mlx5_0");
  CHECK(h->qp_num == std::vector<std::uint32_t>{1234, 1235});
  REQUIRE(h->ready_ack.has_value());
  CHECK_FALSE(*h->ready_ack);
  CHECK_FALSE(h->mtu.has_value());
  CHECK(encode_handshake(*h) == kMooncakeHandshake);
}

TEST_CASE("handshake: ready_ack presence, empty GID and the mtu extension survive a round trip") {
  handshake_desc d;
  d.local_nic_path = "a:1@rxe0";
  d.peer_nic_path = "b:2@rxe1";
  d.qp_num = {17, 18};
  auto legacy = decode_handshake(encode_handshake(d));
  REQUIRE(legacy.has_value());
  CHECK_FALSE(legacy->ready_ack.has_value());  // a legacy peer: no key at all
  CHECK(encode_handshake(d).find("ready_ack") == std::string::npos);
  CHECK(encode_handshake(d).find("\"local_gid\":\"\"") != std::string::npos);
  CHECK(*legacy == d);

  d.ready_ack = true;
  d.mtu = 1024;
  d.local_gid = *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01");
  d.reply_msg = "QP count mismatch";
  auto full = decode_handshake(encode_handshake(d));
  REQUIRE(full.has_value());
  CHECK(*full == d);

  // The reply to a ready ack: an empty desc, no ready_ack key.
  auto ack_reply = decode_handshake(R"({"local_gid":"","local_lid":0,"local_nic_path":"","payload":"","peer_nic_path":"","qp_num":[],"reply_msg":""})");
  REQUIRE(ack_reply.has_value());
  CHECK(ack_reply->qp_num.empty());
  CHECK_FALSE(ack_reply->local_gid.has_value());
}

TEST_CASE("malformed handshakes are rejected with the field named") {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kMooncakeHandshake;
    const auto pos = s.find(from);
    REQUIRE(pos != std::string::npos);
    s.replace(pos, from.size(), to);
    return decode_handshake(s);
  };
  auto check = [](const result<handshake_desc>& r, const std::string& field) {
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::metadata_malformed);
    CHECK_MESSAGE(r.error().detail.find(field) != std::string::npos, r.error().detail);
  };
  check(with("\"qp_num\":[1234,1235],", ""), "qp_num: missing");
  check(with("[1234,1235]", "[1234,-1]"), "qp_num[1]: must not be negative");
  check(with("[1234,1235]", "\"1234\""), "qp_num");
  check(with("\"local_lid\":0", "\"local_lid\":\"0\""), "local_lid");
  check(with("\"local_lid\":0", "\"local_lid\":-1"), "local_lid");
  check(with("\"local_nic_path\":\"10.0.0.1:15321@mlx5_0\",", ""), "local_nic_path: missing");
  check(with("\"peer_nic_path\":\"10.0.0.2:16002@mlx5_0\"", "\"peer_nic_path\":null"), "peer_nic_path");
  check(with("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01", "::1"), "local_gid");
  check(with("\"ready_ack\":false", "\"ready_ack\":0"), "ready_ack: expected a boolean");
  check(with("\"ready_ack\":false", "\"ready_ack\":false,\"mtu\":1000"), "mtu");
  check(with("\"reply_msg\":\"\"", "\"reply_msg\":1"), "reply_msg");
  check(decode_handshake("{\"local_nic_path\""), "json");
}

TEST_CASE("notify messages round-trip and reject missing or mistyped fields") {
  const notify_desc n{"10.0.0.1:15321", "batch 7 done"};
  auto back = decode_notify(encode_notify(n));
  REQUIRE(back.has_value());
  CHECK(*back == n);
  CHECK(encode_notify({"", "success"}) == "{\"name\":\"\",\"notify_msg\":\"success\"}\n");
  CHECK(decode_notify(R"({"name":"x"})").error().detail.find("notify_msg: missing") != std::string::npos);
  CHECK(decode_notify(R"({"name":1,"notify_msg":"m"})").error().detail.find("name: expected a string") != std::string::npos);
  CHECK(decode_notify("nope").error().code == errc::metadata_malformed);
}

TEST_CASE("invalid UTF-8 in a name is encoded, not thrown") {
  notify_desc n{"bad\xff\xfename", "m"};
  const std::string text = encode_notify(n);
  auto back = decode_notify(text);
  REQUIRE(back.has_value());
  CHECK(back->name.find("bad") == 0);
}

TEST_CASE("validate_json checks syntax and depth only") {
  CHECK(validate_json("{}\n").has_value());
  CHECK(validate_json(" [1, \"]]]]\"] ").has_value());
  CHECK_FALSE(validate_json("{").has_value());
  CHECK_FALSE(validate_json("{} {}").has_value());
  CHECK_FALSE(validate_json(std::string(100, '[') + std::string(100, ']')).has_value());
}

TEST_CASE("find_buffer_index tests whole ranges, including the last byte") {
  const segment_desc d = two_device_segment();
  const std::uint64_t base = d.buffers[0].addr;
  CHECK(find_buffer_index(d, base, 1) == 0u);
  CHECK(find_buffer_index(d, base + (1 << 20) - 8, 8) == 0u);
  CHECK_FALSE(find_buffer_index(d, base + (1 << 20) - 8, 9).has_value());
  CHECK_FALSE(find_buffer_index(d, base - 1, 2).has_value());
  CHECK_FALSE(find_buffer_index(d, base, 0).has_value());
  CHECK(find_buffer_index(d, d.buffers[1].addr + 4095, 1) == 1u);
  CHECK_FALSE(find_buffer_index(d, d.buffers[1].addr + 4096, 1).has_value());
  CHECK_FALSE(find_buffer_index(d, UINT64_MAX, UINT64_MAX).has_value());
}

TEST_CASE("segment keys follow Mooncake's scheme") {
  CHECK(segment_key("", "10.0.0.2:16002") == "mooncake/ram/10.0.0.2:16002");
  CHECK(segment_key("prod", "n") == "mooncake/prod/ram/n");
  CHECK(segment_key("prod/", "n") == "mooncake/prod/ram/n");
  CHECK(segment_key("", "rpc_meta/n") == "mooncake/rpc_meta/n");
}

TEST_CASE("rpc_meta keys and values follow Mooncake's scheme") {
  CHECK(rpc_meta_key("", "10.0.0.2:16002") == "mooncake/rpc_meta/10.0.0.2:16002");
  CHECK(rpc_meta_key("prod", "n") == "mooncake/prod/rpc_meta/n");
  CHECK(rpc_meta_key("prod/", "n") == "mooncake/prod/rpc_meta/n");
  CHECK(encode_rpc_meta("10.0.0.2", 16002) == R"({"ip_or_host_name":"10.0.0.2","rpc_port":16002})");
  CHECK(encode_rpc_meta("fe80::1", 0) == R"({"ip_or_host_name":"fe80::1","rpc_port":0})");
}

TEST_CASE("current_timestamp has Mooncake's shape") {
  const std::string t = current_timestamp();
  REQUIRE(t.size() == 26);
  CHECK(t[4] == '-');
  CHECK(t[10] == ' ');
  CHECK(t[19] == '.');
}

TEST_CASE("handshake: tide's psn extension round-trips; out of range or miscounted PSNs are refused") {
  handshake_desc d;
  d.local_nic_path = "10.0.0.1:15000@rxe0";
  d.peer_nic_path = "10.0.0.2:15000@rxe1";
  d.local_gid = gid_bytes{};
  d.local_gid->raw[15] = 1;
  d.qp_num = {17, 18};
  d.psn = std::vector<std::uint32_t>{0x123456, 0xffffff};
  auto back = decode_handshake(encode_handshake(d));
  REQUIRE(back);
  CHECK(*back == d);
  d.psn.reset();
  CHECK(encode_handshake(d).find("psn") == std::string::npos);  // a Mooncake peer sees nothing new
  auto big = decode_handshake(R"({"local_nic_path":"a@x","peer_nic_path":"b@y","local_lid":0,"local_gid":"",)"
                              R"("qp_num":[1],"psn":[16777216]})");
  REQUIRE_FALSE(big);
  CHECK(big.error().code == errc::metadata_malformed);
  CHECK(big.error().detail.find("psn") != std::string::npos);
  auto count = decode_handshake(R"({"local_nic_path":"a@x","peer_nic_path":"b@y","local_lid":0,"local_gid":"",)"
                                R"("qp_num":[1,2],"psn":[5]})");
  REQUIRE_FALSE(count);
  CHECK(count.error().detail.find("psn") != std::string::npos);
}

TEST_CASE("notify: tide's id extension round-trips; without it the bytes are Mooncake's; a bad one is refused") {
  const notify_desc with{"node:1", "kv 7", notify_id{0xfedcba9876543210ull, 42}};
  auto back = decode_notify(encode_notify(with));
  REQUIRE(back);
  CHECK(*back == with);
  const notify_desc without{"node:1", "kv 7"};
  CHECK(encode_notify(without) == "{\"name\":\"node:1\",\"notify_msg\":\"kv 7\"}\n");
  CHECK_FALSE(decode_notify(encode_notify(without))->id.has_value());
  CHECK(decode_notify(R"({"name":"a","notify_msg":"m","tide_id":7})").error().detail.find("tide_id: expected an object") !=
        std::string::npos);
  CHECK(decode_notify(R"({"name":"a","notify_msg":"m","tide_id":{"origin":1}})").error().detail.find("tide_id.seq: missing") !=
        std::string::npos);
  CHECK(decode_notify(R"({"name":"a","notify_msg":"m","tide_id":{"origin":-1,"seq":1}})").error().detail.find(
            "tide_id.origin") != std::string::npos);
}

TEST_CASE("handshake: tide's notify_credits extension round-trips; without it the bytes are as before") {
  handshake_desc d;
  d.local_nic_path = "10.0.0.1:15000@rxe0";
  d.peer_nic_path = "10.0.0.2:15000@rxe1";
  d.local_gid = gid_bytes{};
  d.local_gid->raw[15] = 1;
  d.qp_num = {17, 18};
  const std::string before = encode_handshake(d);
  CHECK(before.find("notify_credits") == std::string::npos);  // a desc without it: Mooncake's bytes
  d.notify_credits = 8;
  const std::string with = encode_handshake(d);
  CHECK(with.find("\"notify_credits\":8") != std::string::npos);
  auto back = decode_handshake(with);
  REQUIRE(back);
  CHECK(*back == d);
  d.notify_credits.reset();
  CHECK(encode_handshake(d) == before);
  auto plain = decode_handshake(before);
  REQUIRE(plain);
  CHECK_FALSE(plain->notify_credits.has_value());
  for (const char* bad : {"0", "65", "-1", "\"8\"", "true"}) {
    auto r = decode_handshake(std::string(R"({"local_nic_path":"a@x","peer_nic_path":"b@y","local_lid":0,"local_gid":"",)") +
                              R"("qp_num":[1],"notify_credits":)" + bad + "}");
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::metadata_malformed);
    CHECK(r.error().detail.find("notify_credits") != std::string::npos);
  }
}
