#include "options.hpp"
#include "report.hpp"
#include "support/process.hpp"

#include <tide/memory/memory_kind.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <regex>
#include <vector>

namespace tb = tide::bench;

namespace {
// A file with `text`, removed at scope exit.
struct temp_file {
  std::string path;
  explicit temp_file(const std::string& text) {
    char p[] = "/tmp/tide-bench-options-XXXXXX";
    const int fd = ::mkstemp(p);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
    path = p;
  }
  ~temp_file() { ::unlink(path.c_str()); }
};

const std::vector<std::string> kPolicies = {"default", "fifo"};

tide::result<tb::bench_options> parse(std::vector<const char*> args) {
  args.insert(args.begin(), "tide-bench");
  return tb::parse_options(static_cast<int>(args.size()), args.data(), kPolicies);
}
}  // namespace

TEST_CASE("transfer_engine_bench flags parse in both gflags spellings") {
  auto o = parse({"--mode=initiator", "--segment_id", "10.47.0.1:15000", "--operation=write",
                  "--block_size=4K", "--batch_size", "16", "--threads=2", "--buffer_size=64M",
                  "--device_name=rxe0,rxe1", "--report_unit=MiB", "--duration=1.5", "--policy=fifo",
                  "--noprogress", "--metrics_port=9464"});
  REQUIRE(o);
  CHECK(o->metrics_port == 9464);
  CHECK(o->mode == tb::bench_mode::initiator);
  CHECK(o->segment_id == "10.47.0.1:15000");
  CHECK(o->operation == tb::bench_operation::write);
  CHECK(o->block_size == 4096);
  CHECK(o->batch_size == 16);
  CHECK(o->threads == 2);
  CHECK(o->buffer_size == 64u << 20);
  CHECK(o->device_names == std::vector<std::string>{"rxe0", "rxe1"});
  CHECK(o->unit.bytes_per_unit == 1048576.0);
  CHECK(o->duration_s == 1.5);
  CHECK(o->policy == "fifo");
  CHECK_FALSE(o->progress);
}

TEST_CASE("bad flags are rejected with the flag named") {
  struct bad_case {
    std::vector<const char*> args;
    const char* needle;
  };
  const std::vector<bad_case> cases = {
      {{"--mode=server"}, "--mode"},
      {{"--frobnicate=1"}, "unknown flag --frobnicate"},
      {{"--mode=target", "--block_size=12Q"}, "suffix"},
      {{"--mode=target", "--batch_size=0"}, "--batch_size must be > 0"},
      {{"--mode=target", "--threads=abc"}, "--threads"},
      {{"--mode=target", "--report_unit=furlongs"}, "--report_unit"},
      {{"--mode=target", "--policy=nope"}, "no policy set named 'nope'"},
      {{"--mode=target", "--protocol=efa"}, "--protocol: rdma or tcp, not 'efa'"},
      {{"--mode=target", "--backend=tent"}, "--backend=tent: tide has no TENT backend"},
      {{"--mode=target", "--backend=fast"}, "--backend: 'fast' is not classic"},
      {{"--mode=target", "--gpu_id=-1"}, "--gpu_id: '-1' is not a CUDA device number"},
      {{"--mode=target", "--gpu_id=x"}, "--gpu_id: 'x' is not a CUDA device number"},
      {{"--mode=target", "--report_precision=x"}, "--report_precision"},
      {{"--mode=target", "--nic_priority_matrix=/nonexistent/matrix.json"}, "--nic_priority_matrix: cannot read"},
      {{"--mode=target", "--metadata_server=https://h:8080/metadata"}, "plain http only"},
      {{"--mode=target", "--metadata_server=redis://h:6379"}, "tide has no redis metadata backend"},
      {{"--mode=target", "--metadata_server=h:notaport"}, "is not P2PHANDSHAKE"},
      {{"--mode=target", "--flagfile=/nonexistent/flags"}, "--flagfile: cannot read"},
      {{"--mode=target", "--auto_discovery=maybe"}, "--auto_discovery: 'maybe' is not true or false"},
      {{"--mode=target", "--duration=-1"}, "--duration"},
      {{"--mode=target", "--metrics_port=0"}, "--metrics_port must be in 1..65535"},
      {{"--mode=target", "--metrics_port=70000"}, "--metrics_port must be in 1..65535"},
      {{"--mode=initiator"}, "--segment_id is required"},
      {{"--mode=target", "--duration"}, "needs a value"},
      {{"stray"}, "unexpected argument"},
  };
  for (const auto& c : cases) {
    auto o = parse(c.args);
    REQUIRE_FALSE(o);
    CHECK(o.error() == tide::errc::invalid_argument);
    INFO(o.error().detail);
    CHECK(o.error().detail.find(c.needle) != std::string::npos);
  }
}

