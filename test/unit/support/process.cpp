#include "process.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <random>
#include <sstream>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <algorithm>

namespace tide::test {

child_process::child_process(std::vector<std::string> argv, std::string log_path) : log_(std::move(log_path)) {
  REQUIRE(!argv.empty());
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  REQUIRE_MESSAGE(fd >= 0, "cannot open " << log_);
  const pid_t pid = ::fork();
  REQUIRE_MESSAGE(pid >= 0, "fork failed");
  if (pid == 0) {
    // Die with the test, even when it crashes before its destructors run.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fd);
  pid_ = pid;
}

child_process::child_process(child_process&& o) noexcept : pid_(o.pid_), log_(std::move(o.log_)) { o.pid_ = -1; }
child_process& child_process::operator=(child_process&& o) noexcept {
  if (this != &o) {
    kill();
    pid_ = o.pid_;
    log_ = std::move(o.log_);
    o.pid_ = -1;
  }
  return *this;
}
child_process::~child_process() { kill(); }

void child_process::signal(int sig) const noexcept {
  if (pid_ > 0) ::kill(pid_, sig);
}

void child_process::kill() noexcept {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int child_process::terminate(std::chrono::milliseconds grace) noexcept {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGTERM);
  return wait_exit(grace);
}

int child_process::wait_exit(std::chrono::milliseconds timeout) noexcept {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill();
  return -1;
}

std::optional<std::string> child_process::wait_for_log(const std::string& needle,
                                                       std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    std::ifstream in(log_);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find(needle) != std::string::npos) return line;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

temp_dir::temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/tide-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  path_ = tmpl;
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

// 127.0.0.1:port (0: any free port, for bind).
sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

}  // namespace

std::vector<std::uint16_t> free_loopback_ports(std::size_t n) {
  std::vector<int> fds;
  std::vector<std::uint16_t> ports;
  for (std::size_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a = loopback(0);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    ports.push_back(ntohs(a.sin_port));
    fds.push_back(fd);  // held open so the next bind gets another port
  }
  for (const int fd : fds) ::close(fd);
  return ports;
}

raw_client::raw_client(std::uint16_t port, const char* source) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd_ >= 0);
  if (source != nullptr) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    REQUIRE(::inet_pton(AF_INET, source, &from.sin_addr) == 1);
    REQUIRE_MESSAGE(::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0,
                    "bind to " << source << ": " << std::strerror(errno));
  }
  sockaddr_in a = loopback(port);
  REQUIRE_MESSAGE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0,
                  "connect to 127.0.0.1:" << port << ": " << std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

raw_client::~raw_client() {
  if (fd_ >= 0) ::close(fd_);
}

bool raw_client::send(const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    off += static_cast<std::size_t>(n);
  }
  return true;
}

void raw_client::shutdown_write() { ::shutdown(fd_, SHUT_WR); }

raw_client::read_result raw_client::read_until_eof(std::chrono::milliseconds timeout) {
  read_result r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return r;
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc <= 0) {
      if (rc < 0 && errno == EINTR) continue;
      return r;
    }
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n == 0) {
      r.eof = true;
      return r;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      r.reset = true;
      r.eof = true;
      return r;
    }
    r.data.append(buf, static_cast<std::size_t>(n));
  }
}

silent_listener::silent_listener() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd_ >= 0);
  sockaddr_in a = loopback(0);
  REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd_, 16) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port_ = ntohs(a.sin_port);
}

silent_listener::~silent_listener() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// Reads exactly n bytes within the deadline; false on EOF, error or timeout.
bool read_exact(int fd, char* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// One whole frame (header + at most 1 MiB of payload), or nothing on EOF,
// error or timeout.
std::optional<std::string> read_frame(int fd, std::chrono::steady_clock::time_point deadline) {
  std::string frame(8, '\0');
  if (!read_exact(fd, frame.data(), 8, deadline)) return std::nullopt;
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(frame[static_cast<std::size_t>(i)]);
  frame.resize(8 + static_cast<std::size_t>(std::min<std::uint64_t>(len, 1 << 20)));
  if (!read_exact(fd, frame.data() + 8, frame.size() - 8, deadline)) return std::nullopt;
  return frame;
}

int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a = loopback(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

scripted_server::scripted_server(std::string reply) {
  const int lfd = listener_.fd();
  thread_ = std::thread([lfd, reply = std::move(reply)] {
    pollfd pf{lfd, POLLIN, 0};
    if (::poll(&pf, 1, 5000) <= 0) return;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    if (read_frame(fd, std::chrono::steady_clock::now() + std::chrono::seconds(5))) (void)send_all(fd, reply);
    ::close(fd);
  });
}

scripted_server::~scripted_server() {
  if (thread_.joinable()) thread_.join();
}

frame_relay::frame_relay(std::uint16_t upstream, answer_fn answer) : upstream_(upstream), answer_(std::move(answer)) {
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      pollfd pf{listener_.fd(), POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      serve(fd);
      ::close(fd);
    }
  });
}

frame_relay::~frame_relay() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void frame_relay::serve(int client) {
  // The upstream server may hold a connect request for its lanes' answers
  // (up to 10 s); a client that goes quiet ends the connection.
  constexpr auto kWait = std::chrono::seconds(30);
  int up = -1;
  while (!stop_.load()) {
    auto frame = read_frame(client, std::chrono::steady_clock::now() + kWait);
    if (!frame) break;
    if (auto reply = answer_(std::string_view(*frame).substr(8))) {
      if (!send_all(client, *reply)) break;
      continue;
    }
    if (up < 0 && (up = connect_loopback(upstream_)) < 0) break;
    if (!send_all(up, *frame)) break;
    auto reply = read_frame(up, std::chrono::steady_clock::now() + kWait);
    if (!reply || !send_all(client, *reply)) break;
  }
  if (up >= 0) ::close(up);
}

std::size_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  in >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

int run_to_completion(std::vector<std::string> argv, const std::string& log_path, std::chrono::milliseconds timeout) {
  child_process p(std::move(argv), log_path);
  return p.wait_exit(timeout);
}

std::size_t resident_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  if (!(in >> pages >> resident)) return 0;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

bool wait_stopped(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  do {
    bool all = true;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(t.path() / "stat");
      std::string stat{std::istreambuf_iterator<char>(in), {}};
      // "pid (comm) S ...": the state follows the last ')'.
      const auto paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') all = false;
    }
    if (!ec && all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

}  // namespace tide::test
