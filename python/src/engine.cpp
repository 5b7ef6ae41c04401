// tide._tide.Engine: transfer_engine<P> for Python, thin.  Arguments are
// converted with the GIL held, the C++ call runs without it, and its error
// becomes an exception once the GIL is back (errors.hpp).  Return-code
// conventions (Mooncake's), buffers and batches as objects live in Python.
//
// Ownership: the Python Engine holds a shared_ptr<core>; each call copies it
// (GIL held) and drops the copy before retaking the GIL, so the engine is
// destroyed without the GIL by whoever used it last, and close() while
// another thread is inside a call only makes later calls fail.
#include "completion.hpp"
#include "engine_iface.hpp"
#include "errors.hpp"
#include "fast_call.hpp"
#include "mooncake_calls.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>

namespace tide::py {
namespace pyb = pybind11;
using namespace std::chrono;

namespace {

/// The engine and the completion queues it may call: the queues are
/// destroyed after the engine, so no lane can call a freed listener.
struct core {
  std::unique_ptr<engine_iface> engine;
  std::mutex mu;  ///< guards queues
  std::vector<std::shared_ptr<completion_queue>> queues;
  named_segments segments;  ///< tide.TransferEngine's, by name
  ~core() { engine.reset(); }
};

pyb::tuple status_tuple(const engine_iface& e, const transfer_status& s) {
  return pyb::make_tuple(static_cast<int>(s.state), s.transferred_bytes, static_cast<int>(s.reason),
                         s.failed_local_device == kNoDevice ? std::string() : e.device_name(s.failed_local_device),
                         std::string(s.failed_peer_path));
}

using request_tuple = std::tuple<int, std::uintptr_t, segment_id, std::int64_t, std::uint64_t, std::size_t>;

class py_engine {
 public:
  py_engine(const std::string& config_json, const std::string& policies, const std::string& metadata_kind) {
    const auto& sets = policy_sets();
    auto set = std::find_if(sets.begin(), sets.end(), [&](const policy_set& s) { return s.name == policies; });
    if (set == sets.end()) {
      std::string names;
      for (const auto& s : sets) names += (names.empty() ? "" : ", ") + s.name;
      throw pyb::value_error("unknown policy set '" + policies + "' (built: " + names + ")");
    }
    engine_factory make = metadata_kind == "etcd" ? set->etcd : metadata_kind == "http" ? set->http : set->p2p;
    if (make == nullptr)
      throw pyb::value_error("policy set '" + policies + "' is built with p2p metadata only, not " + metadata_kind);
    engine_config cfg;
    unwrap(cfg.apply_json(config_json, "tide.Engine"));
    auto c = std::make_shared<core>();
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

  /// Runs f(engine) without the GIL.
  template <class F>
  auto call(F&& f) {
    std::shared_ptr<core> c = core_;
    if (!c) raise(error{errc::not_initialized, "the engine is closed"});
    pyb::gil_scoped_release nogil;
    auto r = f(*c->engine);
    c.reset();  // may be the last reference after a close(): torn down here, without the GIL
    return r;
  }

  void close() {
    std::shared_ptr<core> c = std::move(core_);
    pyb::gil_scoped_release nogil;
    c.reset();
  }
  [[nodiscard]] bool closed() const noexcept { return !core_; }

  std::string segment_name() {
    return call([](engine_iface& e) { return e.segment_name(); });
  }
  std::uint16_t handshake_port() {
    return call([](engine_iface& e) { return e.handshake_port(); });
  }

  std::uint32_t register_memory(std::uintptr_t addr, std::size_t len, const std::string& location, int access) {
    if (access < 0 || access > static_cast<int>(buffer_access::remote_read_write))
      throw pyb::value_error("access must be 0 (local_only) .. 3 (remote_read_write), got " + std::to_string(access));
    return unwrap(call([&](engine_iface& e) -> result<std::uint32_t> {
      if (auto r = e.register_memory(as_pointer(addr), len, location, static_cast<buffer_access>(access)); !r)
        return fail(r.error());
      return e.buffer_id(as_pointer(addr));
    }));
  }
  void unregister_memory(std::uintptr_t addr, int mode) {
    unwrap(call([&](engine_iface& e) { return e.unregister_memory(as_pointer(addr), in_flight_of(mode)); }));
  }
  void register_memory_batch(const std::vector<std::uintptr_t>& addrs, const std::vector<std::size_t>& lens,
                             const std::string& location) {
    if (addrs.size() != lens.size())
      throw pyb::value_error("register_memory_batch: " + std::to_string(addrs.size()) + " addresses but " +
                             std::to_string(lens.size()) + " lengths");
    std::vector<buffer_entry> entries(addrs.size());
    for (std::size_t i = 0; i < addrs.size(); ++i) entries[i] = {as_pointer(addrs[i]), lens[i]};
    unwrap(call([&](engine_iface& e) { return e.register_memory_batch(entries, location); }));
  }
  void unregister_memory_batch(const std::vector<std::uintptr_t>& addrs) {
    std::vector<void*> ptrs(addrs.size());
    std::transform(addrs.begin(), addrs.end(), ptrs.begin(), as_pointer);
    unwrap(call([&](engine_iface& e) { return e.unregister_memory_batch(ptrs); }));
  }
  std::uint32_t buffer_id(std::uintptr_t addr) {
    return unwrap(call([&](engine_iface& e) { return e.buffer_id(as_pointer(addr)); }));
  }

  segment_id open_segment(const std::string& name) {
    return unwrap(call([&](engine_iface& e) { return e.open_segment(name); }));
  }
  void close_segment(segment_id id, int mode) {
    unwrap(call([&](engine_iface& e) { return e.close_segment(id, in_flight_of(mode)); }));
  }
  /// (name, [(addr, length, id, access)]): ids are the peer's stable ids, or
  /// the index for a Mooncake peer.
  pyb::tuple segment_buffers(segment_id id) {
    auto d = unwrap(call([&](engine_iface& e) { return e.segment_descriptor(id); }));
    pyb::list out;
    for (std::size_t i = 0; i < d->buffers.size(); ++i) {
      const auto& b = d->buffers[i];
      out.append(pyb::make_tuple(b.addr, b.length, b.id.value_or(static_cast<std::uint32_t>(i)),
                                 static_cast<int>(b.access)));
    }
    return pyb::make_tuple(d->name, out);
  }

  batch_id allocate_batch(std::size_t capacity) {
    return unwrap(call([&](engine_iface& e) { return e.allocate_batch(capacity); }));
  }
  void free_batch(batch_id b) {
    unwrap(call([&](engine_iface& e) { return e.free_batch(b); }));
  }
  /// `notify` (sender, message): sent to the requests' target once every
  /// task of this submit COMPLETED, never if one failed (tide::notification).
  void submit(batch_id b, const std::vector<request_tuple>& requests, const std::optional<note_tuple>& notify) {
    std::vector<transfer_request> reqs = to_requests(requests);
    unwrap(call([&](engine_iface& e) { return submit_with(e, b, reqs, notify); }));
  }
  /// A whole synchronous batch in one call (what Mooncake's transfer_sync*
  /// do): allocate, submit, wait until every task is final, free.  One GIL
  /// release for all of it, retaken only for a signal check every 100 ms.
  /// Past `timeout_s` (or on Ctrl-C) the batch is canceled and drained first,
  /// so no DMA of it touches the caller's memory once this returns.
  /// Returns (state, bytes, reason, device, path, timed_out) of the batch.
  pyb::tuple transfer(const std::vector<request_tuple>& requests, double timeout_s,
                      const std::optional<note_tuple>& notify) {
    std::vector<transfer_request> reqs = to_requests(requests);
    const batch_outcome out = run_now(reqs, deadline_in(timeout_s), notify);
    return outcome_tuple(out);
  }
  /// transfer() for tide.TransferEngine: Mooncake's arguments as they come
  /// (the target segment's name, three lists of integers, 0 read / 1
  /// write), the segment opened on first use and kept, the requests built
  /// here.  The deadline is Mooncake's: base_s + per_byte_s x the bytes.
  /// None when every request completed; else (state, bytes, reason, device,
  /// path, timed_out, timeout_s).
  pyb::object transfer_named(const std::string& segment, int op, const pyb::handle& locals, const pyb::handle& remotes,
                             const pyb::handle& lengths, double base_s, double per_byte_s,
                             const std::optional<note_tuple>& notify) {
    const transfer_op o = opcode_of(op);
    const address_lists lists = read_address_lists(locals, remotes, lengths);
    if (lists.size() == 0) return pyb::none();
    return run_named(segment, lists.total_bytes(), base_s, per_byte_s, notify,
                     [&](segment_id target) { return lists.requests(o, target); });
  }
  /// transfer_named of one request given as three integers, without a
  /// notification (what transfer_sync_write / _read pass): no sequences to
  /// read, no vectors.  Python calls it as sync_one (below).
  pyb::object transfer_one(const std::string& segment, int op, pyb::handle local, pyb::handle remote,
                           pyb::handle length, double base_s, double per_byte_s) {
    const transfer_op o = opcode_of(op);
    const one_address a = read_one_address(local, remote, length);
    return run_named(segment, a.length, base_s, per_byte_s, std::nullopt,
                     [&](segment_id target) { return std::array{a.request(o, target)}; });
  }
  /// allocate + submit of Mooncake's arguments (as transfer_named's);
  /// (batch id, bytes).  Nothing stays allocated when the submit fails.
  pyb::tuple submit_named(const std::string& segment, int op, const pyb::handle& locals, const pyb::handle& remotes,
                          const pyb::handle& lengths) {
    const transfer_op o = opcode_of(op);
    const address_lists lists = read_address_lists(locals, remotes, lengths);
    std::shared_ptr<core> c = live();
    result<batch_id> b = batch_id{0};
    {
      pyb::gil_scoped_release nogil;
      b = open_and_submit(*c, segment, o, lists);
      c.reset();  // may be the last reference after a close(): torn down here, without the GIL
    }
    const batch_id id = unwrap(std::move(b));
    return pyb::make_tuple(id, lists.total_bytes());
  }
  /// The handle of the segment `name`, opened on first use and kept (the
  /// one transfer_named and submit_named use).
  segment_id named_segment(const std::string& name) {
    std::shared_ptr<core> c = live();
    result<segment_id> id = segment_id{};
    {
      pyb::gil_scoped_release nogil;
      id = c->segments.open(*c->engine, name);
      c.reset();  // may be the last reference after a close(): torn down here, without the GIL
    }
    return unwrap(std::move(id));
  }
  pyb::tuple task_status(batch_id b, std::size_t task) {
    std::shared_ptr<core> c = live();
    auto s = unwrap(c->engine->status_of(b, task));  // lock-free: keeps the GIL
    return status_tuple(*c->engine, s);
  }
  pyb::tuple batch_status(batch_id b) {
    std::shared_ptr<core> c = live();
    auto s = unwrap(c->engine->batch_status(b));
    return status_tuple(*c->engine, s);
  }
  /// Waits in slices of at most 100 ms, checking for signals between them so
  /// Ctrl-C interrupts a long wait.  A negative timeout waits for ever.
  void wait(batch_id b, double timeout_s) {
    const bool forever = timeout_s < 0;
    const auto deadline = deadline_in(forever ? 0.0 : timeout_s);
    for (;;) {
      const auto left = forever ? kWaitSlice : next_slice(deadline);
      auto r = call([&](engine_iface& e) { return e.wait(b, left); });
      if (r) return;
      if (r.error().code != errc::timed_out) raise(std::move(r.error()));
      if (PyErr_CheckSignals() != 0) throw pyb::error_already_set();
      if (!forever && steady_clock::now() >= deadline)
        raise(error{errc::timed_out, "wait: batch unfinished after " + std::to_string(timeout_s) + " s"});
    }
  }
  void cancel(batch_id b) {
    unwrap(call([&](engine_iface& e) { return e.cancel(b); }));
  }
  /// A task's telemetry (task < 0: the batch's sum) as a dict; times in
  /// seconds from the submit (None: not yet).  Lock-free: keeps the GIL.
  pyb::dict telemetry(batch_id b, std::int64_t task) {
    std::shared_ptr<core> c = live();
    auto t = unwrap(task < 0 ? c->engine->batch_telemetry(b)
                             : c->engine->task_telemetry(b, static_cast<std::size_t>(task)));
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
    d["state"] = static_cast<int>(t.state);
    d["reason"] = static_cast<int>(t.reason);
    return d;
  }
  std::string metrics_text() {
    return call([](engine_iface& e) { return e.metrics_text(); });
  }
  /// Tells `queue` when the batch is final (None: stop).  The queue is kept
  /// as long as the engine, so a late call finds it alive.
  void watch(batch_id b, const std::shared_ptr<completion_queue>& queue) {
    std::shared_ptr<core> c = live();
    if (queue) {
      std::lock_guard lock(c->mu);
      if (std::find(c->queues.begin(), c->queues.end(), queue) == c->queues.end()) c->queues.push_back(queue);
    }
    unwrap(c->engine->watch_batch(b, queue.get()));  // takes only the batch's mutex: keeps the GIL
  }

  void send_notify(segment_id target, const std::string& msg, const std::string& sender) {
    unwrap(call([&](engine_iface& e) { return e.send_notify(target, msg, sender); }));
  }
  /// With `wait_s` > 0 and nothing queued, sleeps (without the GIL) until a
  /// notification arrives or `wait_s` passes; Ctrl-C and close() end the
  /// wait within 100 ms (the engine is held one slice at a time).
  std::vector<std::pair<std::string, std::string>> take_notifies(double wait_s) {
    if (!(wait_s >= 0)) throw pyb::value_error("take_notifies: wait must be >= 0 s, got " + std::to_string(wait_s));
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
  void probe(const std::string& segment, double timeout_s) {
    if (!(timeout_s > 0)) throw pyb::value_error("probe: timeout must be > 0 s");
    const auto t = milliseconds(static_cast<std::int64_t>(std::min(timeout_s, 1e6) * 1000) + 1);
    unwrap(call([&](engine_iface& e) { return e.probe(segment, t); }));
  }

  pyb::dict stats() {
    std::shared_ptr<core> c = live();
    engine_stats s;
    notify_stats n;
    notify_outbox_stats o;
    net::handshake_server_stats h;
    {
      pyb::gil_scoped_release nogil;
      s = c->engine->stats();
      n = c->engine->notification_stats();
      o = c->engine->outbox_stats();
      h = c->engine->handshake_stats();
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
    sent["dropped_failed"] = o.dropped_failed;
    sent["refused"] = o.refused;
    sent["send_errors"] = o.send_errors;
    sent["pending"] = o.pending;
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
    return out;
  }

 private:
  static in_flight in_flight_of(int mode) {
    if (mode < 0 || mode > static_cast<int>(in_flight::cancel))
      throw pyb::value_error("in_flight mode must be 0 (reject), 1 (drain) or 2 (cancel)");
    return static_cast<in_flight>(mode);
  }
  /// Requests as (op, source, segment, buffer id or -1 for a raw address,
  /// offset or address, length).
  static std::vector<transfer_request> to_requests(const std::vector<request_tuple>& requests) {
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
  /// transfer_named's run once the arguments are read: the segment opened
  /// (or found), make_requests(segment) run as one batch, the GIL released
  /// for both.
  template <class MakeRequests>
  pyb::object run_named(const std::string& segment, std::uint64_t bytes, double base_s, double per_byte_s,
                        const std::optional<note_tuple>& notify, MakeRequests&& make_requests) {
    const double timeout_s = base_s + per_byte_s * static_cast<double>(bytes);
    std::shared_ptr<core> c = live();
    batch_outcome out;
    {
      pyb::gil_scoped_release nogil;
      if (auto seg = c->segments.open(*c->engine, segment); !seg) {
        out.failure = std::move(seg.error());
      } else {
        const auto reqs = make_requests(*seg);
        out = run_batch(*c->engine, reqs, deadline_in(timeout_s), notify);
      }
      c.reset();  // may be the last reference after a close(): torn down here, without the GIL
    }
    raise_failure(out);
    if (out.status.state == transfer_state::completed && !out.timed_out) return pyb::none();
    return outcome_tuple(out, timeout_s);
  }
  /// run_batch on the live engine, the GIL released; raises its failure.
  batch_outcome run_now(std::span<const transfer_request> reqs, steady_clock::time_point deadline,
                        const std::optional<note_tuple>& notify) {
    std::shared_ptr<core> c = live();
    batch_outcome out;
    {
      pyb::gil_scoped_release nogil;
      out = run_batch(*c->engine, reqs, deadline, notify);
      c.reset();  // may be the last reference after a close(): torn down here, without the GIL
    }
    raise_failure(out);
    return out;
  }
  /// What a run_batch that could not finish raises: the pending Python
  /// error of an interrupt, else its failure.
  static void raise_failure(batch_outcome& out) {
    if (out.interrupted) throw pyb::error_already_set();
    if (out.failure.code != errc::ok) raise(std::move(out.failure));
  }
  /// submit_named's work, without the GIL.
  static result<batch_id> open_and_submit(core& c, const std::string& segment, transfer_op o,
                                          const address_lists& lists) {
    engine_iface& e = *c.engine;
    auto seg = c.segments.open(e, segment);
    if (!seg) return fail(seg.error());
    auto b = e.allocate_batch(lists.size());
    if (!b) return b;
    if (auto r = e.submit(*b, lists.requests(o, *seg)); !r) {
      if (!e.free_batch(*b)) {  // partly posted: let it drain first
        drain(e, *b);
        (void)e.free_batch(*b);
      }
      return fail(r.error());
    }
    return b;
  }
  /// (state, bytes, reason, device, path, timed_out), and the timeout used
  /// when given (transfer_named's).
  static pyb::tuple outcome_tuple(const batch_outcome& out, std::optional<double> timeout_s = std::nullopt) {
    pyb::list t;
    t.append(static_cast<int>(out.status.state));
    t.append(out.status.transferred_bytes);
    t.append(static_cast<int>(out.status.reason));
    t.append(out.device);
    t.append(std::string(out.status.failed_peer_path));
    t.append(out.timed_out);
    if (timeout_s) t.append(*timeout_s);
    return pyb::tuple(t);
  }
  std::shared_ptr<core> live() const {
    if (!core_) raise(error{errc::not_initialized, "the engine is closed"});
    return core_;
  }

  std::shared_ptr<core> core_;  ///< null once closed; read and written with the GIL held
};

/// py_engine::transfer_one as a METH_FASTCALL function (fast_call.hpp):
/// the path of tide.TransferEngine.transfer_sync_write / _read.  All eight
/// arguments positional; None, or transfer_named's failure tuple.
PyObject* sync_one(PyObject*, PyObject* const* args, Py_ssize_t n) noexcept {
  return fast_call([&]() -> pyb::object {
    if (n != 8)
      throw pyb::type_error("sync_one(engine, target_hostname, opcode, buffer, peer_address, length, base_timeout, "
                            "timeout_per_byte) takes 8 arguments, got " + std::to_string(n));
    py_engine* engine = nullptr;  // one type lookup: None casts to null, another type throws
    try {
      engine = pyb::handle(args[0]).cast<py_engine*>();
    } catch (const pyb::cast_error&) {
    }
    if (engine == nullptr)
      throw pyb::type_error(std::string("sync_one: engine must be a tide._tide.Engine, got ") +
                            Py_TYPE(args[0])->tp_name);
    return engine->transfer_one(
        text_argument(args[1], "target_hostname"), int_argument(args[2], "opcode"), args[3], args[4], args[5],
        float_argument(args[6], "base_timeout"), float_argument(args[7], "timeout_per_byte"));
  });
}

PyMethodDef sync_one_def{"sync_one", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&sync_one)),
                         METH_FASTCALL,
                         "sync_one(engine, target_hostname, opcode, buffer, peer_address, length, base_timeout, "
                         "timeout_per_byte): Engine.transfer_named of one request given as three ints, without "
                         "a notification.  None when it completed; else transfer_named's tuple."};

}  // namespace

void init_engine(pyb::module_& m) {
  PyObject* sync_one_fn = PyCFunction_NewEx(&sync_one_def, nullptr, m.attr("__name__").ptr());
  if (sync_one_fn == nullptr) throw pyb::error_already_set();
  m.add_object("sync_one", pyb::reinterpret_steal<pyb::object>(sync_one_fn));
  pyb::class_<py_engine>(m, "Engine", "transfer_engine<P> over the policy set named at creation.  Thread-safe.")
      .def(pyb::init<const std::string&, const std::string&, const std::string&>(), pyb::arg("config_json"),
           pyb::arg("policies") = "default", pyb::arg("metadata_kind") = "p2p",
           "Creates the engine (opens every NIC, starts the handshake service); the GIL is released meanwhile.")
      .def("close", &py_engine::close, "Stops the engine (idempotent); later calls raise EngineClosed.")
      .def_property_readonly("closed", &py_engine::closed)
      .def_property_readonly("segment_name", &py_engine::segment_name)
      .def_property_readonly("handshake_port", &py_engine::handshake_port)
      .def("register_memory", &py_engine::register_memory, pyb::arg("addr"), pyb::arg("length"),
           pyb::arg("location") = "*", pyb::arg("access") = static_cast<int>(buffer_access::remote_read_write), "Registers and publishes; returns the buffer id.")
      .def("unregister_memory", &py_engine::unregister_memory, pyb::arg("addr"), pyb::arg("mode") = 0)
      .def("register_memory_batch", &py_engine::register_memory_batch, pyb::arg("addrs"), pyb::arg("lengths"),
           pyb::arg("location") = "*")
      .def("unregister_memory_batch", &py_engine::unregister_memory_batch, pyb::arg("addrs"))
      .def("buffer_id", &py_engine::buffer_id, pyb::arg("addr"))
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
           "allocate + submit + wait + free in one call without the GIL; a timed-out batch is canceled and drained "
           "first; notify as submit's.  Returns (state, bytes, reason, device, path, timed_out).")
      .def("transfer_named", &py_engine::transfer_named, pyb::arg("segment"), pyb::arg("opcode"), pyb::arg("buffers"),
           pyb::arg("peer_addresses"), pyb::arg("lengths"), pyb::arg("base_timeout"), pyb::arg("timeout_per_byte"),
           pyb::arg("notify") = pyb::none(),
           "transfer() with Mooncake's arguments: the segment by name (opened once, kept), opcode 0 read / 1 write, "
           "equal-length lists of local addresses, peer addresses and lengths.  None when all completed; else "
           "(state, bytes, reason, device, path, timed_out, timeout).")
      .def("submit_named", &py_engine::submit_named, pyb::arg("segment"), pyb::arg("opcode"), pyb::arg("buffers"),
           pyb::arg("peer_addresses"), pyb::arg("lengths"),
           "allocate_batch + submit with transfer_named's arguments; (batch, bytes).")
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
      .def("watch", &py_engine::watch, pyb::arg("batch"), pyb::arg("queue").none(true))
      .def("send_notify", &py_engine::send_notify, pyb::arg("segment"), pyb::arg("message"), pyb::arg("sender") = "")
      .def("take_notifies", &py_engine::take_notifies, pyb::arg("wait") = 0.0)
      .def("probe", &py_engine::probe, pyb::arg("segment_name"), pyb::arg("timeout"))
      .def("stats", &py_engine::stats);
}

}  // namespace tide::py
