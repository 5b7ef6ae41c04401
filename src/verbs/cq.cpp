#include <tide/verbs/cq.hpp>

#include <tide/detail/log.hpp>
#include <tide/verbs/error.hpp>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tide::verbs {

result<completion_channel> completion_channel::create(const context& ctx) {
  errno = 0;
  ibv_comp_channel* ch = ::ibv_create_comp_channel(ctx.native_handle());
  if (ch == nullptr) return fail(verbs_error("ibv_create_comp_channel", ctx.name(), errno));
  completion_channel c{ch};
  const int flags = ::fcntl(ch->fd, F_GETFL);
  if (flags < 0 || ::fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return fail(verbs_error("fcntl(comp_channel fd, O_NONBLOCK)", ctx.name(), errno));
  return c;
}

completion_channel::completion_channel(completion_channel&& o) noexcept : ch_(std::exchange(o.ch_, nullptr)) {}

completion_channel& completion_channel::operator=(completion_channel&& o) noexcept {
  if (this != &o) {
    reset();
    ch_ = std::exchange(o.ch_, nullptr);
  }
  return *this;
}

completion_channel::~completion_channel() { reset(); }

void completion_channel::reset() noexcept {
  if (ch_ == nullptr) return;
  if (const int rc = ::ibv_destroy_comp_channel(ch_); rc != 0)
    TIDE_LOG_ERROR("ibv_destroy_comp_channel on " << device_name_of(ch_->context) << " failed: "
                                                  << std::strerror(rc) << " (a CQ still bound to it?)");
  ch_ = nullptr;
}

std::optional<ibv_cq*> completion_channel::try_get_event() noexcept {
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  if (::ibv_get_cq_event(ch_, &cq, &cq_ctx) != 0) {
    const int err = errno;
    if (err != EAGAIN && err != EWOULDBLOCK)
      TIDE_LOG_WARN("ibv_get_cq_event on " << device_name_of(ch_->context) << ": " << std::strerror(err));
    return std::nullopt;
  }
  return cq;
}

result<completion_queue> completion_queue::create(const context& ctx, int cqe, completion_channel* channel,
                                                  int comp_vector) {
  if (cqe < 1) return fail(errc::invalid_argument, "ibv_create_cq on " + ctx.name() + ": cqe " + std::to_string(cqe) + " < 1");
  if (auto attr = ctx.query_device(); attr && cqe > attr->max_cqe)
    return fail(errc::invalid_argument, "ibv_create_cq on " + ctx.name() + ": cqe " + std::to_string(cqe) +
                                            " above the device's max_cqe " + std::to_string(attr->max_cqe));
  errno = 0;
  ibv_cq* cq = ::ibv_create_cq(ctx.native_handle(), cqe, nullptr,
                               channel != nullptr ? channel->native_handle() : nullptr, comp_vector);
  if (cq == nullptr)
    return fail(verbs_error("ibv_create_cq(" + std::to_string(cqe) + " entries)", ctx.name(), errno));
  return completion_queue{cq};
}

completion_queue::completion_queue(completion_queue&& o) noexcept : cq_(std::exchange(o.cq_, nullptr)) {}

completion_queue& completion_queue::operator=(completion_queue&& o) noexcept {
  if (this != &o) {
    reset();
    cq_ = std::exchange(o.cq_, nullptr);
  }
  return *this;
}

completion_queue::~completion_queue() { reset(); }

void completion_queue::reset() noexcept {
  if (cq_ == nullptr) return;
  if (const int rc = ::ibv_destroy_cq(cq_); rc != 0)
    TIDE_LOG_ERROR("ibv_destroy_cq on " << device_name_of(cq_->context) << " failed: " << std::strerror(rc)
                                        << " (a QP still uses it, or events are unacknowledged?)");
  cq_ = nullptr;
}

errc completion_queue::req_notify(bool solicited_only) noexcept {
  return ::ibv_req_notify_cq(cq_, solicited_only ? 1 : 0) == 0 ? errc::ok : errc::verbs_failed;
}

}  // namespace tide::verbs
