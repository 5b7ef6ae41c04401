// tide._tide.Engine's methods for tide.TransferEngine: Mooncake's arguments
// as they come (a segment by name, address lists, base + per-byte timeouts),
// read natively so that one Mooncake call is one native call (engine.hpp).
#include "engine.hpp"

#include "errors.hpp"

#include <array>

namespace tide::py {
namespace pyb = pybind11;
using namespace std::chrono;

template <class MakeRequests>
pyb::object py_engine::run_named(const std::string& segment, std::uint64_t bytes, double base_s, double per_byte_s,
                                 const std::optional<note_tuple>& notify, MakeRequests&& make_requests) {
  const double timeout_s = seconds_argument(base_s, "base_timeout") +
                           seconds_argument(per_byte_s, "timeout_per_byte") * static_cast<double>(bytes);
  const auto deadline = deadline_in(timeout_s);
  batch_outcome out = with_core([&](core& c) {
    auto seg = c.segments.open(*c.engine, segment);
    if (!seg) {
      batch_outcome failed;
      failed.failure = std::move(seg.error());
      return failed;
    }
    const auto reqs = make_requests(*seg);
    return run_batch(c, reqs, deadline, notify);
  });
  raise_failure(out);
  if (out.completed()) return pyb::none();
  return outcome_tuple(out, timeout_s);
}

pyb::object py_engine::transfer_named(const std::string& segment, int op, const pyb::handle& locals,
                                      const pyb::handle& remotes, const pyb::handle& lengths, double base_s,
                                      double per_byte_s, const std::optional<note_tuple>& notify) {
  const transfer_op o = opcode_of(op);
  const address_lists lists = read_address_lists(locals, remotes, lengths);
  if (lists.size() == 0) return pyb::none();
  return run_named(segment, lists.total_bytes(), base_s, per_byte_s, notify,
                   [&](segment_id target) { return lists.requests(o, target); });
}

pyb::object py_engine::transfer_one(const std::string& segment, int op, pyb::handle local, pyb::handle remote,
                                    pyb::handle length, double base_s, double per_byte_s) {
  const transfer_op o = opcode_of(op);
  const one_address a = read_one_address(local, remote, length);
  return run_named(segment, a.length, base_s, per_byte_s, std::nullopt,
                   [&](segment_id target) { return std::array{a.request(o, target)}; });
}

batch_id py_engine::submit_named(const std::string& segment, int op, const pyb::handle& locals,
                                 const pyb::handle& remotes, const pyb::handle& lengths, double base_s,
                                 double per_byte_s) {
  const transfer_op o = opcode_of(op);
  const address_lists lists = read_address_lists(locals, remotes, lengths);
  const double timeout_s = seconds_argument(base_s, "base_timeout") +
                           seconds_argument(per_byte_s, "timeout_per_byte") * static_cast<double>(lists.total_bytes());
  const auto deadline = deadline_in(timeout_s);
  return unwrap(with_core([&](core& c) -> result<batch_id> {
    auto seg = c.segments.open(*c.engine, segment);
    if (!seg) return fail(seg.error());
    if (!c.orphans.empty()) (void)c.orphans.reap(*c.engine);
    auto b = c.engine->allocate_batch(lists.size());
    if (!b) return b;
    if (auto r = c.engine->submit(*b, lists.requests(o, *seg)); !r) {
      (void)finish_batch(c, *b, steady_clock::now());  // frees it (drains it first were anything posted)
      return fail(r.error());
    }
    c.deadlines.put(*b, deadline);
    return b;
  }));
}

pyb::object py_engine::finish_named(batch_id b) {
  batch_outcome out = with_core([&](core& c) {
    // An id submit_named did not give (stale, or another API's) still goes
    // to the engine, whose own check answers unknown_batch.
    const auto deadline = c.deadlines.take(b).value_or(steady_clock::now() + c.drain_bound);
    return finish_batch(c, b, deadline);
  });
  raise_failure(out);
  if (out.completed()) return pyb::none();
  return outcome_tuple(out);
}

pyb::tuple py_engine::poll_named(batch_id b) {
  std::shared_ptr<core> c = live();
  auto s = unwrap(c->engine->batch_status(b));  // lock-free: keeps the GIL
  owned_status st = own(*c->engine, s);
  if (is_final(st.state)) {
    batch_outcome out;
    {
      pyb::gil_scoped_release nogil;
      (void)c->deadlines.take(b);
      out = finish_batch(*c, b, steady_clock::now());  // final: frees it without waiting
      c.reset();
    }
    raise_failure(out);
  }
  return status_tuple(st);
}

segment_id py_engine::named_segment(const std::string& name) {
  return unwrap(with_core([&](core& c) { return c.segments.open(*c.engine, name); }));
}

}  // namespace tide::py
