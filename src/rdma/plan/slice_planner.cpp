#include <tide/rdma/plan/slice_planner.hpp>

#include <algorithm>
#include <limits>
#include <string>

namespace tide::rdma::plan {
namespace {

constexpr std::uint64_t kMaxMessage = 1ull << 31;  // ibv_sge.length is 32 bits; rxe and mlx5 stop at 2 GiB

std::uint32_t wr_bound(const planner_config& cfg, transfer_op op) noexcept {
  return op == transfer_op::read ? cfg.max_wrs_read : cfg.max_wrs_write;
}

// Whether request b continues request a at both ends and may share its WRs.
bool continues(const request_extent& a, const request_extent& b) noexcept {
  return a.op == b.op && a.target == b.target && a.local_buffer == b.local_buffer &&
         a.peer_buffer == b.peer_buffer && a.local_addr + a.length == b.local_addr &&
         a.remote_addr + a.length == b.remote_addr;
}

struct cut {
  std::uint64_t slice = 0;   // every WR but the last
  std::uint64_t count = 0;   // WRs
  std::uint64_t last = 0;    // length of the last WR
};

cut cut_extent(const planner_config& cfg, std::uint64_t length, transfer_op op) noexcept {
  cut c;
  c.slice = slice_length_for(cfg, length, op);
  const std::uint64_t full = length / c.slice;
  const std::uint64_t rem = length % c.slice;
  if (rem == 0) {
    c.count = full;
    c.last = c.slice;
  } else if (full >= 1 && rem <= cfg.fragment_limit && c.slice + rem <= cfg.max_msg_size) {
    c.count = full;
    c.last = c.slice + rem;
  } else {
    c.count = full + 1;
    c.last = rem;
  }
  return c;
}

}  // namespace

status planner_config::validate() const {
  if (max_msg_size == 0 || max_msg_size > kMaxMessage)
    return fail(errc::config_invalid, "max_msg_size must be 1..2 GiB, got " + std::to_string(max_msg_size));
  if (slice_size == 0 || slice_size > max_msg_size)
    return fail(errc::config_invalid, "slice_size must be 1.." + std::to_string(max_msg_size) +
                                          " (the device's max_msg_sz), got " + std::to_string(slice_size));
  if (fragment_limit > slice_size)
    return fail(errc::config_invalid, "fragment_limit (" + std::to_string(fragment_limit) +
                                          ") must be <= slice_size (" + std::to_string(slice_size) + ")");
  if (max_wrs_write == 0) return fail(errc::config_invalid, "max_wrs_write must be >= 1");
  if (max_wrs_read == 0) return fail(errc::config_invalid, "max_wrs_read must be >= 1");
  return {};
}

std::uint64_t slice_length_for(const planner_config& cfg, std::uint64_t length, transfer_op op) noexcept {
  const std::uint64_t g = cfg.slice_size;
  const std::uint64_t bound = wr_bound(cfg, op);
  if ((length + g - 1) / g <= bound) return g;
  // Grow in multiples of the granularity until `bound` slices cover the extent.
  const std::uint64_t need = (length + bound - 1) / bound;
  const std::uint64_t grown = (need + g - 1) / g * g;
  if (grown <= cfg.max_msg_size) return grown;
  return std::max(g, cfg.max_msg_size / g * g);
}

std::uint64_t wr_count_for(const planner_config& cfg, std::uint64_t length, transfer_op op) noexcept {
  return length == 0 ? 0 : cut_extent(cfg, length, op).count;
}

status plan(const planner_config& cfg, std::span<const request_extent> reqs, slice_plan& out) {
  out.clear();
  out.requests.resize(reqs.size());
  constexpr std::uint64_t kMaxIndex = std::numeric_limits<std::uint32_t>::max();
  std::size_t i = 0;
  while (i < reqs.size()) {
    if (reqs[i].length == 0) return fail(errc::invalid_argument, "request " + std::to_string(i) + ": length 0");
    // The extent: request i and every following request that continues it.
    std::size_t end = i + 1;
    std::uint64_t total = reqs[i].length;
    while (cfg.coalesce && end < reqs.size() && reqs[end].length != 0 && continues(reqs[end - 1], reqs[end])) {
      total += reqs[end].length;
      ++end;
    }
    const cut c = cut_extent(cfg, total, reqs[i].op);
    if (out.wrs.size() + c.count > kMaxIndex || out.pieces.size() + c.count + (end - i) > kMaxIndex)
      return fail(errc::invalid_argument, "submit plans more than 2^32 work requests");
    planned_group g;
    g.first_request = static_cast<std::uint32_t>(i);
    g.request_count = static_cast<std::uint32_t>(end - i);
    g.first_wr = static_cast<std::uint32_t>(out.wrs.size());
    g.wr_count = static_cast<std::uint32_t>(c.count);
    g.bytes = total;
    out.groups.push_back(g);

    // Walk WRs and requests together; a piece ends where either ends.
    std::size_t r = i;            // current request
    std::uint64_t r_start = 0;    // its first byte in extent coordinates
    std::uint64_t pos = 0;        // next byte of the extent to place
    out.requests[r].first_piece = static_cast<std::uint32_t>(out.pieces.size());
    for (std::uint64_t k = 0; k < c.count; ++k) {
      const std::uint64_t w_len = k + 1 == c.count ? c.last : c.slice;
      const std::uint64_t w_end = pos + w_len;
      planned_wr w;
      w.local_addr = reqs[i].local_addr + pos;
      w.remote_addr = reqs[i].remote_addr + pos;
      w.length = static_cast<std::uint32_t>(w_len);
      w.first_piece = static_cast<std::uint32_t>(out.pieces.size());
      w.inline_data = reqs[i].op == transfer_op::write && w_len <= cfg.inline_limit;
      const auto wr_index = static_cast<std::uint32_t>(out.wrs.size());
      while (pos < w_end) {
        const std::uint64_t r_end = r_start + reqs[r].length;
        const std::uint64_t upto = std::min(w_end, r_end);
        out.pieces.push_back({static_cast<std::uint32_t>(r), wr_index, pos - r_start, static_cast<std::uint32_t>(upto - pos)});
        ++out.requests[r].piece_count;
        pos = upto;
        if (pos == r_end && r + 1 < end) {
          r_start = r_end;
          ++r;
          out.requests[r].first_piece = static_cast<std::uint32_t>(out.pieces.size());
        }
      }
      w.piece_count = static_cast<std::uint32_t>(out.pieces.size()) - w.first_piece;
      out.wrs.push_back(w);
    }
    i = end;
  }
  return {};
}

}  // namespace tide::rdma::plan
