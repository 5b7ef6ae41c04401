#pragma once
/// tide's log: which lines it writes and where they go.
///
/// By default each line goes to stderr in one write(), as
///   2026-12-05T10:11:12.123456Z 4711 [tide info] rxe0: port 1, GID index 1 ...
/// (UTC time with microseconds, the writing thread's kernel id, the level).
/// An application that owns its logs installs a sink instead: it receives the
/// level and the bare message (no time, thread or tag), so it can add its own.
///
/// The threshold is, from the strongest: set_log_level(); TIDE_LOG_LEVEL;
/// Mooncake's MC_LOG_LEVEL; warn.  Both variables take error, warn (or
/// warning), info, debug (or trace) or off, in any case; an unknown value is
/// reported once, as a warning, and warn is used.
///
/// tide logs on setup, teardown and error paths only; a transfer that goes
/// well writes nothing.

#include <functional>
#include <optional>
#include <string_view>

namespace tide {

/// A line's level, and the threshold (off: no line at all).
enum class log_level : int { off = -1, error = 0, warn = 1, info = 2, debug = 3 };

/// "off", "error", "warn", "info", "debug".
[[nodiscard]] std::string_view to_string(log_level level) noexcept;
/// The level named `text` (any case): error, warn / warning, info,
/// debug / trace, off.  nullopt for anything else.
[[nodiscard]] std::optional<log_level> parse_log_level(std::string_view text) noexcept;

/// Receives each line at or above the threshold: its level and the message.
/// Called on the thread that logs (any of tide's threads, several at once),
/// so it must be thread-safe; an exception it throws is swallowed.  A line
/// tide logs while the sink runs on that thread (the sink calling into tide)
/// goes to stderr instead of recursing.
using log_sink = std::function<void(log_level, std::string_view message)>;

/// Installs `sink` for every later line of the process (all engines);
/// an empty function goes back to stderr.  Returns once no thread is inside
/// the previous sink any more, so what it captured may then be destroyed.
/// Any thread, except from inside a sink (that call is ignored, with a line
/// on stderr): it would wait for itself.  A binding that calls back into an
/// interpreter must release its global lock around this call.
void set_log_sink(log_sink sink);

/// Sets the threshold for the whole process; it wins over TIDE_LOG_LEVEL
/// and MC_LOG_LEVEL.  Any thread.
void set_log_level(log_level level) noexcept;
/// The threshold in force (read from the environment on first use).
[[nodiscard]] log_level get_log_level() noexcept;

}  // namespace tide
