#include <tide/verbs/error.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace tide::verbs {

errc errc_from_errno(int err, errc fallback) noexcept {
  switch (err) {
    case ENOMEM:
    case ENOSPC: return errc::resource_exhausted;
    case EPERM:
    case EACCES: return errc::permission_denied;
    case ENODEV:
    case ENXIO: return errc::device_not_found;
    case EIO: return errc::device_fatal;  // the device was removed or reset under the context
    case ETIMEDOUT: return errc::timed_out;
    case EFAULT: return errc::invalid_argument;
    default: return fallback;
  }
}

error verbs_error(std::string_view call, std::string_view device, int err, errc fallback) {
  std::string d;
  d.reserve(96);
  d.append(call).append(" on ").append(device.empty() ? std::string_view{"?"} : device).append(": ");
  if (err == 0) {
    // Some verbs return NULL without setting errno (providers differ).
    d.append("failed without an errno");
    return {fallback, std::move(d)};
  }
  char buf[128];
  // GNU strerror_r returns the message (maybe not in buf).
  d.append(::strerror_r(err, buf, sizeof buf)).append(" (errno ").append(std::to_string(err)).append(")");
  return {errc_from_errno(err, fallback), std::move(d)};
}

errc errc_from_post(int ret) noexcept {
  switch (ret) {
    case 0: return errc::ok;
    case ENOMEM: return errc::would_block;
    case EINVAL:
    case EFAULT: return errc::invalid_argument;
    default: return errc::verbs_failed;
  }
}

errc errc_from_wc_status(ibv_wc_status status) noexcept {
  switch (status) {
    case IBV_WC_SUCCESS: return errc::ok;
    case IBV_WC_REM_ACCESS_ERR: return errc::remote_access_error;
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_INV_REQ_ERR: return errc::remote_operation_error;
    case IBV_WC_RETRY_EXC_ERR: return errc::transport_retry_exceeded;
    case IBV_WC_RNR_RETRY_EXC_ERR: return errc::rnr_retry_exceeded;
    case IBV_WC_WR_FLUSH_ERR: return errc::work_request_flushed;
    case IBV_WC_LOC_PROT_ERR: return errc::unregistered_source;
    default: return errc::completion_error;
  }
}

error wc_error(const ibv_wc& wc, std::string_view device) {
  char vendor[16];
  std::snprintf(vendor, sizeof vendor, "0x%x", wc.vendor_err);
  std::string d;
  // wc.opcode is undefined in a failed completion: only wr_id says which WR it was.
  d.append("wr_id=").append(std::to_string(wc.wr_id));
  d.append(" qp_num=").append(std::to_string(wc.qp_num)).append(" on ").append(device).append(": ");
  d.append(::ibv_wc_status_str(wc.status)).append(" (status ").append(std::to_string(static_cast<int>(wc.status)));
  d.append(", vendor_err ").append(vendor).append(")");
  return {errc_from_wc_status(wc.status), std::move(d)};
}

std::string_view device_name_of(const ibv_context* ctx) noexcept {
  if (ctx == nullptr || ctx->device == nullptr) return "?";
  const char* n = ::ibv_get_device_name(ctx->device);
  return n != nullptr ? std::string_view{n} : std::string_view{"?"};
}

}  // namespace tide::verbs
