// What registering memory costs: N buffers (1 GiB in total) registered one
// at a time through the engine (each call publishes the descriptor) and in
// one register_memory_batch, beside ibv_reg_mr of the same buffers alone,
// without and with the cluster secret; and what the first peer to open the
// segment then waits for (with p2p metadata the descriptor is encoded when a
// peer asks, so that is where the N buffers' encode now goes).
// DEVICE "tcp" runs the engines on TCP alone (no ibv_reg_mr column): the
// engine's own bookkeeping, on a host without RDMA.
// --metadata CONNECTION puts the descriptors in a store: "etcd://host:port"
// (policy::etcd) or "http://host:port/path" (policy::http); by default
// p2p.  With a store every registration returns once the store holds a
// descriptor with its buffer, so one caller pays one PUT of the whole
// descriptor per registration; --threads T registers from T threads at once
// (thread k takes buffers k, k+T, ...), which share PUTs (group commit).
// The "puts" column counts the descriptor encodes (with a store: one per PUT)
// of the one-by-one registrations.  --publish-delay MS sets publish_delay:
// registrations return before the store has them, one write per window; the
// times then include a flush_metadata() after the last call, so they end when
// the store holds every buffer, as without a delay.
//   tide-registration DEVICE|tcp [--counts 1,100,10000] [--total-mib 1024] [--secret FILE]
//                    [--metadata CONNECTION] [--threads T] [--publish-delay MS]
#include <tide/engine.hpp>
#include <tide/policy/etcd.hpp>
#include <tide/policy/http.hpp>

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// ibv_reg_mr of every piece on `device`, then ibv_dereg_mr; the registration time in ms.
double verbs_only(const std::string& device, char* base, std::size_t piece, std::size_t count) {
  if (device == "tcp") return 0;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && ctx == nullptr; ++i)
    if (device == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  if (ctx == nullptr) return -1;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  std::vector<ibv_mr*> mrs;
  mrs.reserve(count);
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < count; ++i) {
    ibv_mr* mr = ibv_reg_mr(pd, base + i * piece, piece,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr) break;
    mrs.push_back(mr);
  }
  const double took = mrs.size() == count ? ms_since(t0) : -1;
  for (ibv_mr* mr : mrs) ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return took;
}

struct engine_times {
  double reg_ms = -1;    ///< one register_memory per buffer
  double open_ms = -1;   ///< then a peer's first open_segment
  double batch_ms = -1;  ///< one register_memory_batch of them all
  std::uint64_t puts = 0;  ///< descriptor encodes of the one-by-one registrations
};

struct etcd_policies : tide::default_policies {
  using metadata = tide::policy::etcd;
};
struct http_policies : tide::default_policies {
  using metadata = tide::policy::http;
};

struct run_options {
  std::string device, secret, metadata;
  std::size_t threads = 1;
  std::chrono::milliseconds publish_delay{0};
};

tide::engine_config config_for(const run_options& o, const std::string& secret) {
  tide::engine_config cfg;
  cfg.local_server_name = "127.0.0.1";
  if (o.device == "tcp")
    cfg.transports = "tcp";
  else
    cfg.devices = {o.device};
  cfg.auth_secret_file = secret;
  cfg.metadata = o.metadata;
  cfg.publish_delay = o.publish_delay;
  // A descriptor of 10,000 buffers is megabytes per PUT: give the store time.
  if (!o.metadata.empty()) cfg.metadata_timeout = std::chrono::seconds(60);
  return cfg;
}

template <class P>
engine_times through_engine(const run_options& o, const std::string& secret, char* base, std::size_t piece,
                            std::size_t count) {
  auto e = tide::transfer_engine<P>::create(config_for(o, secret));
  auto peer = tide::transfer_engine<P>::create(config_for(o, secret));
  if (!e || !peer) {
    std::fprintf(stderr, "create: %s\n", (!e ? e.error() : peer.error()).message().c_str());
    return {};
  }
  engine_times t;
  const std::uint64_t encodes0 = (*e)->descriptor_encodes();
  std::atomic<bool> failed{false};
  auto t0 = clock_type::now();
  auto one_by_one = [&](std::size_t first) {
    for (std::size_t i = first; i < count && !failed.load(std::memory_order_relaxed); i += o.threads) {
      if (auto r = (*e)->register_memory(base + i * piece, piece, "cpu:0"); !r) {
        std::fprintf(stderr, "register %zu: %s\n", i, r.error().message().c_str());
        failed = true;
      }
    }
  };
  if (o.threads <= 1) {
    one_by_one(0);
  } else {
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < o.threads; ++k) threads.emplace_back(one_by_one, k);
    for (auto& th : threads) th.join();
  }
  if (failed) return t;
  if (auto r = (*e)->flush_metadata(); !r) {
    std::fprintf(stderr, "flush_metadata: %s\n", r.error().message().c_str());
    return t;
  }
  t.reg_ms = ms_since(t0);
  t.puts = (*e)->descriptor_encodes() - encodes0;
  t0 = clock_type::now();
  auto seg = (*peer)->open_segment((*e)->segment_name());
  if (!seg) {
    std::fprintf(stderr, "open_segment: %s\n", seg.error().message().c_str());
    return t;
  }
  t.open_ms = ms_since(t0);
  if (auto d = (*peer)->segment_descriptor(*seg); !d || (*d)->buffers.size() != count) {
    std::fprintf(stderr, "the peer sees %zu buffers of %zu\n", d ? (*d)->buffers.size() : 0, count);
    return t;
  }
  std::vector<void*> addrs;
  std::vector<tide::buffer_entry> entries;
  for (std::size_t i = 0; i < count; ++i) {
    addrs.push_back(base + i * piece);
    entries.push_back({base + i * piece, piece});
  }
  if (auto r = (*e)->unregister_memory_batch(addrs); !r) {
    std::fprintf(stderr, "unregister_memory_batch: %s\n", r.error().message().c_str());
    return t;
  }
  t0 = clock_type::now();
  if (auto r = (*e)->register_memory_batch(entries, "cpu:0"); !r) {
    std::fprintf(stderr, "register_memory_batch: %s\n", r.error().message().c_str());
    return t;
  }
  if (auto r = (*e)->flush_metadata(); !r) {
    std::fprintf(stderr, "flush_metadata: %s\n", r.error().message().c_str());
    return t;
  }
  t.batch_ms = ms_since(t0);
  return t;
}

}  // namespace

