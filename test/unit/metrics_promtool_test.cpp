// `promtool check metrics` (Debian's prometheus package) on metrics::format's
// output for counters of every kind, escaped labels and a failed rail
// included.  Exits 77 (meson: skipped) only when promtool is absent
// (override its path with TIDE_PROMTOOL).
#include <tide/metrics.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

int main() {
  using namespace tide;
  const char* env = std::getenv("TIDE_PROMTOOL");
  const std::string promtool = env != nullptr && *env != '\0' ? env : "/usr/bin/promtool";
  if (::access(promtool.c_str(), X_OK) != 0) {
    std::printf("%s not found (Debian's prometheus package): skipped (exit 77)\n", promtool.c_str());
    return 77;
  }
  metrics::inputs in;
  rdma::plan::nic_stats n;
  n.name = "rxe0";
  n.bytes = 1u << 30;
  n.wrs = 16384;
  n.errors = 3;
  n.inflight_bytes = 65536;
  n.inflight_wrs = 1;
  n.bandwidth_bps = 1.1e9;
  in.transport.nics.push_back(n);
  n.name = "odd\"nic\\name\n";
  in.transport.nics.push_back(n);
  rdma::plan::rail_stats r;
  r.local = "rxe0";
  r.peer = "127.0.0.1:15001@rxe1";
  r.state.phase = rdma::plan::rail_phase::probing;
  r.state.failures = 2;
  in.transport.rails.push_back(r);
  transfer_meter m;
  for (int i = 0; i < 1000; ++i)
    m.record(i % 2 ? transfer_op::read : transfer_op::write, std::uint64_t{1} << (i % 24), 1'000 + i * 977,
             i % 97 == 0 ? transfer_state::failed : transfer_state::completed,
             i % 97 == 0 ? errc::transport_retry_exceeded : errc::ok);
  in.tasks = m.read();
  in.server.accepted = 3;
  in.client.ok = 2;
  in.notify.accepted = 1;
  in.tcp = tide::tcp::stats{};
  in.tcp->ops_ok = 3;
  const std::string text = metrics::format(in);

  char path[] = "/tmp/tide-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) {
    std::perror("mkstemp");
    return 1;
  }
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    std::perror("write");
    return 1;
  }
  ::close(fd);
  const std::string cmd = promtool + " check metrics < " + path + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    std::perror("popen");
    return 1;
  }
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int st = ::pclose(p);
  ::unlink(path);
  // promtool prints lint findings and exits non-zero on any of them.
  if (st != 0 || !out.empty()) {
    std::printf("promtool check metrics refused the output (status %d):\n%s\n--- the text ---\n%s", st, out.c_str(),
                text.c_str());
    return 1;
  }
  std::printf("promtool check metrics: ok (%zu bytes)\n", text.size());
  return 0;
}
