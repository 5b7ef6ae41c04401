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

#include <tide/detail/log.hpp>
#include <tide/result.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
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
/// stale or out-of-sequence request gets IBV_WC_REM_INV_REQ_ERR), the QP
/// went bad (here or, in a rejected handshake, at the
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

  /// Back to a fresh rail: healthy, no failures counted.  Only for a rail
  /// no slice can reach (rail_table recycling an id nobody holds).
  void reset() noexcept {
    word_.store(0, std::memory_order_relaxed);
    failures_.store(0, std::memory_order_relaxed);
    pauses_.store(0, std::memory_order_relaxed);
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

namespace detail {

// The peer-NIC registry of a rail_table: names, ids and how many rail maps
// hold each id.  Shared (shared_ptr) with the peer_refs of those maps, so a
// map that outlives its table gives its ids back harmlessly.
struct rail_registry {
  explicit rail_registry(std::size_t cap) : capacity(cap) {}
  std::mutex mu;
  const std::size_t capacity;
  std::unordered_map<std::string, std::uint32_t> ids;
  std::vector<std::string> names;  // by id
  std::vector<std::uint32_t> refs;  // by id: rail maps (and peer_id callers) holding it
  // Ids nobody holds, the one released longest ago first: what a full
  // table recycles.  idle_at[id] is valid while in_idle[id].
  std::list<std::uint32_t> idle;
  std::vector<std::list<std::uint32_t>::iterator> idle_at;
  std::vector<bool> in_idle;
  std::uint64_t recycled = 0;
  bool warned_recycling = false;
  bool warned_full = false;

  void hold(std::uint32_t id) {  // under mu
    if (refs[id]++ == 0 && in_idle[id]) {
      idle.erase(idle_at[id]);
      in_idle[id] = false;
    }
  }
  void release(std::uint32_t id) noexcept {
    std::lock_guard lock(mu);
    if (id >= refs.size() || refs[id] == 0) return;
    if (--refs[id] == 0) {
      try {
        idle_at[id] = idle.insert(idle.end(), id);
        in_idle[id] = true;
      } catch (...) {  // no memory for the list node: the id is just not recycled
      }
    }
  }
};

}  // namespace detail

/// The peer ids one rail map holds in its rail_table, given back when it
/// is destroyed (then, once the table is full, an id nobody holds may be
/// recycled for another peer NIC).  Move-only.
class peer_refs {
 public:
  peer_refs() = default;
  peer_refs(std::shared_ptr<detail::rail_registry> reg, std::vector<std::uint32_t> ids) noexcept
      : reg_(std::move(reg)), ids_(std::move(ids)) {}
  peer_refs(peer_refs&& o) noexcept : reg_(std::move(o.reg_)), ids_(std::move(o.ids_)) {}
  peer_refs& operator=(peer_refs&& o) noexcept {
    if (this != &o) {
      give_back();
      reg_ = std::move(o.reg_);
      ids_ = std::move(o.ids_);
    }
    return *this;
  }
  peer_refs(const peer_refs&) = delete;
  peer_refs& operator=(const peer_refs&) = delete;
  ~peer_refs() { give_back(); }

 private:
  void give_back() noexcept;
  std::shared_ptr<detail::rail_registry> reg_;
  std::vector<std::uint32_t> ids_;
};

/// Every rail of one transport: local device ids (< kMaxLocal) by peer NICs
/// registered by name.  Registration (peer_id) is the setup path and takes a
/// mutex; at() is lock-free (one acquire load of the chunk pointer) and its
/// references stay valid for the table's life.
///
/// Bounded: at most `max_peers` peer NICs (16384 by default).  Each
/// peer_id() call holds its id until release() (a rail map holds the ids of
/// its peer NICs for as long as a segment view or a task uses it: peer_refs).
/// Once the table is full, a new peer NIC takes over the id that has been
/// held by nobody for longest, with its rails reset to healthy: no slice
/// can still report on it, since slices reach rails only through a rail map
/// that holds the id.  Logged once.  Only when every id is held (that many
/// peer NICs in open segments or in flight) does peer_id() return kNoPeer:
/// that peer NIC's slices then go without rail health (never paused),
/// logged once.
class rail_table {
 public:
  static constexpr std::size_t kMaxLocal = 16;
  static constexpr std::size_t kChunk = 64;     ///< peer NICs per chunk
  static constexpr std::size_t kChunks = 256;   ///< so at most 16384 peer NICs
  static constexpr std::uint32_t kNoPeer = 0xffffffffu;

  /// `max_peers` is capped at kChunk * kChunks.
  explicit rail_table(rail_health_config cfg = {}, std::size_t max_peers = kChunk * kChunks)
      : cfg_(cfg), reg_(std::make_shared<detail::rail_registry>(std::clamp<std::size_t>(max_peers, 1, kChunk * kChunks))) {}
  rail_table(const rail_table&) = delete;
  rail_table& operator=(const rail_table&) = delete;
  ~rail_table() {
    for (auto& c : chunks_) delete c.load(std::memory_order_relaxed);
  }

  [[nodiscard]] const rail_health_config& config() const noexcept { return cfg_; }

  /// The id of peer NIC `nic_path` ("server@device"), registered on first
  /// use, held until release(id); kNoPeer when every id is held.  Setup
  /// path; any thread.
  [[nodiscard]] std::uint32_t peer_id(std::string_view nic_path) {
    detail::rail_registry& r = *reg_;
    std::lock_guard lock(r.mu);
    if (auto it = r.ids.find(std::string(nic_path)); it != r.ids.end()) {
      r.hold(it->second);
      return it->second;
    }
    if (r.names.size() < r.capacity) {
      const std::size_t id = r.names.size();
      if (id % kChunk == 0) chunks_[id / kChunk].store(new chunk, std::memory_order_release);
      r.names.emplace_back(nic_path);
      r.refs.push_back(0);
      r.idle_at.emplace_back();
      r.in_idle.push_back(false);
      r.ids.emplace(std::string(nic_path), static_cast<std::uint32_t>(id));
      r.hold(static_cast<std::uint32_t>(id));
      return static_cast<std::uint32_t>(id);
    }
    if (r.idle.empty()) {
      if (!r.warned_full) {
        r.warned_full = true;
        TIDE_LOG_WARN("rail table full: " << r.capacity << " peer NICs all in use by open segments or transfers; "
                      "slices to further peer NICs (" << nic_path << " first) go without rail health until some close");
      }
      return kNoPeer;
    }
    const std::uint32_t id = r.idle.front();
    r.idle.pop_front();
    r.in_idle[id] = false;
    if (!r.warned_recycling) {
      r.warned_recycling = true;
      TIDE_LOG_INFO("rail table full (" << r.capacity << " peer NICs): the rails of peer NICs no open segment "
                    "uses are recycled, longest unused first (" << r.names[id] << " for " << nic_path << ")");
    }
    r.ids.erase(r.names[id]);
    r.names[id] = std::string(nic_path);
    r.ids.emplace(r.names[id], id);
    for (std::size_t l = 0; l < kMaxLocal; ++l) at(l, id).reset();
    ++r.recycled;
    r.hold(id);
    return id;
  }

  /// Gives back one hold of `id` taken by peer_id().  kNoPeer is ignored.
  void release(std::uint32_t id) noexcept { reg_->release(id); }

  /// A peer_refs that gives `ids` (each held once by peer_id()) back when destroyed.
  [[nodiscard]] peer_refs hold_until_destroyed(std::vector<std::uint32_t> ids) const noexcept {
    return peer_refs(reg_, std::move(ids));
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

  /// Peer NICs registered now, by id (a recycled id has its new name).  Setup path.
  [[nodiscard]] std::vector<std::string> peer_names() const {
    std::lock_guard lock(reg_->mu);
    return reg_->names;
  }
  /// Ids held now / recycled so far (tests, stats).
  [[nodiscard]] std::size_t held_peers() const {
    std::lock_guard lock(reg_->mu);
    return static_cast<std::size_t>(std::count_if(reg_->refs.begin(), reg_->refs.end(), [](auto n) { return n != 0; }));
  }
  [[nodiscard]] std::uint64_t recycled_peers() const {
    std::lock_guard lock(reg_->mu);
    return reg_->recycled;
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return reg_->capacity; }

 private:
  struct chunk {
    std::array<std::array<rail_state, kMaxLocal>, kChunk> rails;
  };

  rail_health_config cfg_;
  std::shared_ptr<detail::rail_registry> reg_;
  std::array<std::atomic<chunk*>, kChunks> chunks_{};
};

inline void peer_refs::give_back() noexcept {
  if (!reg_) return;
  for (const std::uint32_t id : ids_)
    if (id != rail_table::kNoPeer) reg_->release(id);
  reg_.reset();
  ids_.clear();
}

}  // namespace tide::rdma::plan
