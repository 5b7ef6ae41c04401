#pragma once
/// Location tags: where a registered buffer's memory lives, as Mooncake
/// names it.  `cpu:N` (NUMA node N), `cuda:N` (GPU N), `*` (anywhere), and
/// `segments:<page_size>:<n0>,<n1>,...` (page i of the buffer lives on NUMA
/// node n_(i mod count): an interleaved or per-page placement).
///
/// The tag picks the NICs a slice prefers (see priority_matrix).

#include <tide/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::topology {

enum class location_kind : std::uint8_t { any, cpu, cuda, segments };

struct location {
  location_kind kind = location_kind::any;
  /// N of `cpu:N` / `cuda:N`; -1 otherwise.
  int index = -1;
  /// `segments:` only: the page size (> 0) and the node of each page.
  std::uint64_t page_size = 0;
  std::vector<int> nodes;

  /// Parses a tag.  Errors: errc::bad_location with a detail that names the
  /// offending part ("cpu:x: index is not a number", "segments:0:1: page size
  /// must be > 0", ...).  Any thread; allocates.
  [[nodiscard]] static result<location> parse(std::string_view text);

  /// The canonical text (`parse(l.to_string()) == l`).
  [[nodiscard]] std::string to_string() const;

  /// The NUMA node (cpu) or index (cuda) that byte `offset` of a buffer with
  /// this location lives on; -1 for `*`.  O(1), noexcept.
  [[nodiscard]] int index_at(std::uint64_t offset) const noexcept;

  /// The priority-matrix key that governs byte `offset`: "cpu:N", "cuda:N"
  /// or "*".  Allocates: setup path only.
  [[nodiscard]] std::string key_at(std::uint64_t offset) const;

  friend bool operator==(const location&, const location&) = default;
};

}  // namespace tide::topology
