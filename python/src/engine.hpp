#pragma once
// tide._tide.Engine: transfer_engine<P> for Python, thin.  Arguments are
// converted with the GIL held, the C++ call runs without it, and its error
// becomes an exception once the GIL is back (errors.hpp).  Return-code
// conventions (Mooncake's), buffers and batches as objects live in Python;
// how a batch is finished lives in batch_run.hpp, for every caller.
//
// Ownership: core.hpp.  close() while another thread is inside a call makes
// later calls fail, and returns once the engine is destroyed (the last call
// using it has returned), so memory the engine could DMA into may be
// released after it.

#include "batch_run.hpp"
#include "completion.hpp"
#include "core.hpp"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tide::py {

/// Requests as (op, source, segment, buffer id or -1 for a raw address,
/// offset or address, length).
using request_tuple = std::tuple<int, std::uintptr_t, segment_id, std::int64_t, std::uint64_t, std::size_t>;

/// (state, bytes, reason, device, path) of a status.
[[nodiscard]] pybind11::tuple status_tuple(const owned_status& s);
/// (state, bytes, reason, device, path, timed_out, leaked), and the timeout
/// used when given (Mooncake's calls, for their message).
[[nodiscard]] pybind11::tuple outcome_tuple(const batch_outcome& out,
                                            std::optional<double> timeout_s = std::nullopt);
/// What a batch that could not finish raises: the pending Python error of an
/// interrupt, its failure, or EngineClosed when close() ended it.  With the
/// GIL.
void raise_failure(batch_outcome& out);

class py_engine {
 public:
  py_engine(const std::string& config_json, const std::string& policies);
  /// A Python Engine dropped without close(): the engine is torn down (lanes
  /// joined, the handshake server stopped) without the GIL, or by the last
  /// call still using it.
  ~py_engine();
  py_engine(const py_engine&) = delete;
  py_engine& operator=(const py_engine&) = delete;

  void close(const std::vector<batch_id>& batches);
  [[nodiscard]] bool closed() const noexcept { return !core_; }

  std::string segment_name();
  std::uint16_t handshake_port();
  std::uint16_t tcp_port();

  std::uint32_t register_memory(std::uintptr_t addr, std::size_t len, const std::string& location, int access);
  void unregister_memory(std::uintptr_t addr, int mode);
  std::vector<std::uint32_t> register_memory_batch(const std::vector<std::uintptr_t>& addrs,
                                                  const std::vector<std::size_t>& lens, const std::string& location,
                                                  const std::vector<int>& access);
  void unregister_memory_batch(const std::vector<std::uintptr_t>& addrs);
  void flush_metadata();
  std::uint32_t buffer_id(std::uintptr_t addr);
  std::uintptr_t allocate_managed(std::size_t length);
  void free_managed(std::uintptr_t addr);
  void copy_in(std::uintptr_t addr, const pybind11::object& data, std::size_t length);
  pybind11::bytes copy_out(std::uintptr_t addr, std::size_t length);

  segment_id open_segment(const std::string& name);
  void close_segment(segment_id id, int mode);
  pybind11::tuple segment_buffers(segment_id id);

  batch_id allocate_batch(std::size_t capacity);
  void free_batch(batch_id b);
  void submit(batch_id b, const std::vector<request_tuple>& requests, const std::optional<note_tuple>& notify);
  pybind11::tuple transfer(const std::vector<request_tuple>& requests, double timeout_s,
                           const std::optional<note_tuple>& notify);
  pybind11::tuple finish(batch_id b, double timeout_s);
  bool release(batch_id b);
  std::vector<batch_id> orphans();

  pybind11::object transfer_named(const std::string& segment, int op, const pybind11::handle& locals,
                                  const pybind11::handle& remotes, const pybind11::handle& lengths, double base_s,
                                  double per_byte_s, const std::optional<note_tuple>& notify);
  /// transfer_named of one request given as three integers, without a
  /// notification (what transfer_sync_write / _read pass).  Python calls it
  /// as sync_one (fast_call.cpp).
  pybind11::object transfer_one(const std::string& segment, int op, pybind11::handle local, pybind11::handle remote,
                                pybind11::handle length, double base_s, double per_byte_s);
  batch_id submit_named(const std::string& segment, int op, const pybind11::handle& locals,
                        const pybind11::handle& remotes, const pybind11::handle& lengths, double base_s,
                        double per_byte_s);
  pybind11::object finish_named(batch_id b);
  pybind11::tuple poll_named(batch_id b);
  segment_id named_segment(const std::string& name);

  pybind11::tuple task_status(batch_id b, std::size_t task);
  pybind11::tuple batch_status(batch_id b);
  void wait(batch_id b, double timeout_s);
  void cancel(batch_id b);
  pybind11::dict telemetry(batch_id b, std::int64_t task);
  std::string metrics_text();

  void watch(batch_id b, const std::shared_ptr<completion_queue>& queue);
  void unwatch(batch_id b);
  void forget_queue(const std::shared_ptr<completion_queue>& queue);
  std::size_t watch_queues();

  void send_notify(segment_id target, const std::string& msg, const std::string& sender);
  std::vector<std::pair<std::string, std::string>> take_notifies(double wait_s);
  void probe(const std::string& segment, double timeout_s);
  pybind11::dict stats();

 private:
  /// Runs f(engine) without the GIL.
  template <class F>
  auto call(F&& f) {
    std::shared_ptr<core> c = live();
    pybind11::gil_scoped_release nogil;
    auto r = f(*c->engine);
    c.reset();  // may be the last reference after a close(): torn down here, without the GIL
    return r;
  }
  /// Runs f(core) without the GIL.
  template <class F>
  auto with_core(F&& f) {
    std::shared_ptr<core> c = live();
    pybind11::gil_scoped_release nogil;
    auto r = f(*c);
    c.reset();
    return r;
  }
  template <class MakeRequests>
  pybind11::object run_named(const std::string& segment, std::uint64_t bytes, double base_s, double per_byte_s,
                             const std::optional<note_tuple>& notify, MakeRequests&& make_requests);
  std::shared_ptr<core> live() const;

  std::shared_ptr<core> core_;  ///< null once closed; read and written with the GIL held
};

}  // namespace tide::py
