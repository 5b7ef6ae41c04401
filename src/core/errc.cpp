#include <tide/errc.hpp>
#include <tide/result.hpp>

#include <string>

namespace tide {
namespace {

struct errc_text {
  std::string_view name;
  std::string_view description;
};

// One row per code; the switch keeps -Wswitch watching for a code without text.
constexpr errc_text text_of(errc e) noexcept {
  switch (e) {
    case errc::ok: return {"ok", "success"};
    case errc::invalid_argument: return {"invalid_argument", "a parameter is malformed"};
    case errc::zero_length: return {"zero_length", "a transfer or registration of zero bytes"};
    case errc::unregistered_source: return {"unregistered_source", "the local range is not inside registered memory"};
    case errc::out_of_bounds: return {"out_of_bounds", "the remote range lies outside every buffer of the segment"};
    case errc::batch_full: return {"batch_full", "more requests than the batch was allocated for"};
    case errc::batch_busy: return {"batch_busy", "the batch still has unfinished tasks"};
    case errc::unknown_batch: return {"unknown_batch", "the batch id is not allocated"};
    case errc::unknown_task: return {"unknown_task", "the task index is outside the batch"};
    case errc::timed_out: return {"timed_out", "the deadline passed"};
    case errc::canceled: return {"canceled", "the batch was canceled"};
    case errc::would_block: return {"would_block", "a bounded queue is full"};
    case errc::capacity_zero: return {"capacity_zero", "capacity must be at least 1"};
    case errc::already_exists: return {"already_exists", "the key is already present"};
    case errc::not_found: return {"not_found", "the key is not present"};
    case errc::already_registered: return {"already_registered", "the range overlaps registered memory"};
    case errc::not_registered: return {"not_registered", "the range was never registered"};
    case errc::out_of_memory: return {"out_of_memory", "an allocation failed"};
    case errc::bad_location: return {"bad_location", "the location string does not parse"};
    case errc::not_initialized: return {"not_initialized", "the engine is not initialized"};
    case errc::busy: return {"busy", "the object is in use"};
    case errc::frame_too_large: return {"frame_too_large", "a handshake frame exceeds the size bound"};
    case errc::config_invalid: return {"config_invalid", "a configuration value is out of range"};
    case errc::remote_access_denied: return {"remote_access_denied", "the peer's buffer does not allow this operation"};
    case errc::batch_too_large: return {"batch_too_large", "the batch capacity is above max_tasks_per_batch"};
    case errc::memory_unsupported: return {"memory_unsupported", "memory of a kind this host cannot move"};
    case errc::copy_failed: return {"copy_failed", "a staging copy between device and host memory failed"};
    case errc::handshake_failed: return {"handshake_failed", "the TCP handshake with the peer failed"};
    case errc::handshake_rejected: return {"handshake_rejected", "the peer rejected the handshake"};
    case errc::peer_unreachable: return {"peer_unreachable", "the peer cannot be reached"};
    case errc::protocol_error: return {"protocol_error", "the peer sent a malformed frame"};
    case errc::qp_state_error: return {"qp_state_error", "a queue pair state transition failed"};
    case errc::endpoint_closed: return {"endpoint_closed", "the endpoint was closed or evicted"};
    case errc::remote_access_error: return {"remote_access_error", "the peer rejected the remote key or address"};
    case errc::remote_operation_error: return {"remote_operation_error", "the peer failed the operation"};
    case errc::transport_retry_exceeded: return {"transport_retry_exceeded", "the peer did not acknowledge (transport retries exhausted)"};
    case errc::rnr_retry_exceeded: return {"rnr_retry_exceeded", "the peer was not ready to receive (RNR retries exhausted)"};
    case errc::work_request_flushed: return {"work_request_flushed", "the queue pair entered the error state"};
    case errc::completion_error: return {"completion_error", "a work completion failed"};
    case errc::mtu_mismatch: return {"mtu_mismatch", "the peers cannot agree on a path MTU"};
    case errc::qp_count_mismatch: return {"qp_count_mismatch", "the peer uses a different number of QPs per endpoint"};
    case errc::retry_exhausted: return {"retry_exhausted", "the transfer failed on every path it was retried on"};
    case errc::auth_failed: return {"auth_failed", "the peer failed the cluster-secret authentication"};
    case errc::connection_lost: return {"connection_lost", "the TCP data connection closed, reset or stalled with the request in flight"};
    case errc::device_not_found: return {"device_not_found", "no RDMA device of that name"};
    case errc::no_device: return {"no_device", "no RDMA device on this host"};
    case errc::device_open_failed: return {"device_open_failed", "the RDMA device could not be opened"};
    case errc::device_fatal: return {"device_fatal", "the RDMA device reported a fatal error"};
    case errc::port_down: return {"port_down", "the port is not active"};
    case errc::gid_not_found: return {"gid_not_found", "no usable GID on the port"};
    case errc::resource_exhausted: return {"resource_exhausted", "the device refused to allocate a resource"};
    case errc::verbs_failed: return {"verbs_failed", "a verbs call failed"};
    case errc::context_inactive: return {"context_inactive", "the device context is disabled"};
    case errc::permission_denied: return {"permission_denied", "permission denied (check ulimit -l)"};
    case errc::completion_queue_error: return {"completion_queue_error", "a completion queue failed; its endpoints were failed and it was rebuilt"};
    case errc::metadata_malformed: return {"metadata_malformed", "a metadata descriptor is malformed"};
    case errc::metadata_unavailable: return {"metadata_unavailable", "the metadata backend cannot be reached"};
    case errc::segment_not_found: return {"segment_not_found", "no descriptor for that segment"};
    case errc::unknown_segment: return {"unknown_segment", "the segment handle is not open"};
    case errc::metadata_conflict: return {"metadata_conflict", "a concurrent metadata update won"};
  }
  return {"unknown", "unknown error"};
}

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "tide"; }
  std::string message(int v) const override {
    return std::string(describe(static_cast<errc>(v)));
  }
};

}  // namespace

std::string_view to_string(errc e) noexcept { return text_of(e).name; }
std::string_view describe(errc e) noexcept { return text_of(e).description; }

std::string_view to_string(errc_group g) noexcept {
  switch (g) {
    case errc_group::none: return "none";
    case errc_group::local: return "local";
    case errc_group::endpoint: return "endpoint";
    case errc_group::device: return "device";
    case errc_group::metadata: return "metadata";
  }
  return "unknown";
}

const std::error_category& tide_category() noexcept {
  static const category instance;
  return instance;
}

std::string error::message() const {
  std::string out(to_string(code));
  out += ": ";
  out += detail.empty() ? describe(code) : std::string_view(detail);
  return out;
}

}  // namespace tide
