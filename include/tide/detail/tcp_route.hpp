#pragma once
// The engine's TCP route (not API): where the engine joins the two
// transports, which know nothing of each other.  To the RDMA data path it is
// a slice_carrier (rdma/detail/carrier.hpp): a WR handed over becomes a
// tcp::op to the peer's data port, and its outcome goes back through
// rdma_transport::carried.  To the TCP server it is the local_memory: a
// peer's request opens a range of a registered buffer through
// rdma_transport::open_local_range.
//
// Ownership: the engine owns the route, the tcp::transport and the
// rdma_transport; it shuts the data path down, then the TCP transport
// (every op done), before either goes.  Jobs (one per WR in flight over
// TCP) come from a pool the route owns: taken by the thread that carries a
// WR, given back by the I/O thread that ends it.

#include <tide/rdma/rdma_transport.hpp>
#include <tide/tcp/tcp_transport.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <vector>

namespace tide::detail {

template <class P>
class tcp_route final : public rdma::detail::slice_carrier, public tcp::local_memory {
 public:
  tcp_route() = default;
  tcp_route(const tcp_route&) = delete;
  tcp_route& operator=(const tcp_route&) = delete;

  /// The owner, once each, before the first request: the data path (for
  /// the server's ranges and the carried outcomes) and the TCP transport.
  void attach(rdma::rdma_transport<P>* data_path, tcp::transport* tcp) noexcept {
    tcp_ = tcp;
    data_path_.store(data_path, std::memory_order_release);
  }

  [[nodiscard]] bool reaches(const rdma::remote_segment& seg) const noexcept override {
    return tcp_ != nullptr && seg.tcp_port != 0;
  }

  void carry(rdma::detail::slice& s) noexcept override {
    job* j = take();
    auto* dp = data_path_.load(std::memory_order_acquire);
    if (j == nullptr) return dp->carried(s, errc::out_of_memory);
    const auto* seg = static_cast<const rdma::remote_segment*>(s.task->keep_alive.get());
    j->s = &s;
    j->kind = s.op;
    j->local_addr = s.local_addr;
    j->remote_addr = s.remote_addr;
    j->length = s.length;
    j->stager = dp->stager_of(s.local_addr, s.length);
    j->requeued_ = 0;
    tcp_->submit(tcp::peer{seg->tcp_host, seg->tcp_port, seg->tcp_version}, *j);
  }

  wire::tcp_status open_range(std::uint64_t addr, std::uint64_t length, transfer_op kind, void*& handle,
                              const memory::copy_engine*& stager) noexcept override {
    auto* dp = data_path_.load(std::memory_order_acquire);
    if (dp == nullptr) return wire::tcp_status::unavailable;  // still starting
    switch (dp->open_local_range(addr, length, kind, handle, stager)) {
      case errc::ok: return wire::tcp_status::ok;
      case errc::remote_access_denied: return wire::tcp_status::access_denied;
      case errc::busy: return wire::tcp_status::unavailable;
      default: return wire::tcp_status::addr_rejected;
    }
  }
  void close_range(void* handle) noexcept override {
    data_path_.load(std::memory_order_acquire)->close_local_range(handle);
  }

 private:
  struct job final : tcp::op {
    tcp_route* owner = nullptr;
    rdma::detail::slice* s = nullptr;
    void done(errc e) noexcept override {
      rdma::detail::slice* slice = s;
      tcp_route* r = owner;
      r->give(this);  // first: carried() may carry the slice again
      r->data_path_.load(std::memory_order_acquire)->carried(*slice, e);
    }
    [[nodiscard]] errc stop_reason() const noexcept override { return rdma::detail::should_drop(*s); }
  };

  job* take() noexcept {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      try {
        jobs_.emplace_back();
        free_.reserve(jobs_.size());  // give() then never allocates
      } catch (...) {
        return nullptr;
      }
      jobs_.back().owner = this;
      return &jobs_.back();
    }
    job* j = free_.back();
    free_.pop_back();
    return j;
  }
  void give(job* j) noexcept {
    std::lock_guard lock(mu_);
    free_.push_back(j);
  }

  std::atomic<rdma::rdma_transport<P>*> data_path_{nullptr};
  tcp::transport* tcp_ = nullptr;
  std::mutex mu_;
  std::deque<job> jobs_;     ///< every job made, never freed while the route lives (stable addresses)
  std::vector<job*> free_;  ///< under mu_
};

}  // namespace tide::detail
