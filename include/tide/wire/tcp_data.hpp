#pragma once
/// Mooncake's TCP data-port protocol, byte for byte, and tide's
/// authentication exchange for data connections (research/gpu-and-tcp.md B1).
///
/// A request is a 24-byte header: u64 size, u64 addr (the target's virtual
/// address), u8 opcode, 7 bytes of padding (Mooncake leaves them
/// uninitialised; readers ignore them, tide writes zeros); both integers
/// little-endian.  Opcode 1 is WRITE, anything else READ; bit 0x80 marks a
/// version-2 peer, which gets 8-byte status frames:
///
///   WRITE  client: header, payload          server: status (after the last byte landed)
///   READ   client: header                   server: status, payload
///
/// A status is a little-endian u64 whose high half is the magic "MCTV"
/// (0x4D435456) and whose low half a code: 0 ok, 1 the address was rejected
/// (Mooncake's two).  tide's server also answers 2 (the buffer does not grant
/// the operation) and 3 (the buffer is going away or the server stops);
/// Mooncake's client reads any code but 0 as a failure.  Version-1 peers get
/// no status frames and one request per connection.
///
/// With a cluster secret, a data connection first runs this exchange (tide
/// peers only; Mooncake's cannot join a cluster with a secret):
///
///   client -> server  hello      16 bytes "tide-tcp-auth-v1"
///   server -> client  challenge  status ok, Ns (16 bytes)
///   client -> server  request    Nc (16), u16 identity length, identity, M1 (32)
///   server -> client  reply      status ok, M2 (32)        | status auth_failed, close
///
/// with M1 and M2 the handshake's MACs (wire/auth.hpp) over message type
/// kTcpDataAuthType and the body "tcp-data", so a data connection proves the
/// same secret, both ways, bound to the client's identity (its segment name)
/// and to both fresh nonces.  Every field has a fixed or capped size: the
/// server reads at most kTcpAuthRequestMax bytes before the MAC is checked.
///
/// Thread safety: pure functions.

#include <tide/transfer.hpp>
#include <tide/wire/frame.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace tide::wire {

inline constexpr std::size_t kTcpHeaderSize = 24;
inline constexpr std::size_t kTcpStatusSize = 8;
inline constexpr std::uint8_t kTcpOpRead = 0;
inline constexpr std::uint8_t kTcpOpWrite = 1;
inline constexpr std::uint8_t kTcpV2Flag = 0x80;
inline constexpr std::uint64_t kTcpStatusMagic = 0x4D435456;

/// One request header.
struct tcp_header {
  std::uint64_t size = 0;
  std::uint64_t addr = 0;
  transfer_op op = transfer_op::write;
  bool v2 = true;  ///< the 0x80 flag: the peer wants status frames
  friend bool operator==(const tcp_header&, const tcp_header&) = default;
};

using tcp_header_bytes = std::array<std::uint8_t, kTcpHeaderSize>;
[[nodiscard]] tcp_header_bytes encode_tcp_header(const tcp_header& h) noexcept;
/// Never fails: opcode 1 (under the flag) is WRITE, anything else READ, as
/// Mooncake's server reads it.  Range checks are the server's.
[[nodiscard]] tcp_header decode_tcp_header(std::span<const std::uint8_t, kTcpHeaderSize> b) noexcept;

/// Status codes (the low half of a status frame).
enum class tcp_status : std::uint32_t {
  ok = 0,
  addr_rejected = 1,  ///< no registered buffer holds the range (Mooncake's)
  access_denied = 2,  ///< tide: the buffer does not grant this operation
  unavailable = 3,    ///< tide: the buffer is being unregistered, or the server stops
  auth_failed = 4,    ///< tide: the data connection did not prove the cluster secret
};
[[nodiscard]] std::string_view to_string(tcp_status s) noexcept;

using tcp_status_bytes = std::array<std::uint8_t, kTcpStatusSize>;
[[nodiscard]] tcp_status_bytes encode_tcp_status(tcp_status s) noexcept;
/// The code of a status frame, or nullopt when its high half is not the
/// magic (a version-1 peer, or garbage).
[[nodiscard]] std::optional<std::uint32_t> decode_tcp_status(std::span<const std::uint8_t, kTcpStatusSize> b) noexcept;

/// What a request's failure at the server means to the initiator.
[[nodiscard]] errc tcp_status_errc(std::uint32_t code) noexcept;

// ---- the authentication exchange (secret set) ----
inline constexpr std::string_view kTcpAuthHello = "tide-tcp-auth-v1";
static_assert(kTcpAuthHello.size() == 16);
inline constexpr std::size_t kTcpAuthIdentityMax = 255;
/// The request's largest size: Nc, the length, the identity, M1.
inline constexpr std::size_t kTcpAuthRequestMax = 16 + 2 + kTcpAuthIdentityMax + 32;
/// The message type the MACs bind (none of Mooncake's frame types).
inline constexpr auto kTcpDataAuthType = static_cast<message_type>(0x44);
inline constexpr std::string_view kTcpDataAuthBody = "tcp-data";

}  // namespace tide::wire
