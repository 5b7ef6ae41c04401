#pragma once
/// Whether spinning pays on this host now: spin_event's adaptation.  Not API.
///
/// A spinning thread only pays while a CPU is free for it: on a host where
/// every CPU is taken (a build, a serving process's own workers) it takes a
/// time slice from the work that would complete the request (on Soft-RoCE
/// the kernel moves the bytes on those CPUs) and waits for its own turn
/// again, so a one-request batch costs milliseconds instead of a wake-up.
/// The measure is the kernel's count of runnable threads (the fourth field
/// of /proc/loadavg, "running/total", an instantaneous count that includes
/// the reader and any thread of ours that spins) against the online CPUs:
/// more runnable threads than CPUs means some of them wait, so ours should
/// sleep instead of spinning.  One sample is noisy (a kernel thread runs for
/// a moment), so the verdict follows a moving score of recent samples.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <fcntl.h>
#include <unistd.h>

namespace tide::policy::detail {

/// The decision, without I/O (unit-tested): fed one sample at a time.
/// Score: an exponential moving average of "crowded" (1) / "not" (0) in
/// units of 1/256, weight 1/4 per sample; spinning pays while it is below
/// one half.  So three crowded samples in a row stop the spinning, a
/// crowded sample now and then (one in four) never does, and three quiet
/// samples in a row after a long crowded period bring it back.
class headroom_score {
 public:
  static constexpr std::uint32_t kFull = 256;

  /// `running`: runnable threads on the host, the sampling thread included;
  /// `cpus`: online CPUs.  0 for either: no information, the score stays.
  static constexpr bool crowded(std::uint32_t running, std::uint32_t cpus) noexcept { return running > cpus; }

  static constexpr std::uint32_t next(std::uint32_t score, std::uint32_t running, std::uint32_t cpus) noexcept {
    if (running == 0 || cpus == 0) return score;
    return score - score / 4 + (crowded(running, cpus) ? kFull / 4 : 0);
  }

  static constexpr bool spin_pays(std::uint32_t score) noexcept { return score < kFull / 2; }
};

/// "running" from /proc/loadavg's text ("0.22 0.95 1.49 3/456 12345"); 0
/// when the text does not have that shape.
constexpr std::uint32_t parse_loadavg_running(const char* s, std::size_t n) noexcept {
  std::size_t i = 0;
  for (int field = 0; field < 3; ++field) {  // skip three averages and their spaces
    while (i < n && s[i] != ' ') ++i;
    while (i < n && s[i] == ' ') ++i;
  }
  std::uint32_t v = 0;
  std::size_t digits = 0;
  for (; i < n && s[i] >= '0' && s[i] <= '9' && digits < 9; ++i, ++digits) v = v * 10 + static_cast<std::uint32_t>(s[i] - '0');
  return digits != 0 && i < n && s[i] == '/' ? v : 0;
}

/// The process-wide sampler.  Any thread may call spin_pays(); the first
/// caller past the sampling period reads /proc/loadavg (one pread of an fd
/// kept open: a few microseconds) and updates the score; every other call
/// costs one clock read and two relaxed loads.  Where /proc/loadavg cannot
/// be read, spinning always pays (the strategies behave as before).
class cpu_headroom {
 public:
  static constexpr std::chrono::milliseconds kPeriod{2};

  [[nodiscard]] static bool spin_pays() noexcept {
    auto& s = state();
    if (sample_due(s.next_sample_ns, kPeriod)) sample(s);
    return headroom_score::spin_pays(s.score.load(std::memory_order_relaxed));
  }

  static constexpr std::chrono::microseconds kQuickPeriod{50};

  /// Whether the host has more runnable threads than CPUs now: the last
  /// sample, at most kQuickPeriod old, unsmoothed (spin_event asks it in a
  /// window that has already spun a while, where being late costs the
  /// woken thread its CPU).  Sampled as spin_pays() is, one thread at a
  /// time; where /proc/loadavg cannot be read, never crowded.
  [[nodiscard]] static bool crowded_now() noexcept {
    auto& s = state();
    if (sample_due(s.next_quick_ns, kQuickPeriod)) {
      const auto running = read_running(s);
      if (running != 0) s.crowded.store(headroom_score::crowded(running, s.cpus), std::memory_order_relaxed);
    }
    return s.crowded.load(std::memory_order_relaxed);
  }

 private:
  struct shared {
    shared() noexcept
        : fd(::open("/proc/loadavg", O_RDONLY | O_CLOEXEC)), cpus(online_cpus()) {}
    // Never closed: the process keeps one fd for its lifetime (lanes may
    // sample until the very end of static destruction).
    std::atomic<std::int64_t> next_sample_ns{0};
    std::atomic<std::uint32_t> score{0};
    std::atomic<std::int64_t> next_quick_ns{0};
    std::atomic<bool> crowded{false};
    const int fd;  ///< set before any sampler reads it (a function-local static's init)
    const std::uint32_t cpus;
  };

  static std::uint32_t online_cpus() noexcept {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? static_cast<std::uint32_t>(n) : 0;
  }

  static shared& state() noexcept {
    static shared s;
    return s;
  }

  // Whether this caller takes the sample of the period that `next_ns` ends:
  // one sampler at a time, the CAS winner; the others use the last verdict.
  static bool sample_due(std::atomic<std::int64_t>& next_ns, std::chrono::nanoseconds period) noexcept {
    const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    std::int64_t due = next_ns.load(std::memory_order_relaxed);
    return now >= due && next_ns.compare_exchange_strong(due, now + period.count(), std::memory_order_relaxed);
  }

  // Runnable threads on the host; 0 when unknown.
  static std::uint32_t read_running(shared& s) noexcept {
    if (s.fd < 0) return 0;
    char buf[128];
    const ssize_t n = ::pread(s.fd, buf, sizeof buf, 0);  // seq_file: offset 0 regenerates the text
    return n <= 0 ? 0 : parse_loadavg_running(buf, static_cast<std::size_t>(n));
  }

  static void sample(shared& s) noexcept {
    const auto running = read_running(s);
    if (running == 0) return;
    // Only the CAS winner of this period writes, so load + store loses nothing.
    s.score.store(headroom_score::next(s.score.load(std::memory_order_relaxed), running, s.cpus),
                  std::memory_order_relaxed);
  }
};

}  // namespace tide::policy::detail
