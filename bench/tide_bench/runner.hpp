#pragma once
/// The benchmark loop, a template over the policy set, as Mooncake's
/// transfer_engine_bench drives its engine: each thread allocates a batch,
/// submits batch_size requests of block_size bytes, waits for the batch,
/// frees it, and again until the duration is up.

#include "options.hpp"
#include "report.hpp"

#include <tide/engine.hpp>
#include <tide/memory/memory_kind.hpp>

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

namespace tide::bench {

/// The benchmark's memory, released on scope exit: page-aligned anonymous
/// host memory, or GPU memory with --use_vram.  Filled unless --init_mem=false.
class bench_buffer {
 public:
  /// Null data() on failure, with `error` saying why.
  explicit bench_buffer(const bench_options& o) : len_(o.buffer_size) {
    if (o.use_vram) {
      auto d = memory::device_allocation::allocate(o.gpu_id, len_);
      if (!d) {
        error = "--use_vram: " + d.error().detail;
        return;
      }
      gpu_ = std::move(*d);
      data_ = static_cast<std::byte*>(gpu_.data());
      if (o.init_mem)
        if (auto r = memory::fill_device(data_, 0x5a, len_); !r) error = "--init_mem: " + r.error().detail;
      if (!error.empty()) data_ = nullptr;
      return;
    }
    void* p = ::mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      error = "cannot allocate " + std::to_string(len_) + " bytes";
      return;
    }
    data_ = static_cast<std::byte*>(p);
    if (o.init_mem)
      for (std::size_t i = 0; i < len_; i += 4096) data_[i] = static_cast<std::byte>(i >> 12);
  }
  bench_buffer(const bench_buffer&) = delete;
  bench_buffer& operator=(const bench_buffer&) = delete;
  ~bench_buffer() {
    if (data_ != nullptr && !gpu_.data()) ::munmap(data_, len_);
  }
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return len_; }
  std::string error;

 private:
  std::byte* data_ = nullptr;
  std::size_t len_ = 0;
  memory::device_allocation gpu_;
};

/// The engine configuration the flags ask for.  A flag given on the command
/// line counts as set by the program (engine_config::set_keys), so it wins
/// over TIDE_CONFIG and the environment; one left at its default does not.
inline engine_config bench_engine_config(const bench_options& o) {
  engine_config cfg;
  auto given = [&](std::string_view flag, const char* key) {
    if (o.given.count(flag) != 0) cfg.set_keys.insert(key);
  };
  cfg.local_server_name = o.local_server_name;
  given("local_server_name", "local_server_name");
  cfg.metadata = o.metadata_server;
  given("metadata_server", "metadata");
  if (!o.auth_secret_file.empty()) cfg.auth_secret_file = o.auth_secret_file;
  if (o.metrics_port != 0) cfg.metrics_port = o.metrics_port;  // 127.0.0.1 (engine_config::metrics_bind)
  if (!o.auto_discovery) {
    // Mooncake's bench installs the one transport --protocol names, on --device_name's devices.
    cfg.devices = o.device_names;
    given("device_name", "devices");
    cfg.transports = o.protocol;
    given("protocol", "transports");
    cfg.custom_topology_file = o.nic_priority_matrix;
    given("nic_priority_matrix", "custom_topology_file");
  }
  return cfg;
}

/// Target: registers a buffer, prints "segment: <name>", serves until SIGINT/SIGTERM.
template <class P>
int run_target(const bench_options& o) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // Blocked before any engine thread starts, so only sigwait below sees them.
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto engine = transfer_engine<P>::create(bench_engine_config(o));
  if (!engine) {
    std::cerr << "tide-bench: engine: " << engine.error().message() << "\n";
    return 1;
  }
  bench_buffer buf(o);
  if (buf.data() == nullptr) {
    std::cerr << "tide-bench: " << buf.error << "\n";
    return 1;
  }
  if (auto r = (*engine)->register_memory(buf.data(), buf.size(), "*"); !r) {
    std::cerr << "tide-bench: register_memory: " << r.error().message() << "\n";
    return 1;
  }
  std::cout << "segment: " << (*engine)->segment_name() << std::endl;
  // Where Mooncake's engine logs its P2P segment: scripts written for transfer_engine_bench read it there.
  if (o.metadata_server == "P2PHANDSHAKE")
    std::cerr << "Transfer Engine RPC using P2P handshake, listening on " << (*engine)->segment_name() << std::endl;
  if (o.metrics_port != 0) std::cout << "metrics: http://127.0.0.1:" << (*engine)->metrics_port() << "/metrics" << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  return 0;
}

