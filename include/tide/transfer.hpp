#pragma once
/// The user-facing vocabulary of transfers: requests, their states and
/// statuses, segment and batch handles.  Shared by rdma_transport and
/// transfer_engine.

#include <tide/errc.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

namespace tide {

/// A handle to an opened remote segment (open_segment); small integers.
using segment_id = std::uint64_t;
/// A handle to an allocated batch (allocate_batch).
using batch_id = std::uint64_t;

inline constexpr segment_id kInvalidSegment = std::numeric_limits<segment_id>::max();

enum class transfer_op : std::uint8_t { read, write };

/// What unregister_memory / close_segment do when submitted transfers still
/// use the buffer or segment: refuse with errc::busy (naming how many
/// slices), wait for them (drain), or cancel their tasks and then wait.
enum class in_flight : std::uint8_t { reject, drain, cancel };

/// One transfer: `length` bytes between local `source` (inside registered
/// memory) and the target segment.
///
/// Addressing, two forms:
///  - Mooncake's: `buffer == kRawAddress` and `target_offset` is the remote
///    virtual address (as published in the peer's buffer descriptor); the
///    range must lie inside one remote buffer or submit rejects it with
///    errc::out_of_bounds.
///  - bounds-checked: `buffer` is the stable id of a buffer of the segment
///    (transfer_engine::buffer_id on the owner; published as buffers[].id;
///    for a Mooncake peer, whose descriptor has no ids, the index in its
///    buffers[]) and `target_offset` an offset inside that buffer; submit
///    rejects `target_offset + length > buffer length` with errc::out_of_bounds,
///    and an id the segment does not have (after one forced refresh of its
///    descriptor) with errc::out_of_bounds too.  Once a refresh shows that the
///    owner restarted since the segment was opened (ids count from 0 in every
///    process), requests by id fail with errc::unknown_segment until the
///    segment is closed and opened again.
struct transfer_request {
  static constexpr std::uint32_t kRawAddress = std::numeric_limits<std::uint32_t>::max();

  transfer_op op = transfer_op::write;
  void* source = nullptr;
  segment_id target = kInvalidSegment;
  std::uint64_t target_offset = 0;
  std::size_t length = 0;
  std::uint32_t buffer = kRawAddress;

  /// Mooncake's form: `remote_addr` is the peer's virtual address.
  [[nodiscard]] static constexpr transfer_request at_address(transfer_op op, void* source, segment_id target,
                                                             std::uint64_t remote_addr, std::size_t length) noexcept {
    return {op, source, target, remote_addr, length, kRawAddress};
  }
  /// The bounds-checked form: the buffer with id `buffer` of the segment, at `offset`.
  [[nodiscard]] static constexpr transfer_request in_buffer(transfer_op op, void* source, segment_id target,
                                                            std::uint32_t buffer, std::uint64_t offset,
                                                            std::size_t length) noexcept {
    return {op, source, target, offset, length, buffer};
  }
};

/// Mooncake's TransferStatusEnum, less INVALID (tide reports bad input as an errc at submit).
enum class transfer_state : std::uint8_t { waiting, pending, completed, failed, timeout, canceled };

[[nodiscard]] constexpr std::string_view to_string(transfer_state s) noexcept {
  switch (s) {
    case transfer_state::waiting: return "WAITING";
    case transfer_state::pending: return "PENDING";
    case transfer_state::completed: return "COMPLETED";
    case transfer_state::failed: return "FAILED";
    case transfer_state::timeout: return "TIMEOUT";
    case transfer_state::canceled: return "CANCELED";
  }
  return "?";
}

/// True for the states a task never leaves.
[[nodiscard]] constexpr bool is_final(transfer_state s) noexcept {
  return s == transfer_state::completed || s == transfer_state::failed || s == transfer_state::timeout ||
         s == transfer_state::canceled;
}

/// No device (transfer_status::failed_local_device when no NIC path failed).
inline constexpr std::uint16_t kNoDevice = 0xffff;

/// Told when a watched batch's last unfinished task turns final
/// (transfer_engine::watch_batch): an event loop's way to learn of a
/// completion without a thread blocked in wait().  batch_final runs on the
/// engine thread that retired the task, under the batch's mutex: it must not
/// block, throw or call into the engine.
class batch_listener {
 public:
  virtual void batch_final(batch_id b) noexcept = 0;

 protected:
  ~batch_listener() = default;
};

struct transfer_status {
  transfer_state state = transfer_state::waiting;
  std::uint64_t transferred_bytes = 0;
  /// Why a FAILED / TIMEOUT / CANCELED task ended (ok otherwise): the first
  /// error that hit it (timed_out, canceled, or a slice's error; a
  /// work_request_flushed gives way to the error that caused the flush).
  errc reason = errc::ok;
  /// The NIC path of the first wire failure, when one happened: the local
  /// device (index into the transport's contexts, transport().context(i))
  /// and the peer NIC path "<segment>@<nic>".  The view stays valid as long
  /// as the engine (transport) that returned it, also after the batch is
  /// freed.
  std::uint16_t failed_local_device = kNoDevice;
  std::string_view failed_peer_path{};
};

}  // namespace tide
