#pragma once
/// Rail health: whether a (local NIC, peer NIC) rail may carry slices.
///
/// A rail that fails (transport retry exceeded, connect refused, peer
/// unreachable, QP fatal) is paused for a cooldown that starts at
/// `initial_cooldown` and doubles on every failure after a probe, up to
/// `max_cooldown`.  When the cooldown has passed, ONE slice is let through as
/// a probe (claim_probe); its success restores the rail, its failure pauses
/// it again for twice as long.  A success on the rail from any slice restores
/// it too.  Failures of slices that were already on the wire when the rail
/// paused (a dead link flushes every WR of its QPs) do not extend the pause:
/// only the first failure of an outage counts.
///
/// One rail_table per transport, shared by every lane of every context
/// (TENT keeps one per lane and needs ~18 errors to trip a rail on 6 lanes;
/// tide trips it on the first).  Each rail is one 64-bit atomic word, so the
/// hot path reads it with one relaxed load and changes it with a CAS.
///
/// Time: callers pass `now_us` (steady clock, microseconds; see
/// steady_now_us()), so tests drive a fake clock.

#include <tide/result.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tide::rdma::plan {

/// Microseconds of the steady clock (the clock rail health runs on).
[[nodiscard]] inline std::int64_t steady_now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class rail_phase : std::uint8_t {
  healthy = 0,  ///< carries slices
  paused = 1,   ///< failed; nothing until the cooldown has passed
  probing = 2,  ///< one probe slice is out; nothing else until it returns
};

[[nodiscard]] constexpr std::string_view to_string(rail_phase p) noexcept {
  switch (p) {
    case rail_phase::healthy: return "healthy";
    case rail_phase::paused: return "paused";
    case rail_phase::probing: return "probing";
  }
  return "?";
}

struct rail_health_config {
  std::chrono::microseconds initial_cooldown{100'000};  ///< first pause
  std::chrono::microseconds max_cooldown{10'000'000};   ///< the doubling stops here

  /// Errors: config_invalid naming the field (initial 0 or above max).
  [[nodiscard]] status validate() const {
    if (initial_cooldown.count() <= 0)
      return fail(errc::config_invalid, "rail_initial_cooldown must be > 0");
    if (max_cooldown < initial_cooldown)
      return fail(errc::config_invalid, "rail_max_cooldown must be >= rail_initial_cooldown");
    return {};
  }
};

/// Whether a slice that failed with `e` says its rail is broken (and so
/// pauses it): no ACK, a connect that failed or was refused, a QP or port
/// gone bad.  Not: a flushed WR (a victim of the rail's first failure),
/// rejected memory access (the buffer's fault), cancel, timeout, eviction.
[[nodiscard]] constexpr bool counts_against_rail(errc e) noexcept {
  switch (e) {
    case errc::transport_retry_exceeded:
    case errc::rnr_retry_exceeded:
    case errc::peer_unreachable:
    case errc::handshake_failed:
    case errc::handshake_rejected:
    case errc::protocol_error:
    case errc::qp_state_error:
    case errc::mtu_mismatch:
    case errc::qp_count_mismatch:
    case errc::completion_error:
    case errc::context_inactive:
    case errc::device_fatal:
    case errc::port_down: return true;
    default: return false;
  }
}

/// Whether a slice that failed with `e` on the only rail to its peer is
/// worth another try there on a fresh endpoint: the failure is transient
/// while the peer process lives on.  No ACK came (a loss burst, the peer
/// re-handshook with new QPs or restarted quickly), the peer's responder
/// rejected the request (remote_operation_error: under Soft-RoCE drops a
/// stale or out-of-sequence request gets IBV_WC_REM_INV_REQ_ERR, issue 17
/// item 7), the QP went bad (here or, in a rejected handshake, at the
/// peer: rdma/connector.hpp), or the WR was flushed with such a QP (a
/// victim of the same outage), or the peer turned the connect down over a
/// race in its endpoint store and asked for another attempt (busy:
/// rdma/connector.hpp, kTryAgain).  Each leaves the endpoint unusable, so
/// the retry needs the fresh endpoint anyway.  The transport retries these with
/// backoff until the task's deadline (detail/retry_timer.hpp).  A fresh
/// endpoint starts with a handshake, so a peer that is gone fails that with
/// peer_unreachable, which is not in this list: the slice then fails at
/// once instead of waiting for its deadline.
[[nodiscard]] constexpr bool fresh_endpoint_may_help(errc e) noexcept {
  return e == errc::transport_retry_exceeded || e == errc::rnr_retry_exceeded || e == errc::qp_state_error ||
         e == errc::work_request_flushed || e == errc::remote_operation_error || e == errc::busy;
}

/// What a rail looks like right now (stats, tests).
struct rail_snapshot {
  rail_phase phase = rail_phase::healthy;
  unsigned level = 0;             ///< pauses since it was last healthy (cooldown = initial << (level-1))
  std::int64_t until_us = 0;      ///< end of the pause / probe window
  std::uint64_t failures = 0;     ///< failures reported, in total
  std::uint64_t pauses = 0;       ///< times it went from healthy/probing to paused
};

/// The state of one rail.  Every member may be called from any thread at
/// any time; all are lock-free (one load, at most a CAS loop).
class rail_state {
 public:
  /// True when the rail is healthy.  Hot path: one relaxed load.
  [[nodiscard]] bool healthy() const noexcept { return phase_of(word_.load(std::memory_order_relaxed)) == rail_phase::healthy; }

