#pragma once
/// The priority matrix: for each location key ("cpu:0", "cuda:1"), the NICs
/// it prefers and the NICs it may fall back to, in Mooncake's JSON form
/// `{"cpu:0":[["mlx5_0"],["mlx5_1"]], ...}`.
///
/// Device ids: a matrix numbers its NICs by the order in which they first
/// appear when walking the keys in sorted order, each key's preferred list
/// before its available list (Mooncake's rule, mooncake-wire.md §6 pitfall 6).
/// A segment descriptor's devices[] and every buffer's rkey[]/lkey[] use that
/// order, so a peer can index them with the id it selects.

#include <tide/result.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tide::topology {

struct hca_info;
struct gpu_info;

/// The NICs of one location, as device ids of the matrix.
struct matrix_entry {
  std::vector<std::uint16_t> preferred;
  std::vector<std::uint16_t> available;

  /// Mooncake's selectDevice: retry 0 -> a NIC chosen by `random` among the
  /// preferred ones (among the available ones when none is preferred);
  /// retry k > 0 -> entry (k-1) mod |preferred + available| of the
  /// concatenated list, so successive retries walk every NIC once.
  /// Returns -1 when the entry lists no NIC.  Hot path: O(1), noexcept.
  [[nodiscard]] int select(unsigned retry, std::uint32_t random) const noexcept {
    const std::size_t np = preferred.size();
    const std::size_t total = np + available.size();
    if (total == 0) [[unlikely]] return -1;
    if (retry == 0) {
      if (np != 0) return preferred[random % np];
      return available[random % available.size()];
    }
    const std::size_t i = (retry - 1) % total;
    return i < np ? preferred[i] : available[i - np];
  }
};

class priority_matrix {
 public:
  priority_matrix() = default;

  /// Parses Mooncake's JSON.  Errors: errc::metadata_malformed naming the key
  /// (a value that is not an array of exactly two arrays of strings).
  [[nodiscard]] static result<priority_matrix> from_json(std::string_view text);

  /// Builds the matrix of this host: for each NUMA node N a key "cpu:N"
  /// whose preferred NICs are those on node N (and those whose node is
  /// unknown), the others available.  `hcas` keeps only the NICs to use.
  /// For each GPU a key "cuda:N" whose preferred NICs are those at the
  /// smallest PCI distance from it, among the NICs on its NUMA node when
  /// there are any (Mooncake's rule), the others available; every NIC is
  /// preferred where no distance is known (rxe has no PCI function).
  [[nodiscard]] static priority_matrix from_hcas(const std::vector<hca_info>& hcas,
                                                 const std::vector<int>& numa_nodes,
                                                 const std::vector<gpu_info>& gpus = {});

  /// Builds a matrix from explicit lists (tests, custom topologies).
  [[nodiscard]] static priority_matrix from_lists(
      const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>>& lists);

  /// Mooncake's JSON text (compact, keys sorted).
  [[nodiscard]] std::string to_json() const;

  /// The NIC names in device-id order (the rule above).
  [[nodiscard]] const std::vector<std::string>& devices() const noexcept { return devices_; }
  /// The id of NIC `name`, or -1.
  [[nodiscard]] int device_id(std::string_view name) const noexcept;

  /// The entry of `key`, or nullptr when the matrix has no such key.
  [[nodiscard]] const matrix_entry* find(std::string_view key) const noexcept;
  /// The entry used for `*` and for keys the matrix lacks: every NIC preferred.
  [[nodiscard]] const matrix_entry& any() const noexcept { return any_; }
  /// find(key), or any() when absent.
  [[nodiscard]] const matrix_entry& resolve(std::string_view key) const noexcept;

  /// select_device(location key, retry) with a process-wide random source.
  /// Errors: errc::device_not_found when the matrix has no NIC at all.
  [[nodiscard]] result<int> select_device(std::string_view key, unsigned retry) const;

  /// The named lists as parsed (for JSON round trips and printing).
  [[nodiscard]] const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>,
                               std::less<>>& lists() const noexcept {
    return lists_;
  }

  [[nodiscard]] bool empty() const noexcept { return devices_.empty(); }

 private:
  void index();

  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>, std::less<>> lists_;
  std::map<std::string, matrix_entry, std::less<>> entries_;
  std::vector<std::string> devices_;
  matrix_entry any_;
};

/// A small, fast per-thread random source for NIC choice (xorshift).
[[nodiscard]] std::uint32_t fast_random() noexcept;

}  // namespace tide::topology
