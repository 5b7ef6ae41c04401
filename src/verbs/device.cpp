#include <tide/verbs/device.hpp>

#include <tide/detail/log.hpp>
#include <tide/verbs/error.hpp>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tide::verbs {

result<device_list> device_list::get() {
  errno = 0;
  int n = 0;
  ibv_device** list = ::ibv_get_device_list(&n);
  if (list == nullptr) {
    const int err = errno;
    // ENOSYS: the kernel has no RDMA support at all (no uverbs): same as no device.
    if (err == ENOSYS) return device_list{nullptr, 0};
    return fail(verbs_error("ibv_get_device_list", "host", err));
  }
  return device_list{list, n};
}

device_list::device_list(device_list&& o) noexcept
    : list_(std::exchange(o.list_, nullptr)), count_(std::exchange(o.count_, 0)) {}

device_list& device_list::operator=(device_list&& o) noexcept {
  if (this != &o) {
    if (list_ != nullptr) ::ibv_free_device_list(list_);
    list_ = std::exchange(o.list_, nullptr);
    count_ = std::exchange(o.count_, 0);
  }
  return *this;
}

device_list::~device_list() {
  if (list_ != nullptr) ::ibv_free_device_list(list_);
}

std::vector<std::string> device_list::names() const {
  std::vector<std::string> v;
  v.reserve(size());
  for (ibv_device* d : devices()) v.emplace_back(::ibv_get_device_name(d));
  return v;
}

ibv_device* device_list::find(std::string_view name) const noexcept {
  for (ibv_device* d : devices())
    if (name == ::ibv_get_device_name(d)) return d;
  return nullptr;
}

std::string_view async_event::name() const noexcept { return ::ibv_event_type_str(type); }

errc async_event::severity() const noexcept {
  switch (type) {
    case IBV_EVENT_DEVICE_FATAL: return errc::device_fatal;
    case IBV_EVENT_PORT_ERR: return errc::port_down;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: return errc::qp_state_error;
    case IBV_EVENT_CQ_ERR: return errc::completion_error;
    case IBV_EVENT_SRQ_ERR: return errc::completion_error;
    default: return errc::ok;
  }
}

result<context> context::open(std::string_view name) {
  auto list = device_list::get();
  if (!list) return fail(std::move(list.error()));
  if (list->empty()) return fail(errc::no_device, "opening " + std::string(name) + ": this host has no RDMA device");
  ibv_device* dev = list->find(name);
  if (dev == nullptr) {
    std::string have;
    for (const auto& n : list->names()) have.append(have.empty() ? "" : ", ").append(n);
    return fail(errc::device_not_found, "no RDMA device called \"" + std::string(name) + "\" (have: " + have + ")");
  }
  errno = 0;
  ibv_context* ctx = ::ibv_open_device(dev);
  if (ctx == nullptr) return fail(verbs_error("ibv_open_device", name, errno, errc::device_open_failed));
  context c{ctx, std::string(name)};
  // The monitor polls for events; a blocking read would stall it.
  const int flags = ::fcntl(ctx->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return fail(verbs_error("fcntl(async_fd, O_NONBLOCK)", name, errno));
  return c;
}

context::context(context&& o) noexcept : ctx_(std::exchange(o.ctx_, nullptr)), name_(std::move(o.name_)) {}

context& context::operator=(context&& o) noexcept {
  if (this != &o) {
    close();
    ctx_ = std::exchange(o.ctx_, nullptr);
    name_ = std::move(o.name_);
  }
  return *this;
}

context::~context() { close(); }

void context::close() noexcept {
  if (ctx_ == nullptr) return;
  if (const int rc = ::ibv_close_device(ctx_); rc != 0)
    TIDE_LOG_ERROR("ibv_close_device on " << name_ << " failed: " << std::strerror(errno)
                                          << " (were all its pd/cq/qp/mr destroyed first?)");
  ctx_ = nullptr;
}

result<ibv_device_attr> context::query_device() const {
  ibv_device_attr attr{};
  if (const int rc = ::ibv_query_device(ctx_, &attr); rc != 0) return fail(verbs_error("ibv_query_device", name_, rc));
  return attr;
}

result<ibv_port_attr> context::query_port(std::uint8_t port) const {
  if (port == 0) return fail(errc::invalid_argument, name_ + ": port numbers start at 1");
  ibv_port_attr attr{};
  if (const int rc = ::ibv_query_port(ctx_, port, &attr); rc != 0)
    return fail(verbs_error("ibv_query_port(" + std::to_string(port) + ")", name_, rc));
  return attr;
}

result<gid> context::query_gid(std::uint8_t port, int index) const {
  ibv_gid g{};
  if (::ibv_query_gid(ctx_, port, index, &g) != 0)
    return fail(verbs_error("ibv_query_gid(port " + std::to_string(port) + ", index " + std::to_string(index) + ")",
                            name_, errno != 0 ? errno : EINVAL));
  const gid r = gid::from_ibv(g);
  if (r.is_zero())
    return fail(errc::gid_not_found, name_ + " port " + std::to_string(port) + ": GID index " +
                                         std::to_string(index) + " is empty");
  return r;
}

std::optional<async_event> context::next_async_event() noexcept {
  if (ctx_ == nullptr) return std::nullopt;
  ibv_async_event ev{};
  if (::ibv_get_async_event(ctx_, &ev) != 0) {
    const int err = errno;
    if (err != EAGAIN && err != EWOULDBLOCK)
      TIDE_LOG_WARN("ibv_get_async_event on " << name_ << ": " << std::strerror(err));
    return std::nullopt;
  }
  async_event out;
  out.type = ev.event_type;
  switch (ev.event_type) {
    case IBV_EVENT_CQ_ERR: out.cq = ev.element.cq; break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: out.srq = ev.element.srq; break;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE: out.port_num = ev.element.port_num; break;
    case IBV_EVENT_DEVICE_FATAL: break;
    default:  // QP events (and WQ events, which name a wq in the same slot)
      out.qp = ev.element.qp;
      // Read before the ack: once acknowledged, the QP may be destroyed (finding 12).
      if (ev.element.qp != nullptr && ev.event_type != IBV_EVENT_WQ_FATAL) out.qp_num = ev.element.qp->qp_num;
      break;
  }
  ::ibv_ack_async_event(&ev);
  return out;
}

result<ibv_mtu> mtu_from_bytes(int bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default:
      return fail(errc::invalid_argument, "MTU " + std::to_string(bytes) + " is not one of 256, 512, 1024, 2048, 4096");
  }
}

}  // namespace tide::verbs
