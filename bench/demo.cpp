// tide-demo: moves 256 MiB from one RDMA device to another with RDMA WRITE on
// one RC QP pair inside one process, using only tide's verbs layer, checks a
// sample of the bytes and prints MB/s (10^6 bytes per second).
//
//   tide-demo [--from rxe1] [--to rxe0] [--mib 256] [--msg-kib 256] [--depth 8] [--repeat 3]
//
// Without --from/--to: $RXE_VM_DEVICES reversed ("rxe0 rxe1" -> from rxe1 to
// rxe0), else the last and the first device of the host.
#include <tide/verbs/cq.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/error.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>
#include <tide/verbs/qp.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace v = tide::verbs;
using tide::errc;

namespace {

struct options {
  std::string from, to;
  std::size_t mib = 256;
  std::size_t msg_kib = 256;
  int depth = 8;
  int repeat = 3;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tide-demo: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T take(tide::result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message());
  return std::move(*r);
}

void take(tide::status s, const char* what) {
  if (!s) die(std::string(what) + ": " + s.error().message());
}

options parse(int argc, char** argv) {
  options o;
  auto number = [&](int& i) -> long {
    if (i + 1 >= argc) die(std::string(argv[i]) + " needs a value");
    char* end = nullptr;
    const long n = std::strtol(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0' || n <= 0) die(std::string(argv[i - 1]) + ": not a positive number: " + argv[i]);
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--from" && i + 1 < argc) o.from = argv[++i];
    else if (a == "--to" && i + 1 < argc) o.to = argv[++i];
    else if (a == "--mib") o.mib = static_cast<std::size_t>(number(i));
    else if (a == "--msg-kib") o.msg_kib = static_cast<std::size_t>(number(i));
    else if (a == "--depth") o.depth = static_cast<int>(number(i));
    else if (a == "--repeat") o.repeat = static_cast<int>(number(i));
    else die("unknown argument " + std::string(a) +
             " (usage: tide-demo [--from DEV] [--to DEV] [--mib N] [--msg-kib N] [--depth N] [--repeat N])");
  }
  if (o.msg_kib > 1024 || o.msg_kib * 1024 > o.mib << 20) die("--msg-kib must be at most 1024 and at most --mib");
  if (o.depth > 128) die("--depth must be at most 128");
  if (o.from.empty() || o.to.empty()) {
    std::vector<std::string> names;
    if (const char* env = std::getenv("RXE_VM_DEVICES"); env != nullptr) {
      std::istringstream in(env);
      for (std::string n; in >> n;) names.push_back(n);
    }
    if (names.empty()) names = take(v::device_list::get(), "listing devices").names();
    if (names.empty()) die("no RDMA device on this host (run it through tools/rxe-vm)");
    if (o.from.empty()) o.from = names.back();
    if (o.to.empty()) o.to = names.front();
  }
  return o;
}

struct free_deleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};

struct end {
  std::string name;
  std::unique_ptr<std::byte, free_deleter> mem;
  v::context ctx;
  ibv_port_attr port;
  int gid_index;
  v::gid gid;
  v::protection_domain pd;
  v::completion_queue cq;
  v::memory_region mr;
  v::queue_pair qp;
};

std::unique_ptr<end> open_end(const std::string& name, std::size_t bytes) {
  std::unique_ptr<std::byte, free_deleter> mem(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
  if (!mem) die("cannot allocate " + std::to_string(bytes) + " bytes");
  std::memset(mem.get(), 0, bytes);  // touch every page before pinning
  auto ctx = take(v::context::open(name), "open");
  const auto port = take(ctx.query_port(1), "query_port");
  if (port.state != IBV_PORT_ACTIVE) die(name + " port 1 is not ACTIVE");
  const int gid_index = take(v::select_gid_index(name, 1), "select_gid_index");
  const auto gid = take(ctx.query_gid(1, gid_index), "query_gid");
  auto pd = take(v::protection_domain::create(ctx), "alloc pd");
  auto cq = take(v::completion_queue::create(ctx, 256), "create cq");
  auto mr = take(v::memory_region::register_memory(pd, mem.get(), bytes), "register");
  auto qp = take(v::queue_pair::create(pd, cq, cq), "create qp");
  return std::unique_ptr<end>(new end{name, std::move(mem), std::move(ctx), port, gid_index, gid, std::move(pd),
                                      std::move(cq), std::move(mr), std::move(qp)});
}

void connect(end& a, end& b) {
  const ibv_mtu mtu = v::path_mtu(a.port.active_mtu, b.port.active_mtu);
  for (auto [l, p] : {std::pair<end*, end*>{&a, &b}, {&b, &a}}) {
    take(l->qp.to_init(1), "to_init");
    v::remote_qp r;
    r.qp_num = p->qp.qp_num();
    r.dgid = p->gid;
    r.lid = p->port.lid;
    r.path_mtu = mtu;
    r.sgid_index = l->gid_index;
    take(l->qp.to_rtr(r), "to_rtr");
  }
  take(a.qp.to_rts(), "to_rts");
  take(b.qp.to_rts(), "to_rts");
}

std::uint8_t pattern(std::size_t i) noexcept { return static_cast<std::uint8_t>((i * 0x9E3779B1u) >> 24); }

// One pass: WRITEs of `msg` bytes covering the region, `depth` in flight.
double one_pass(end& src, end& dst, std::size_t bytes, std::size_t msg, int depth) {
  const std::size_t count = (bytes + msg - 1) / msg;
  std::size_t posted = 0, done = 0;
  std::array<ibv_wc, 16> wcs{};
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::seconds(600);
  while (done < count) {
    while (posted < count && posted - done < static_cast<std::size_t>(depth)) {
      const std::size_t off = posted * msg;
      const std::size_t len = std::min(msg, bytes - off);
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(src.mem.get() + off), static_cast<std::uint32_t>(len),
                  src.mr.lkey()};
      ibv_send_wr wr{};
      wr.wr_id = posted;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(dst.mr.addr()) + off;
      wr.wr.rdma.rkey = dst.mr.rkey();
      if (const errc e = src.qp.post_send(&wr); e != errc::ok)
        die("post_send: " + std::string(tide::to_string(e)));
      ++posted;
    }
    const int n = src.cq.poll(wcs);
    if (n < 0) die("ibv_poll_cq failed on " + src.name);
    for (int i = 0; i < n; ++i)
      if (wcs[static_cast<std::size_t>(i)].status != IBV_WC_SUCCESS)
        die(v::wc_error(wcs[static_cast<std::size_t>(i)], src.name).message());
    done += static_cast<std::size_t>(n);
    if (n == 0 && std::chrono::steady_clock::now() > deadline) die("no progress for 600 s");
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const std::size_t bytes = o.mib << 20;
  const std::size_t msg = o.msg_kib << 10;
  auto src = open_end(o.from, bytes);
  auto dst = open_end(o.to, bytes);
  connect(*src, *dst);
  for (std::size_t i = 0; i < bytes; ++i) src->mem.get()[i] = std::byte{pattern(i)};
  std::printf("tide-demo: %s -> %s, RDMA WRITE of %zu MiB in %zu KiB messages, %d outstanding, path MTU %d\n",
              o.from.c_str(), o.to.c_str(), o.mib, o.msg_kib, o.depth,
              v::mtu_bytes(v::path_mtu(src->port.active_mtu, dst->port.active_mtu)));
  std::vector<double> rates;
  for (int r = 0; r < o.repeat; ++r) {
    std::memset(dst->mem.get(), 0, bytes);
    const double secs = one_pass(*src, *dst, bytes, msg, o.depth);
    // A sample: one byte per 4 KiB page at a moving position, plus the last message whole.
    std::size_t checked = 0, wrong = 0;
    for (std::size_t i = (r * 997u) % 4096; i < bytes; i += 4096, ++checked)
      wrong += dst->mem.get()[i] != std::byte{pattern(i)};
    for (std::size_t i = bytes - std::min(msg, bytes); i < bytes; ++i, ++checked)
      wrong += dst->mem.get()[i] != std::byte{pattern(i)};
    const double mbps = static_cast<double>(bytes) / secs / 1e6;
    rates.push_back(mbps);
    std::printf("  pass %d: %.3f s, %.1f MB/s, %zu sampled bytes checked, %zu wrong\n", r + 1, secs, mbps, checked,
                wrong);
    if (wrong != 0) die("data check failed");
  }
  std::sort(rates.begin(), rates.end());
  std::printf("tide-demo: %.1f MB/s (median of %d passes, min %.1f, max %.1f)\n", rates[rates.size() / 2], o.repeat,
              rates.front(), rates.back());
  return 0;
}