TEST_CASE("Mooncake's GPU flags: --use_vram, --gpu_id, --init_mem") {
  auto o = parse({"--mode=target", "--use_vram", "--gpu_id=3", "--init_mem=false"});
  REQUIRE(o);
  CHECK(o->use_vram);
  CHECK(o->gpu_id == 3);
  CHECK_FALSE(o->init_mem);
  auto d = parse({"--mode=target"});
  REQUIRE(d);
  CHECK_FALSE(d->use_vram);  // host memory unless asked, as Mooncake's non-CUDA build
  CHECK(d->init_mem);
}

TEST_CASE("tide-bench --use_vram where no CUDA driver loads fails at once, saying why") {
  if (tide::memory::cuda().usable) return;  // tools/gpu-check runs it on a GPU
  const char* bench = std::getenv("TIDE_TEST_BENCH");
  REQUIRE_MESSAGE(bench != nullptr, "meson sets TIDE_TEST_BENCH");
  tide::test::temp_dir dir;
  const std::string log = (dir.path() / "target.log").string();
  tide::test::child_process target({bench, "--mode=target", "--protocol=tcp", "--use_vram", "--buffer_size=1048576"},
                                   log);
  CHECK(target.wait_exit(std::chrono::seconds(60)) == 1);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  INFO(text.str());
  CHECK(text.str().find("--use_vram: cuda:0: " + tide::memory::cuda().why_not) != std::string::npos);
}

TEST_CASE("sizes accept binary suffixes and reject overflow") {
  CHECK(*tb::parse_size("65536") == 65536);
  CHECK(*tb::parse_size("64KiB") == 65536);
  CHECK(*tb::parse_size("1G") == 1ull << 30);
  CHECK_FALSE(tb::parse_size("99999999999999G"));
  CHECK_FALSE(tb::parse_size(""));
}

TEST_CASE("percentiles by nearest rank, and the summary's units") {
  std::vector<double> v;
  for (int i = 1000; i >= 1; --i) v.push_back(i);
  CHECK(tb::percentile(v, 50) == 500);
  CHECK(tb::percentile(v, 99) == 990);
  CHECK(tb::percentile(v, 99.9) == 999);
  std::vector<double> empty;
  CHECK(tb::percentile(empty, 50) == 0);

  tb::bench_options o;
  tb::run_figures f;
  f.bytes = 2'000'000'000;
  f.requests = 1000;
  f.seconds = 2;
  f.cpu_seconds = 1;
  auto s = tb::summarize(f, o);
  CHECK(s.throughput == doctest::Approx(1.0));   // GB/s
  CHECK(s.requests_per_s == doctest::Approx(500));
  CHECK(s.cpu_s_per_gb == doctest::Approx(0.5));
}

