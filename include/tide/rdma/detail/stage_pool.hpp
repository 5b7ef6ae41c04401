#pragma once
/// The staged RDMA path: local memory that no NIC registered (GPU memory
/// where neither dma-buf nor nvidia_peermem serves, host memory with the
/// staging switch) still moves over RDMA, through pinned host chunks the
/// NIC did register.  A lane gives a staged slice a chunk just before it
/// posts it; a WRITE's bytes are copied into the chunk then, a READ's are
/// copied out of it when its WR completes, before the slice retires, so a
/// task is final only after its last copy ("final means final").  The lane
/// copies slice k+1 while the NIC moves slice k: the pipeline is the lane's
/// post loop.  Copies are the buffer's copy engine's (memcpy, or CUDA's
/// synchronous cuMemcpy on the device's primary context).
///
/// Ownership and threads: a pool belongs to one lane and only that lane's
/// thread takes and gives back its chunks.  A chunk is attached to a slice
/// (slice::chunk) only while the slice sits in that lane's queued groups or
/// posted rings; every way out of them (detail::retire_wr, and
/// rdma_context::on_slice_failed before a retry goes elsewhere) runs on the
/// lane's thread and detaches it first (unstage).

#include <tide/detail/log.hpp>
#include <tide/errc.hpp>
#include <tide/memory/memory_kind.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace tide::rdma::detail {

class stage_pool;

/// One bounce chunk; while attached, the slice's local_addr/lkey name the
/// chunk and `user_addr` keeps the slice's own address.
struct stage_chunk {
  std::byte* data = nullptr;
  std::uint64_t user_addr = 0;
  stage_pool* pool = nullptr;
  stage_chunk* next_free = nullptr;
};

class stage_pool {
 public:
  /// `staged` counts the payload bytes copied through the chunks (either
  /// way); the context's, which outlives the pool.
  stage_pool(std::size_t chunk_size, std::size_t chunks, std::atomic<std::uint64_t>& staged) noexcept
      : chunk_size_(chunk_size), count_(chunks), staged_(staged) {}
  stage_pool(const stage_pool&) = delete;
  stage_pool& operator=(const stage_pool&) = delete;
  ~stage_pool() {
    mr_.reset();  // before the memory it registered
    if (pinned_by_ != nullptr) pinned_by_->unpin(memory_.get());
  }

  /// Readies the front of the chain at `head` for posting: each staged
  /// slice (stager set) gets a chunk and a WRITE's bytes.  Returns how many
  /// slices from the front may be posted (at most `limit`); it stops at the
  /// first staged slice it cannot give a chunk (none free: it waits for
  /// completions to give some back).  A slice at the front that cannot be
  /// staged at all (its copy failed, it is longer than a chunk, the pool
  /// cannot be made) is unlinked and returned in `refused` with why in
  /// `refused_error`: the caller retires it (it would fail on every path).
  /// Lane thread.
  [[nodiscard]] std::uint32_t prepare(slice*& head, std::uint32_t limit, const verbs::protection_domain& pd,
                                      slice*& refused, errc& refused_error) noexcept {
    refused = nullptr;
    std::uint32_t ready = 0;
    for (slice* s = head; s != nullptr && ready < limit; s = s->next) {
      if (s->stager == nullptr || s->chunk != nullptr) {
        ++ready;
        continue;
      }
      errc e = s->length > chunk_size_ ? errc::invalid_argument : errc::ok;
      stage_chunk* c = nullptr;
      if (e == errc::ok) {
        if (!ensure(pd, *s->stager)) {
          e = errc::out_of_memory;
        } else if (c = take(); c == nullptr) {
          break;
        }
      }
      if (e == errc::ok && s->op != transfer_op::read) {
        e = s->stager->to_host(c->data, s->local_addr, s->length);
        if (e == errc::ok) staged_.fetch_add(s->length, std::memory_order_relaxed);
      }
      if (e != errc::ok) {
        if (c != nullptr) give_back(c);
        if (ready != 0) break;  // it heads the chain on a later call
        if (!warned_)  // once per pool: a pool that cannot be made refuses every slice
          TIDE_LOG_WARN("staged RDMA: a " << s->length << "-byte slice at " << s->local_addr << " cannot be staged ("
                                          << (e == errc::invalid_argument ? "longer than a stage chunk"
                                                                          : (e == errc::out_of_memory ? why_broken_
                                                                                                      : "the copy failed"))
                                          << "); its task fails with " << to_string(e));
        warned_ = true;
        head = s->next;
        s->next = nullptr;
        refused = s;
        refused_error = e;
        return 0;
      }
      c->user_addr = s->local_addr;
      s->chunk = c;
      s->local_addr = reinterpret_cast<std::uint64_t>(c->data);
      s->lkey = mr_->lkey();
      ++ready;
    }
    return ready;
  }

