#pragma once
/// The data path's resolved views of segments: local registered buffers
/// (with one MR per context) and remote segments (buffers sorted for
/// address lookup, NIC paths, device choice through the peer's priority
/// matrix).  Built on the setup path; read on the hot path without locks.

#include <tide/wire/descriptors.hpp>
#include <tide/result.hpp>
#include <tide/memory/memory_kind.hpp>
#include <tide/topology/location.hpp>
#include <tide/topology/priority_matrix.hpp>
#include <tide/verbs/mr.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tide::rdma {

namespace plan {
struct rail_map;
}

/// Chooses a NIC for byte `offset` of a buffer: the matrix entries of its
/// location (one per `segments:` node, else one).
struct device_chooser {
  topology::location loc;
  std::vector<const topology::matrix_entry*> entries;  ///< per node of loc (or one)

  [[nodiscard]] const topology::matrix_entry& entry_at(std::uint64_t offset) const noexcept {
    if (entries.size() == 1) return *entries[0];
    return *entries[(offset / loc.page_size) % entries.size()];
  }
  /// Builds the entries from `m` (a key the matrix lacks means every NIC).
  static device_chooser make(const topology::location& loc, const topology::priority_matrix& m);
};

/// The MR access flags for `a`: local write always; REMOTE_READ/WRITE as
/// granted; never REMOTE_ATOMIC.
[[nodiscard]] constexpr int mr_access(buffer_access a) noexcept {
  int f = IBV_ACCESS_LOCAL_WRITE;
  if (allows_read(a)) f |= IBV_ACCESS_REMOTE_READ;
  if (allows_write(a)) f |= IBV_ACCESS_REMOTE_WRITE;
  return f;
}

struct local_buffer {
  /// Stable id, published as the descriptor's buffers[].id: assigned at
  /// registration from a per-transport counter, never reused.
  std::uint32_t id = 0;
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  buffer_access access = buffer_access::remote_read_write;
  std::string location_text;
  device_chooser chooser;
  std::vector<verbs::memory_region> mrs;  ///< one per context, in device-id order
  memory::kind kind = memory::kind::host;
  int device = -1;  ///< cuda: the device ordinal
  /// Where a transport cannot touch the memory itself (TCP and GPU memory,
  /// or host memory with stage_host_memory), it copies through this; null:
  /// the bytes move straight from and into the buffer.
  const memory::copy_engine* stager = nullptr;
  /// False: no NIC registered it (GPU memory without GPUDirect, or host
  /// memory with stage_host_memory): lkeys are 0, it is published with
  /// rkeys 0 and "reach": "tcp", and every request touching it goes over TCP.
  bool nic_reachable = true;
  std::vector<std::uint32_t> lkeys;
  /// Slices of submitted transfers from this buffer not yet retired:
  /// submit adds (under the table's shared lock), retire_slice subtracts.
  /// unregister_memory refuses or drains while it is not 0.
  mutable std::atomic<std::size_t> inflight{0};
  /// Set by a draining unregister_memory: submit treats the buffer as gone.
  std::atomic<bool> closing{false};
};

struct remote_buffer {
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::vector<std::uint32_t> rkeys;  ///< per device, devices[] order
  buffer_access access = buffer_access::remote_read_write;  ///< what the owner grants (its descriptor)
  bool tcp_only = false;             ///< no NIC of the owner reaches it (its descriptor's "reach")
  device_chooser chooser;            ///< yields matrix ids; map with remote_segment::to_desc
};

struct remote_segment {
  std::string name;
  std::string server;                   ///< NIC paths are "<server>@<device>"
  std::vector<std::string> nic_paths;   ///< per device, devices[] order
  topology::priority_matrix matrix;     ///< the peer's (or one over devices[] when absent)
  std::vector<int> to_desc;             ///< matrix device id -> devices[] index (-1: unknown)
  std::vector<remote_buffer> buffers;   ///< descriptor order
  std::vector<std::uint32_t> by_addr;   ///< buffer indices sorted by addr
  /// (buffer id, index) sorted by id: what the bounds-checked form addresses.
  /// Ids are the descriptor's buffers[].id, or the index for a descriptor
  /// without ids (Mooncake's).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> by_id;
  /// Its TCP data port, when the descriptor publishes one (0: none): the
  /// host part of its name, as Mooncake's TCP initiators read it.
  std::string tcp_host;
  std::uint16_t tcp_port = 0;
  std::uint32_t tcp_version = 1;
  /// The descriptor's tide_incarnation (absent from Mooncake's): ids in
  /// by_id name buffers of this incarnation only.
  std::optional<std::uint64_t> incarnation;
  /// How these NICs pair with the local ones (set by the transport before
  /// the view is shared).  Owned by the views that use it, so it lives as
  /// long as a task holding the view (its slices point at it), and no longer:
  /// its peer ids in the rail table are then given back.
  std::shared_ptr<const plan::rail_map> rails;

  /// Builds the view.  Errors: metadata_malformed (a buffer location that
  /// does not parse, a priority matrix naming no device of devices[]).
  [[nodiscard]] static result<std::shared_ptr<remote_segment>> resolve(const segment_desc& d);

  /// Index of the buffer that holds [addr, addr+len), or -1.  O(log n).
  [[nodiscard]] int find(std::uint64_t addr, std::uint64_t len) const noexcept;
  /// Index of the buffer with id `id`, or -1.  O(log n).
  [[nodiscard]] int find_id(std::uint32_t id) const noexcept;

  /// Peer device (devices[] index) for byte `offset` of buffer `b` on try
  /// `retry`; -1 when none.  Hot path.
  [[nodiscard]] int choose(const remote_buffer& b, std::uint64_t offset, unsigned retry,
                           std::uint32_t random) const noexcept {
    const auto& e = b.chooser.entry_at(offset);
    const std::size_t total = e.preferred.size() + e.available.size();
    for (std::size_t k = 0; k <= total; ++k) {
      const int id = e.select(retry + static_cast<unsigned>(k), random);
      if (id >= 0 && static_cast<std::size_t>(id) < to_desc.size() && to_desc[static_cast<std::size_t>(id)] >= 0)
        return to_desc[static_cast<std::size_t>(id)];
      if (retry == 0 && k == 0) retry = 1;  // walk deterministically after a miss
    }
    return -1;
  }
};

}  // namespace tide::rdma
