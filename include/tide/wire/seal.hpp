#pragma once
/// Sealed buffer entries: what a descriptor's reader must not learn without
/// the cluster secret (a buffer's addr, rkeys and lkeys) is encrypted with
/// AES-256-GCM (libcrypto) under K_seal (auth.hpp), with a fresh 12-byte
/// nonce per seal.  The associated data binds the blob to its place:
///   "tide-seal-v2" | segment name | buffer id | buffer name | length | access
/// (each variable part length-prefixed; a buffer without an id, as Mooncake
/// writes them, is bound to its index instead), so a blob moved to another
/// segment, id, name, length or access level fails to open.  The id, not the
/// index, because ids are what peers address and they stay put when an
/// earlier buffer is unregistered: a blob need not be sealed again then
/// (seal_cache).  The JSON field is "sealed": hex(nonce | ciphertext |
/// 16-byte tag); descriptors.cpp writes it instead of addr/rkey/lkey when a
/// secret is configured.
///
/// The rest of a sealed descriptor is authenticated by descriptor MACs
/// (descriptor_mac): the routing fields (rdma_server_name, the devices and
/// their GIDs, the priority matrix) decide where our handshakes and WRs go,
/// and the buffer list (ids, order, which blobs) decides which remote buffer
/// a WRITE lands in.
///
/// Thread-safe: the free functions keep no state (seal_cache is one
/// encoder's).

#include <tide/result.hpp>
#include <tide/wire/auth.hpp>
#include <tide/wire/descriptors.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tide::wire {

/// hex(nonce | AES-256-GCM(addr, rkey[], lkey[]) | tag).  Errors:
/// errc::auth_failed when the RNG or cipher fails (never in practice).
[[nodiscard]] result<std::string> seal_buffer(const cluster_secret& s, std::string_view segment_name,
                                              std::size_t index, const buffer_desc& b);
/// Buffers sealed by seal_buffer in this process so far (all threads): what
/// tests count to see that a publish seals only what changed.
[[nodiscard]] std::uint64_t seals_done() noexcept;
/// Opens `sealed` into b.addr, b.rkey, b.lkey (b.id, b.name, b.length and
/// b.access must already hold the values it was sealed with).  Errors:
/// errc::metadata_malformed "buffers[<index>].sealed: ..." (not hex, too
/// short, or the tag does not verify: tampered or sealed under another secret).
[[nodiscard]] status open_buffer(const cluster_secret& s, std::string_view segment_name, std::size_t index,
                                 std::string_view sealed, buffer_desc& b);

/// HMAC-SHA256 under K_desc (auth.hpp) of one section of a sealed descriptor:
///   "tide-desc-v1" | section | segment name | timestamp | canonical
/// (each part length-prefixed).  `canonical` is the section's compact JSON
/// as nlohmann writes it (keys sorted).  The name and timestamp are in every
/// section's MAC, so sections of two descriptors, or of two publishes of one,
/// cannot be mixed.
[[nodiscard]] std::array<std::uint8_t, 32> descriptor_mac(const cluster_secret& s, std::string_view section,
                                                          std::string_view segment_name, std::string_view timestamp,
                                                          std::string_view canonical);
/// Constant-time check of hex `mac` against descriptor_mac(...).
[[nodiscard]] bool verify_descriptor_mac(const cluster_secret& s, std::string_view section,
                                         std::string_view segment_name, std::string_view timestamp,
                                         std::string_view canonical, std::string_view mac);

/// The encoded entries of the last descriptor, by buffer: each buffer's JSON
/// object (with its sealed blob, with a secret) and its MAC.  A publish
/// encodes and seals only the buffers that are new or changed, and the rest
/// of its work on the buffer list is copying bytes: registering N buffers one
/// by one costs N seals and N JSON encodes, not N^2/2 of each.  An entry is
/// reused only for the same secret, segment name and buffer (every field
/// equal), so reuse is invisible to a reader: it is the entry the last publish
/// already showed.
/// Not thread-safe: one encode at a time (segment_cache::publish_json holds a
/// mutex around it).
class seal_cache {
 public:
  struct entry {
    std::string json;                 ///< the buffer's compact JSON object
    std::array<std::uint8_t, 32> mac{};  ///< descriptor_mac("buffer", segment, "", json); with a secret only
  };
  /// Starts one encode of segment `segment_name` under `s` (null: no
  /// secret).  Entries of another secret or segment name are dropped here,
  /// once, so find() compares only the buffer.
  void begin(const cluster_secret* s, std::string_view segment_name);
  /// The entry of a buffer equal to `b` encoded by an earlier encode (marked
  /// as used by this one), else nullptr.
  [[nodiscard]] const entry* find(std::size_t index, const buffer_desc& b);
  /// Stores `e` as b's entry (marked as used) and returns it.
  const entry& store(std::size_t index, const buffer_desc& b, entry e);
  /// Forgets the entries this encode did not use (buffers gone).  Walks the
  /// entries only when some were not used: a publish after registrations
  /// alone costs nothing here.
  void sweep();
  /// Entries held; buffers encoded (with a secret: sealed) anew since construction.
  [[nodiscard]] std::size_t size() const noexcept { return by_key_.size(); }
  [[nodiscard]] std::uint64_t misses() const noexcept { return misses_; }
  /// What the next encode should reserve: the last one's size and a margin,
  /// so a descriptor grown by a buffer is not copied again while it is built.
  [[nodiscard]] std::size_t last_size() const noexcept { return last_size_ + last_size_ / 8 + 1024; }
  void set_last_size(std::size_t n) noexcept { last_size_ = n; }

 private:
  struct slot {
    buffer_desc buffer;
    entry e;
    std::uint64_t used_in = 0;  ///< the encode (gen_) that last used it
  };
  static std::uint64_t key_of(std::size_t index, const buffer_desc& b) noexcept {
    return b.id ? *b.id : (std::uint64_t{1} << 32) + index;  // ids are 32-bit: no collision
  }
  const cluster_secret* secret_ = nullptr;
  std::string segment_;
  std::unordered_map<std::uint64_t, slot> by_key_;
  std::uint64_t gen_ = 0;        ///< encodes begun
  std::size_t used_ = 0;         ///< slots marked by the current encode
  std::uint64_t misses_ = 0;
  std::size_t last_size_ = 0;
};

}  // namespace tide::wire
