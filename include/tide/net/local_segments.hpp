#pragma once
/// The process-wide registry of descriptors this process serves in p2p mode.
///
/// In p2p mode a segment is named "host:port" after its owner's handshake
/// server, and peers fetch the descriptor from that port with a Metadata
/// request.  The p2p backend's put_segment("host:port", json) stores the JSON
/// here under the port; the handshake_server bound to that port answers
/// Metadata requests from here (unless its handlers supply local_segment).
/// Keyed by port because the port is what identifies a server within one
/// process; two servers cannot share a port.  remove_segment withdraws it, so
/// later Metadata requests are answered "null".
///
/// Thread-safe (a shared mutex; readers do not block each other).

#include <cstdint>
#include <optional>
#include <string>

namespace tide::net {

/// Publishes (or replaces) the JSON served on `port`.
void publish_local_segment(std::uint16_t port, std::string json);
/// Withdraws it; returns false when nothing was published on `port`.
bool withdraw_local_segment(std::uint16_t port);
/// The JSON published on `port`, if any (a copy).
[[nodiscard]] std::optional<std::string> local_segment(std::uint16_t port);

}  // namespace tide::net
