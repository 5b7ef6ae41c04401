#pragma once
/// RDMA notifications between tide peers (issue 18), the endpoint's share:
/// the wire format of the SENDs on an endpoint's QP 0, the registered slab
/// they live in, and the credits.  Not API.
///
/// Both ends advertise in the handshake how many receives they post
/// (handshake_desc::notify_credits, R).  When both did, each end posts
/// R + kCreditReserve receives on its QP 0 before the QP leaves INIT (so no
/// SEND of a conforming peer can find an empty receive queue), and may have
/// at most the peer's R notification SENDs outstanding.  A peer that
/// advertises R and posts fewer receives draws RNR NAKs; QP 0 of such an
/// endpoint has finite RNR retries (kNotifyRnrRetry, endpoint.hpp), so it
/// fails instead of stalling for ever, its SENDs go over TCP, and the
/// context advertises no RDMA notifications to that peer again
/// (rdma_context::refuse_rdma_notify).  A receiver hands a credit message back
/// each time it has reposted R/2 notification receives; credit messages use
/// the kCreditReserve receives.  Why two suffice: a receiver sends credit
/// message k+2 only after it consumed R/2 notifications beyond those it
/// credited in k and k+1 (>= R together), which the sender can only have
/// sent after it processed message k (and reposted its receive first).
///
/// Ownership and threads: the endpoint owns its notify_qp.  prepare() runs
/// on the setup thread that connects the endpoint, before the connect
/// message reaches the lanes (the lane mailbox's mutex publishes it);
/// everything else runs on lane 0 of the endpoint's context (the owner of
/// QP 0), except enabled(), which is fixed before the endpoint is connected
/// and read by any thread after an acquire load of the endpoint's state.
/// The slab is deregistered after the QPs are destroyed (endpoint members).

#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/notify_send.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>
#include <tide/wire/descriptors.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

namespace tide::rdma::detail {

/// Bytes per receive and send buffer.  Both ends must use the same size (a
/// SEND larger than the receive buffer kills the QP), so it is a protocol
/// constant of the notify_credits extension, not a setting.
inline constexpr std::uint32_t kNotifySlot = 4608;
inline constexpr std::uint32_t kNotifyHeader = 8;
/// A message's header with its notify_id (version 2): kNotifyHeader, then
/// origin and seq.  Receivers take both versions; senders write version 2
/// when the message has an id (every transfer-bound one does).
inline constexpr std::uint32_t kNotifyIdHeader = kNotifyHeader + 16;
/// Receives kept for credit messages, and send buffers for them.
inline constexpr std::uint32_t kCreditReserve = 2;
inline constexpr std::uint32_t kMaxNotifyTx = kMaxNotifyCredits + kCreditReserve;

/// The first byte of every SEND on QP 0.
enum class notify_kind : std::uint8_t { message = 'N', credit = 'C' };

/// Encodes `n` as a message SEND into `out` (kNotifySlot bytes).  Returns
/// the length, or 0 when it does not fit (the caller falls back to TCP).
[[nodiscard]] inline std::uint32_t encode_notify_message(const notify_desc& n, std::byte* out) noexcept {
  const std::uint32_t header = n.id ? kNotifyIdHeader : kNotifyHeader;
  const std::size_t len = header + n.name.size() + n.notify_msg.size();
  if (len > kNotifySlot || n.name.size() > 0xffff) return 0;
  const auto nl = static_cast<std::uint16_t>(n.name.size());
  const auto ml = static_cast<std::uint32_t>(n.notify_msg.size());
  out[0] = std::byte{static_cast<std::uint8_t>(notify_kind::message)};
  out[1] = std::byte{static_cast<std::uint8_t>(n.id ? 2 : 1)};  // version
  std::memcpy(out + 2, &nl, 2);
  std::memcpy(out + 4, &ml, 4);
  if (n.id) {
    std::memcpy(out + kNotifyHeader, &n.id->origin, 8);
    std::memcpy(out + kNotifyHeader + 8, &n.id->seq, 8);
  }
  std::memcpy(out + header, n.name.data(), n.name.size());
  std::memcpy(out + header + n.name.size(), n.notify_msg.data(), n.notify_msg.size());
  return static_cast<std::uint32_t>(len);
}

[[nodiscard]] inline std::uint32_t encode_credit(std::uint32_t credits, std::byte* out) noexcept {
  out[0] = std::byte{static_cast<std::uint8_t>(notify_kind::credit)};
  out[1] = std::byte{1};
  const std::uint16_t zero = 0;
  std::memcpy(out + 2, &zero, 2);
  std::memcpy(out + 4, &credits, 4);
  return kNotifyHeader;
}

/// What a receive held: a message, credits, or garbage (a peer bug; dropped).
struct notify_decoded {
  notify_kind kind = notify_kind::message;
  bool ok = false;
  std::uint32_t credits = 0;
  notify_desc msg;
};
[[nodiscard]] inline notify_decoded decode_notify_send(const std::byte* in, std::uint32_t len) {
  notify_decoded d;
  if (len < kNotifyHeader || len > kNotifySlot) return d;
  const auto version = std::to_integer<std::uint8_t>(in[1]);
  std::uint16_t nl = 0;
  std::uint32_t v = 0;
  std::memcpy(&nl, in + 2, 2);
  std::memcpy(&v, in + 4, 4);
  if (in[0] == std::byte{static_cast<std::uint8_t>(notify_kind::credit)}) {
    d.kind = notify_kind::credit;
    d.credits = v;
    d.ok = version == 1 && len == kNotifyHeader && v <= kMaxNotifyCredits;
    return d;
  }
  if (in[0] != std::byte{static_cast<std::uint8_t>(notify_kind::message)} || (version != 1 && version != 2)) return d;
  const std::uint32_t header = version == 2 ? kNotifyIdHeader : kNotifyHeader;
  if (std::size_t{header} + nl + v != len) return d;
  if (version == 2) {
    notify_id id;
    std::memcpy(&id.origin, in + kNotifyHeader, 8);
    std::memcpy(&id.seq, in + kNotifyHeader + 8, 8);
    d.msg.id = id;
  }
  const char* p = reinterpret_cast<const char*>(in + header);
  d.msg.name.assign(p, nl);
  d.msg.notify_msg.assign(p + nl, v);
  d.ok = true;
  return d;
}

class notify_qp final : public wr_hook {
 public:
  notify_qp() = default;
  notify_qp(const notify_qp&) = delete;
  notify_qp& operator=(const notify_qp&) = delete;

