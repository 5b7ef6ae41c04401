#pragma once
/// What one tide-bench run measured, and how it is printed.

#include "options.hpp"

#include <tide/telemetry.hpp>

#include <array>

#include <cstdint>
#include <string>
#include <vector>

namespace tide::bench {

/// user + system CPU seconds of this process so far (getrusage).
[[nodiscard]] double process_cpu_seconds() noexcept;

/// What one local NIC moved in the measured window (engine->stats() deltas).
struct nic_figures {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t wrs = 0;
  std::uint64_t errors = 0;
  double bandwidth_bps = 0;  ///< the path policy's estimate at the end (bytes/s)
};

/// A rail that failed at some point, as it stood at the end.
struct rail_figures {
  std::string local;
  std::string peer;
  std::string state;  ///< healthy, paused, probing
  std::uint64_t failures = 0;
  std::uint64_t pauses = 0;
};

/// Where one batch's time went, in microseconds, from the engine's telemetry
/// (issue 36's breakdown): the caller's allocate and submit until the batch
/// was planned; planned until the first WR went to ibv_post_send (the hand-off
/// to a lane); posted until the last task turned final (the wire, the NIC and
/// the lane's poll); final until wait() returned (waking the waiter); and
/// free_batch (with batch_status).
struct batch_phases {
  double submit = 0, to_post = 0, wire_and_poll = 0, wake = 0, free = 0;
};

struct run_figures {
  std::uint64_t bytes = 0;        ///< completed payload bytes
  std::uint64_t requests = 0;     ///< completed requests (blocks)
  std::uint64_t failed_requests = 0;
  double seconds = 0;             ///< wall time of the measured window
  double cpu_seconds = 0;         ///< process CPU time in the window (all threads)
  std::vector<double> batch_latency_us;  ///< one entry per completed batch
  std::vector<batch_phases> phases;      ///< one per completed batch whose telemetry was read
  double open_segment_ms = 0;            ///< open_segment (metadata fetch, and its handshake in p2p mode)
  double first_batch_us = 0;             ///< thread 0's first batch, connection handshakes included
  std::vector<nic_figures> nics;         ///< per local NIC, so spraying and failover show
  std::vector<rail_figures> rails;
  /// Per op (0 read, 1 write), every size class: the requests that turned
  /// final in the window (the engine's telemetry histograms, deltas).
  std::array<latency_histogram::snapshot, 2> transfer_latency{};
};

/// The histograms of `after` minus `before`, summed over size classes, per op.
[[nodiscard]] std::array<latency_histogram::snapshot, 2> latency_delta(const transfer_meter::snapshot& before,
                                                                       const transfer_meter::snapshot& after);

struct summary {
  double throughput = 0;          ///< in options.unit per second
  double requests_per_s = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0;
  batch_phases phases_p50;        ///< each phase's own median (they need not add up to p50_us)
  double cpu_s_per_gb = 0;        ///< CPU seconds per 1e9 bytes moved
};

/// The p-th percentile (0..100) by nearest rank; 0 for an empty set.  Sorts `v`.
[[nodiscard]] double percentile(std::vector<double>& v, double p);
[[nodiscard]] summary summarize(run_figures f, const bench_options& o);

/// One human-readable block: Mooncake's line ("Test completed: duration 10.00, batch count N,
/// throughput 12.34 GB/s", the throughput with --report_precision decimals), then tide's
/// figures (operation, latency, CPU, NICs, rails) on the lines after it.
[[nodiscard]] std::string format_report(const summary& s, const run_figures& f, const bench_options& o);
/// The same as a JSON object (keys: throughput, unit, requests_per_s, p50_us, ...).
[[nodiscard]] std::string format_json(const summary& s, const run_figures& f, const bench_options& o);

}  // namespace tide::bench