TEST_CASE("the report prints per-op transfer latency quantiles from the telemetry histograms") {
  tide::transfer_meter m;
  const auto before = m.read();
  for (int i = 0; i < 1000; ++i) m.record(tide::transfer_op::write, 4096, i < 900 ? 15'000 : 150'000,
                                          tide::transfer_state::completed, tide::errc::ok);
  tb::run_figures f;
  f.transfer_latency = tb::latency_delta(before, m.read());
  CHECK(f.transfer_latency[1].count() == 1000);
  CHECK(f.transfer_latency[0].count() == 0);
  tb::bench_options o;
  const auto text = tb::format_report(tb::summarize(f, o), f, o);
  INFO(text);
  CHECK(text.find("transfer latency write (per request, telemetry): p50 <= 20 us, p90 <= 20 us, p99 <= 200 us, "
                  "p999 <= 200 us (1000 requests") != std::string::npos);
  CHECK(text.find("transfer latency read") == std::string::npos);  // no reads: no line
  CHECK(tb::format_json(tb::summarize(f, o), f, o).find("\"p99_us_le\": 200.0") != std::string::npos);
}

TEST_CASE("the report splits batches into phases, each its own median; no batches read, no line") {
  tb::bench_options o;
  tb::run_figures f;
  CHECK(tb::format_report(tb::summarize(f, o), f, o).find("batch phases") == std::string::npos);
  CHECK(tb::format_json(tb::summarize(f, o), f, o).find("phase_") == std::string::npos);
  // Three batches: every phase's median comes from its own column, not from one batch.
  f.phases = {{1, 30, 40, 0.5, 2}, {3, 10, 45, 0.1, 1}, {2, 20, 50, 0.9, 3}};
  const auto s = tb::summarize(f, o);
  CHECK(s.phases_p50.submit == 2);
  CHECK(s.phases_p50.to_post == 20);
  CHECK(s.phases_p50.wire_and_poll == 45);
  CHECK(s.phases_p50.wake == 0.5);
  CHECK(s.phases_p50.free == 2);
  const auto text = tb::format_report(s, f, o);
  INFO(text);
  CHECK(text.find("batch phases p50 (us, each its own median): submit 2.0, to post 20.0, wire and poll 45.0, "
                  "wake 0.5, free 2.0") != std::string::npos);
  const auto json = tb::format_json(s, f, o);
  CHECK(json.find("\"phase_to_post_us\": 20.0") != std::string::npos);
  CHECK(json.find("\"phase_wire_and_poll_us\": 45.0") != std::string::npos);
}

