#pragma once
/// tide::errc — every failure tide reports, grouped by what it takes down
/// (UCX style): one operation (local), one peer connection (endpoint),
/// one HCA (device), or the view of remote segments (metadata).
///
/// Hot-path calls return `errc` directly (`[[nodiscard]]`, noexcept); setup
/// calls return `tide::result<T>` whose error carries an errc plus a detail
/// string (see result.hpp).  The numeric ranges are stable: the group of a
/// code is its value / 100.

#include <cstdint>
#include <string_view>
#include <system_error>

namespace tide {

enum class errc_group : std::uint8_t { none = 0, local = 1, endpoint = 2, device = 3, metadata = 4 };

enum class errc : int {
  ok = 0,

  // --- local: one call or one transfer fails, nothing else is affected ---
  invalid_argument = 100,   ///< a parameter is malformed (e.g. shard count not a power of two)
  zero_length,              ///< a transfer or registration of 0 bytes
  unregistered_source,      ///< the local address range is not inside registered memory
  out_of_bounds,            ///< the remote range lies outside every buffer of the segment
  batch_full,               ///< more requests than the batch was allocated for
  batch_busy,               ///< the batch still has unfinished tasks
  unknown_batch,            ///< the batch id was never allocated or is already freed
  unknown_task,             ///< the task index is outside the batch
  timed_out,                ///< a wait or a transfer passed its deadline
  canceled,                 ///< the batch was canceled
  would_block,              ///< a bounded queue is full; try again
  capacity_zero,            ///< a container was given capacity 0
  already_exists,           ///< the key is already present
  not_found,                ///< the key is not present
  already_registered,       ///< the memory range overlaps a registered region
  not_registered,           ///< unregister of a range that was never registered
  out_of_memory,            ///< an allocation failed
  bad_location,             ///< a location string (cpu:N, segments:...) does not parse
  not_initialized,          ///< the engine was used before init() or after shutdown
  busy,                     ///< the object is in use (e.g. a segment with transfers in flight)
  frame_too_large,          ///< a handshake frame above the configured bound
  config_invalid,           ///< a config field or environment override is out of range
  remote_access_denied,     ///< the peer's descriptor does not grant this operation on that buffer
  batch_too_large,          ///< a batch capacity above engine_config::max_tasks_per_batch
  memory_unsupported,       ///< memory of a kind this host cannot move (GPU memory without a CUDA driver, or no path reaches it)
  copy_failed,              ///< a staging copy between device and host memory failed (the log names the driver's error)

  // --- endpoint: one connection to one peer NIC is affected ---
  handshake_failed = 200,   ///< TCP handshake could not be completed (connect/read/write)
  handshake_rejected,       ///< the peer answered with a non-empty reply_msg
  peer_unreachable,         ///< TCP connect to the peer timed out or was refused
  protocol_error,           ///< the peer sent a frame we cannot parse
  qp_state_error,           ///< a QP transition (INIT/RTR/RTS) failed
  endpoint_closed,          ///< the endpoint was torn down or evicted
  remote_access_error,      ///< the peer rejected the rkey/address (IBV_WC_REM_ACCESS_ERR)
  remote_operation_error,   ///< the peer failed the operation (IBV_WC_REM_OP_ERR)
  transport_retry_exceeded, ///< no ACK from the peer (IBV_WC_RETRY_EXC_ERR)
  rnr_retry_exceeded,       ///< receiver not ready (IBV_WC_RNR_RETRY_EXC_ERR)
  work_request_flushed,     ///< the QP went to error state with this WR queued
  completion_error,         ///< any other failed work completion
  mtu_mismatch,             ///< the peers cannot agree on a path MTU
  qp_count_mismatch,        ///< the peer has a different number of QPs per endpoint
  retry_exhausted,          ///< a slice failed on every path it was retried on
  auth_failed,              ///< the peer did not prove the cluster secret (or we have none and it requires one)
  connection_lost,          ///< a TCP data connection closed, reset or stalled with the request in flight

  // --- device: one HCA (context) is affected ---
  device_not_found = 300,   ///< no such RDMA device
  no_device,                ///< no RDMA device at all on this host
  device_open_failed,       ///< ibv_open_device failed
  device_fatal,             ///< IBV_EVENT_DEVICE_FATAL: the context is unusable
  port_down,                ///< the port is not ACTIVE
  gid_not_found,            ///< no usable GID on the port
  resource_exhausted,       ///< the device refused to create a pd/cq/qp/mr (ENOMEM/ENOSPC)
  verbs_failed,             ///< another verbs call failed; see the detail
  context_inactive,         ///< the context was disabled after device or port errors
  permission_denied,        ///< e.g. memlock limit too low to pin memory
  completion_queue_error,   ///< a CQ overran or failed (IBV_EVENT_CQ_ERR, ibv_poll_cq < 0): its QPs fail, it is rebuilt

  // --- metadata: the view of remote segments is affected ---
  metadata_malformed = 400, ///< a descriptor does not parse or validate; the detail names the field
  metadata_unavailable,     ///< the metadata backend cannot be reached
  segment_not_found,        ///< no descriptor is stored under that segment name
  unknown_segment,          ///< a segment handle that was never opened or is closed
  metadata_conflict,        ///< a concurrent update won (compare-and-swap lost)
};

/// The group that a code belongs to (its blast radius).
[[nodiscard]] constexpr errc_group group_of(errc e) noexcept {
  const int v = static_cast<int>(e);
  return v == 0 ? errc_group::none : static_cast<errc_group>(v / 100);
}

/// A stable, human-readable name for `e` ("unregistered_source", ...).
[[nodiscard]] std::string_view to_string(errc e) noexcept;
/// One sentence describing `e`.
[[nodiscard]] std::string_view describe(errc e) noexcept;
[[nodiscard]] std::string_view to_string(errc_group g) noexcept;

/// The std::error_category of tide's codes, for interop with std::error_code.
[[nodiscard]] const std::error_category& tide_category() noexcept;
[[nodiscard]] inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), tide_category()};
}

}  // namespace tide

template <>
struct std::is_error_code_enum<tide::errc> : std::true_type {};
