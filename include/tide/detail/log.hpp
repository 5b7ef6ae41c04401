#pragma once
/// Minimal leveled logging to stderr.  The threshold comes from
/// TIDE_LOG_LEVEL (error, warn, info, debug; default warn), read once.
/// Not for the hot path: call it on setup and error paths only.

#include <sstream>
#include <string_view>

namespace tide::detail {

enum class log_level : int { error = 0, warn = 1, info = 2, debug = 3 };

/// True when messages of `level` are printed.
[[nodiscard]] bool log_enabled(log_level level) noexcept;
/// Writes one line "[tide <level>] <msg>" to stderr atomically (one write()).
void log_write(log_level level, std::string_view msg) noexcept;

}  // namespace tide::detail

#define TIDE_LOG(level, expr)                                                      \
  do {                                                                             \
    if (::tide::detail::log_enabled(::tide::detail::log_level::level)) {           \
      std::ostringstream tide_log_os_;                                             \
      tide_log_os_ << expr;                                                        \
      ::tide::detail::log_write(::tide::detail::log_level::level, tide_log_os_.str()); \
    }                                                                              \
  } while (0)
#define TIDE_LOG_ERROR(expr) TIDE_LOG(error, expr)
#define TIDE_LOG_WARN(expr) TIDE_LOG(warn, expr)
#define TIDE_LOG_INFO(expr) TIDE_LOG(info, expr)
#define TIDE_LOG_DEBUG(expr) TIDE_LOG(debug, expr)
