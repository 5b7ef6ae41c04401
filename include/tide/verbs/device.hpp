#pragma once
/// RAII owners of the device list and of an opened device (ibv_context), and
/// the context's async events.

#include <tide/result.hpp>
#include <tide/verbs/gid.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tide::verbs {

/// The RDMA devices of this host (ibv_get_device_list). Move-only.
class device_list {
 public:
  /// Lists the devices. An empty list is not an error (check `empty()`).
  /// Errors: permission_denied / verbs_failed when libibverbs cannot list
  /// (e.g. no uverbs access). Any thread; reads sysfs.
  [[nodiscard]] static result<device_list> get();

  device_list(device_list&& o) noexcept;
  device_list& operator=(device_list&& o) noexcept;
  device_list(const device_list&) = delete;
  device_list& operator=(const device_list&) = delete;
  ~device_list();

  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(count_); }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  [[nodiscard]] std::span<ibv_device* const> devices() const noexcept { return {list_, size()}; }
  /// The device names in list order ("rxe0", "mlx5_0", ...). Allocates.
  [[nodiscard]] std::vector<std::string> names() const;
  /// The device called `name`, or nullptr.
  [[nodiscard]] ibv_device* find(std::string_view name) const noexcept;

 private:
  device_list(ibv_device** list, int count) noexcept : list_(list), count_(count) {}
  ibv_device** list_ = nullptr;
  int count_ = 0;
};

/// An async event, already acknowledged (ibv_ack_async_event) when returned:
/// the element pointers identify the object only and must not be dereferenced
/// after that object is destroyed.
struct async_event {
  ibv_event_type type{};
  ibv_qp* qp = nullptr;       ///< for QP events
  std::uint32_t qp_num = 0;   ///< for QP events: read before the event was acknowledged
  ibv_cq* cq = nullptr;       ///< for CQ events
  ibv_srq* srq = nullptr;     ///< for SRQ events
  int port_num = 0;           ///< for port events
  /// ibv_event_type_str(type).
  [[nodiscard]] std::string_view name() const noexcept;
  /// What the event takes down: device_fatal for DEVICE_FATAL, port_down for
  /// PORT_ERR, qp_state_error for QP_FATAL / QP_REQ_ERR / QP_ACCESS_ERR /
  /// PATH_MIG_ERR, completion_error for CQ_ERR, ok for informational events
  /// (PORT_ACTIVE, LID_CHANGE, GID_CHANGE, COMM_EST, SQ_DRAINED, ...).
  [[nodiscard]] errc severity() const noexcept;
};

/// An opened RDMA device (ibv_context). Move-only; closing happens in the
/// destructor, which logs (never throws) if ibv_close_device fails. Every pd,
/// cq, qp and mr made from it must be destroyed first.
class context {
 public:
  /// Opens the device called `name` and makes its async fd non-blocking.
  /// Errors: no_device (the host has none), device_not_found (no such name; the
  /// detail lists the names there are), device_open_failed (ibv_open_device).
  /// Any thread; a system call or two.
  [[nodiscard]] static result<context> open(std::string_view name);

  context(context&& o) noexcept;
  context& operator=(context&& o) noexcept;
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context();

  [[nodiscard]] ibv_context* native_handle() const noexcept { return ctx_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// ibv_query_device. Errors: verbs_failed/device_fatal with the errno text.
  [[nodiscard]] result<ibv_device_attr> query_device() const;
  /// ibv_query_port. Errors: invalid_argument (port 0), verbs_failed.
  [[nodiscard]] result<ibv_port_attr> query_port(std::uint8_t port) const;
  /// ibv_query_gid for one table entry. Errors: verbs_failed, gid_not_found (zero GID).
  [[nodiscard]] result<gid> query_gid(std::uint8_t port, int index) const;

  /// The fd that becomes readable when an async event is pending (non-blocking).
  [[nodiscard]] int async_fd() const noexcept { return ctx_ != nullptr ? ctx_->async_fd : -1; }
  /// Reads one pending async event, acknowledges it and returns a copy; nothing
  /// when none is pending (never blocks). A read failure other than EAGAIN is
  /// logged and reported as nothing. Call from one thread at a time (the
  /// monitor); cost: one read() system call.
  [[nodiscard]] std::optional<async_event> next_async_event() noexcept;

 private:
  context(ibv_context* ctx, std::string name) noexcept : ctx_(ctx), name_(std::move(name)) {}
  void close() noexcept;
  ibv_context* ctx_ = nullptr;
  std::string name_;
};

/// Path MTU for a connection: the smaller of both ends' active MTU and `cap`.
[[nodiscard]] constexpr ibv_mtu path_mtu(ibv_mtu local_active, ibv_mtu remote_active,
                                         ibv_mtu cap = IBV_MTU_4096) noexcept {
  ibv_mtu m = local_active < remote_active ? local_active : remote_active;
  return m < cap ? m : cap;
}

/// Bytes of an ibv_mtu (IBV_MTU_1024 -> 1024); 0 for a value outside the enum.
[[nodiscard]] constexpr int mtu_bytes(ibv_mtu m) noexcept {
  const int v = static_cast<int>(m);
  return v >= IBV_MTU_256 && v <= IBV_MTU_4096 ? 128 << v : 0;
}

/// The ibv_mtu of 256, 512, 1024, 2048 or 4096 bytes. Errors: invalid_argument.
[[nodiscard]] result<ibv_mtu> mtu_from_bytes(int bytes);

}  // namespace tide::verbs