  /// True when the rail is paused or probing and its window has passed, so
  /// claim_probe() may succeed.  No side effect.
  [[nodiscard]] bool probe_due(std::int64_t now_us) const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    return phase_of(w) != rail_phase::healthy && now_us >= until_of(w);
  }

  /// Claims the one probe slice of an expired pause (or of a probe that
  /// never came back within its window).  True for exactly one caller per
  /// window; the caller must then send one slice on this rail.
  [[nodiscard]] bool claim_probe(std::int64_t now_us, const rail_health_config& cfg) noexcept {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    while (phase_of(w) != rail_phase::healthy && now_us >= until_of(w)) {
      const unsigned level = level_of(w);
      const std::uint64_t next = make(rail_phase::probing, level, now_us + cooldown_us(cfg, level));
      if (word_.compare_exchange_weak(w, next, std::memory_order_relaxed)) return true;
    }
    return false;
  }

  /// Reports a failure at `now_us`.  Healthy -> paused for the initial
  /// cooldown; probing -> paused for twice the last cooldown (capped);
  /// already paused -> unchanged (the same outage).  Returns true when this
  /// call paused the rail.
  bool fail(std::int64_t now_us, const rail_health_config& cfg) noexcept {
    failures_.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    for (;;) {
      const rail_phase p = phase_of(w);
      if (p == rail_phase::paused) return false;
      const unsigned level = p == rail_phase::healthy ? 1u : std::min(level_of(w) + 1u, kMaxLevel);
      const std::uint64_t next = make(rail_phase::paused, level, now_us + cooldown_us(cfg, level));
      if (word_.compare_exchange_weak(w, next, std::memory_order_relaxed)) {
        pauses_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
    }
  }

  /// Reports a success: the rail is healthy again with its cooldown reset.
  /// Hot path: one relaxed load when already healthy.  Returns true when
  /// this call restored it.
  bool succeed() noexcept {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    while (phase_of(w) != rail_phase::healthy)
      if (word_.compare_exchange_weak(w, 0, std::memory_order_relaxed)) return true;
    return false;
  }

  [[nodiscard]] rail_snapshot snapshot() const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    return {phase_of(w), level_of(w), until_of(w), failures_.load(std::memory_order_relaxed),
            pauses_.load(std::memory_order_relaxed)};
  }

  /// The pause that level `level` means: initial << (level-1), at most max.
  [[nodiscard]] static std::int64_t cooldown_us(const rail_health_config& cfg, unsigned level) noexcept {
    const std::int64_t initial = cfg.initial_cooldown.count();
    const std::int64_t cap = cfg.max_cooldown.count();
    std::int64_t c = initial;
    for (unsigned i = 1; i < level && c < cap; ++i) c *= 2;
    return std::min(c, cap);
  }

