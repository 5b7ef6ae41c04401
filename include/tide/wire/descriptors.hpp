#pragma once
/// Segment, buffer, device, handshake and notify descriptors, and their JSON.
///
/// The JSON is Mooncake's (field names, types and layout; see
/// research/mooncake-wire.md §2-3), so a Mooncake peer reads what tide writes
/// and the other way round.  The codecs live in src/wire/descriptors.cpp (the wire layer,
/// below metadata/ and net/);
/// this header pulls in no JSON library.
///
/// API in brief:
///   segment_desc d{...};                 // built by the data path when it registers memory
///   std::string j = encode_segment(d);   // compact JSON ending in '\n'
///   result<segment_desc> r = decode_segment(j);   // validates everything
///   status s = validate_segment(d);      // the same checks, without JSON
///   find_buffer_index(d, addr, len)      // which buffer holds [addr, addr+len)
///   encode_handshake / decode_handshake, encode_notify / decode_notify
///   parse_gid / format_gid               // "fe:80:00:...:01", 16 colon-separated bytes
///
/// Every decoder either returns a complete, validated descriptor or
/// errc::metadata_malformed with a detail naming the field
/// ("buffers[1].rkey: expected 2 keys (one per device), got 1"); never a
/// partly filled one.  All functions are thread-safe (no shared state).

#include <tide/result.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tide {

namespace wire {
class cluster_secret;
class seal_cache;
}

/// Most devices a segment descriptor may list (the path selector considers
/// 64 peer devices) and most buffers; decoders refuse more before any
/// per-element work.
inline constexpr std::size_t kMaxSegmentDevices = 64;
inline constexpr std::size_t kMaxSegmentBuffers = std::size_t{1} << 20;

/// What peers may do to a registered buffer.  The MR's access flags follow
/// it (remote_read: REMOTE_READ only; local_only: no remote flag, and the
/// buffer is never published).  No REMOTE_ATOMIC in any of them.
enum class buffer_access : std::uint8_t { local_only, remote_read, remote_write, remote_read_write };

/// "local_only", "remote_read", "remote_write", "remote_read_write".
[[nodiscard]] std::string_view to_string(buffer_access a) noexcept;
[[nodiscard]] constexpr bool allows_read(buffer_access a) noexcept {
  return a == buffer_access::remote_read || a == buffer_access::remote_read_write;
}
[[nodiscard]] constexpr bool allows_write(buffer_access a) noexcept {
  return a == buffer_access::remote_write || a == buffer_access::remote_read_write;
}

/// A 128-bit RDMA GID in network byte order (same layout as ibv_gid::raw).
struct gid_bytes {
  std::array<std::uint8_t, 16> raw{};
  friend bool operator==(const gid_bytes&, const gid_bytes&) = default;
};

/// Parses Mooncake's GID text: exactly 16 hex bytes (1 or 2 digits each,
/// either case) joined by ':'; nothing before or after.  The compressed IPv6
/// form ("fe80::1") is rejected, as Mooncake does.
/// Errors: errc::metadata_malformed ("gid: ...").
[[nodiscard]] result<gid_bytes> parse_gid(std::string_view text);
/// Formats as 16 lowercase "%02x" bytes joined by ':' (47 characters).
[[nodiscard]] std::string format_gid(const gid_bytes& gid);

/// One RDMA NIC of a segment's owner.  `devices[i]` pairs with every
/// buffer's rkey[i] / lkey[i].
struct device_desc {
  std::string name;       ///< e.g. "mlx5_0", "rxe0"
  std::uint16_t lid = 0;  ///< port LID (0 on RoCE)
  gid_bytes gid;          ///< the GID peers must address
  friend bool operator==(const device_desc&, const device_desc&) = default;
};

