#include <tide/detail/log.hpp>

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <strings.h>

namespace tide::detail {
namespace {

log_level threshold_from_env() noexcept {
  const char* v = std::getenv("TIDE_LOG_LEVEL");
  if (v == nullptr) return log_level::warn;
  if (::strcasecmp(v, "error") == 0) return log_level::error;
  if (::strcasecmp(v, "info") == 0) return log_level::info;
  if (::strcasecmp(v, "debug") == 0) return log_level::debug;
  return log_level::warn;
}

constexpr std::string_view name_of(log_level l) noexcept {
  switch (l) {
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
  }
  return "?";
}

}  // namespace

bool log_enabled(log_level level) noexcept {
  static const log_level threshold = threshold_from_env();
  return static_cast<int>(level) <= static_cast<int>(threshold);
}

void log_write(log_level level, std::string_view msg) noexcept {
  try {
    std::string line = "[tide ";
    line += name_of(level);
    line += "] ";
    line += msg;
    line += '\n';
    // One write() so that lines from several threads do not interleave.
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
  } catch (...) {
    // Logging must never take the caller down.
  }
}

}  // namespace tide::detail
