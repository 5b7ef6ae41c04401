// metrics::format: the Prometheus text exposition (format 0.0.4) of an
// engine's counters.  See <tide/metrics.hpp> for the families.
#include <tide/metrics.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

namespace tide::metrics {

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string seconds_text(std::int64_t ns) {
  // %.9g keeps every nanosecond of values below 1 s and 9 significant
  // digits above (a sum of latencies); Prometheus parses any float form.
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(ns) / 1e9);
  return buf;
}

namespace {

// One label: name and (unescaped) value.
struct label {
  std::string_view name;
  std::string_view value;
};

class writer {
 public:
  // HELP and TYPE of a family; a family is written once, its samples follow.
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    // HELP text escapes backslash and line feed (not the quote).
    for (const char c : help) {
      if (c == '\\') out_ += "\\\\";
      else if (c == '\n') out_ += "\\n";
      else out_ += c;
    }
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(std::string_view name, std::initializer_list<label> labels, std::string_view value) {
    out_ += name;
    if (labels.size() != 0) {
      out_ += '{';
      bool first = true;
      for (const auto& l : labels) {
        if (!first) out_ += ',';
        first = false;
        out_ += l.name;
        out_ += "=\"";
        out_ += escape_label_value(l.value);
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void sample(std::string_view name, std::initializer_list<label> labels, std::uint64_t value) {
    sample(name, labels, std::to_string(value));
  }
  void sample_double(std::string_view name, std::initializer_list<label> labels, double value) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    sample(name, labels, std::string_view(buf));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string_view op_name(std::size_t op) { return op == 0 ? "read" : "write"; }

std::string_view state_label(transfer_state s) {
  switch (s) {
    case transfer_state::completed: return "completed";
    case transfer_state::failed: return "failed";
    case transfer_state::timeout: return "timeout";
    case transfer_state::canceled: return "canceled";
    default: return "other";
  }
}

bool active(const inputs& in, std::size_t nic) {
  return nic >= in.nic_active.size() || in.nic_active[nic] != 0;
}

void nics(writer& w, const inputs& in) {
  const rdma::plan::transport_stats& t = in.transport;
  w.family("tide_nic_up", "gauge", "1 while the NIC's context is active; 0 after device or port errors disabled it.");
  for (std::size_t i = 0; i < t.nics.size(); ++i)
    w.sample("tide_nic_up", {{"nic", t.nics[i].name}}, active(in, i) ? std::uint64_t{1} : std::uint64_t{0});
  w.family("tide_nic_bytes_total", "counter", "Payload bytes of completed work requests initiated on this NIC.");
  for (const auto& n : t.nics) w.sample("tide_nic_bytes_total", {{"nic", n.name}}, n.bytes);
  w.family("tide_nic_work_requests_total", "counter", "Work requests dispatched to this NIC (retries included).");
  for (const auto& n : t.nics) w.sample("tide_nic_work_requests_total", {{"nic", n.name}}, n.wrs);
  w.family("tide_nic_errors_total", "counter", "Work requests that failed on this NIC.");
  for (const auto& n : t.nics) w.sample("tide_nic_errors_total", {{"nic", n.name}}, n.errors);
  w.family("tide_nic_inflight_bytes", "gauge", "Bytes dispatched to this NIC and not yet completed.");
  for (const auto& n : t.nics) w.sample("tide_nic_inflight_bytes", {{"nic", n.name}}, n.inflight_bytes);
  w.family("tide_nic_inflight_work_requests", "gauge", "Work requests dispatched to this NIC and not yet retired.");
  for (const auto& n : t.nics) w.sample("tide_nic_inflight_work_requests", {{"nic", n.name}}, n.inflight_wrs);
  w.family("tide_nic_staged_bytes_total", "counter",
           "Payload bytes copied through this NIC's stage chunks (memory no NIC registers, moved over RDMA).");
  for (const auto& n : t.nics) w.sample("tide_nic_staged_bytes_total", {{"nic", n.name}}, n.staged_bytes);
  w.family("tide_nic_bandwidth_estimate_bytes_per_second", "gauge",
           "The NIC's estimated bandwidth (the port rate until traffic has been measured).");
  for (const auto& n : t.nics)
    w.sample_double("tide_nic_bandwidth_estimate_bytes_per_second", {{"nic", n.name}}, n.bandwidth_bps);
}

void rails(writer& w, const inputs& in) {
  const rdma::plan::transport_stats& t = in.transport;
  if (t.rails.empty()) return;
  // A rail whose local NIC is down carries nothing whatever its own health
  // says (no slice is sent there to fail it): it reads local_nic_down.
  auto nic_down = [&](const std::string& local) {
    for (std::size_t i = 0; i < t.nics.size(); ++i)
      if (t.nics[i].name == local) return !active(in, i);
    return false;
  };
  // At most max_rails of them, the ones worth a look first: a scrape must
  // not grow with every peer NIC ever seen.
  std::vector<const rdma::plan::rail_stats*> shown;
  for (int rank = 0; rank < 3 && shown.size() < in.max_rails; ++rank)
    for (const auto& r : t.rails) {
      const int of = r.state.phase != rdma::plan::rail_phase::healthy ? 0 : r.state.failures != 0 ? 1 : 2;
      if (of == rank && shown.size() < in.max_rails) shown.push_back(&r);
    }
  std::sort(shown.begin(), shown.end());  // back to the transport's order
  w.family("tide_rails_omitted", "gauge",
           "Rails left out of the tide_rail_ families past the cap (healthy rails that never failed go first).");
  w.sample("tide_rails_omitted", {}, static_cast<std::uint64_t>(t.rails.size() - shown.size()));
  constexpr std::array<rdma::plan::rail_phase, 3> phases = {
      rdma::plan::rail_phase::healthy, rdma::plan::rail_phase::paused, rdma::plan::rail_phase::probing};
  w.family("tide_rail_state", "gauge",
           "1 for the current state of the (local NIC, peer NIC) rail: healthy, paused (failed, cooling down), "
           "probing (one probe slice out) or local_nic_down (its local NIC is disabled).");
  for (const auto* rp : shown) {
    const auto& r = *rp;
    const bool down = nic_down(r.local);
    for (const auto p : phases)
      w.sample("tide_rail_state", {{"local_nic", r.local}, {"peer_nic", r.peer}, {"state", to_string(p)}},
               !down && r.state.phase == p ? std::uint64_t{1} : std::uint64_t{0});
    w.sample("tide_rail_state", {{"local_nic", r.local}, {"peer_nic", r.peer}, {"state", "local_nic_down"}},
             down ? std::uint64_t{1} : std::uint64_t{0});
  }
  w.family("tide_rail_failures_total", "counter", "Slice failures reported against the rail.");
  for (const auto* r : shown)
    w.sample("tide_rail_failures_total", {{"local_nic", r->local}, {"peer_nic", r->peer}}, r->state.failures);
  w.family("tide_rail_pauses_total", "counter", "Times the rail was paused after a failure.");
  for (const auto* r : shown)
    w.sample("tide_rail_pauses_total", {{"local_nic", r->local}, {"peer_nic", r->peer}}, r->state.pauses);
}

void tasks(writer& w, const transfer_meter::snapshot& m) {
  w.family("tide_tasks_total", "counter", "Transfer tasks that turned final, by final state.");
  for (std::size_t i = 0; i < m.finals.size(); ++i)
    w.sample("tide_tasks_total", {{"state", state_label(transfer_meter::kFinalStates[i])}}, m.finals[i]);
  w.family("tide_tasks_carried_total", "counter",
           "Final tasks whose bytes went (at least partly) over each transport; a task failed over counts in both.");
  w.sample("tide_tasks_carried_total", {{"transport", "rdma"}}, m.carried[0]);
  w.sample("tide_tasks_carried_total", {{"transport", "tcp"}}, m.carried[1]);

  // Only the reasons that occurred: a family of 100+ zero series would
  // drown the ones that matter.
  bool any = false;
  for (const auto n : m.reasons) any |= n != 0;
  if (any) {
    w.family("tide_task_errors_total", "counter", "Tasks that did not complete, by the error that ended them.");
    for (std::size_t slot = 0; slot < m.reasons.size(); ++slot) {
      if (m.reasons[slot] == 0) continue;
      const auto e = static_cast<errc>(static_cast<int>(slot / 32) * 100 + static_cast<int>(slot % 32));
      w.sample("tide_task_errors_total", {{"reason", to_string(e)}}, m.reasons[slot]);
    }
  }

  w.family("tide_transfer_latency_seconds", "histogram",
           "Time from a task's submit to its final state, by op and size class (le: request bytes).");
  std::array<std::string, latency_histogram::kBoundsNs.size()> le;
  for (std::size_t i = 0; i < le.size(); ++i) le[i] = seconds_text(latency_histogram::kBoundsNs[i]);
  for (std::size_t op = 0; op < 2; ++op)
    for (std::size_t c = 0; c < kSizeClasses; ++c) {
      const auto& h = m.latency[op][c];
      const std::string_view opn = op_name(op), cls = size_class_name(c);
      std::uint64_t cum = 0;
      for (std::size_t i = 0; i < latency_histogram::kBuckets; ++i) {
        cum += h.buckets[i];
        const std::string_view bound = i < le.size() ? std::string_view(le[i]) : std::string_view("+Inf");
        w.sample("tide_transfer_latency_seconds_bucket", {{"op", opn}, {"size_class", cls}, {"le", bound}}, cum);
      }
      w.sample("tide_transfer_latency_seconds_sum", {{"op", opn}, {"size_class", cls}},
               seconds_text(static_cast<std::int64_t>(h.sum_ns)));
      w.sample("tide_transfer_latency_seconds_count", {{"op", opn}, {"size_class", cls}}, cum);
    }
}

void tcp_transport(writer& w, const tcp::stats& t) {
  w.family("tide_tcp_requests_total", "counter", "Requests this engine sent over TCP, by result.");
  w.sample("tide_tcp_requests_total", {{"result", "ok"}}, t.ops_ok);
  w.sample("tide_tcp_requests_total", {{"result", "failed"}}, t.ops_failed);
  w.family("tide_tcp_bytes_total", "counter",
           "TCP payload bytes: written and read by this engine's requests, served_in and served_out for peers'.");
  w.sample("tide_tcp_bytes_total", {{"direction", "written"}}, t.bytes_written);
  w.sample("tide_tcp_bytes_total", {{"direction", "read"}}, t.bytes_read);
  w.sample("tide_tcp_bytes_total", {{"direction", "served_in"}}, t.bytes_served_in);
  w.sample("tide_tcp_bytes_total", {{"direction", "served_out"}}, t.bytes_served_out);
  w.family("tide_tcp_staged_bytes_total", "counter",
           "TCP payload bytes copied through staging buffers (GPU memory, or host memory with stage_host_memory).");
  w.sample("tide_tcp_staged_bytes_total", {}, t.bytes_staged);
  w.family("tide_tcp_connections_total", "counter", "TCP data connections, by event (client and server).");
  w.sample("tide_tcp_connections_total", {{"event", "opened"}}, t.connections_opened);
  w.sample("tide_tcp_connections_total", {{"event", "connect_failed"}}, t.connect_failures);
  w.sample("tide_tcp_connections_total", {{"event", "lost"}}, t.connections_lost);
  w.sample("tide_tcp_connections_total", {{"event", "accepted"}}, t.accepted);
  w.sample("tide_tcp_connections_total", {{"event", "refused_source"}}, t.refused_source);
  w.sample("tide_tcp_connections_total", {{"event", "refused_full"}}, t.refused_full);
  w.sample("tide_tcp_connections_total", {{"event", "dropped"}}, t.dropped);
  w.sample("tide_tcp_connections_total", {{"event", "auth_failed"}}, t.auth_failed);
  w.family("tide_tcp_server_requests_total", "counter", "Peers' requests on the TCP data port, by result.");
  w.sample("tide_tcp_server_requests_total", {{"result", "served"}}, t.requests_served);
  w.sample("tide_tcp_server_requests_total", {{"result", "rejected"}}, t.requests_rejected);
  w.family("tide_tcp_server_open_connections", "gauge", "Connections open on the TCP data port.");
  w.sample("tide_tcp_server_open_connections", {}, t.open_connections);
}

void handshakes(writer& w, const net::handshake_server_stats& s, const handshake_client_stats& c) {
  w.family("tide_handshake_server_connections_total", "counter", "Connections the handshake server accepted.");
  w.sample("tide_handshake_server_connections_total", {}, s.accepted);
  w.family("tide_handshake_server_requests_served_total", "counter",
           "Handshake-port requests answered (connect, metadata, notify, probe).");
  w.sample("tide_handshake_server_requests_served_total", {}, s.served);
  w.family("tide_handshake_server_auth_refused_total", "counter",
           "Handshake-port requests refused by authentication (the cluster secret).");
  w.sample("tide_handshake_server_auth_refused_total", {}, s.auth_failed);
  w.family("tide_handshake_server_dropped_total", "counter",
           "Handshake connections dropped for bad input, timeout or overload (refused sources included).");
  w.sample("tide_handshake_server_dropped_total", {}, s.dropped);
  w.family("tide_handshake_client_total", "counter", "Handshakes this engine initiated, by result.");
  w.sample("tide_handshake_client_total", {{"result", "ok"}}, c.ok);
  w.sample("tide_handshake_client_total", {{"result", "failed"}}, c.failed);
  w.sample("tide_handshake_client_total", {{"result", "auth_failed"}}, c.auth_failed);
}

void notify(writer& w, const notify_stats& n) {
  w.family("tide_notify_accepted_total", "counter", "Notifications accepted into the inbox.");
  w.sample("tide_notify_accepted_total", {}, n.accepted);
  w.family("tide_notify_refused_total", "counter", "Notifications refused, by the inbox bound they hit.");
  w.sample("tide_notify_refused_total", {{"bound", "count"}}, n.dropped_count);
  w.sample("tide_notify_refused_total", {{"bound", "bytes"}}, n.dropped_bytes);
  w.sample("tide_notify_refused_total", {{"bound", "rate"}}, n.dropped_rate);
  w.family("tide_notify_duplicates_total", "counter",
           "Copies of notifications already taken (a SEND also sent over TCP), dropped.");
  w.sample("tide_notify_duplicates_total", {}, n.duplicates);
  w.family("tide_notify_queued", "gauge", "Notifications waiting to be taken.");
  w.sample("tide_notify_queued", {}, static_cast<std::uint64_t>(n.queued));
  w.family("tide_notify_queued_bytes", "gauge", "Bytes of the notifications waiting to be taken.");
  w.sample("tide_notify_queued_bytes", {}, static_cast<std::uint64_t>(n.queued_bytes));
}

}  // namespace

std::string format(const inputs& in) {
  writer w;
  nics(w, in);
  rails(w, in);
  tasks(w, in.tasks);
  handshakes(w, in.server, in.client);
  if (in.tcp) tcp_transport(w, *in.tcp);
  notify(w, in.notify);
  return w.take();
}

}  // namespace tide::metrics
