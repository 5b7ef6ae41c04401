#pragma once
/// The one place that turns verbs and errno failures into tide::errc.
///
/// Setup calls build a `tide::error` whose detail names the call, the device
/// and what the OS said ("ibv_reg_mr on rxe0: Cannot allocate memory (errno 12)").
/// Hot-path calls (post, poll) use the noexcept mappings that return a bare errc.

#include <tide/errc.hpp>
#include <tide/result.hpp>

#include <infiniband/verbs.h>

#include <string_view>

namespace tide::verbs {

/// Maps an errno value returned by a setup-path verbs call to an errc.
/// Codes with one clear meaning map to it (ENOMEM/ENOSPC -> resource_exhausted,
/// EPERM/EACCES -> permission_denied, ENODEV/ENXIO -> device_not_found, EIO ->
/// device_fatal, ETIMEDOUT -> timed_out, EFAULT -> invalid_argument); every other
/// value maps to `fallback`, which the caller picks for the call it made (a QP
/// transition passes qp_state_error). Thread-safe, no allocation.
[[nodiscard]] errc errc_from_errno(int err, errc fallback = errc::verbs_failed) noexcept;

/// The error for a failed setup call: code from errc_from_errno(err, fallback),
/// detail "<call> on <device>: <strerror> (errno N)". Allocates; cold path.
[[nodiscard]] error verbs_error(std::string_view call, std::string_view device, int err,
                                errc fallback = errc::verbs_failed);

/// Maps the return value of ibv_post_send / ibv_post_recv (an errno value, 0 on
/// success) to an errc: 0 -> ok, ENOMEM -> would_block (the work queue is full),
/// EINVAL -> invalid_argument, EFAULT -> invalid_argument, anything else ->
/// verbs_failed. Hot path: noexcept, no allocation.
[[nodiscard]] errc errc_from_post(int ret) noexcept;

/// Maps a work completion status to an errc: success -> ok, REM_ACCESS_ERR ->
/// remote_access_error, REM_OP_ERR / REM_INV_REQ_ERR -> remote_operation_error,
/// RETRY_EXC_ERR -> transport_retry_exceeded, RNR_RETRY_EXC_ERR -> rnr_retry_exceeded,
/// WR_FLUSH_ERR -> work_request_flushed, LOC_PROT_ERR -> unregistered_source, others ->
/// completion_error. Hot path: noexcept, no allocation.
[[nodiscard]] errc errc_from_wc_status(ibv_wc_status status) noexcept;

/// The error for a failed work completion: code from errc_from_wc_status, detail
/// "wr_id=N qp_num=N on <device>: <ibv_wc_status_str> (status N, vendor_err 0xN)".
/// Allocates; call it off the hot path, once per failed completion.
[[nodiscard]] error wc_error(const ibv_wc& wc, std::string_view device);

/// The name of a device behind a context, or "?" for a null context.
[[nodiscard]] std::string_view device_name_of(const ibv_context* ctx) noexcept;

}  // namespace tide::verbs
