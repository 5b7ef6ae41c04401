#pragma once
/// Prometheus metrics (text exposition format 0.0.4) and the optional HTTP
/// endpoint that serves them.
///
///   std::string text = engine->metrics_text();   // any thread
///   // or engine_config::metrics_port = 9464: GET http://127.0.0.1:9464/metrics
///
/// metrics::format turns a snapshot of the engine's counters into the text;
/// it is a pure function (src/engine/metrics.cpp), so it is unit-tested
/// without an engine.  metrics::http_server (src/engine/metrics_server.cpp)
/// keeps Boost.Beast out of every public header.
///
/// The families (every name has the tide_ prefix; counters end in _total;
/// units are bytes and seconds):
///   tide_nic_bytes_total{nic}                  completed payload bytes initiated here
///   tide_nic_work_requests_total{nic}          WRs dispatched
///   tide_nic_errors_total{nic}                 WRs that failed on the NIC
///   tide_nic_inflight_bytes{nic}, tide_nic_inflight_work_requests{nic}
///   tide_nic_bandwidth_estimate_bytes_per_second{nic}
///   tide_nic_up{nic}                           1 while the NIC's context is active
///   tide_rail_state{local_nic,peer_nic,state}  1 for the rail's current state, 0 for the others:
///                                              healthy, paused, probing, or local_nic_down
///   tide_rail_failures_total, tide_rail_pauses_total{local_nic,peer_nic}
///   tide_rails_omitted                         rails left out past inputs::max_rails
///   tide_tasks_total{state}                    tasks that turned final, by final state
///   tide_tasks_carried_total{transport}        final tasks whose bytes went (partly) over rdma, tcp
///   tide_tcp_requests_total{result}            requests this engine sent over TCP: ok, failed
///   tide_tcp_bytes_total{direction}            TCP payload: written, read (as initiator), served_in, served_out
///   tide_tcp_connections_total{event}          opened, connect_failed, lost (client); accepted,
///                                              refused_source, refused_full, dropped, auth_failed (server)
///   tide_tcp_server_requests_total{result}     peers' requests: served, rejected
///   tide_tcp_server_open_connections
///   tide_task_errors_total{reason}             tasks that did not complete, by errc name
///   tide_transfer_latency_seconds{op,size_class}  histogram, submit to final
///   tide_handshake_server_{connections,requests_served,auth_refused,dropped}_total
///   tide_handshake_client_total{result}        handshakes this engine initiated: ok, failed, auth_failed
///   tide_notify_accepted_total, tide_notify_refused_total{bound}, tide_notify_queued{,_bytes}

#include <tide/detail/notify_inbox.hpp>
#include <tide/net/handshake_server.hpp>
#include <tide/rdma/plan/nic_load.hpp>
#include <tide/tcp/tcp_transport.hpp>
#include <tide/result.hpp>
#include <tide/telemetry.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tide::metrics {

/// Handshakes this engine started (connects to peers' NICs).
struct handshake_client_stats {
  std::uint64_t ok = 0;
  std::uint64_t failed = 0;       ///< every error but auth_failed
  std::uint64_t auth_failed = 0;  ///< the peer refused our proof, or we refused its
};

/// Most rails format() writes by default (4 + 2 series each).
inline constexpr std::size_t kMaxRailSeries = 256;

/// Everything metrics::format reads.
struct inputs {
  rdma::plan::transport_stats transport;  ///< with every rail (stats(true))
  /// The tide_rail_* families list at most this many rails, so a scrape
  /// stays bounded however many peers have come and gone: rails not
  /// healthy first, then those that have failed, then the others, each in
  /// the transport's order; tide_rails_omitted counts the rest.
  std::size_t max_rails = kMaxRailSeries;
  /// Per local NIC (transport.nics' order): 1 while its context is active,
  /// 0 once device or port errors disabled it (a link down).  Missing
  /// entries count as active.
  std::vector<std::uint8_t> nic_active;
  transfer_meter::snapshot tasks;
  net::handshake_server_stats server;
  handshake_client_stats client;
  notify_stats notify;
  /// The TCP transport's counters; absent when it is not installed.
  std::optional<tcp::stats> tcp;
};

/// The text exposition of `in`: HELP and TYPE before every family, label
/// values escaped, histogram buckets cumulative with `le` in seconds.
/// Throws std::bad_alloc only.
[[nodiscard]] std::string format(const inputs& in);

/// A label value escaped as the format wants it: backslash, double quote
/// and line feed become \\, \" and \n.
[[nodiscard]] std::string escape_label_value(std::string_view v);

/// Nanoseconds as seconds, 9 significant digits ("1e-06", "0.25", "10"):
/// exact for every value below 1 s.
[[nodiscard]] std::string seconds_text(std::int64_t ns);

/// A small HTTP/1.1 server for GET /metrics on its own thread.  One
/// connection at a time; a request may be at most 8 KiB and must arrive
/// within 5 s; answers 200 with `text()` and "Content-Type: text/plain;
/// version=0.0.4; charset=utf-8" for GET /metrics, 404 for other paths, 405
/// for other methods.  The destructor stops the thread and joins it.
/// The owner (the engine's impl) destroys it before anything `text` reads.
class http_server {
 public:
  using text_fn = std::function<std::string()>;
  /// Binds `host:port` (port 0: any free one; see port()) and starts the
  /// thread.  Errors: config_invalid (host is no IP address),
  /// already_exists (the port is in use), handshake_failed (other socket errors).
  [[nodiscard]] static result<std::unique_ptr<http_server>> start(const std::string& host, std::uint16_t port,
                                                                  text_fn text);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  [[nodiscard]] std::uint16_t port() const noexcept;

 private:
  struct impl;
  explicit http_server(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace tide::metrics
