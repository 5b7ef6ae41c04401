// tide._tide's log functions: tide's log lines handed to Python (tide/_log.py
// forwards them to the `logging` logger "tide") without any of tide's
// threads taking the GIL.
//
// Why a queue: tide logs from its own threads (lanes, I/O, the handshake
// server), sometimes with one of its mutexes held.  A sink that took the GIL
// there could wait for a Python thread that waits for that mutex (the
// binding keeps the GIL through a few lock-taking calls), and at interpreter
// shutdown a thread taking the GIL is ended by Python mid-call.  So the sink
// only appends to a bounded queue under its own mutex; Python's drain thread
// waits for lines without the GIL (wait_logs) and takes them with it
// (take_logs).  Nothing here ever calls into Python from a tide thread.
//
// Ownership: the queue is one per process, never destroyed (a tide thread
// may log while the process exits).  Every function may be called from any
// thread.
#include "errors.hpp"

#include <tide/log.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace tide::py {
namespace pyb = pybind11;

namespace {

struct log_queue {
  /// Lines kept while Python does not drain (a stopped drain thread must not
  /// grow memory without bound); past it lines are counted, not kept.
  static constexpr std::size_t kMaxLines = 10000;
  std::mutex mu;
  std::condition_variable ready;
  std::deque<std::pair<int, std::string>> lines;  ///< guarded by mu
  std::uint64_t dropped = 0;                      ///< guarded by mu; since the last take
  std::uint64_t wakes = 0;                        ///< guarded by mu; wake_logs() calls
};

log_queue& queue() {
  static auto* q = new log_queue;  // never destroyed: threads may log during exit
  return *q;
}

/// The sink: any tide thread, several at once.  Never blocks on Python.
void push(log_level level, std::string_view msg) {
  auto& q = queue();
  {
    std::lock_guard lk(q.mu);
    if (q.lines.size() >= log_queue::kMaxLines) {
      ++q.dropped;
      return;
    }
    q.lines.emplace_back(static_cast<int>(level), std::string(msg));
  }
  q.ready.notify_one();
}

void forward_logs(bool on) {
  // set_log_sink waits for every call of the previous sink to end; ours never
  // waits for Python, but release the GIL anyway, as log.hpp asks of bindings.
  pyb::gil_scoped_release nogil;
  set_log_sink(on ? log_sink(&push) : log_sink());
}

/// Waits, without the GIL, until a line is queued, wake_logs() is called or
/// `wait_s` passes; true when lines are queued.
bool wait_logs(double wait_s) {
  if (!(wait_s >= 0)) throw pyb::value_error("wait_logs: wait must be >= 0 s");
  auto& q = queue();
  pyb::gil_scoped_release nogil;
  std::unique_lock lk(q.mu);
  const std::uint64_t wakes = q.wakes;
  // Bounded by the caller's wait, which is short: a condition variable
  // inherited over fork() may miss a notify, and the next wait sees the lines.
  q.ready.wait_for(lk, std::chrono::duration<double>(std::min(wait_s, 3600.0)),
                   [&] { return !q.lines.empty() || q.dropped != 0 || q.wakes != wakes; });
  return !q.lines.empty() || q.dropped != 0;
}

/// Every queued line as (level, message), oldest first; lines the full
/// queue refused are reported as one warning at the end.
pyb::list take_logs() {
  std::deque<std::pair<int, std::string>> lines;
  std::uint64_t dropped = 0;
  {
    auto& q = queue();
    std::lock_guard lk(q.mu);
    lines.swap(q.lines);
    std::swap(dropped, q.dropped);
  }
  pyb::list out;
  for (auto& [level, msg] : lines) out.append(pyb::make_tuple(level, std::move(msg)));
  if (dropped != 0)
    out.append(pyb::make_tuple(static_cast<int>(log_level::warn),
                               std::to_string(dropped) + " tide log lines dropped: more than " +
                                   std::to_string(log_queue::kMaxLines) + " were waiting for Python"));
  return out;
}

void wake_logs() {
  auto& q = queue();
  {
    std::lock_guard lk(q.mu);
    ++q.wakes;
  }
  q.ready.notify_all();
}

void set_level(const std::string& name) {
  auto l = parse_log_level(name);
  if (!l) throw pyb::value_error("log level must be error, warn, info, debug or off, got '" + name + "'");
  set_log_level(*l);
}

}  // namespace

void init_log(pyb::module_& m) {
  m.def("forward_logs", &forward_logs, pyb::arg("on"),
        "True: tide's log lines go to a queue that take_logs() empties; False: back to stderr.");
  m.def("wait_logs", &wait_logs, pyb::arg("wait"),
        "Waits (GIL released) up to `wait` s for a queued line or wake_logs(); True when lines are queued.");
  m.def("take_logs", &take_logs, "The queued log lines as (level, message): 0 error, 1 warn, 2 info, 3 debug.");
  m.def("wake_logs", &wake_logs, "Ends every wait_logs() under way.");
  m.def("set_log_level", &set_level, pyb::arg("level"),
        "The threshold of every engine's log: error, warn, info, debug or off (wins over TIDE_LOG_LEVEL).");
  m.def("get_log_level", [] { return std::string(to_string(get_log_level())); }, "The threshold in force.");
}

}  // namespace tide::py
