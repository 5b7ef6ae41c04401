#pragma once
/// The logging macros tide's own code uses (<tide/log.hpp> is the public
/// side: the sink and the threshold).  Not for the hot path: call them on
/// setup and error paths only.

#include <tide/log.hpp>

#include <sstream>
#include <string_view>

namespace tide::detail {

using tide::log_level;

/// True when lines of `level` are written (the threshold; see <tide/log.hpp>).
[[nodiscard]] bool log_enabled(log_level level) noexcept;
/// Hands one line to the installed sink, else writes it to stderr with the
/// time and the thread id in one write().  Never throws.
void log_write(log_level level, std::string_view msg) noexcept;
/// The stderr form of a line: "<UTC time with us>Z <tid> [tide <level>] <msg>\n".
[[nodiscard]] std::string log_format(log_level level, std::string_view msg);

}  // namespace tide::detail

#define TIDE_LOG(level, expr)                                                      \
  do {                                                                             \
    if (::tide::detail::log_enabled(::tide::log_level::level)) {                   \
      std::ostringstream tide_log_os_;                                             \
      tide_log_os_ << expr;                                                        \
      ::tide::detail::log_write(::tide::log_level::level, tide_log_os_.str());     \
    }                                                                              \
  } while (0)
#define TIDE_LOG_ERROR(expr) TIDE_LOG(error, expr)
#define TIDE_LOG_WARN(expr) TIDE_LOG(warn, expr)
#define TIDE_LOG_INFO(expr) TIDE_LOG(info, expr)
#define TIDE_LOG_DEBUG(expr) TIDE_LOG(debug, expr)
