#pragma once
/// Forwarding header: the handshake framing lives in the wire layer
/// (tide/wire/frame.hpp, below both metadata/ and net/).  The names stay
/// usable as tide::net::*.

#include <tide/wire/frame.hpp>

namespace tide::net {
using wire::decode_frame;
using wire::encode_frame;
using wire::encode_legacy_frame;
using wire::frame;
using wire::frame_decoder;
using wire::kDefaultMaxFrame;
using wire::kFrameHeaderSize;
using wire::message_type;
using wire::to_string;
}  // namespace tide::net
