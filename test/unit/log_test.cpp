// <tide/log.hpp>: the sink an application installs, the threshold, and the
// stderr format (UTC time with microseconds, thread id, level).
#include <tide/detail/log.hpp>
#include <tide/log.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using tide::log_level;

namespace {

struct captured {
  std::mutex mu;
  std::vector<std::pair<log_level, std::string>> lines;
};

// Redirects fd 2 to a file while alive; text() reads what was written.
class stderr_capture {
 public:
  stderr_capture() {
    std::snprintf(path_, sizeof path_, "/tmp/tide-log-test-XXXXXX");
    fd_ = ::mkstemp(path_);
    REQUIRE(fd_ >= 0);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(fd_, STDERR_FILENO);
  }
  ~stderr_capture() {
    restore();
    ::close(fd_);
    ::unlink(path_);
  }
  void restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string text() const {
    std::string s;
    char buf[4096];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, at);
      if (n <= 0) break;
      s.append(buf, static_cast<std::size_t>(n));
      at += n;
    }
    return s;
  }

 private:
  char path_[64];
  int fd_ = -1;
  int saved_ = -1;
};

}  // namespace

TEST_CASE("the sink receives each line at or above the threshold, with its level") {
  captured cap;
  tide::set_log_level(log_level::info);
  tide::set_log_sink([&](log_level l, std::string_view m) {
    std::lock_guard lock(cap.mu);
    cap.lines.emplace_back(l, std::string(m));
  });
  TIDE_LOG_ERROR("an error " << 1);
  TIDE_LOG_WARN("a warning");
  TIDE_LOG_INFO("an info line");
  TIDE_LOG_DEBUG("not at info");
  // From several threads at once.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([t] { TIDE_LOG_INFO("thread " << t); });
  for (auto& th : threads) th.join();
  tide::set_log_sink({});
  tide::set_log_level(log_level::warn);
  REQUIRE(cap.lines.size() == 7);
  CHECK(cap.lines[0] == std::pair{log_level::error, std::string("an error 1")});
  CHECK(cap.lines[1] == std::pair{log_level::warn, std::string("a warning")});
  CHECK(cap.lines[2] == std::pair{log_level::info, std::string("an info line")});
  TIDE_LOG_WARN("after the sink is removed");  // goes to stderr, not to the old sink
  CHECK(cap.lines.size() == 7);
}

TEST_CASE("off: no line anywhere, neither to the sink nor to stderr") {
  stderr_capture err;
  int calls = 0;
  tide::set_log_level(log_level::off);
  TIDE_LOG_ERROR("nobody sees this");
  tide::set_log_sink([&](log_level, std::string_view) { ++calls; });
  TIDE_LOG_ERROR("nor this");
  tide::set_log_sink({});
  tide::set_log_level(log_level::warn);
  err.restore();
  CHECK(calls == 0);
  CHECK(err.text().empty());
  CHECK(tide::get_log_level() == log_level::warn);
}

TEST_CASE("stderr lines carry UTC time with microseconds, the thread id and the level, in one write") {
  stderr_capture err;
  TIDE_LOG_WARN("hello " << 42);
  err.restore();
  const std::string text = err.text();
  INFO(text);
  static const std::regex line(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z \d+ \[tide warn\] hello 42\n$)");
  CHECK(std::regex_match(text, line));
  CHECK(text.find(" " + std::to_string(::gettid()) + " ") != std::string::npos);
}

TEST_CASE("a sink that logs or throws does not recurse or take the caller down") {
  stderr_capture err;
  int calls = 0;
  tide::set_log_sink([&](log_level, std::string_view m) {
    ++calls;
    TIDE_LOG_WARN("inside the sink: " << m);  // to stderr, not back into the sink
    tide::set_log_sink({});                    // refused from inside, with a line
    throw std::runtime_error("sink failed");
  });
  TIDE_LOG_WARN("outer");
  tide::set_log_sink({});
  err.restore();
  CHECK(calls == 1);
  CHECK(err.text().find("[tide warn] inside the sink: outer") != std::string::npos);
  CHECK(err.text().find("set_log_sink called from inside the log sink: ignored") != std::string::npos);
}

TEST_CASE("level names: tide's and Mooncake's MC_LOG_LEVEL words") {
  CHECK(tide::parse_log_level("error") == log_level::error);
  CHECK(tide::parse_log_level("WARNING") == log_level::warn);
  CHECK(tide::parse_log_level("Info") == log_level::info);
  CHECK(tide::parse_log_level("TRACE") == log_level::debug);
  CHECK(tide::parse_log_level("off") == log_level::off);
  CHECK_FALSE(tide::parse_log_level("verbose"));
  CHECK_FALSE(tide::parse_log_level(""));
  CHECK(tide::to_string(log_level::info) == "info");
}