 private:
  // Word: bits 0-1 phase, 2-7 level, 8-63 deadline (us of the steady clock).
  static constexpr unsigned kMaxLevel = 63;
  static rail_phase phase_of(std::uint64_t w) noexcept { return static_cast<rail_phase>(w & 3u); }
  static unsigned level_of(std::uint64_t w) noexcept { return static_cast<unsigned>((w >> 2) & 63u); }
  static std::int64_t until_of(std::uint64_t w) noexcept { return static_cast<std::int64_t>(w >> 8); }
  static std::uint64_t make(rail_phase p, unsigned level, std::int64_t until) noexcept {
    return static_cast<std::uint64_t>(p) | (std::uint64_t{level} << 2) |
           (static_cast<std::uint64_t>(until < 0 ? 0 : until) << 8);
  }

  std::atomic<std::uint64_t> word_{0};
  std::atomic<std::uint64_t> failures_{0};
  std::atomic<std::uint64_t> pauses_{0};
};

/// Every rail of one transport: local device ids (< kMaxLocal) by peer NICs
/// registered by name.  Registration (peer_id) is the setup path and takes a
/// mutex; at() is lock-free (one acquire load of the chunk pointer) and its
/// references stay valid for the table's life.  Peer ids are never reused.
class rail_table {
 public:
  static constexpr std::size_t kMaxLocal = 16;
  static constexpr std::size_t kChunk = 64;     ///< peer NICs per chunk
  static constexpr std::size_t kChunks = 256;   ///< so at most 16384 peer NICs
  static constexpr std::uint32_t kNoPeer = 0xffffffffu;

  explicit rail_table(rail_health_config cfg = {}) : cfg_(cfg) {}
  rail_table(const rail_table&) = delete;
  rail_table& operator=(const rail_table&) = delete;
  ~rail_table() {
    for (auto& c : chunks_) delete c.load(std::memory_order_relaxed);
  }

  [[nodiscard]] const rail_health_config& config() const noexcept { return cfg_; }

  /// The id of peer NIC `nic_path` ("server@device"), registered on first
  /// use; kNoPeer when the table is full.  Setup path; any thread.
  [[nodiscard]] std::uint32_t peer_id(std::string_view nic_path) {
    std::lock_guard lock(mu_);
    if (auto it = ids_.find(std::string(nic_path)); it != ids_.end()) return it->second;
    const std::size_t id = names_.size();
    if (id >= kChunk * kChunks) return kNoPeer;
    if (id % kChunk == 0) chunks_[id / kChunk].store(new chunk, std::memory_order_release);
    names_.emplace_back(nic_path);
    ids_.emplace(std::string(nic_path), static_cast<std::uint32_t>(id));
    return static_cast<std::uint32_t>(id);
  }

  /// The rail (local, peer).  Requires local < kMaxLocal and a peer id from
  /// peer_id() (not kNoPeer).  Hot path; any thread.
  [[nodiscard]] rail_state& at(std::size_t local, std::uint32_t peer) const noexcept {
    chunk* c = chunks_[peer / kChunk].load(std::memory_order_acquire);  // pairs with the release in peer_id
    return c->rails[peer % kChunk][local];
  }

  /// Whether (local, peer) may carry an ordinary slice now: healthy.
  [[nodiscard]] bool healthy(std::size_t local, std::uint32_t peer) const noexcept {
    return peer == kNoPeer || at(local, peer).healthy();
  }

  /// Report a failure / success of a slice on (local, peer).  Any thread.
  bool fail(std::size_t local, std::uint32_t peer, std::int64_t now_us) noexcept {
    return peer != kNoPeer && at(local, peer).fail(now_us, cfg_);
  }
  bool succeed(std::size_t local, std::uint32_t peer) noexcept { return peer != kNoPeer && at(local, peer).succeed(); }
  [[nodiscard]] bool claim_probe(std::size_t local, std::uint32_t peer, std::int64_t now_us) noexcept {
    return peer != kNoPeer && at(local, peer).claim_probe(now_us, cfg_);
  }

  /// Peer NICs registered so far and their names (stats).  Setup path.
  [[nodiscard]] std::vector<std::string> peer_names() const {
    std::lock_guard lock(mu_);
    return names_;
  }

 private:
  struct chunk {
    std::array<std::array<rail_state, kMaxLocal>, kChunk> rails;
  };

  rail_health_config cfg_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::uint32_t> ids_;
  std::vector<std::string> names_;
  std::array<std::atomic<chunk*>, kChunks> chunks_{};
};

}  // namespace tide::rdma::plan
