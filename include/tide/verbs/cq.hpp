#pragma once
/// RAII owners of a completion channel and a completion queue.

#include <tide/errc.hpp>
#include <tide/result.hpp>
#include <tide/verbs/device.hpp>

#include <infiniband/verbs.h>

#include <optional>
#include <span>

namespace tide::verbs {

/// A completion channel (ibv_comp_channel): the fd a thread can wait on for
/// completion events of the CQs bound to it. Its fd is non-blocking. Move-only;
/// must outlive every CQ bound to it.
class completion_channel {
 public:
  /// ibv_create_comp_channel. Errors: resource_exhausted, verbs_failed. Any thread.
  [[nodiscard]] static result<completion_channel> create(const context& ctx);

  completion_channel(completion_channel&& o) noexcept;
  completion_channel& operator=(completion_channel&& o) noexcept;
  completion_channel(const completion_channel&) = delete;
  completion_channel& operator=(const completion_channel&) = delete;
  ~completion_channel();

  [[nodiscard]] ibv_comp_channel* native_handle() const noexcept { return ch_; }
  /// Readable when an armed CQ bound to this channel has a new completion.
  [[nodiscard]] int fd() const noexcept { return ch_ != nullptr ? ch_->fd : -1; }
  /// Takes one pending event (ibv_get_cq_event) without blocking and returns
  /// the CQ it names, or nothing. The caller must acknowledge it with that CQ's
  /// `ack_events` (batched: acking takes a lock) before the CQ is destroyed.
  /// One thread at a time; one read() system call.
  [[nodiscard]] std::optional<ibv_cq*> try_get_event() noexcept;

 private:
  explicit completion_channel(ibv_comp_channel* ch) noexcept : ch_(ch) {}
  void reset() noexcept;
  ibv_comp_channel* ch_ = nullptr;
};

/// A completion queue (ibv_cq). Move-only; destroyed in the destructor, which
/// logs (never throws) on failure. Destroy it before its QPs' context closes
/// and after its QPs are destroyed.
class completion_queue {
 public:
  /// ibv_create_cq(ctx, cqe, nullptr, channel, comp_vector); `channel` may be
  /// nullptr (poll-only CQ). Errors: invalid_argument (cqe < 1 or above the
  /// device's max_cqe: the detail names both), resource_exhausted, verbs_failed.
  [[nodiscard]] static result<completion_queue> create(const context& ctx, int cqe,
                                                       completion_channel* channel = nullptr,
                                                       int comp_vector = 0);

  completion_queue(completion_queue&& o) noexcept;
  completion_queue& operator=(completion_queue&& o) noexcept;
  completion_queue(const completion_queue&) = delete;
  completion_queue& operator=(const completion_queue&) = delete;
  ~completion_queue();

  [[nodiscard]] ibv_cq* native_handle() const noexcept { return cq_; }
  /// The number of entries the device actually gave (>= the requested cqe).
  [[nodiscard]] int capacity() const noexcept { return cq_->cqe; }

  /// ibv_poll_cq into `out`: the number of completions written (0 when none),
  /// or a negative value when polling failed (the CQ is in error). Hot path:
  /// noexcept, no allocation, no system call. One thread at a time per CQ.
  [[nodiscard]] int poll(std::span<ibv_wc> out) noexcept {
    return ::ibv_poll_cq(cq_, static_cast<int>(out.size()), out.data());
  }

  /// Arms the CQ (ibv_req_notify_cq): the next completion raises an event on
  /// the channel. Re-poll after arming to close the race with completions that
  /// arrived before. Returns ok or verbs_failed. noexcept.
  [[nodiscard]] errc req_notify(bool solicited_only = false) noexcept;

  /// Acknowledges `n` events taken from the channel for this CQ.
  void ack_events(unsigned n) noexcept {
    if (n != 0) ::ibv_ack_cq_events(cq_, n);
  }

 private:
  explicit completion_queue(ibv_cq* cq) noexcept : cq_(cq) {}
  void reset() noexcept;
  ibv_cq* cq_ = nullptr;
};

}  // namespace tide::verbs