/// One registered memory region.
struct buffer_desc {
  std::string name;                 ///< location tag ("cpu:0", "*", "segments:...")
  std::uint64_t addr = 0;           ///< virtual address in the owner's process
  std::uint64_t length = 0;         ///< bytes
  std::vector<std::uint32_t> lkey;  ///< one per device, in devices[] order
  std::vector<std::uint32_t> rkey;  ///< one per device, in devices[] order
  /// tide's extension, JSON "access" ("remote_read" / "remote_write"),
  /// written only when not the default; Mooncake ignores it, and a buffer
  /// without it (every Mooncake buffer) allows both.
  buffer_access access = buffer_access::remote_read_write;
  /// tide's extension, JSON "reach": "tcp", written only when set: no NIC of
  /// the owner registers this buffer (GPU memory without GPUDirect), so its
  /// keys are 0 and peers reach it over TCP.  Mooncake ignores it.
  bool tcp_only = false;
  /// tide's stable buffer id (JSON "id"; Mooncake's reader ignores it).
  /// Absent in Mooncake's descriptors: the id is then the buffer's index.
  std::optional<std::uint32_t> id = std::nullopt;  // initialised: brace-inits of the fields above stay warning-free
  friend bool operator==(const buffer_desc&, const buffer_desc&) = default;
};

/// A row of the priority matrix: NICs preferred for a location, then the others usable.
struct priority_entry {
  std::vector<std::string> preferred;
  std::vector<std::string> available;
  friend bool operator==(const priority_entry&, const priority_entry&) = default;
};
/// location -> NICs; JSON `{"cpu:0":[["mlx5_0"],["mlx5_1"]]}`.  Sorted by key,
/// as Mooncake's topology walks it.
using priority_matrix = std::map<std::string, priority_entry, std::less<>>;

/// Everything a peer needs to address a process's registered memory.
struct segment_desc {
  std::string name;                ///< segment name ("host:port" in p2p mode)
  std::string protocol = "rdma";   ///< tide writes "rdma"
  std::vector<device_desc> devices;
  std::vector<buffer_desc> buffers;
  priority_matrix priority;        ///< JSON "priority_matrix"
  std::string timestamp;           ///< informational ("2026-01-01 12:00:00.123456")
  std::uint16_t tcp_data_port = 0;
  std::uint32_t tcp_proto_version = 1;
  std::optional<std::string> rdma_server_name;  ///< peers build NIC paths from it when set
  /// tide's extension (JSON "tide_incarnation", 16 hex digits): drawn at
  /// random when the publishing engine is created.  Buffer ids are unique
  /// within one incarnation only (they start again at 0 when the process
  /// restarts under the same segment name), so a reader holding ids from
  /// one incarnation must not use them against another.  Absent in
  /// Mooncake's descriptors.
  std::optional<std::uint64_t> incarnation;
  /// tide's extension, written with a cluster secret only (bound by the
  /// header MAC, so a store writer without the secret can change neither):
  /// "tide_stamp", microseconds of UTC when published, strictly increasing
  /// per publisher, so a reader can refuse an older descriptor than one it
  /// has seen (a replay); and "tide_handshake", the publisher's handshake
  /// address ("host:port"), which readers with the secret use instead of
  /// the unauthenticated rpc_meta entry.
  std::optional<std::uint64_t> stamp;
  std::optional<std::string> handshake;
  friend bool operator==(const segment_desc&, const segment_desc&) = default;
};

/// What a publish adds to a descriptor without copying it (segment_cache
/// stamps every publish): each field set here is written in place of the
/// descriptor's own.
struct publish_marks {
  std::string_view timestamp;
  std::optional<std::uint64_t> incarnation;
  std::optional<std::uint64_t> stamp;
  std::optional<std::string_view> handshake;
};

/// The Connection (type 0) message; request and reply alike.
struct handshake_desc {
  std::string payload;         ///< opaque; "" for RDMA
  std::string local_nic_path;  ///< sender's "<server>@<nic>"
  std::string peer_nic_path;   ///< the receiver's NIC path the sender targets
  std::uint16_t local_lid = 0;
  std::optional<gid_bytes> local_gid;   ///< absent = JSON "" (look it up in devices[])
  std::vector<std::uint32_t> qp_num;    ///< sender's QPs; index i pairs with the receiver's QP i
  /// Presence (even false) announces ready-ack support; true marks the ack
  /// message itself.  Absent = a legacy peer: no ack.
  std::optional<bool> ready_ack;
  std::string reply_msg;       ///< "" = accepted; otherwise the reason for rejecting
  /// tide's extension: the sender's active path MTU in bytes (256..4096).
  /// Mooncake ignores the field; absent when the peer is Mooncake.
  std::optional<std::uint32_t> mtu;
  /// tide's extension: the sender's initial send PSN per QP (24 bits, same
  /// order as qp_num).  Absent from Mooncake, which fixes every PSN at 0:
  /// then both ends use 0.
  std::optional<std::vector<std::uint32_t>> psn;
  /// tide's extension (JSON "notify_credits"): the sender of this desc posts
  /// that many receives on QP 0 for transfer-bound notifications sent as
  /// RDMA SENDs (rdma/detail/notify_qp.hpp), 1..kMaxNotifyCredits.  Absent
  /// (Mooncake, or a tide peer with notify_rdma_credits = 0): notifications
  /// to it go over TCP.
  std::optional<std::uint32_t> notify_credits;
  friend bool operator==(const handshake_desc&, const handshake_desc&) = default;
};