/// Initiator: opens the target's segment and drives transfers for the duration.
template <class P>
int run_initiator(const bench_options& o) {
  auto engine_r = transfer_engine<P>::create(bench_engine_config(o));
  if (!engine_r) {
    std::cerr << "tide-bench: engine: " << engine_r.error().message() << "\n";
    return 1;
  }
  auto& engine = **engine_r;
  if (o.metrics_port != 0) std::cerr << "tide-bench: metrics: http://127.0.0.1:" << engine.metrics_port() << "/metrics\n";
  bench_buffer buf(o);
  if (buf.data() == nullptr) {
    std::cerr << "tide-bench: " << buf.error << "\n";
    return 1;
  }
  if (auto r = engine.register_memory(buf.data(), buf.size(), "*"); !r) {
    std::cerr << "tide-bench: register_memory: " << r.error().message() << "\n";
    return 1;
  }
  const auto open_t0 = std::chrono::steady_clock::now();
  auto seg = engine.open_segment(o.segment_id);
  const double open_segment_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - open_t0).count();
  if (!seg) {
    std::cerr << "tide-bench: open_segment " << o.segment_id << ": " << seg.error().message() << "\n";
    return 1;
  }
  auto desc = engine.segment_descriptor(*seg);
  if (!desc || (*desc)->buffers.empty()) {
    std::cerr << "tide-bench: segment " << o.segment_id << " has no registered buffer\n";
    return 1;
  }
  const auto& remote = (*desc)->buffers.front();
  const std::size_t per_thread = static_cast<std::size_t>(o.block_size) * o.batch_size;
  if (per_thread * o.threads > remote.length) {
    std::cerr << "tide-bench: the target's buffer (" << remote.length
              << " B) is smaller than block_size x batch_size x threads\n";
    return 1;
  }

  const auto op = o.operation == bench_operation::read ? transfer_op::read : transfer_op::write;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bytes{0}, requests{0}, failed{0};
  std::atomic<int> fatal{0};
  std::mutex lat_mu;
  std::vector<double> latencies;
  std::vector<batch_phases> phases;

  // One batch: allocate, submit, wait, free.  Returns its latency, all four included (what a
  // synchronous transfer costs its caller, as the Python module's calls do), or nothing after a
  // failure (reported, and `fatal` set).  Where the time went goes to `ph` when given; reading
  // the telemetry is left out of the latency.
  using clock = std::chrono::steady_clock;
  auto us = [](clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  auto one_batch = [&](const std::vector<transfer_request>& reqs,
                       std::optional<batch_phases>* ph = nullptr) -> std::optional<double> {
    const auto t0 = clock::now();
    auto b = engine.allocate_batch(o.batch_size);
    if (!b) {
      std::cerr << "tide-bench: allocate_batch: " << b.error().message() << "\n";
      fatal = 1;
      return std::nullopt;
    }
    if (auto s = engine.submit(*b, reqs); !s) {
      std::cerr << "tide-bench: submit: " << s.error().message() << "\n";
      fatal = 1;
      (void)engine.free_batch(*b);
      return std::nullopt;
    }
    auto w = engine.wait(*b, std::chrono::seconds(60));
    const auto waited = clock::now();
    auto st = engine.batch_status(*b);
    const auto checked = clock::now();
    if (!w || !st || st->state != transfer_state::completed) {
      std::cerr << "tide-bench: batch did not complete: "
                << (!w ? w.error().message()
                       : st ? std::string(to_string(st->state)) + " " + std::string(to_string(st->reason))
                            : st.error().message())
                << "\n";
      failed += o.batch_size;
      (void)engine.cancel(*b);
      (void)engine.wait(*b, std::chrono::seconds(60));
      (void)engine.free_batch(*b);
      fatal = 1;
      return std::nullopt;
    }
    std::optional<transfer_telemetry> tel;
    if (ph != nullptr)
      if (auto t = engine.batch_telemetry(*b)) tel = *t;
    const auto freeing = clock::now();
    if (auto f = engine.free_batch(*b); !f) {
      std::cerr << "tide-bench: free_batch: " << f.error().message() << "\n";
      fatal = 1;
      return std::nullopt;
    }
    const auto end = clock::now();
    if (tel && tel->first_post != clock::time_point{} && tel->completion != clock::time_point{})
      *ph = batch_phases{us(tel->submit - t0), us(tel->first_post - tel->submit), us(tel->completion - tel->first_post),
             us(waited - tel->completion), us(checked - waited) + us(end - freeing)};
    return us(checked - t0) + us(end - freeing);
  };

  double first_batch_us = 0;  // thread 0's, published by warmed_up
  std::atomic<std::uint32_t> warmed_up{0};
  std::atomic<bool> go{false};
  auto worker = [&](std::uint32_t t) {
    std::vector<transfer_request> reqs(o.batch_size);
    for (std::uint32_t i = 0; i < o.batch_size; ++i) {
      const std::size_t off = t * per_thread + static_cast<std::size_t>(i) * o.block_size;
      reqs[i] = transfer_request::at_address(op, buf.data() + off, *seg, remote.addr + off, o.block_size);
    }
    // An untimed first batch: it pays for the lazy connection handshakes, which are not throughput.
    const auto first = one_batch(reqs);
    const bool warm = first.has_value();
    if (warm && t == 0) first_batch_us = *first;
    warmed_up.fetch_add(1);
    while (warm && !go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<double> mine;
    std::vector<batch_phases> my_phases;
    while (warm && !stop.load(std::memory_order_relaxed)) {
      std::optional<batch_phases> ph;
      auto latency = one_batch(reqs, &ph);
      if (!latency) break;
      bytes += per_thread;
      requests += o.batch_size;
      mine.push_back(*latency);
      if (ph) my_phases.push_back(*ph);
    }
    std::lock_guard lock(lat_mu);
    latencies.insert(latencies.end(), mine.begin(), mine.end());
    phases.insert(phases.end(), my_phases.begin(), my_phases.end());
  };

  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < o.threads; ++t) threads.emplace_back(worker, t);
  while (warmed_up.load() < o.threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto nics0 = engine.stats().nics;  // after warm-up: the window's deltas only
  const auto meter0 = engine.transport().meter();
  const double cpu0 = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  go = true;
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(o.duration_s));
  std::uint64_t last_bytes = 0;
  auto last = start;
  while (std::chrono::steady_clock::now() < deadline && fatal.load() == 0) {
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(200), deadline - std::chrono::steady_clock::now()));
    const auto now = std::chrono::steady_clock::now();
    if (o.progress && now - last >= std::chrono::seconds(1)) {
      const auto b = bytes.load();
      std::fprintf(stderr, "\r[tide-bench] %.0f s  %.3f %s/s  ", std::chrono::duration<double>(now - start).count(),
                   static_cast<double>(b - last_bytes) / o.unit.bytes_per_unit /
                       std::chrono::duration<double>(now - last).count(),
                   o.unit.name.c_str());
      last_bytes = b;
      last = now;
    }
  }
  stop = true;
  for (auto& th : threads) th.join();
  if (o.progress) std::fprintf(stderr, "\n");

  run_figures f;
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  f.cpu_seconds = process_cpu_seconds() - cpu0;
  f.bytes = bytes;
  f.requests = requests;
  f.failed_requests = failed;
  f.batch_latency_us = std::move(latencies);
  f.phases = std::move(phases);
  f.open_segment_ms = open_segment_ms;
  f.first_batch_us = first_batch_us;
  f.transfer_latency = latency_delta(meter0, engine.transport().meter());
  const auto end_stats = engine.stats();
  for (std::size_t i = 0; i < end_stats.nics.size(); ++i) {
    const auto& n = end_stats.nics[i];
    const auto* before = i < nics0.size() ? &nics0[i] : nullptr;
    f.nics.push_back({n.name, n.bytes - (before ? before->bytes : 0), n.wrs - (before ? before->wrs : 0),
                      n.errors - (before ? before->errors : 0), n.bandwidth_bps});
  }
  for (const auto& r : end_stats.rails)
    f.rails.push_back({r.local, r.peer, std::string(rdma::plan::to_string(r.state.phase)), r.state.failures, r.state.pauses});
  const auto s = summarize(f, o);
  // On stderr, where Mooncake's bench logs its result line.
  std::cerr << format_report(s, f, o) << std::flush;
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << format_json(s, f, o);
    if (!out) {
      std::cerr << "tide-bench: cannot write " << o.json_path << "\n";
      return 1;
    }
  }
  return fatal.load() == 0 ? 0 : 1;
}

template <class P>
int run(const bench_options& o) {
  return o.mode == bench_mode::target ? run_target<P>(o) : run_initiator<P>(o);
}

}  // namespace tide::bench
