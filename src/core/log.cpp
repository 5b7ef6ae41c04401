#include <tide/detail/log.hpp>

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>

namespace tide {
namespace {

// The threshold; kUnset until the environment was read or set_log_level ran.
constexpr int kUnset = -100;
std::atomic<int> g_threshold{kUnset};

// The sink and who is inside it.  log_write holds `mu` shared while it
// calls the sink, set_log_sink holds it exclusively to swap: so the swap
// waits for every call of the old sink under way.
struct sink_slot {
  std::shared_mutex mu;
  log_sink sink;
};
sink_slot& slot() {
  static sink_slot* s = new sink_slot;  // never destroyed: threads may log during exit
  return *s;
}
// This thread is inside the sink: a line it logs now goes to stderr (a
// recursive shared lock could deadlock behind a waiting set_log_sink).
thread_local bool t_in_sink = false;

void write_stderr(std::string_view text) noexcept {
  // One write() so that lines from several threads do not interleave.
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, text.data(), text.size());
}

void stderr_line(log_level level, std::string_view msg) noexcept {
  try {
    const std::string line = detail::log_format(level, msg);
    write_stderr(line);
  } catch (...) {
    // Logging must never take the caller down.
  }
}

int threshold_from_env() noexcept {
  for (const char* name : {"TIDE_LOG_LEVEL", "MC_LOG_LEVEL"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    if (auto l = parse_log_level(v)) return static_cast<int>(*l);
    // Reported whatever the threshold: warn is what is used instead.
    stderr_line(log_level::warn, std::string(name) + "=\"" + std::string(v).substr(0, 64) +
                                     "\" is not a log level (error, warn, info, debug, off); using warn");
    return static_cast<int>(log_level::warn);
  }
  return static_cast<int>(log_level::warn);
}

int threshold() noexcept {
  int t = g_threshold.load(std::memory_order_relaxed);
  if (t != kUnset) [[likely]]
    return t;
  // Once per process, so a bad value is reported once; a value set by
  // set_log_level meanwhile is kept (the exchange only replaces kUnset).
  static std::once_flag once;
  std::call_once(once, [] {
    int expected = kUnset;
    g_threshold.compare_exchange_strong(expected, threshold_from_env(), std::memory_order_relaxed);
  });
  return g_threshold.load(std::memory_order_relaxed);
}

}  // namespace

std::string_view to_string(log_level level) noexcept {
  switch (level) {
    case log_level::off: return "off";
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
  }
  return "?";
}

std::optional<log_level> parse_log_level(std::string_view text) noexcept {
  std::string s;
  for (char c : text.substr(0, 16)) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text.size() > 16) return std::nullopt;
  if (s == "error") return log_level::error;
  if (s == "warn" || s == "warning") return log_level::warn;
  if (s == "info") return log_level::info;
  if (s == "debug" || s == "trace") return log_level::debug;
  if (s == "off" || s == "none") return log_level::off;
  return std::nullopt;
}

void set_log_sink(log_sink sink) {
  if (t_in_sink) {
    stderr_line(log_level::warn, "set_log_sink called from inside the log sink: ignored");
    return;
  }
  auto& s = slot();
  log_sink old;
  {
    std::unique_lock lock(s.mu);
    old = std::exchange(s.sink, std::move(sink));
  }
  // `old` is destroyed here, outside the lock: its destructor may log.
}

void set_log_level(log_level level) noexcept { g_threshold.store(static_cast<int>(level), std::memory_order_relaxed); }

log_level get_log_level() noexcept { return static_cast<log_level>(threshold()); }

namespace detail {

bool log_enabled(log_level level) noexcept {
  return level != log_level::off && static_cast<int>(level) <= threshold();
}

std::string log_format(log_level level, std::string_view msg) {
  const auto now = std::chrono::system_clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char head[96];
  std::snprintf(head, sizeof head, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ %ld [tide ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us % 1000000),
                static_cast<long>(::syscall(SYS_gettid)));
  std::string line = head;
  line += to_string(level);
  line += "] ";
  line += msg;
  line += '\n';
  return line;
}

void log_write(log_level level, std::string_view msg) noexcept {
  if (!t_in_sink) {
    auto& s = slot();
    std::shared_lock lock(s.mu);
    if (s.sink) {
      t_in_sink = true;
      try {
        s.sink(level, msg);
      } catch (...) {
        // A sink that throws loses its line, never the caller.
      }
      t_in_sink = false;
      return;
    }
  }
  stderr_line(level, msg);
}

}  // namespace detail
}  // namespace tide