/// Most receive credits a handshake may advertise for RDMA notifications.
inline constexpr std::uint32_t kMaxNotifyCredits = 64;

/// Names one transfer-bound notification: its sending engine (a random
/// origin drawn when the engine starts) and a sequence number there.  A SEND
/// whose completion teardown flushed is sent again over TCP, and only the
/// target can tell whether the first copy arrived: its inbox drops an id it
/// has already taken.
struct notify_id {
  std::uint64_t origin = 0;
  std::uint64_t seq = 0;
  friend bool operator==(const notify_id&, const notify_id&) = default;
};

/// The Notify (type 2) message.
struct notify_desc {
  std::string name;
  std::string notify_msg;
  /// tide's extension (JSON "tide_id": {"origin", "seq"}), set on
  /// transfer-bound notifications; Mooncake ignores it and never sends it.
  /// The inbox consumes it: take_notifies() returns messages without it.
  std::optional<notify_id> id{};
  friend bool operator==(const notify_desc&, const notify_desc&) = default;
};

/// Checks a segment descriptor as decode_segment does: non-empty name and
/// protocol; at most kMaxSegmentDevices devices and kMaxSegmentBuffers
/// buffers (checked first); device names non-empty and unique; every buffer named, addr != 0,
/// length != 0, no wrap-around past 2^64, no two buffers overlapping; for
/// protocol "rdma" lkey and rkey have one entry per device (other protocols:
/// when rkey is non-empty).  Errors: errc::metadata_malformed naming the field.
/// Cost: O(buffers log buffers).
[[nodiscard]] status validate_segment(const segment_desc& desc);

/// Compact JSON (keys sorted, as jsoncpp writes them) ending in '\n'.
/// Does not validate; invalid UTF-8 in strings is replaced by U+FFFD.
/// With `seal` (a cluster secret), every buffer's addr, rkey and lkey are
/// replaced by one "sealed" field (wire/seal.hpp): readers of the metadata
/// store learn names, lengths and access, never an address or a key.
/// With `seal` the descriptor also carries "mac": {"header", "devices",
/// "priority_matrix", "buffers"}, HMACs under K_desc of everything else
/// (wire/seal.hpp descriptor_mac), so a store writer without the secret can
/// change no field: not where handshakes go (rdma_server_name), not the
/// GIDs, not which id names which buffer.
/// With `cache`, buffers equal to ones sealed by an earlier call keep their
/// blob (wire::seal_cache): a publish seals only what changed.
/// Errors only with `seal`, when the cipher fails: errc::auth_failed.
[[nodiscard]] std::string encode_segment(const segment_desc& desc);
[[nodiscard]] result<std::string> encode_segment(const segment_desc& desc, const wire::cluster_secret* seal);
[[nodiscard]] result<std::string> encode_segment(const segment_desc& desc, const wire::cluster_secret* seal,
                                                 wire::seal_cache* cache);
/// As above, with `timestamp` written (and, with `seal`, bound by the MACs)
/// in place of desc.timestamp: a publisher stamps its descriptor without
/// copying it.
[[nodiscard]] result<std::string> encode_segment(const segment_desc& desc, const wire::cluster_secret* seal,
                                                 wire::seal_cache* cache, std::string_view timestamp);
/// As above, with every field `marks` sets written in place of desc's.
[[nodiscard]] result<std::string> encode_segment(const segment_desc& desc, const wire::cluster_secret* seal,
                                                 wire::seal_cache* cache, const publish_marks& marks);
