#pragma once
/// GIDs: the 16-byte port addresses of RoCE / InfiniBand, their text form in
/// Mooncake's format, and the choice of a GID index from the port's table.

#include <tide/result.hpp>

#include <infiniband/verbs.h>

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::verbs {

/// A 16-byte GID (network byte order, as in `ibv_gid::raw`).
struct gid {
  std::array<std::uint8_t, 16> raw{};

  /// 16 lowercase `%02x` bytes joined by ':' (47 characters), the format of
  /// Mooncake's segment descriptors and handshake. Allocates.
  [[nodiscard]] std::string to_string() const;
  /// True when every byte is 0 (an empty GID table slot).
  [[nodiscard]] bool is_zero() const noexcept;
  /// True for `::ffff:a.b.c.d` (the RoCE v2 GID of an IPv4 address).
  [[nodiscard]] bool is_ipv4_mapped() const noexcept;
  /// True for fe80::/10 (IPv6 link-local; RoCE v1/v2 default GID).
  [[nodiscard]] bool is_link_local() const noexcept;

  [[nodiscard]] static gid from_ibv(const ibv_gid& g) noexcept;
  [[nodiscard]] ibv_gid to_ibv() const noexcept;

  friend bool operator==(const gid&, const gid&) = default;
  friend auto operator<=>(const gid&, const gid&) = default;
};

/// Parses Mooncake's GID text: exactly 16 ':'-separated hex values of 1 or 2
/// digits each (upper or lower case), nothing before or after. The compressed
/// IPv6 form ("fe80::1") is rejected, as Mooncake rejects it.
/// Errors: invalid_argument with a detail naming the part and what was wrong.
[[nodiscard]] result<gid> parse_gid(std::string_view text);

/// Parses the sysfs form of a GID ("fe80:0000:...:0001": 8 groups of 4 hex digits).
/// Errors: invalid_argument.
[[nodiscard]] result<gid> parse_sysfs_gid(std::string_view text);

/// The type of a GID table entry as sysfs reports it.
enum class gid_type : std::uint8_t {
  ib_roce_v1,  ///< "IB/RoCE v1"
  roce_v2,     ///< "RoCE v2"
  unknown,     ///< the type file is missing or unreadable (unused slot)
};

/// One populated entry of a port's GID table.
struct gid_entry {
  int index = -1;
  gid value;
  gid_type type = gid_type::unknown;
  std::string netdev;  ///< the net device behind the GID; empty on InfiniBand
};

/// Reads the populated (non-zero) GID table entries of `device`'s `port` from
/// `<sysfs_root>/class/infiniband/<device>/ports/<port>/gids/*`, with their
/// types (gid_attrs/types/*) and net devices (gid_attrs/ndevs/*), in index order.
/// Errors: device_not_found when the device or port directory does not exist.
/// Any thread; reads a few dozen small files.
[[nodiscard]] result<std::vector<gid_entry>> read_gid_table(std::string_view device, int port,
                                                            std::string_view sysfs_root = "/sys");

/// Picks the GID index to use on `device`/`port`.
///
/// With `explicit_index >= 0` that index is used after checking that it is a
/// populated entry (errors: gid_not_found naming the index and the table size).
/// Otherwise the best entry wins, in this order: a RoCE v2 IPv4-mapped GID with a
/// net device; a RoCE v2 GID with a net device that is not link-local; any
/// RoCE v2 GID with a net device; on InfiniBand (no net devices at all) the first
/// populated entry. Ties go to the lowest index.
/// Errors: device_not_found (no such device/port), gid_not_found (no usable entry).
[[nodiscard]] result<int> select_gid_index(std::string_view device, int port, int explicit_index = -1,
                                           std::string_view sysfs_root = "/sys");

/// Picks from an already read table (what select_gid_index does after reading).
[[nodiscard]] result<int> select_gid_index(const std::vector<gid_entry>& table, std::string_view device,
                                           int port, int explicit_index = -1);

}  // namespace tide::verbs
