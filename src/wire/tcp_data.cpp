// wire::tcp_data — Mooncake's TCP data-port header and status frames (see the header).
#include <tide/wire/tcp_data.hpp>

namespace tide::wire {

namespace {
void put_le64(std::uint8_t* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t get_le64(const std::uint8_t* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

tcp_header_bytes encode_tcp_header(const tcp_header& h) noexcept {
  tcp_header_bytes b{};
  put_le64(b.data(), h.size);
  put_le64(b.data() + 8, h.addr);
  b[16] = static_cast<std::uint8_t>((h.op == transfer_op::write ? kTcpOpWrite : kTcpOpRead) | (h.v2 ? kTcpV2Flag : 0));
  return b;
}

tcp_header decode_tcp_header(std::span<const std::uint8_t, kTcpHeaderSize> b) noexcept {
  tcp_header h;
  h.size = get_le64(b.data());
  h.addr = get_le64(b.data() + 8);
  h.v2 = (b[16] & kTcpV2Flag) != 0;
  h.op = (b[16] & static_cast<std::uint8_t>(~kTcpV2Flag)) == kTcpOpWrite ? transfer_op::write : transfer_op::read;
  return h;
}

std::string_view to_string(tcp_status s) noexcept {
  switch (s) {
    case tcp_status::ok: return "ok";
    case tcp_status::addr_rejected: return "address rejected";
    case tcp_status::access_denied: return "access denied";
    case tcp_status::unavailable: return "unavailable";
    case tcp_status::auth_failed: return "authentication failed";
  }
  return "unknown";
}

tcp_status_bytes encode_tcp_status(tcp_status s) noexcept {
  tcp_status_bytes b{};
  put_le64(b.data(), (kTcpStatusMagic << 32) | static_cast<std::uint32_t>(s));
  return b;
}

std::optional<std::uint32_t> decode_tcp_status(std::span<const std::uint8_t, kTcpStatusSize> b) noexcept {
  const std::uint64_t v = get_le64(b.data());
  if ((v >> 32) != kTcpStatusMagic) return std::nullopt;
  return static_cast<std::uint32_t>(v & 0xffffffffu);
}

errc tcp_status_errc(std::uint32_t code) noexcept {
  switch (static_cast<tcp_status>(code)) {
    case tcp_status::ok: return errc::ok;
    // As RDMA's remote access error: the peer's buffers may have changed.
    case tcp_status::addr_rejected: return errc::remote_access_error;
    case tcp_status::access_denied: return errc::remote_access_denied;
    case tcp_status::unavailable: return errc::busy;
    case tcp_status::auth_failed: return errc::auth_failed;
  }
  return errc::protocol_error;
}

}  // namespace tide::wire