engine_times through_engine(const run_options& o, const std::string& secret, char* base, std::size_t piece,
                            std::size_t count) {
  if (o.metadata.rfind("etcd", 0) == 0) return through_engine<etcd_policies>(o, secret, base, piece, count);
  if (o.metadata.rfind("http", 0) == 0) return through_engine<http_policies>(o, secret, base, piece, count);
  return through_engine<tide::default_policies>(o, secret, base, piece, count);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: tide-registration DEVICE [--counts 1,100,10000] [--total-mib 1024] [--secret FILE] "
                 "[--metadata etcd://HOST:PORT|http://HOST:PORT/PATH] [--threads T] [--publish-delay MS]\n");
    return 2;
  }
  run_options opts;
  opts.device = argv[1];
  const std::string& device = opts.device;
  std::vector<std::size_t> counts{1, 100, 10000};
  std::size_t total = std::size_t{1024} << 20;
  std::string secret;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--counts") {
      counts.clear();
      for (std::size_t at = 0; at < value.size();) {
        const std::size_t comma = value.find(',', at);
        counts.push_back(std::stoul(value.substr(at, comma - at)));
        at = comma == std::string::npos ? value.size() : comma + 1;
      }
    } else if (flag == "--total-mib") {
      total = std::stoul(value) << 20;
    } else if (flag == "--secret") {
      secret = value;
    } else if (flag == "--metadata") {
      if (value.rfind("etcd://", 0) != 0 && value.rfind("http://", 0) != 0)
        return std::fprintf(stderr, "--metadata: etcd://HOST:PORT or http://HOST:PORT/PATH, not %s\n", value.c_str()), 2;
      opts.metadata = value;
    } else if (flag == "--publish-delay") {
      opts.publish_delay = std::chrono::milliseconds(std::stoul(value));
    } else if (flag == "--threads") {
      opts.threads = std::stoul(value);
      if (opts.threads == 0) return std::fprintf(stderr, "--threads must be >= 1\n"), 2;
    } else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  char* base = static_cast<char*>(std::aligned_alloc(4096, total));
  if (base == nullptr) return std::fprintf(stderr, "cannot allocate %zu bytes\n", total), 1;
  std::memset(base, 0, total);  // touched once, so no run pays the first faults
  std::printf("metadata %s, %zu registering thread(s), publish_delay %lld ms\n",
              opts.metadata.empty() ? "p2p" : opts.metadata.c_str(), opts.threads,
              static_cast<long long>(opts.publish_delay.count()));
  std::printf("%-8s %-9s %13s %12s %12s %8s %12s %14s %14s %14s %12s\n", "buffers", "each", "ibv_reg_mr ms", "tide ms",
              "us/buffer", "puts", "batch ms", "first open ms", "+secret ms", "+secret open", "+secret puts");
  int status = 0;
  for (const std::size_t n : counts) {
    const std::size_t piece = total / n / 4096 * 4096;
    if (piece == 0) return std::fprintf(stderr, "%zu buffers do not fit in %zu bytes\n", n, total), 2;
    const double verbs = verbs_only(device, base, piece, n);
    const engine_times plain = through_engine(opts, "", base, piece, n);
    const engine_times sealed = secret.empty() ? engine_times{} : through_engine(opts, secret, base, piece, n);
    if (verbs < 0 || plain.reg_ms < 0 || (!secret.empty() && sealed.reg_ms < 0)) status = 1;
    if (plain.batch_ms < 0 || (!secret.empty() && sealed.batch_ms < 0)) status = 1;
    std::printf("%-8zu %-9s %13.1f %12.1f %12.1f %8llu %12.1f %14.1f %14.1f %14.1f %12llu\n", n,
                (std::to_string(piece >> 10) + " KiB").c_str(), verbs, plain.reg_ms,
                plain.reg_ms * 1000 / static_cast<double>(n), static_cast<unsigned long long>(plain.puts),
                plain.batch_ms, plain.open_ms, sealed.reg_ms, sealed.open_ms,
                static_cast<unsigned long long>(sealed.puts));
    std::fflush(stdout);
  }
  std::free(base);
  return status;
}
