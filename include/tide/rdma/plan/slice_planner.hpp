#pragma once
/// The slice planner: turns the requests of one submit into work requests
/// (WRs), device-free so unit tests drive it directly.  First step of the
/// data path: submit -> **plan** -> path -> lane -> NIC -> completion.
///
/// Rules (TENT's planning, research/tent.md 1.1, with tide's tail rule):
///  - Requests of one submit that continue each other at BOTH ends (the next
///    request starts where the previous ends, locally and remotely), with the
///    same op, target and buffers, are coalesced into one extent; WRs of an
///    extent may carry bytes of several requests.  Off with `coalesce=false`.
///  - An extent is cut into slices of `slice_size` bytes (the granularity).
///    When that would exceed the WR bound of its op (`max_wrs_write`,
///    `max_wrs_read`), the slice grows in multiples of the granularity until
///    the extent fits the bound: a 64 MiB WRITE becomes 32 WRs of 2 MiB.
///    No slice is ever longer than `max_msg_size` (the device's
///    max_msg_sz), which wins over the WR bound.
///  - A tail up to `fragment_limit` joins the slice before it (if the sum
///    stays within max_msg_size), as Mooncake's fragment rule does.
///  - WRITE WRs up to `inline_limit` bytes are marked inline; the lane
///    decides whether to send them with IBV_SEND_INLINE.
///
/// The output is three arrays: groups (extents), WRs, and pieces.  A piece is
/// the part of one request that one WR carries; every byte of every request
/// lies in exactly one piece, the pieces of a request are contiguous in
/// `pieces` and in offset order, and the pieces of a WR are contiguous too.
///
/// Thread safety: plan() is a pure function of its inputs; a slice_plan is
/// owned by one thread at a time.  Cost: O(requests + WRs), allocation only
/// when the output vectors grow (they keep their capacity across calls).

#include <tide/result.hpp>
#include <tide/transfer.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace tide::rdma::plan {

struct planner_config {
  std::uint64_t slice_size = 65536;      ///< granularity of slices
  std::uint64_t fragment_limit = 16384;  ///< a tail up to this joins the previous slice
  std::uint32_t max_wrs_write = 32;      ///< WRs per WRITE extent before slices grow (TENT: 32)
  std::uint32_t max_wrs_read = 64;       ///< WRs per READ extent before slices grow (TENT: 64)
  std::uint64_t max_msg_size = 1u << 30; ///< the device's max_msg_sz (ibv_query_port)
  std::uint32_t inline_limit = 0;        ///< WRITE WRs up to this many bytes are marked inline
  bool coalesce = true;                  ///< merge requests contiguous at both ends

  /// Errors: config_invalid naming the field (slice_size 0 or above
  /// max_msg_size, max_msg_size 0 or above 2 GiB, fragment_limit above
  /// slice_size, a WR bound of 0).  Setup path.
  [[nodiscard]] status validate() const;
};

/// One request as the planner sees it (resolved by the transport).
struct request_extent {
  std::uint64_t local_addr = 0;
  std::uint64_t remote_addr = 0;
  std::uint64_t length = 0;
  transfer_op op = transfer_op::write;
  std::uint64_t target = 0;        ///< segment id
  std::uint64_t local_buffer = 0;  ///< identity of the local buffer (any stable key, e.g. its address)
  std::uint32_t peer_buffer = 0;   ///< index of the peer buffer
};

/// Coalesced requests [first_request, first_request + request_count), cut
/// into WRs [first_wr, first_wr + wr_count).
struct planned_group {
  std::uint32_t first_request = 0;
  std::uint32_t request_count = 0;
  std::uint32_t first_wr = 0;
  std::uint32_t wr_count = 0;
  std::uint64_t bytes = 0;
};

/// One work request: `length` bytes from local_addr to remote_addr.
struct planned_wr {
  std::uint64_t local_addr = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t length = 0;
  std::uint32_t first_piece = 0;
  std::uint32_t piece_count = 0;
  bool inline_data = false;
};

/// The part of request `request` (at `offset`, `length` bytes) that WR `wr` carries.
struct planned_piece {
  std::uint32_t request = 0;
  std::uint32_t wr = 0;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};

/// Pieces [first_piece, first_piece + piece_count) belong to this request.
struct planned_request {
  std::uint32_t first_piece = 0;
  std::uint32_t piece_count = 0;
};

struct slice_plan {
  std::vector<planned_group> groups;
  std::vector<planned_wr> wrs;
  std::vector<planned_piece> pieces;
  std::vector<planned_request> requests;  ///< one per input request

  void clear() noexcept {
    groups.clear();
    wrs.clear();
    pieces.clear();
    requests.clear();
  }
};

/// Slice length for an extent of `length` bytes of `op`: slice_size, or a
/// multiple of it large enough to keep the WR count within the op's bound,
/// never above max_msg_size.  Requires cfg.validate().
[[nodiscard]] std::uint64_t slice_length_for(const planner_config& cfg, std::uint64_t length, transfer_op op) noexcept;

/// Number of WRs an extent of `length` bytes of `op` becomes.
[[nodiscard]] std::uint64_t wr_count_for(const planner_config& cfg, std::uint64_t length, transfer_op op) noexcept;

/// Plans `reqs` into `out` (cleared first).  Requires cfg.validate() and
/// every length > 0 (the transport rejects 0 before).  Errors:
/// invalid_argument when a request has length 0 or a piece index would
/// overflow 32 bits.
[[nodiscard]] status plan(const planner_config& cfg, std::span<const request_extent> reqs, slice_plan& out);

}  // namespace tide::rdma::plan
