#pragma once
/// Sealed buffer entries: what a descriptor's reader must not learn without
/// the cluster secret (a buffer's addr, rkeys and lkeys) is encrypted with
/// AES-256-GCM (libcrypto) under K_seal (auth.hpp), with a fresh 12-byte
/// nonce per seal.  The associated data binds the blob to its place:
///   "tide-seal-v1" | segment name | buffer index | buffer name | length | access
/// (each variable part length-prefixed), so a blob moved to another segment,
/// index, name, length or access level fails to open.  The JSON field is
/// "sealed": hex(nonce | ciphertext | 16-byte tag); descriptors.cpp writes it
/// instead of addr/rkey/lkey when a secret is configured.
///
/// Thread-safe (no shared state; each call owns its cipher context).

#include <tide/result.hpp>
#include <tide/wire/auth.hpp>
#include <tide/wire/descriptors.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace tide::wire {

/// hex(nonce | AES-256-GCM(addr, rkey[], lkey[]) | tag).  Errors:
/// errc::auth_failed when the RNG or cipher fails (never in practice).
[[nodiscard]] result<std::string> seal_buffer(const cluster_secret& s, std::string_view segment_name,
                                              std::size_t index, const buffer_desc& b);
/// Opens `sealed` into b.addr, b.rkey, b.lkey (b.name, b.length and b.access
/// must already hold the values it was sealed with).  Errors:
/// errc::metadata_malformed "buffers[<index>].sealed: ..." (not hex, too
/// short, or the tag does not verify: tampered or sealed under another secret).
[[nodiscard]] status open_buffer(const cluster_secret& s, std::string_view segment_name, std::size_t index,
                                 std::string_view sealed, buffer_desc& b);

}  // namespace tide::wire
