#pragma once
// Bench-only baseline: an endpoint store built the way Mooncake builds its
// FIFOEndpointStore / SIEVEEndpointStore (transfer engine, rdma_transport/
// endpoint_store.cpp): std::unordered_map from the peer NIC path to a
// std::shared_ptr, a std::list of keys with a second unordered_map of list
// iterators, a std::set "waiting list" of evicted endpoints, all under one
// reader-writer lock (std::shared_mutex here; Mooncake uses its own
// RWSpinlock).  SIEVE marks visited with an atomic store on every hit and
// inserts new entries visited (Mooncake's PR #767).  Written for this
// benchmark from the description in shared/research/mooncake.md; it is not
// part of tide.

#include <atomic>
#include <cstddef>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tide::bench::mooncake_like {

struct endpoint {
  std::atomic<std::size_t> outstanding{0};
  std::atomic<bool> active{true};
};

class fifo_store {
 public:
  explicit fifo_store(std::size_t max_size) : max_size_(max_size) {}

  std::shared_ptr<endpoint> get(const std::string& key) {
    std::shared_lock g(lock_);
    auto it = map_.find(key);
    return it != map_.end() ? it->second : nullptr;
  }

  std::shared_ptr<endpoint> insert(const std::string& key) {
    std::unique_lock g(lock_);
    if (auto it = map_.find(key); it != map_.end()) return it->second;
    auto ep = std::make_shared<endpoint>();
    while (map_.size() >= max_size_) evict();
    map_[key] = ep;
    list_.push_back(key);
    pos_[key] = std::prev(list_.end());
    return ep;
  }

  std::size_t reclaim() {
    std::unique_lock g(lock_);
    std::vector<std::shared_ptr<endpoint>> doomed;
    for (const auto& ep : waiting_) {
      if (ep->outstanding.load(std::memory_order_acquire) == 0) doomed.push_back(ep);
    }
    for (const auto& ep : doomed) waiting_.erase(ep);
    return doomed.size();
  }

 private:
  void evict() {
    if (list_.empty()) return;
    const std::string victim = list_.front();
    list_.pop_front();
    pos_.erase(victim);
    auto& ep = map_[victim];
    ep->active = false;
    waiting_.insert(ep);
    map_.erase(victim);
  }

  std::size_t max_size_;
  std::shared_mutex lock_;
  std::unordered_map<std::string, std::shared_ptr<endpoint>> map_;
  std::list<std::string> list_;
  std::unordered_map<std::string, std::list<std::string>::iterator> pos_;
  std::set<std::shared_ptr<endpoint>> waiting_;
};

class sieve_store {
 public:
  explicit sieve_store(std::size_t max_size) : max_size_(max_size) {}

  std::shared_ptr<endpoint> get(const std::string& key) {
    std::shared_lock g(lock_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    it->second.second.store(true, std::memory_order_relaxed);  // every hit writes
    return it->second.first;
  }

  std::shared_ptr<endpoint> insert(const std::string& key) {
    std::unique_lock g(lock_);
    if (auto it = map_.find(key); it != map_.end()) return it->second.first;
    auto ep = std::make_shared<endpoint>();
    while (map_.size() >= max_size_) evict();
    auto& slot = map_[key];
    slot.first = ep;
    slot.second.store(true, std::memory_order_relaxed);  // inserted visited
    list_.push_front(key);
    pos_[key] = list_.begin();
    return ep;
  }

  std::size_t reclaim() {
    std::unique_lock g(lock_);
    std::vector<std::shared_ptr<endpoint>> doomed;
    for (const auto& ep : waiting_) {
      if (ep->outstanding.load(std::memory_order_acquire) == 0) doomed.push_back(ep);
    }
    for (const auto& ep : doomed) waiting_.erase(ep);
    return doomed.size();
  }

 private:
  using list_t = std::list<std::string>;

  void evict() {
    if (list_.empty()) return;
    auto o = hand_ ? *hand_ : std::prev(list_.end());
    for (;;) {
      auto& visited = map_[*o].second;
      if (!visited.load(std::memory_order_relaxed)) break;
      visited.store(false, std::memory_order_relaxed);
      o = o == list_.begin() ? std::prev(list_.end()) : std::prev(o);
    }
    if (o == list_.begin()) {
      hand_.reset();
    } else {
      hand_ = std::prev(o);
    }
    const std::string victim = *o;
    list_.erase(o);
    pos_.erase(victim);
    auto ep = map_[victim].first;
    ep->active = false;
    waiting_.insert(ep);
    map_.erase(victim);
  }

  std::size_t max_size_;
  std::shared_mutex lock_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<endpoint>, std::atomic<bool>>> map_;
  list_t list_;
  std::unordered_map<std::string, list_t::iterator> pos_;
  std::optional<list_t::iterator> hand_;
  std::set<std::shared_ptr<endpoint>> waiting_;
};

}  // namespace tide::bench::mooncake_like
