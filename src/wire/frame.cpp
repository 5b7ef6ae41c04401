#include <tide/wire/frame.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace tide::wire {

std::string_view to_string(message_type t) noexcept {
  switch (t) {
    case message_type::connect: return "connect";
    case message_type::metadata: return "metadata";
    case message_type::notify: return "notify";
    case message_type::probe: return "probe";
  }
  return "unknown";
}

namespace {

void put_le64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::string encode_frame(message_type type, std::string_view body) {
  std::string out;
  out.reserve(kFrameHeaderSize + 1 + body.size());
  put_le64(out, body.size() + 1);
  out.push_back(static_cast<char>(type));
  out.append(body);
  return out;
}

std::string encode_legacy_frame(std::string_view body) {
  std::string out;
  out.reserve(kFrameHeaderSize + body.size());
  put_le64(out, body.size());
  out.append(body);
  return out;
}

std::size_t frame_decoder::bytes_wanted() const noexcept {
  if (state_ != state::need_more) return 0;
  if (header_have_ < kFrameHeaderSize) return kFrameHeaderSize - header_have_;
  return static_cast<std::size_t>(length_ - payload_have_);
}

void frame_decoder::on_header() {
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | header_[i];
  if (len == 0) {
    state_ = state::failed;
    error_ = error{errc::frame_too_large, "frame length is 0"};
    return;
  }
  if (len > max_payload_) {
    state_ = state::failed;
    error_ = error{errc::frame_too_large, "frame length " + std::to_string(len) +
                                              " exceeds the bound " + std::to_string(max_payload_)};
    return;
  }
  length_ = len;
}

void frame_decoder::on_first_payload_byte(unsigned char c) {
  if (c <= 3) {
    frame_.type = static_cast<message_type>(c);
    frame_.legacy = false;
  } else if (c < 0x80) {
    // Untyped old-protocol body: this byte is already part of the JSON.
    frame_.type = message_type::connect;
    frame_.legacy = true;
    frame_.body.push_back(static_cast<char>(c));
  } else {
    state_ = state::failed;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", c);
    error_ = error{errc::protocol_error, std::string("unknown message type ") + hex};
  }
}

std::size_t frame_decoder::feed(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t used = 0;
  while (used < n && state_ == state::need_more) {
    if (header_have_ < kFrameHeaderSize) {
      const std::size_t take = std::min(n - used, kFrameHeaderSize - header_have_);
      std::memcpy(header_ + header_have_, p + used, take);
      header_have_ += take;
      used += take;
      if (header_have_ == kFrameHeaderSize) on_header();
      continue;
    }
    if (payload_have_ == 0) {
      on_first_payload_byte(p[used]);
      ++used;
      ++payload_have_;
    } else {
      const std::size_t take =
          static_cast<std::size_t>(std::min<std::uint64_t>(n - used, length_ - payload_have_));
      frame_.body.append(reinterpret_cast<const char*>(p + used), take);
      used += take;
      payload_have_ += take;
    }
    if (state_ == state::need_more && payload_have_ == length_) state_ = state::complete;
  }
  return used;
}

result<frame> decode_frame(std::string_view bytes, std::size_t max_payload) {
  frame_decoder dec{max_payload};
  const std::size_t used = dec.feed(bytes.data(), bytes.size());
  switch (dec.current()) {
    case frame_decoder::state::failed:
      return fail(dec.failure());
    case frame_decoder::state::need_more:
      return fail(errc::protocol_error, "truncated frame: " + std::to_string(dec.bytes_wanted()) +
                                            " more bytes expected");
    case frame_decoder::state::complete:
      break;
  }
  if (used != bytes.size()) {
    return fail(errc::protocol_error,
                std::to_string(bytes.size() - used) + " trailing bytes after the frame");
  }
  return dec.take();
}

}  // namespace tide::wire
