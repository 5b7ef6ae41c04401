// tide._tide.Engine's methods and its pybind11 class (engine.hpp says how
// the binding is shaped).  The methods taking Mooncake's arguments are in
// engine_named.cpp, the plain METH_FASTCALL entry point in fast_call.cpp,
// copies in and out of memory in buffers.cpp.
#include "engine.hpp"

#include "buffers.hpp"
#include "errors.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <thread>

namespace tide::py {
namespace pyb = pybind11;
using namespace std::chrono;

namespace {

in_flight in_flight_of(int mode) {
  if (mode < 0 || mode > static_cast<int>(in_flight::cancel))
    throw pyb::value_error("in_flight mode must be 0 (reject), 1 (drain) or 2 (cancel)");
  return static_cast<in_flight>(mode);
}

std::vector<transfer_request> to_requests(const std::vector<request_tuple>& requests) {
  std::vector<transfer_request> reqs;
  reqs.reserve(requests.size());
  for (const auto& [op, src, seg, buf, off, len] : requests) {
    if (op != 0 && op != 1) throw pyb::value_error("opcode must be 0 (read) or 1 (write), got " + std::to_string(op));
    if (buf < -1 || buf >= static_cast<std::int64_t>(transfer_request::kRawAddress))
      throw pyb::value_error("buffer id out of range: " + std::to_string(buf));
    const auto o = op == 0 ? transfer_op::read : transfer_op::write;
    reqs.push_back(buf < 0 ? transfer_request::at_address(o, as_pointer(src), seg, off, len)
                           : transfer_request::in_buffer(o, as_pointer(src), seg, static_cast<std::uint32_t>(buf),
                                                         off, len));
  }
  return reqs;
}

pyb::dict tcp_stats_dict(const tcp::stats& t, std::uint16_t port) {
  pyb::dict d;
  d["port"] = port;  // 0: TCP is not installed
  d["ops_ok"] = t.ops_ok;
  d["ops_failed"] = t.ops_failed;
  d["bytes_written"] = t.bytes_written;
  d["bytes_read"] = t.bytes_read;
  d["connections_opened"] = t.connections_opened;
  d["connect_failures"] = t.connect_failures;
  d["connections_lost"] = t.connections_lost;
  d["accepted"] = t.accepted;
  d["refused_source"] = t.refused_source;
  d["refused_full"] = t.refused_full;
  d["requests_served"] = t.requests_served;
  d["requests_rejected"] = t.requests_rejected;
  d["auth_failed"] = t.auth_failed;
  d["dropped"] = t.dropped;
  d["bytes_served_in"] = t.bytes_served_in;
  d["bytes_served_out"] = t.bytes_served_out;
  d["bytes_staged"] = t.bytes_staged;
  d["open_connections"] = t.open_connections;
  return d;
}

}  // namespace

pyb::tuple status_tuple(const owned_status& s) {
  return pyb::make_tuple(static_cast<int>(s.state), s.bytes, static_cast<int>(s.reason), s.device, s.path);
}

pyb::tuple outcome_tuple(const batch_outcome& out, std::optional<double> timeout_s) {
  pyb::list t;
  t.append(static_cast<int>(out.status.state));
  t.append(out.status.bytes);
  t.append(static_cast<int>(out.status.reason));
  t.append(out.status.device);
  t.append(out.status.path);
  t.append(out.timed_out);
  t.append(out.leaked);
  if (timeout_s) t.append(*timeout_s);
  return pyb::tuple(t);
}

void raise_failure(batch_outcome& out) {
  if (out.interrupted) throw pyb::error_already_set();
  if (out.failure.code != errc::ok) raise(std::move(out.failure));
  if (out.closed) raise(error{errc::not_initialized, "the engine was closed while the batch ran (canceled)"});
}

py_engine::py_engine(const std::string& config_json, const std::string& policies) {
  const auto& sets = policy_sets();
  auto set = std::find_if(sets.begin(), sets.end(), [&](const policy_set& s) { return s.name == policies; });
  if (set == sets.end()) {
    std::string names;
    for (const auto& s : sets) names += (names.empty() ? "" : ", ") + s.name;
    throw pyb::value_error("unknown policy set '" + policies + "' (built: " + names + ")");
  }
  engine_config cfg;
  unwrap(cfg.apply_json(config_json, "tide.Engine"));
  // The keywords count as set by the program: create() resolves them over
  // TIDE_CONFIG and the environment.  The backend is the one that result
  // names (a copy resolved here; applying the environment onto cfg itself
  // would let it win over the keywords).
  const engine_config resolved = unwrap(cfg.resolve());
  const std::string& metadata = resolved.metadata;
  const metadata_kind kind = metadata_kind_of(metadata);
  engine_factory make = set->factory(kind);
  if (make == nullptr)
    throw pyb::value_error("policy set '" + policies + "' is built with p2p metadata only, not \"" + metadata +
                           "\"");
  auto c = std::make_shared<core>(resolved.transfer_timeout);
  error failure;
  {
    pyb::gil_scoped_release nogil;
    auto e = make(std::move(cfg));
    if (e) c->engine = std::move(*e);
    else failure = std::move(e.error());
  }
  if (!c->engine) raise(std::move(failure));
  core_ = std::move(c);
}

py_engine::~py_engine() {
  if (!core_) return;
  std::shared_ptr<core> c = std::move(core_);
  // pybind11 deallocates with the GIL held; the teardown joins threads.
  pyb::gil_scoped_release nogil;
  c.reset();
}

void py_engine::close(const std::vector<batch_id>& batches) {
  std::shared_ptr<core> c = std::move(core_);
  if (!c) return;
  c->closing.store(true, std::memory_order_release);
  const std::weak_ptr<core> alive = c;
  bool interrupted = false;
  {
    pyb::gil_scoped_release nogil;
    finish_all(*c, batches);
    c.reset();
    // Other threads' calls end within a slice (waits), once canceled and
    // drained (batch runs), or when their own call returns (register, open,
    // notify); the last of them destroys the engine.
    for (int n = 1; !alive.expired(); ++n) {
      std::this_thread::sleep_for(milliseconds(1));
      if (n % 100 == 0 && signal_raised()) {
        interrupted = true;
        break;
      }
    }
  }
  if (interrupted) throw pyb::error_already_set();
}

std::shared_ptr<core> py_engine::live() const {
  if (!core_) raise(error{errc::not_initialized, "the engine is closed"});
  return core_;
}

std::string py_engine::segment_name() {
  return call([](engine_iface& e) { return e.segment_name(); });
}

std::uint16_t py_engine::handshake_port() {
  return call([](engine_iface& e) { return e.handshake_port(); });
}

std::uint16_t py_engine::tcp_port() {
  return call([](engine_iface& e) { return e.tcp_port(); });
}

std::uint32_t py_engine::register_memory(std::uintptr_t addr, std::size_t len, const std::string& location,
                                         int access) {
  if (access < 0 || access > static_cast<int>(buffer_access::remote_read_write))
    throw pyb::value_error("access must be 0 (local_only) .. 3 (remote_read_write), got " + std::to_string(access));
  return unwrap(call([&](engine_iface& e) -> result<std::uint32_t> {
    if (auto r = e.register_memory(as_pointer(addr), len, location, static_cast<buffer_access>(access)); !r)
      return fail(r.error());
    return e.buffer_id(as_pointer(addr));
  }));
}

void py_engine::unregister_memory(std::uintptr_t addr, int mode) {
  const in_flight m = in_flight_of(mode);
  unwrap(call([&](engine_iface& e) { return e.unregister_memory(as_pointer(addr), m); }));
}

std::vector<std::uint32_t> py_engine::register_memory_batch(const std::vector<std::uintptr_t>& addrs,
                                                             const std::vector<std::size_t>& lens,
                                                             const std::string& location,
                                                             const std::vector<int>& access) {
  if (addrs.size() != lens.size())
    throw pyb::value_error("register_memory_batch: " + std::to_string(addrs.size()) + " addresses but " +
                           std::to_string(lens.size()) + " lengths");
  if (!access.empty() && access.size() != addrs.size())
    throw pyb::value_error("register_memory_batch: " + std::to_string(addrs.size()) + " addresses but " +
                           std::to_string(access.size()) + " access values");
  std::vector<buffer_entry> entries(addrs.size());
  for (std::size_t i = 0; i < addrs.size(); ++i) {
    entries[i] = {as_pointer(addrs[i]), lens[i]};
    if (access.empty()) continue;
    if (access[i] < 0 || access[i] > static_cast<int>(buffer_access::remote_read_write))
      throw pyb::value_error("register_memory_batch: access[" + std::to_string(i) +
                             "] must be 0 (local_only) .. 3 (remote_read_write), got " + std::to_string(access[i]));
    entries[i].access = static_cast<buffer_access>(access[i]);
  }
  return unwrap(call([&](engine_iface& e) -> result<std::vector<std::uint32_t>> {
    if (auto r = e.register_memory_batch(entries, location); !r) return fail(r.error());
    std::vector<std::uint32_t> ids;
    ids.reserve(entries.size());
    for (const auto& b : entries) {
      auto id = e.buffer_id(b.addr);
      if (!id) return fail(id.error());  // unregistered meanwhile by another thread
      ids.push_back(*id);
    }
    return ids;
  }));
}

void py_engine::unregister_memory_batch(const std::vector<std::uintptr_t>& addrs) {
  std::vector<void*> ptrs(addrs.size());
  std::transform(addrs.begin(), addrs.end(), ptrs.begin(), as_pointer);
  unwrap(call([&](engine_iface& e) { return e.unregister_memory_batch(ptrs); }));
}

void py_engine::flush_metadata() {
  unwrap(call([](engine_iface& e) { return e.flush_metadata(); }));
}

std::uint32_t py_engine::buffer_id(std::uintptr_t addr) {
  return unwrap(call([&](engine_iface& e) { return e.buffer_id(as_pointer(addr)); }));
}

std::uintptr_t py_engine::allocate_managed(std::size_t length) {
  return unwrap(with_core([&](core& c) { return c.managed.allocate(*c.engine, length); }));
}

void py_engine::free_managed(std::uintptr_t addr) {
  unwrap(with_core([&](core& c) { return c.managed.free(*c.engine, addr); }));
}

void py_engine::copy_in(std::uintptr_t addr, const pyb::object& data, std::size_t length) {
  // Holding the core keeps a managed block mapped while it is written.
  const std::shared_ptr<core> c = live();
  copy_into(addr, data, length);
}

pyb::bytes py_engine::copy_out(std::uintptr_t addr, std::size_t length) {
  const std::shared_ptr<core> c = live();
  return copy_from(addr, length);
}

segment_id py_engine::open_segment(const std::string& name) {
  return unwrap(call([&](engine_iface& e) { return e.open_segment(name); }));
}

void py_engine::close_segment(segment_id id, int mode) {
  const in_flight m = in_flight_of(mode);
  unwrap(call([&](engine_iface& e) { return e.close_segment(id, m); }));
}

/// (name, [(addr, length, id, access)]): ids are the peer's stable ids, or
/// the index for a Mooncake peer.
pyb::tuple py_engine::segment_buffers(segment_id id) {
  auto d = unwrap(call([&](engine_iface& e) { return e.segment_descriptor(id); }));
  pyb::list out;
  for (std::size_t i = 0; i < d->buffers.size(); ++i) {
    const auto& b = d->buffers[i];
    out.append(pyb::make_tuple(b.addr, b.length, b.id.value_or(static_cast<std::uint32_t>(i)),
                               static_cast<int>(b.access)));
  }
  return pyb::make_tuple(d->name, out);
}

batch_id py_engine::allocate_batch(std::size_t capacity) {
  return unwrap(with_core([&](core& c) {
    if (!c.orphans.empty()) (void)c.orphans.reap(*c.engine);
    return c.engine->allocate_batch(capacity);
  }));
}

void py_engine::free_batch(batch_id b) {
  unwrap(call([&](engine_iface& e) { return e.free_batch(b); }));
}

void py_engine::submit(batch_id b, const std::vector<request_tuple>& requests, const std::optional<note_tuple>& notify) {
  std::vector<transfer_request> reqs = to_requests(requests);
  unwrap(call([&](engine_iface& e) { return submit_with(e, b, reqs, notify); }));
}

pyb::tuple py_engine::transfer(const std::vector<request_tuple>& requests, double timeout_s,
                               const std::optional<note_tuple>& notify) {
  const auto deadline = deadline_in(seconds_argument(timeout_s, "timeout"));
  std::vector<transfer_request> reqs = to_requests(requests);
  batch_outcome out = with_core([&](core& c) { return run_batch(c, reqs, deadline, notify); });
  raise_failure(out);
  return outcome_tuple(out);
}

pyb::tuple py_engine::finish(batch_id b, double timeout_s) {
  const auto deadline = seconds_argument(timeout_s, "timeout") < 0 ? kNever : deadline_in(timeout_s);
  batch_outcome out = with_core([&](core& c) { return finish_batch(c, b, deadline); });
  raise_failure(out);
  return outcome_tuple(out);
}

bool py_engine::release(batch_id b) {
  return with_core([&](core& c) { return release_batch(c, b); });
}

std::vector<batch_id> py_engine::orphans() {
  return with_core([&](core& c) { return c.orphans.reap(*c.engine); });
}

pyb::tuple py_engine::task_status(batch_id b, std::size_t task) {
  std::shared_ptr<core> c = live();
  auto s = unwrap(c->engine->status_of(b, task));  // lock-free: keeps the GIL
  return status_tuple(own(*c->engine, s));
}

pyb::tuple py_engine::batch_status(batch_id b) {
  std::shared_ptr<core> c = live();
  auto s = unwrap(c->engine->batch_status(b));
  return status_tuple(own(*c->engine, s));
}

void py_engine::wait(batch_id b, double timeout_s) {
  const bool forever = seconds_argument(timeout_s, "timeout") < 0;
  const auto deadline = forever ? kNever : deadline_in(timeout_s);
  for (;;) {
    // The engine is held one slice at a time: a close() ends the wait.
    auto r = call([&](engine_iface& e) { return e.wait(b, next_slice(deadline)); });
    if (r) return;
    // A close() meanwhile may have freed the batch: that is EngineClosed, not unknown_batch.
    if (!core_) raise(error{errc::not_initialized, "the engine was closed while waiting"});
    if (r.error().code != errc::timed_out) raise(std::move(r.error()));
    if (PyErr_CheckSignals() != 0) throw pyb::error_already_set();
    if (steady_clock::now() >= deadline)
      raise(error{errc::timed_out, "wait: batch unfinished after " + std::to_string(timeout_s) + " s"});
  }
}

void py_engine::cancel(batch_id b) {
  unwrap(call([&](engine_iface& e) { return e.cancel(b); }));
}

pyb::dict py_engine::telemetry(batch_id b, std::int64_t task) {
  std::shared_ptr<core> c = live();
  auto t = unwrap(task < 0 ? c->engine->batch_telemetry(b)
                           : c->engine->task_telemetry(b, static_cast<std::size_t>(task)));  // lock-free
  const auto since_submit = [&](transfer_telemetry::time_point p) -> pyb::object {
    if (p == transfer_telemetry::time_point{}) return pyb::none();
    return pyb::float_(duration<double>(p - t.submit).count());
  };
  pyb::list nics;
  for (std::uint16_t i = 0; i < 32; ++i)
    if ((t.local_nics >> i) & 1U) nics.append(c->engine->device_name(i));
  pyb::dict d;
  d["first_post_s"] = since_submit(t.first_post);
  d["completion_s"] = since_submit(t.completion);
  d["bytes"] = t.bytes;
  d["transferred_bytes"] = t.transferred_bytes;
  d["wrs"] = t.wrs;
  d["retries"] = t.retries;
  d["tasks"] = t.tasks;
  d["local_nics"] = nics;
  d["peer_nics"] = t.peer_nics;
  pyb::list via;  // which transports carried it: both after a failover from RDMA to TCP
  if ((t.transports & transfer_telemetry::kViaRdma) != 0) via.append("rdma");
  if ((t.transports & transfer_telemetry::kViaTcp) != 0) via.append("tcp");
  d["transports"] = via;
  d["state"] = static_cast<int>(t.state);
  d["reason"] = static_cast<int>(t.reason);
  return d;
}

std::string py_engine::metrics_text() {
  return call([](engine_iface& e) { return e.metrics_text(); });
}

void py_engine::watch(batch_id b, const std::shared_ptr<completion_queue>& queue) {
  if (!queue) throw pyb::type_error("watch: queue must be a CompletionQueue");
  std::shared_ptr<core> c = live();
  unwrap(c->watches.watch(*c->engine, b, queue));  // a batch's mutex only: keeps the GIL
}

void py_engine::unwatch(batch_id b) {
  std::shared_ptr<core> c = live();
  unwrap(c->watches.unwatch(*c->engine, b));
}

void py_engine::forget_queue(const std::shared_ptr<completion_queue>& queue) {
  if (!queue || !core_) return;  // closed: the engine is gone, it calls nothing
  std::shared_ptr<core> c = core_;
  c->watches.forget(*c->engine, queue);
}

std::size_t py_engine::watch_queues() {
  return live()->watches.queues();
}

void py_engine::send_notify(segment_id target, const std::string& msg, const std::string& sender) {
  unwrap(call([&](engine_iface& e) { return e.send_notify(target, msg, sender); }));
}

std::vector<std::pair<std::string, std::string>> py_engine::take_notifies(double wait_s) {
  if (!(seconds_argument(wait_s, "wait") >= 0))
    throw pyb::value_error("take_notifies: wait must be >= 0 s, got " + std::to_string(wait_s));
  const auto deadline = deadline_in(wait_s);
  std::vector<notify_desc> v;
  for (;;) {
    v = call([&](engine_iface& e) { return e.take_notifies(next_slice(deadline)); });
    if (!v.empty() || steady_clock::now() >= deadline) break;
    if (PyErr_CheckSignals() != 0) throw pyb::error_already_set();
  }
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(v.size());
  for (auto& n : v) out.emplace_back(std::move(n.name), std::move(n.notify_msg));
  return out;
}

void py_engine::probe(const std::string& segment, double timeout_s) {
  if (!(seconds_argument(timeout_s, "timeout") > 0)) throw pyb::value_error("probe: timeout must be > 0 s");
  const auto t = milliseconds(static_cast<std::int64_t>(std::min(timeout_s, 1e6) * 1000) + 1);
  unwrap(call([&](engine_iface& e) { return e.probe(segment, t); }));
}

pyb::dict py_engine::stats() {
  std::shared_ptr<core> c = live();
  engine_stats s;
  notify_stats n;
  notify_outbox_stats o;
  net::handshake_server_stats h;
  tcp::stats t;
  std::uint16_t tcp_port = 0;
  {
    pyb::gil_scoped_release nogil;
    s = c->engine->stats();
    n = c->engine->notification_stats();
    o = c->engine->outbox_stats();
    h = c->engine->handshake_stats();
    t = c->engine->tcp_stats();
    tcp_port = c->engine->tcp_port();
  }
  pyb::list nics, rails;
  for (const auto& x : s.nics) {
    pyb::dict d;
    d["name"] = x.name;
    d["bytes"] = x.bytes;
    d["wrs"] = x.wrs;
    d["errors"] = x.errors;
    d["inflight_bytes"] = x.inflight_bytes;
    d["bandwidth_bps"] = x.bandwidth_bps;
    d["prior_bps"] = x.prior_bps;
    nics.append(d);
  }
  for (const auto& x : s.rails) {
    pyb::dict d;
    d["local"] = x.local;
    d["peer"] = x.peer;
    d["state"] = std::string(rdma::plan::to_string(x.state.phase));
    d["failures"] = x.state.failures;
    d["pauses"] = x.state.pauses;
    rails.append(d);
  }
  pyb::dict notes;
  notes["accepted"] = n.accepted;
  notes["dropped_count"] = n.dropped_count;
  notes["dropped_bytes"] = n.dropped_bytes;
  notes["dropped_rate"] = n.dropped_rate;
  notes["duplicates"] = n.duplicates;
  notes["queued"] = n.queued;
  pyb::dict sent;
  sent["submitted"] = o.submitted;
  sent["sent"] = o.sent;
  sent["sent_rdma"] = o.sent_rdma;
  sent["sent_tcp"] = o.sent_tcp;
  sent["sent_with_data"] = o.sent_with_data;
  sent["rdma_fallbacks"] = o.rdma_fallbacks;
  sent["dropped_failed"] = o.dropped_failed;
  sent["refused"] = o.refused;
  sent["send_errors"] = o.send_errors;
  sent["dropped_overflow"] = o.dropped_overflow;
  sent["dropped_at_stop"] = o.dropped_at_stop;
  sent["pending"] = o.pending;
  sent["queued"] = o.queued;
  pyb::dict hs;
  hs["accepted"] = h.accepted;
  hs["served"] = h.served;
  hs["dropped"] = h.dropped;
  hs["auth_failed"] = h.auth_failed;
  pyb::dict out;
  out["nics"] = nics;
  out["rails"] = rails;
  out["notifications"] = notes;
  out["notifications_sent"] = sent;
  out["handshakes"] = hs;
  out["tcp"] = tcp_stats_dict(t, tcp_port);
  return out;
}

void init_engine(pyb::module_& m) {
  pyb::class_<py_engine>(m, "Engine",
                         "transfer_engine<P> over the policy set named at creation.  Thread-safe.")
      .def(pyb::init<const std::string&, const std::string&>(), pyb::arg("config_json"),
           pyb::arg("policies") = "default",
           "Creates the engine (opens every NIC, starts the handshake service); the GIL is released meanwhile.  "
           "The metadata backend is the one engine_config::metadata names once TIDE_CONFIG and the environment "
           "are applied over config_json.")
      .def("close", &py_engine::close, pyb::arg("batches") = std::vector<batch_id>{},
           "Stops the engine (idempotent): cancels `batches` and every parked one, waits for them with one "
           "deadline, then returns once the engine is destroyed (calls still running on other threads end first). "
           "Later calls raise EngineClosed.")
      .def_property_readonly("closed", &py_engine::closed)
      .def_property_readonly("segment_name", &py_engine::segment_name)
      .def_property_readonly("handshake_port", &py_engine::handshake_port)
      .def_property_readonly("tcp_port", &py_engine::tcp_port, "The TCP data port (0: TCP is not installed).")
      .def("register_memory", &py_engine::register_memory, pyb::arg("addr"), pyb::arg("length"),
           pyb::arg("location") = "*", pyb::arg("access") = static_cast<int>(buffer_access::remote_read_write),
           "Registers and publishes; returns the buffer id.")
      .def("unregister_memory", &py_engine::unregister_memory, pyb::arg("addr"), pyb::arg("mode") = 0)
      .def("register_memory_batch", &py_engine::register_memory_batch, pyb::arg("addrs"), pyb::arg("lengths"),
           pyb::arg("location") = "*", pyb::arg("access") = std::vector<int>{},
           "Registers them all or none, publishes once; returns their buffer ids.  `access`: one value per "
           "buffer (empty: remote_read_write).")
      .def("unregister_memory_batch", &py_engine::unregister_memory_batch, pyb::arg("addrs"))
      .def("flush_metadata", &py_engine::flush_metadata,
           "etcd/http with publish_delay_ms: stores the registrations made so far now; otherwise returns at once.")
      .def("buffer_id", &py_engine::buffer_id, pyb::arg("addr"))
      .def("allocate_managed", &py_engine::allocate_managed, pyb::arg("length"),
           "Maps and registers `length` bytes; the address.  Unmapped by free_managed, or once the engine is "
           "destroyed.")
      .def("free_managed", &py_engine::free_managed, pyb::arg("addr"),
           "Unregisters (draining transfers) and unmaps an allocate_managed block; when the unregister fails it "
           "raises and the block stays mapped and registered.")
      .def("copy_in", &py_engine::copy_in, pyb::arg("addr"), pyb::arg("data"), pyb::arg("length"),
           "copy_in (the module's) while the engine, and so its managed blocks, stay alive.")
      .def("copy_out", &py_engine::copy_out, pyb::arg("addr"), pyb::arg("length"),
           "copy_out (the module's) while the engine, and so its managed blocks, stay alive.")
      .def("open_segment", &py_engine::open_segment, pyb::arg("name"))
      .def("close_segment", &py_engine::close_segment, pyb::arg("segment"), pyb::arg("mode") = 0)
      .def("segment_buffers", &py_engine::segment_buffers, pyb::arg("segment"))
      .def("allocate_batch", &py_engine::allocate_batch, pyb::arg("capacity"))
      .def("free_batch", &py_engine::free_batch, pyb::arg("batch"))
      .def("submit", &py_engine::submit, pyb::arg("batch"), pyb::arg("requests"), pyb::arg("notify") = pyb::none(),
           "notify (sender, message): delivered to the target after every byte of these requests, never if one "
           "fails.")
      .def("transfer", &py_engine::transfer, pyb::arg("requests"), pyb::arg("timeout"),
           pyb::arg("notify") = pyb::none(),
           "allocate + submit + finish in one call without the GIL; notify as submit's.  Returns (state, bytes, "
           "reason, device, path, timed_out, leaked).")
      .def("finish", &py_engine::finish, pyb::arg("batch"), pyb::arg("timeout"),
           "Waits until the batch is final or `timeout` s pass (< 0: no limit), cancels it then, drains it within "
           "transfer_timeout + 10 s and frees it; one not final by then is parked (freed once final) and "
           "reported leaked.  Ctrl-C cancels and parks it.  Returns (state, bytes, reason, device, path, "
           "timed_out, leaked).")
      .def("release", &py_engine::release, pyb::arg("batch"),
           "Frees the batch when final, else cancels and parks it (freed once final); True when freed.  Never "
           "waits.")
      .def("orphans", &py_engine::orphans, "Frees the parked batches now final; the ids still parked.")
      .def("transfer_named", &py_engine::transfer_named, pyb::arg("segment"), pyb::arg("opcode"), pyb::arg("buffers"),
           pyb::arg("peer_addresses"), pyb::arg("lengths"), pyb::arg("base_timeout"), pyb::arg("timeout_per_byte"),
           pyb::arg("notify") = pyb::none(),
           "transfer() with Mooncake's arguments: the segment by name (opened once, kept), opcode 0 read / 1 write, "
           "equal-length lists of local addresses, peer addresses and lengths; the deadline base_timeout + "
           "timeout_per_byte x the bytes.  None when all completed; else (state, bytes, reason, device, path, "
           "timed_out, leaked, timeout).")
      .def("submit_named", &py_engine::submit_named, pyb::arg("segment"), pyb::arg("opcode"), pyb::arg("buffers"),
           pyb::arg("peer_addresses"), pyb::arg("lengths"), pyb::arg("base_timeout"), pyb::arg("timeout_per_byte"),
           "allocate_batch + submit with transfer_named's arguments; the batch id.  finish_named applies the "
           "deadline.")
      .def("finish_named", &py_engine::finish_named, pyb::arg("batch"),
           "finish() of a submit_named batch with its deadline.  None when all completed; else (state, bytes, "
           "reason, device, path, timed_out, leaked).")
      .def("poll_named", &py_engine::poll_named, pyb::arg("batch"),
           "The batch's status; a final batch is freed.  (state, bytes, reason, device, path).")
      .def("named_segment", &py_engine::named_segment, pyb::arg("name"),
           "The handle of segment `name`, opened on first use and kept open (transfer_named's).")
      .def("task_status", &py_engine::task_status, pyb::arg("batch"), pyb::arg("task"))
      .def("batch_status", &py_engine::batch_status, pyb::arg("batch"))
      .def("wait", &py_engine::wait, pyb::arg("batch"), pyb::arg("timeout"))
      .def("cancel", &py_engine::cancel, pyb::arg("batch"))
      .def("telemetry", &py_engine::telemetry, pyb::arg("batch"), pyb::arg("task") = -1,
           "A task's telemetry (task -1: the batch's sum): first_post_s / completion_s after the submit (None: not "
           "yet), bytes, transferred_bytes, wrs, retries, tasks, local_nics, peer_nics (bit per peer device), state, "
           "reason.")
      .def("metrics_text", &py_engine::metrics_text, "The Prometheus text exposition of the engine's counters.")
      .def("watch", &py_engine::watch, pyb::arg("batch"), pyb::arg("queue"),
           "Tells `queue` when the batch is final (at once when it is already).")
      .def("unwatch", &py_engine::unwatch, pyb::arg("batch"))
      .def("forget_queue", &py_engine::forget_queue, pyb::arg("queue"),
           "Stops every watch of `queue`; the engine never calls it again.")
      .def("watch_queues", &py_engine::watch_queues, "How many completion queues the engine keeps.")
      .def("send_notify", &py_engine::send_notify, pyb::arg("segment"), pyb::arg("message"), pyb::arg("sender") = "")
      .def("take_notifies", &py_engine::take_notifies, pyb::arg("wait") = 0.0)
      .def("probe", &py_engine::probe, pyb::arg("segment_name"), pyb::arg("timeout"))
      .def("stats", &py_engine::stats);
}

}  // namespace tide::py
