#pragma once
/// Mooncake's handshake framing (research/mooncake-wire.md §1), without I/O.
///
///   | u64 length, little-endian | u8 type | body |      length = 1 + body size
///   | u64 length, little-endian | body (JSON, first byte > 3) |   legacy: length = body size
///
/// Types: connect = 0, metadata = 1, notify = 2, probe = 3.  A payload whose
/// first byte is 4..0x7f is a legacy ("old protocol") untyped body, handled as
/// a connect and answered untyped.  A first byte of 0x80..0xff is an unknown
/// type (Mooncake compares a signed char, so it never sends one).  A length
/// of 0 or above the bound is rejected before any payload is buffered.
///
/// API in brief:
///   std::string wire = encode_frame(message_type::probe, "{}\n");
///   frame_decoder dec{max_payload};  dec.feed(p, n)  ->  complete / need_more / failed
///   result<frame> f = decode_frame(bytes, max_payload);  // exactly one frame
/// Used by the handshake server and client (net/handshake_*.hpp) and fuzzed
/// by test/fuzz/frame_fuzz.cpp.

#include <tide/result.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace tide::wire {

enum class message_type : std::uint8_t { connect = 0, metadata = 1, notify = 2, probe = 3 };

/// "connect", "metadata", "notify", "probe", or "unknown".
[[nodiscard]] std::string_view to_string(message_type t) noexcept;

inline constexpr std::size_t kFrameHeaderSize = 8;
/// Mooncake's default bound on a frame's length field (1 MiB).
inline constexpr std::size_t kDefaultMaxFrame = std::size_t{1} << 20;

/// One decoded frame.
struct frame {
  message_type type = message_type::connect;
  bool legacy = false;  ///< untyped old-protocol frame (type is then connect)
  std::string body;
};

/// Header + type byte + body.  Body is sent as given (Mooncake's bodies end in '\n').
[[nodiscard]] std::string encode_frame(message_type type, std::string_view body);
/// Header + body, no type byte: the reply to a legacy request.
[[nodiscard]] std::string encode_legacy_frame(std::string_view body);

/// Incremental decoder for one frame.  Feed bytes as they arrive; it buffers
/// at most the announced length, which is checked against the bound as soon
/// as the 8 header bytes are in.  Not thread-safe (one per connection).
class frame_decoder {
 public:
  enum class state : std::uint8_t { need_more, complete, failed };

  /// `max_payload`: largest accepted length field (type byte + body).
  explicit frame_decoder(std::size_t max_payload = kDefaultMaxFrame) noexcept
      : max_payload_(max_payload) {}

  /// Consumes bytes up to the end of the frame; returns how many were used
  /// (fewer than `n` once the frame is complete or has failed).
  std::size_t feed(const void* data, std::size_t n);
  [[nodiscard]] state current() const noexcept { return state_; }
  /// Why decoding failed: errc::frame_too_large (length 0 or over the bound)
  /// or errc::protocol_error (unknown type byte).  Valid when failed.
  [[nodiscard]] const error& failure() const noexcept { return error_; }
  /// The decoded frame; valid once, when complete.
  [[nodiscard]] frame take() noexcept { return std::move(frame_); }
  /// Bytes still missing from the frame (header first), 0 when done.
  [[nodiscard]] std::size_t bytes_wanted() const noexcept;
  /// Bytes buffered so far (the server's memory accounting).
  [[nodiscard]] std::size_t buffered() const noexcept { return frame_.body.size(); }

 private:
  void on_header();
  void on_first_payload_byte(unsigned char c);

  std::size_t max_payload_;
  unsigned char header_[kFrameHeaderSize]{};
  std::size_t header_have_ = 0;
  std::uint64_t length_ = 0;     // payload bytes announced
  std::uint64_t payload_have_ = 0;
  state state_ = state::need_more;
  error error_;
  frame frame_;
};

/// Decodes exactly one frame from `bytes`; a short buffer is
/// errc::protocol_error ("truncated"), trailing bytes likewise.
[[nodiscard]] result<frame> decode_frame(std::string_view bytes, std::size_t max_payload = kDefaultMaxFrame);

}  // namespace tide::wire
