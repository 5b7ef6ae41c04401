#pragma once
/// Forwarding header: handshake names live in the wire layer
/// (tide/wire/address.hpp).  The names stay usable as tide::net::*.

#include <tide/wire/address.hpp>

namespace tide::net {
using wire::format_peer_address;
using wire::kDefaultHandshakePort;
using wire::make_nic_path;
using wire::nic_path;
using wire::parse_peer_address;
using wire::peer_address;
using wire::split_nic_path;
}  // namespace tide::net