  /// Both ends advertised (`local` receives here, `peer` there): allocates
  /// and registers the slab.  Setup thread, before the lanes connect QP 0.
  /// Errors: those of ibv_reg_mr (the endpoint then connects without RDMA
  /// notifications: the caller ignores the error after logging it).
  [[nodiscard]] status prepare(const verbs::protection_domain& pd, std::uint32_t local, std::uint32_t peer) {
    if (enabled_ || local == 0 || peer == 0) return {};
    local_ = std::min(local, kMaxNotifyCredits);
    peer_ = std::min(peer, kMaxNotifyCredits);
    const std::size_t slots = rx_slots() + tx_slots();
    slab_ = std::make_unique<std::byte[]>(slots * kNotifySlot);
    auto mr = verbs::memory_region::register_memory(pd, slab_.get(), slots * kNotifySlot, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) {
      slab_.reset();
      return fail(mr.error());
    }
    mr_.emplace(std::move(*mr));
    for (std::uint32_t i = 0; i < tx_slots(); ++i) {
      wr_[i] = slice{};
      wr_[i].hook = this;
    }
    tx_credits = peer_;
    tx_free_ = (tx_slots() >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << tx_slots()) - 1);
    enabled_ = true;
    return {};
  }

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// Receives posted on QP 0: R for messages, kCreditReserve for credits.
  [[nodiscard]] std::uint32_t rx_slots() const noexcept { return local_ + kCreditReserve; }
  [[nodiscard]] std::uint32_t local_credits() const noexcept { return local_; }
  [[nodiscard]] std::uint32_t tx_slots() const noexcept { return peer_ + kCreditReserve; }
  [[nodiscard]] std::byte* rx_buf(std::uint32_t i) noexcept { return slab_.get() + std::size_t{i} * kNotifySlot; }
  [[nodiscard]] std::byte* tx_buf(std::uint32_t i) noexcept {
    return slab_.get() + std::size_t{rx_slots() + i} * kNotifySlot;
  }
  [[nodiscard]] std::uint32_t lkey() const noexcept { return mr_->lkey(); }
  [[nodiscard]] slice& tx_wr(std::uint32_t i) noexcept { return wr_[i]; }

  /// A free send buffer: a message one among the first peer_ (and only with
  /// a credit), a credit message one among the last kCreditReserve.  -1:
  /// none.  Lane 0.
  [[nodiscard]] int take_tx(bool credit) noexcept {
    const std::uint32_t lo = credit ? peer_ : 0, hi = credit ? tx_slots() : peer_;
    for (std::uint32_t i = lo; i < hi; ++i)
      if ((tx_free_ >> i) & 1u) {
        tx_free_ &= ~(std::uint64_t{1} << i);
        return static_cast<int>(i);
      }
    return -1;
  }
  void give_back_tx(std::uint32_t i) noexcept { tx_free_ |= std::uint64_t{1} << i; }
  void set_item(std::uint32_t i, notify_send* n) noexcept { items_[i] = n; }

  /// A SEND of ours left the ring (completed, flushed, or the lane gave up on
  /// it): frees its buffer and tells its notification.  Lane 0.
  void wr_done(slice& s, errc e) noexcept override {
    const auto i = static_cast<std::uint32_t>(&s - wr_.data());
    give_back_tx(i);
    if (notify_send* n = items_[i]) {
      items_[i] = nullptr;
      n->sent(e == errc::ok);
    }
  }

  // ---- lane 0's counters ----
  std::uint32_t rx_posted = 0;   ///< receives posted on QP 0, not completed (each holds the endpoint)
  std::uint32_t tx_credits = 0;  ///< message SENDs the peer still has receives for
  std::uint32_t to_return = 0;   ///< message receives reposted, not yet credited back
  bool listed = false;           ///< in its lane's list of endpoints with receives
  std::int64_t progress_ns = 0;  ///< when credits last came back (the waiting list's clock)

 private:
  bool enabled_ = false;
  std::uint32_t local_ = 0, peer_ = 0;
  std::unique_ptr<std::byte[]> slab_;
  std::optional<verbs::memory_region> mr_;
  std::uint64_t tx_free_ = 0;  ///< bit i: send buffer i free
  std::array<slice, kMaxNotifyTx> wr_{};
  std::array<notify_send*, kMaxNotifyTx> items_{};
};

}  // namespace tide::rdma::detail