// Command lines from Mooncake's documentation and scripts, unchanged.
TEST_CASE("Mooncake's transfer_engine_bench command lines parse unchanged") {
  SUBCASE("docs: etcd as a bare host:port, a device") {
    auto o = parse({"--mode=target", "--metadata_server=10.0.0.1:2379", "--local_server_name=10.0.0.2:12345",
                    "--device_name=erdma_0"});
    REQUIRE(o);
    CHECK(o->mode == tb::bench_mode::target);
    CHECK(o->metadata_server == "etcd://10.0.0.1:2379");
    CHECK(o->local_server_name == "10.0.0.2:12345");
    CHECK(o->device_names == std::vector<std::string>{"erdma_0"});
    auto i = parse({"--metadata_server=10.0.0.1:2379", "--segment_id=10.0.0.2:12345",
                    "--local_server_name=10.0.0.3:12346", "--device_name=erdma_1"});
    REQUIRE(i);
    CHECK(i->mode == tb::bench_mode::initiator);  // Mooncake's default mode
  }
  SUBCASE("quick start: --auto_discovery with P2PHANDSHAKE") {
    auto t = parse({"--mode=target", "--auto_discovery", "--metadata_server=P2PHANDSHAKE"});
    REQUIRE(t);
    CHECK(t->auto_discovery);
    auto i = parse({"--mode=initiator", "--auto_discovery", "--metadata_server=P2PHANDSHAKE",
                    "--segment_id=node050:15428"});
    REQUIRE(i);
    CHECK(i->segment_id == "node050:15428");
    // --device_name is not used with --auto_discovery, as in Mooncake, and tide says so.
    auto d = parse({"--mode=target", "--auto_discovery", "--device_name=mlx5_0"});
    REQUIRE(d);
    REQUIRE(d->warnings.size() == 1);
    CHECK(d->warnings[0].find("--device_name is not used with --auto_discovery") != std::string::npos);
  }
  SUBCASE("http metadata, several devices, etcd:// and etcds://, tcp") {
    auto h = parse({"--metadata_server=http://g0021:8080/metadata", "--segment_id=g0021",
                    "--device_name=mlx5_0,mlx5_1,mlx5_3,mlx5_4"});
    REQUIRE(h);
    CHECK(h->metadata_server == "http://g0021:8080/metadata");
    CHECK(h->device_names.size() == 4);
    auto e = parse({"--mode=target", "--metadata_server=etcd://10.0.0.1:2379", "--local_server_name=TARGET_NAME",
                    "--device_name=erdma_0"});
    REQUIRE(e);
    CHECK(e->metadata_server == "etcd://10.0.0.1:2379");
    CHECK(parse({"--mode=target", "--metadata_server=etcds://10.0.0.1:2379"})->metadata_server ==
          "etcds://10.0.0.1:2379");
    CHECK(parse({"--mode=target", "--metadata_server=10.0.0.1:2379,10.0.0.2:2379"})->metadata_server ==
          "etcd://10.0.0.1:2379,10.0.0.2:2379");
    auto t = parse({"--mode=target", "--metadata_server=10.121.4.11:2379", "--local_server_name=10.121.4.11:12345",
                    "--protocol=tcp"});
    REQUIRE(t);
    CHECK(t->protocol == "tcp");
  }
  SUBCASE("the failover script: byte counts, a NIC priority matrix file, --use_vram=false") {
    temp_file matrix(R"({"cpu:0": [["mlx5_0"], ["mlx5_1"]]})");
    const std::string flag = "--nic_priority_matrix=" + matrix.path;
    auto o = parse({"--metadata_server=P2PHANDSHAKE", "--protocol=rdma", "--buffer_size=268435456",
                    "--block_size=4194304", "--batch_size=1", "--threads=1", "--duration=10", "--operation=write",
                    "--use_vram=false", "--mode=target", "--local_server_name=127.0.0.1:31000",
                    "--device_name=mlx5_0,mlx5_1", flag.c_str()});
    REQUIRE(o);
    CHECK(o->nic_priority_matrix == matrix.path);
    CHECK(o->buffer_size == 268435456);
    CHECK(o->block_size == 4194304);
  }
  SUBCASE("--report_precision, --backend=classic, a buffer raised as Mooncake raises it") {
    auto o = parse({"--segment_id=x", "--report_precision=4", "--backend=classic", "--buffer_size=1M",
                    "--block_size=64K", "--batch_size=32", "--threads=2"});
    REQUIRE(o);
    CHECK(o->report_precision == 4);
    CHECK(o->buffer_size == 4u << 20);
    REQUIRE(o->warnings.size() == 1);
    CHECK(o->warnings[0].find("using 4194304, as Mooncake does") != std::string::npos);
  }
  SUBCASE("gflags' own: --flagfile with a program section, --undefok, --tryfromenv, -flag value") {
    temp_file flags("# Mooncake flags\n--mode=target\n--metadata_server=10.0.0.1:2379\n"
                          "some_other_program\n--threads=99\ntransfer_engine_bench\n--threads=3\n");
    const std::string ff = "--flagfile=" + flags.path;
    auto o = parse({ff.c_str(), "--undefok=some_flag,verbose", "--some_flag=1", "--noverbose", "-duration", "2"});
    REQUIRE(o);
    CHECK(o->mode == tb::bench_mode::target);
    CHECK(o->metadata_server == "etcd://10.0.0.1:2379");
    CHECK(o->threads == 3);  // the section for other programs is skipped
    CHECK(o->duration_s == 2);
    ::setenv("FLAGS_batch_size", "7", 1);
    auto e = parse({"--mode=target", "--tryfromenv=batch_size,threads"});
    ::unsetenv("FLAGS_batch_size");
    REQUIRE(e);
    CHECK(e->batch_size == 7);
    CHECK(e->given.count("batch_size") == 1);
    auto missing = parse({"--mode=target", "--fromenv=threads"});
    REQUIRE_FALSE(missing);
    CHECK(missing.error().detail.find("FLAGS_threads is not set") != std::string::npos);
  }
}