/// Parses and validates.  Unknown fields are ignored.  Required: name,
/// protocol, buffers, and for "rdma" devices and priority_matrix; optional:
/// timestamp, tcp_data_port, tcp_proto_version (default 1), rdma_server_name,
/// tide_incarnation (16 hex digits), tide_stamp (an unsigned integer),
/// tide_handshake ("host:port" with a port), and per buffer access.  Without `seal` a sealed buffer is
/// metadata_malformed ("buffers[i].sealed: ... configure auth_secret_file");
/// with it every buffer must be sealed (an unsealed one, which anyone who can
/// write the store could have put there, is metadata_malformed), one that
/// fails to open is metadata_malformed "buffers[i].sealed: authentication
/// failed ...", and a missing or wrong MAC is metadata_malformed naming its
/// section ("mac.devices: does not verify: ...").  Sealed or not, a buffer's
/// "id" is kept.  More than kMaxSegmentDevices devices or kMaxSegmentBuffers
/// buffers is refused before they are read.
[[nodiscard]] result<segment_desc> decode_segment(std::string_view json);
[[nodiscard]] result<segment_desc> decode_segment(std::string_view json, const wire::cluster_secret* seal);

/// `ready_ack`, `mtu`, `psn` and `notify_credits` are written only when set.
[[nodiscard]] std::string encode_handshake(const handshake_desc& desc);
/// Required: local_nic_path, peer_nic_path, local_lid, local_gid, qp_num;
/// optional: payload, reply_msg, ready_ack, mtu (one of 256, 512, 1024,
/// 2048, 4096), psn, notify_credits (1..kMaxNotifyCredits).
[[nodiscard]] result<handshake_desc> decode_handshake(std::string_view json);

/// `tide_id` is written only when set.
[[nodiscard]] std::string encode_notify(const notify_desc& desc);
/// Required: name, notify_msg (strings); optional: tide_id (an object of two
/// unsigned integers, origin and seq).
[[nodiscard]] result<notify_desc> decode_notify(std::string_view json);

/// Syntax check only: `text` is one JSON value (surrounding whitespace
/// allowed) nested at most 32 deep.  Errors: errc::metadata_malformed with the
/// parser's message.  The handshake server drops requests that fail it.
[[nodiscard]] status validate_json(std::string_view text);

/// Index of the first buffer that holds all of [addr, addr + length), or
/// nullopt (also for length 0).  The seeds' selectDevice address test.
/// Thread-safe, noexcept, no allocation; O(buffers).
[[nodiscard]] std::optional<std::size_t> find_buffer_index(const segment_desc& desc,
                                                           std::uint64_t addr,
                                                           std::uint64_t length) noexcept;

/// Local time as Mooncake writes it: "YYYY-MM-DD HH:MM:SS.uuuuuu".
[[nodiscard]] std::string current_timestamp();

/// Mooncake's key for a segment descriptor: "mooncake/[<cluster_id>/]ram/<name>",
/// or "mooncake/[<cluster_id>/]<name>" when the name already contains '/'.
[[nodiscard]] std::string segment_key(std::string_view cluster_id, std::string_view name);

/// Mooncake's key for a server's handshake address in etcd/HTTP mode:
/// "mooncake/[<cluster_id>/]rpc_meta/<server_name>".  Mooncake peers read it
/// to learn where to send handshake requests to <server_name>.
[[nodiscard]] std::string rpc_meta_key(std::string_view cluster_id, std::string_view server_name);

/// The value stored under rpc_meta_key: {"ip_or_host_name":<host>,"rpc_port":<port>}
/// (compact, keys sorted, no trailing newline).
[[nodiscard]] std::string encode_rpc_meta(std::string_view host, std::uint16_t port);

/// A server's handshake address as stored under rpc_meta_key.
struct rpc_meta {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const rpc_meta&, const rpc_meta&) = default;
};
/// Parses Mooncake's rpc_meta value (jsoncpp output: may end in '\n').
/// Errors: metadata_malformed naming the field (ip_or_host_name must be a
/// non-empty string, rpc_port 1..65535).
[[nodiscard]] result<rpc_meta> decode_rpc_meta(std::string_view json);

}  // namespace tide
