#pragma once
/// The lane's cold paths (rdma/lane.hpp): a failed CQ, and the drain when
/// the lane stops.  Lane thread.  Not API; lane.hpp includes it last.

#include <tide/rdma/lane.hpp>

#include <chrono>
#include <thread>
#include <vector>

namespace tide::rdma {

// The CQ failed: no completion will come for anything posted on it.  Takes
// every slice out of this lane's rings, rebuilds the CQ, fails every
// endpoint (each has a QP on the old CQ), and only then hands the slices
// back to the transport (completion_queue_error) for another path: in the
// other order an endpoint made between the two from the old CQ table
// survived with its QP on the abandoned CQ, and a retry could land on it
// (post_pending also refuses such a QP).  The
// old CQ lives until its QPs are destroyed.
template <class P>
void lane<P>::on_cq_error(const char* why) noexcept {
  TIDE_LOG_WARN(ctx_.name() << ": lane " << index_ << ": completion queue error (" << why
                            << "): failing its endpoints and rebuilding it");
  std::vector<handle> eps;
  eps.swap(posted_);
  cq_used_ = 0;
  notify_.on_cq_error();
  detail::slice* failed = nullptr;
  detail::slice** link = &failed;
  for (auto& h : eps) {
    endpoint& e = *h;
    e.lane_error(index_);
    std::size_t n = 0;
    for (detail::slice* s = e.take_ring(index_); s != nullptr; s = s->next, ++n) {
      *link = s;
      link = &s->next;
    }
    e.release(n);
  }
  if (auto fresh = ctx_.rebuild_cq(index_); fresh) {
    idle_->detach(cq_->native_handle());
    cq_ = std::move(*fresh);
    if (auto r = idle_->attach(cq_->native_handle(), ctx_.channel(index_)); !r)
      TIDE_LOG_ERROR(ctx_.name() << ": lane " << index_ << ": " << r.error().message());
    cq_capacity_ = static_cast<std::uint32_t>(std::max(1, cq_->capacity()));
    native_cq_.store(cq_->native_handle(), std::memory_order_release);
  } else {
    TIDE_LOG_ERROR(ctx_.name() << ": lane " << index_ << ": cannot rebuild the CQ: " << fresh.error().message());
  }
  ctx_.cq_failed(index_);
  for (detail::slice* s = failed; s != nullptr;) {
    detail::slice* next = s->next;
    s->next = nullptr;
    ctx_.on_slice_failed(*s, errc::completion_queue_error);
    s = next;
  }
  eps.clear();  // after the slices: a drain marker among them lives in its endpoint
}

// Stopping: retires what is queued, waits (bounded) for the completions of
// what is posted, then retires what is left in the rings.
template <class P>
void lane<P>::drain_on_stop() noexcept {
  (void)handle_mail();
  if (detail::slice* chain = queue_.take_all()) enqueue(chain);
  for (auto& g : groups_) {
    for (detail::slice* s = g.head; s != nullptr;) {
      detail::slice* next = s->next;
      s->next = nullptr;
      detail::retire_wr(*s, errc::endpoint_closed);
      s = next;
    }
    g = {};
  }
  // Completions of WRs still out: bounded wait (the context moved the QPs
  // to ERR first, so they flush).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((cq_used_ != 0 || notify_.rx_posted() != 0) && std::chrono::steady_clock::now() < until) {
    (void)handle_mail();
    if (!undrained_.empty()) (void)retry_drains();
    if (poll() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (endpoint* e : undrained_) e->release();  // their rings are taken below
  undrained_.clear();
  for (auto& h : posted_) {
    std::size_t n = 0;
    for (detail::slice* s = h->take_ring(index_); s != nullptr;) {
      detail::slice* next = s->next;
      s->next = nullptr;
      ++n;
      detail::retire_wr(*s, errc::endpoint_closed);
      s = next;
    }
    h->release(n);
  }
  posted_.clear();
  notify_.stop();  // notifications not posted go back (TCP); receives left give their holds up
  (void)handle_mail();
}

}  // namespace tide::rdma