TEST_CASE("the result line is Mooncake's, character for character, and tide's lines follow it") {
  tb::bench_options o;
  tb::run_figures f;
  f.seconds = 10.004;
  f.bytes = 2'000'000'000;
  f.batch_latency_us.assign(3, 1.0);
  auto text = tb::format_report(tb::summarize(f, o), f, o);
  const auto first = text.substr(0, text.find('\n'));
  CHECK(first == "Test completed: duration 10.00, batch count 3, throughput 0.20 GB/s");
  // What a parser written for Mooncake's log line reads (its line from Mooncake's docs first).
  const std::regex mooncake(R"(Test completed: duration ([0-9.]+), batch count ([0-9]+), throughput ([0-9.]+) (\S+)/s)");
  std::smatch m;
  const std::string theirs = "I0722 02:00:03.725140 2543054 transfer_engine_bench.cpp:352] Test completed: duration "
                             "10.00, batch count 196316, throughput 164.66 GB/s";
  REQUIRE(std::regex_search(theirs, m, mooncake));
  REQUIRE(std::regex_search(text, m, mooncake));
  CHECK(m[3] == "0.20");
  CHECK(m[4] == "GB");
  o.report_precision = 4;
  o.unit = {"MiB", 1048576.0};
  text = tb::format_report(tb::summarize(f, o), f, o);
  CHECK(text.starts_with("Test completed: duration 10.00, batch count 3, throughput 190.6586 MiB/s\n  operation"));
}

// Mooncake's quick start (--auto_discovery, P2PHANDSHAKE), run: without an RDMA device the
// engine runs on TCP alone, so this needs no device.  The initiator's stderr holds Mooncake's
// result line as a line of its own, first, and tide's figures after it.
TEST_CASE("tide-bench runs Mooncake's quick-start command lines and prints Mooncake's result line") {
  const char* bench = std::getenv("TIDE_TEST_BENCH");
  REQUIRE_MESSAGE(bench != nullptr, "meson sets TIDE_TEST_BENCH");
  tide::test::temp_dir dir;
  const std::string tlog = (dir.path() / "target.log").string(), ilog = (dir.path() / "initiator.log").string();
  tide::test::child_process target({bench, "--mode=target", "--auto_discovery", "--metadata_server=P2PHANDSHAKE",
                                    "--buffer_size=16777216"},
                                   tlog);
  const auto line = target.wait_for_log("segment: ", std::chrono::seconds(60));
  REQUIRE_MESSAGE(line, "the target printed no segment");
  const std::string segment = line->substr(line->find("segment: ") + 9);
  CHECK(target.wait_for_log("Transfer Engine RPC using P2P handshake, listening on " + segment,
                            std::chrono::seconds(10)));
  tide::test::child_process initiator({bench, "--mode=initiator", "--auto_discovery", "--metadata_server=P2PHANDSHAKE",
                                       "--segment_id=" + segment, "--buffer_size=16777216", "--duration=1",
                                       "--threads=2", "--batch_size=8", "--noprogress"},
                                      ilog);
  const int rc = initiator.wait_exit(std::chrono::seconds(100));
  target.terminate();
  std::ifstream in(ilog);
  std::stringstream text;
  text << in.rdbuf();
  INFO(text.str());
  CHECK(rc == 0);
  static const std::regex result(
      R"((^|\n)Test completed: duration [0-9]+\.[0-9]{2}, batch count [0-9]+, throughput [0-9]+\.[0-9]{2} GB/s\n  operation read)");
  CHECK(std::regex_search(text.str(), result));
}
