#include "options.hpp"
#include "report.hpp"

#include <doctest/doctest.h>

#include <vector>

namespace tb = tide::bench;

namespace {
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
      {{"--mode=target", "--protocol=efa"}, "--protocol: rdma or tcp"},
      {{"--mode=target", "--duration=-1"}, "--duration"},
      {{"--mode=target", "--metrics_port=0"}, "--metrics_port must be in 1..65535"},
      {{"--mode=target", "--metrics_port=70000"}, "--metrics_port must be in 1..65535"},
      {{"--mode=initiator"}, "--segment_id is required"},
      {{"--mode=target", "--duration"}, "needs a value"},
      {{"--mode=initiator", "--segment_id=x", "--buffer_size=1M", "--block_size=64K", "--batch_size=32",
        "--threads=2"}, "exceeds --buffer_size"},
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