  // ---- unstage's half (detail::unstage) ----
  void give_back(stage_chunk* c) noexcept {
    c->next_free = free_;
    free_ = c;
  }
  void count_staged(std::uint64_t n) noexcept { staged_.fetch_add(n, std::memory_order_relaxed); }

 private:
  // Allocates and registers the chunks on the first staged slice: a lane
  // that never stages costs nothing.  Pinned by the first engine that pins.
  bool ensure(const verbs::protection_domain& pd, const memory::copy_engine& e) noexcept {
    if (!mr_ && !broken_) {
      broken_ = true;  // until every step below succeeded
      const std::size_t bytes = chunk_size_ * count_;
      try {
        memory_.reset(new (std::nothrow) std::byte[bytes]);
        if (!memory_) {
          why_broken_ = "cannot allocate " + std::to_string(bytes) + " bytes of stage chunks";
          return false;
        }
        auto mr = verbs::memory_region::register_memory(pd, memory_.get(), bytes, IBV_ACCESS_LOCAL_WRITE);
        if (!mr) {
          why_broken_ = "cannot register the stage chunks: " + mr.error().message();
          memory_.reset();
          return false;
        }
        chunks_.resize(count_);
        mr_.emplace(std::move(*mr));
      } catch (...) {  // a string or the chunk table: out of memory
        memory_.reset();
        return false;
      }
      for (std::size_t i = count_; i-- > 0;) {
        chunks_[i].data = memory_.get() + i * chunk_size_;
        chunks_[i].pool = this;
        chunks_[i].next_free = free_;
        free_ = &chunks_[i];
      }
      broken_ = false;
    }
    if (!mr_) return false;
    if (pinned_by_ == nullptr && tried_ != &e) {
      tried_ = &e;
      if (e.pin(memory_.get(), chunk_size_ * count_)) pinned_by_ = &e;
    }
    return true;
  }

  stage_chunk* take() noexcept {
    stage_chunk* c = free_;
    if (c != nullptr) {
      free_ = c->next_free;
      c->next_free = nullptr;
    }
    return c;
  }

  const std::size_t chunk_size_;
  const std::size_t count_;
  std::unique_ptr<std::byte[]> memory_;
  std::optional<verbs::memory_region> mr_;
  std::vector<stage_chunk> chunks_;
  stage_chunk* free_ = nullptr;
  bool broken_ = false;     ///< the chunks cannot be made (tried once)
  std::string why_broken_;  ///< why, where it could be said
  bool warned_ = false;     ///< a refusal was logged
  const memory::copy_engine* pinned_by_ = nullptr;
  const memory::copy_engine* tried_ = nullptr;
  std::atomic<std::uint64_t>& staged_;
};

/// Detaches a staged slice's chunk as the slice leaves its lane with
/// outcome `e`: a completed READ's bytes are copied to the slice's own
/// memory first.  Returns the outcome, copy_failed (or the engine's error)
/// when that copy failed.  Lane thread; a slice without a chunk passes.
[[nodiscard]] inline errc unstage(slice& s, errc e) noexcept {
  stage_chunk* c = s.chunk;
  if (c == nullptr) return e;
  s.chunk = nullptr;
  if (e == errc::ok && s.op == transfer_op::read) {
    e = s.stager->from_host(c->user_addr, c->data, s.length);
    if (e == errc::ok) c->pool->count_staged(s.length);
  }
  s.local_addr = c->user_addr;
  s.lkey = 0;
  c->pool->give_back(c);
  return e;
}

}  // namespace tide::rdma::detail
