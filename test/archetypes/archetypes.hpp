#pragma once
// Minimal models of tide's policy concepts: each provides exactly what its
// concept documents and nothing else (no Boost hooks, no spare members).
// archetypes_test.cpp instantiates the library's templates against them,
// which proves the templates use nothing beyond the concepts.

#include <tide/metadata/backend.hpp>
#include <tide/policy/shard_hash.hpp>
#include <tide/result.hpp>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

struct ibv_cq;
struct ibv_comp_channel;

namespace tide::archetypes {

// Eviction: FIFO over a hand-rolled doubly linked list.
struct eviction {
  static constexpr std::string_view kName = "archetype_eviction";
  struct hook {
    hook* prev = nullptr;  // toward the head
    hook* next = nullptr;  // toward the tail
  };
  class order {
   public:
    void insert(hook& h) noexcept {
      h.prev = nullptr;
      h.next = head_;
      if (head_ != nullptr) head_->prev = &h;
      head_ = &h;
      if (tail_ == nullptr) tail_ = &h;
      ++size_;
    }
    void erase(hook& h) noexcept {
      (h.prev != nullptr ? h.prev->next : head_) = h.next;
      (h.next != nullptr ? h.next->prev : tail_) = h.prev;
      h.prev = h.next = nullptr;
      --size_;
    }
    void touch(hook& /*h*/) noexcept {}
    hook* evict() noexcept {
      hook* v = tail_;
      if (v != nullptr) erase(*v);
      return v;
    }
    std::size_t size() const noexcept { return size_; }

   private:
    hook* head_ = nullptr;
    hook* tail_ = nullptr;
    std::size_t size_ = 0;
  };
};

// Shard hash: everything on shard 0.
struct shard_hash {
  static constexpr std::string_view kName = "archetype_shard_hash";
  static constexpr bool kNeedsPowerOfTwo = false;
  static std::size_t shard(const shard_key& /*k*/, std::size_t /*count*/) noexcept { return 0; }
};

// Idle: returns at once.
class idle {
 public:
  static constexpr std::string_view kName = "archetype_idle";
  static constexpr bool wakes_on_completion = false;
  struct config {};
  static result<idle> create(const config& /*cfg*/) { return idle{}; }
  status attach(ibv_cq* /*cq*/, ibv_comp_channel* /*channel*/) { return {}; }
  void detach(ibv_cq* /*cq*/) noexcept {}
  void on_work() noexcept {}
  template <class F>
  void on_empty(F&& /*repass*/) noexcept {}
  void wake() noexcept {}
};

// Metadata: a map under a mutex.
class metadata {
 public:
  static constexpr std::string_view kName = "archetype_metadata";
  explicit metadata(const metadata_config& /*cfg*/) {}
  result<std::string> get_segment(std::string_view name) {
    std::lock_guard g(mu_);
    auto it = store_.find(std::string(name));
    if (it == store_.end()) return fail(errc::segment_not_found, std::string(name));
    return it->second;
  }
  status put_segment(std::string_view name, std::string_view json) {
    std::lock_guard g(mu_);
    store_[std::string(name)] = std::string(json);
    return {};
  }
  status remove_segment(std::string_view name) {
    std::lock_guard g(mu_);
    if (store_.erase(std::string(name)) == 0) return fail(errc::segment_not_found, std::string(name));
    return {};
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> store_;
};

// Endpoint for endpoint_store.
class endpoint {
 public:
  std::size_t outstanding() const noexcept { return outstanding_; }
  void on_evict() noexcept { evicted_ = true; }

  std::size_t outstanding_ = 0;  // the test sets these directly (one thread)
  bool evicted_ = false;
};

struct policies {
  using eviction = archetypes::eviction;
  using shard_hash = archetypes::shard_hash;
  using idle = archetypes::idle;
  using metadata = archetypes::metadata;
};

}  // namespace tide::archetypes
