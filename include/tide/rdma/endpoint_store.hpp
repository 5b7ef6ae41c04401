#pragma once
/// tide::endpoint_store — the endpoints of one RDMA context, keyed by peer
/// NIC path ("server@nic"), bounded, with a pluggable eviction policy.
///
/// What the store owns: the key map (a Boost.Intrusive hash set over
/// buckets allocated once), the endpoint objects, and the drain list of
/// evicted endpoints that still have work in flight.  What the policy owns:
/// the order of the entries and the choice of victim (see
/// <tide/policy/eviction.hpp>).
///
/// Sharing with in-flight users: an intrusive reference count per entry.
/// find() and get_or_insert() return a `handle` (like a shared_ptr without
/// the control block); an entry is destroyed only when it has left the map
/// (evicted, erased, cleared), no handle refers to it, and its endpoint's
/// outstanding() is zero.  The count is taken under the shared lock, so a
/// find can never resurrect an entry that an eviction has already taken out.
///
/// Locking: finds run concurrently under a reader-sharded shared lock
/// (each reader writes only its own cache line); insert / erase / evict
/// take it exclusively, for O(1) work plus the policy's evict().  The drain
/// list has its own mutex, so reclaim() never blocks finds.  Endpoint
/// factories, on_evict() and endpoint destructors run with no lock held.
///
/// Use (data path):
///   auto store = endpoint_store<rdma_endpoint, P::eviction>::create(max_endpoints);  // result<unique_ptr>
///   auto ep = (*store)->get_or_insert(peer_nic_path, [&](std::string_view key) {
///     return rdma_endpoint::create(ctx, key);         // result<std::unique_ptr<rdma_endpoint>>
///   });
///   if (!ep) return fail(ep.error());
///   (*ep)->post(slices);   // outstanding() grows; the CQ poller shrinks it
///   ep->reset();           // or let the handle go out of scope
///   // monitor thread, about 1 Hz: (*store)->trim(); (*store)->reclaim();

#include <tide/detail/log.hpp>
#include <tide/detail/sharded_shared_mutex.hpp>
#include <tide/detail/string_hash.hpp>
#include <tide/policy/eviction.hpp>
#include <tide/result.hpp>

#include <boost/intrusive/list.hpp>
#include <boost/intrusive/unordered_set.hpp>

#include <atomic>
#include <bit>
#include <cassert>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace tide {

/// What endpoint_store requires of its Endpoint type.
///
///   std::size_t outstanding() const noexcept
///       Work requests posted on this endpoint whose completions have not
///       been processed yet.  Read (possibly from a monitor thread) only
///       after the entry has left the map; it must then load with acquire
///       order, and the completion path must make its decrement to zero
///       (release) its last access to the endpoint, because the store may
///       destroy the endpoint as soon as it reads zero.
///   void on_evict() noexcept
///       Called exactly once, when the entry leaves the map (eviction,
///       erase or clear), from the thread that removed it, with no store
///       lock held: the endpoint starts its teardown (e.g. stops accepting
///       new work so that holders of a handle get errc::endpoint_closed,
///       moves its QPs to ERR so that posted work flushes).  Not called on
///       an endpoint whose insertion lost a race (see get_or_insert) nor by
///       the store's destructor.
///
/// Optionally:
///   bool pinned() const noexcept
///       True while evicting the endpoint would waste work already begun
///       (a handshake in flight, slices posted).  Choosing a victim, a
///       full store passes over pinned entries and entries a handle refers
///       to; when every entry is such, it grows past its capacity instead,
///       and later inserts and trim() bring it back.  Without pinned(),
///       every entry may be evicted.  Called under the store's exclusive
///       lock.
template <class E>
concept store_endpoint = std::destructible<E> && requires(const E& ce, E& e) {
  { ce.outstanding() } noexcept -> std::same_as<std::size_t>;
  { e.on_evict() } noexcept -> std::same_as<void>;
};

template <class E>
concept pinnable_endpoint = requires(const E& ce) {
  { ce.pinned() } noexcept -> std::same_as<bool>;
};

/// A factory for endpoint_store<E>: called as `f(key)` with the peer NIC
/// path; returns the new endpoint or the error that prevented it.
template <class F, class E>
concept endpoint_factory =
    std::invocable<F&, std::string_view> &&
    std::same_as<std::invoke_result_t<F&, std::string_view>, result<std::unique_ptr<E>>>;

template <class Endpoint, class Eviction>
class endpoint_store {
  static_assert(store_endpoint<Endpoint>,
                "endpoint_store<Endpoint, ...>: Endpoint must provide "
                "`std::size_t outstanding() const noexcept` and `void on_evict() noexcept` "
                "(see tide::store_endpoint in <tide/rdma/endpoint_store.hpp>)");
  static_assert(eviction_policy<Eviction>,
                "endpoint_store<..., Eviction>: Eviction is not an eviction policy; use "
                "tide::policy::sieve, fifo, lru or mooncake_sieve, or provide kName, hook and "
                "order with noexcept insert/erase/touch/evict/size (see <tide/policy/eviction.hpp>)");

  struct node;

 public:
  using endpoint_type = Endpoint;
  using eviction_type = Eviction;

  /// Keeps one entry's endpoint alive; empty when a find missed.
  /// Copying adds a reference (one relaxed RMW on the entry); moving is free.
  /// Requires: every handle is destroyed before the store.
  /// Thread safety: a handle is one thread's object; distinct handles to the
  /// same entry may be used and destroyed in different threads at once.
  class handle {
   public:
    handle() noexcept = default;
    handle(const handle& o) noexcept : n_(o.n_) {
      // Relaxed: the caller's own reference keeps the entry alive.
      if (n_ != nullptr) n_->refs.fetch_add(1, std::memory_order_relaxed);
    }
    handle(handle&& o) noexcept : n_(std::exchange(o.n_, nullptr)) {}
    handle& operator=(handle o) noexcept {
      std::swap(n_, o.n_);
      return *this;
    }
    ~handle() { reset(); }

    /// Drops the reference (the handle becomes empty).
    void reset() noexcept {
      // Release pairs with the acquire load in reclaim()/retire(): this
      // holder's accesses to the endpoint happen before its destruction.
      if (n_ != nullptr) n_->refs.fetch_sub(1, std::memory_order_release);
      n_ = nullptr;
    }

    [[nodiscard]] explicit operator bool() const noexcept { return n_ != nullptr; }
    /// Requires: the handle is not empty.
    [[nodiscard]] Endpoint& operator*() const noexcept { return *n_->endpoint; }
    [[nodiscard]] Endpoint* operator->() const noexcept { return n_->endpoint.get(); }
    [[nodiscard]] Endpoint* get() const noexcept { return n_ != nullptr ? n_->endpoint.get() : nullptr; }
    /// The peer NIC path of the entry (valid while the handle is).
    [[nodiscard]] std::string_view key() const noexcept { return n_ != nullptr ? n_->key : std::string_view{}; }

   private:
    friend class endpoint_store;
    explicit handle(node* adopted) noexcept : n_(adopted) {}  // adopts one reference
    node* n_ = nullptr;
  };

  /// Creates a store of at most `capacity` live entries.
  /// Errors: errc::capacity_zero when capacity == 0; errc::out_of_memory.
  /// Cost: allocates min(bit_ceil(capacity), 2^16) buckets once.
  [[nodiscard]] static result<std::unique_ptr<endpoint_store>> create(std::size_t capacity) {
    if (capacity == 0) {
      return fail(errc::capacity_zero, "endpoint_store: capacity must be at least 1 endpoint");
    }
    try {
      return std::unique_ptr<endpoint_store>(new endpoint_store(capacity));
    } catch (const std::bad_alloc&) {
      return fail(errc::out_of_memory, "endpoint_store: cannot allocate the bucket array for capacity " +
                                           std::to_string(capacity));
    }
  }

  endpoint_store(const endpoint_store&) = delete;
  endpoint_store& operator=(const endpoint_store&) = delete;

  /// Destroys every endpoint, live or draining, whatever its outstanding
  /// count: stop the workers that poll for these endpoints first.  Logs a
  /// warning for each endpoint that still had work or a handle.
  ~endpoint_store() {
    std::size_t busy = 0;
    map_.clear_and_dispose([&](node* n) {
      order_.erase(*n);
      busy += n->refs.load(std::memory_order_acquire) != 0 || n->endpoint->outstanding() != 0;
      delete n;
    });
    drain_.clear_and_dispose([&](node* n) {
      busy += !idle(*n);
      delete n;
    });
    if (busy != 0) {
      TIDE_LOG_WARN("endpoint_store: destroyed " << busy
                                                 << " endpoint(s) that still had work in flight or a handle");
    }
  }

  /// The entry for `key`, or an empty handle.  A hit calls the policy's
  /// touch() (FIFO and SIEVE never move a node; LRU does, under its lock).
  /// Thread safety: any thread, concurrently with every other member.
  /// Cost: one inline hash of the key, one RMW on this thread's lock slot (two with
  /// the unlock), one relaxed RMW on the entry; no allocation, no syscall.
  [[nodiscard]] handle find(std::string_view key) noexcept {
    const lookup k{key, hash_key(key)};
    detail::shared_guard guard(lock_);
    auto it = map_.find(k, lookup_hash{}, lookup_equal{});
    if (it == map_.end()) return handle{};
    order_.touch(*it);
    // Under the shared lock: an eviction (exclusive) either happened
    // before, and we missed, or happens after we hold this reference.
    it->refs.fetch_add(1, std::memory_order_relaxed);
    return handle{&*it};
  }

  /// True when `key` is in the map.  Does not count as a hit (no touch).
  [[nodiscard]] bool contains(std::string_view key) const noexcept {
    const lookup k{key, hash_key(key)};
    detail::shared_guard guard(lock_);
    return map_.find(k, lookup_hash{}, lookup_equal{}) != map_.end();
  }

  /// The entry for `key`; on a miss, makes one with `factory(key)` and
  /// inserts it, evicting one entry if the store is full.
  /// The factory runs without any lock held, so several threads missing
  /// on the same key may each run it: one result is kept, the others are
  /// destroyed (without on_evict) and those callers get the kept entry.
  /// Errors: the factory's error; errc::invalid_argument for an empty key
  /// or a factory that returned a null pointer; errc::out_of_memory.
  /// Thread safety: any thread.  Cost: a find; on a miss, the factory, one
  /// node allocation and one exclusive section.
  template <class Factory>
  [[nodiscard]] result<handle> get_or_insert(std::string_view key, Factory&& factory) {
    static_assert(endpoint_factory<Factory, Endpoint>,
                  "get_or_insert(key, factory): factory(std::string_view) must return "
                  "tide::result<std::unique_ptr<Endpoint>>");
    if (handle h = find(key)) return h;
    return insert_new(key, factory, /*fail_if_present=*/false);
  }

  /// Inserts a new entry made by `factory(key)`, evicting one if full.
  /// Errors: errc::already_exists when `key` is present (checked before the
  /// factory runs and again under the lock; the factory's result is then
  /// destroyed); the factory's error; errc::invalid_argument (empty key,
  /// null endpoint); errc::out_of_memory.  Thread safety: any thread.
  template <class Factory>
  [[nodiscard]] result<handle> insert(std::string_view key, Factory&& factory) {
    static_assert(endpoint_factory<Factory, Endpoint>,
                  "insert(key, factory): factory(std::string_view) must return "
                  "tide::result<std::unique_ptr<Endpoint>>");
    if (contains(key)) return fail(already_exists_error(key));
    return insert_new(key, factory, /*fail_if_present=*/true);
  }

  /// Removes `key` from the map; its endpoint gets on_evict() and is
  /// destroyed now when idle, or drained like an evicted one.
  /// Errors: errc::not_found when `key` is not in the map.
  /// Thread safety: any thread.
  [[nodiscard]] status erase(std::string_view key) {
    const lookup k{key, hash_key(key)};
    node* victim = nullptr;
    {
      std::lock_guard guard(lock_);
      auto it = map_.find(k, lookup_hash{}, lookup_equal{});
      if (it != map_.end()) {
        victim = &*it;
        order_.erase(*victim);
        map_.erase(it);
      }
    }
    if (victim == nullptr) {
      return fail(errc::not_found, "endpoint_store: no endpoint for '" + std::string(key) + "'");
    }
    retire(victim);
    return {};
  }

  /// Removes every entry as erase() would; returns how many.
  /// Thread safety: any thread.
  std::size_t clear() noexcept {
    node_list taken;
    {
      std::lock_guard guard(lock_);
      map_.clear_and_dispose([&](node* n) {
        order_.erase(*n);
        taken.push_back(*n);
      });
    }
    const std::size_t count = taken.size();
    taken.clear_and_dispose([&](node* n) { retire(n); });
    return count;
  }

  /// Destroys every drained endpoint that has no handle and no outstanding
  /// work; returns how many it destroyed.  Call it periodically (Mooncake:
  /// 1 Hz from the monitor thread).
  /// Thread safety: any thread, concurrently with everything (finds are
  /// never blocked by it).  Cost: one relaxed load when nothing drains.
  std::size_t reclaim() noexcept {
    if (draining_.load(std::memory_order_relaxed) == 0) return 0;
    node_list doomed;
    {
      std::lock_guard guard(drain_mu_);
      for (auto it = drain_.begin(); it != drain_.end();) {
        if (idle(*it)) {
          node& n = *it;
          it = drain_.erase(it);
          doomed.push_back(n);
        } else {
          ++it;
        }
      }
      draining_.store(drain_.size(), std::memory_order_relaxed);
    }
    const std::size_t count = doomed.size();
    doomed.clear_and_dispose([](node* n) { delete n; });
    return count;
  }

  /// Evicts unpinned entries while the store is past its capacity (it grew
  /// there while every entry was pinned); returns how many.  Call it with
  /// reclaim().  Thread safety: any thread.  Cost: one relaxed load when
  /// the store is within its capacity.
  std::size_t trim() noexcept {
    if (!over_capacity_.load(std::memory_order_relaxed)) return 0;
    node_list victims;
    {
      std::lock_guard guard(lock_);
      while (map_.size() > capacity_) {
        node* v = choose_victim();
        if (v == nullptr) break;
        map_.erase(map_.iterator_to(*v));
        victims.push_back(*v);
      }
      over_capacity_.store(map_.size() > capacity_, std::memory_order_relaxed);
    }
    const std::size_t count = victims.size();
    victims.clear_and_dispose([&](node* v) { retire(v); });
    return count;
  }

  /// Live entries (a snapshot under concurrency).
  [[nodiscard]] std::size_t size() const noexcept {
    detail::shared_guard guard(lock_);
    return map_.size();
  }
  /// Evicted or erased endpoints still waiting for reclaim().
  [[nodiscard]] std::size_t draining() const noexcept { return draining_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// Calls f(std::string_view key, Endpoint&) for every live entry under
  /// the shared lock (f must not call back into the store; it blocks
  /// inserts and erases while it runs).  Not a hit: nothing is touched.
  template <class F>
  void for_each(F&& f) {
    detail::shared_guard guard(lock_);
    for (node& n : map_) f(std::string_view{n.key}, *n.endpoint);
  }

  /// The policy's order, for tests that observe it.  Requires that no other
  /// thread uses the store meanwhile.
  [[nodiscard]] const typename Eviction::order& order_for_testing() const noexcept { return order_; }

 private:
  using map_hook = boost::intrusive::unordered_set_member_hook<>;
  using drain_hook = boost::intrusive::list_member_hook<>;

  struct node : Eviction::hook {
    node(std::string k, std::size_t h, std::unique_ptr<Endpoint> ep) noexcept
        : key(std::move(k)), hash(h), endpoint(std::move(ep)) {}
    map_hook in_map;
    drain_hook in_drain;  // also links a node into local lists while it moves
    std::string key;
    std::size_t hash;
    std::unique_ptr<Endpoint> endpoint;
    // Handles alive; starts at 1 for the handle the inserter gets.
    std::atomic<std::uint32_t> refs{1};
  };

  struct lookup {
    std::string_view key;
    std::size_t hash;
  };
  struct node_hash {
    std::size_t operator()(const node& n) const noexcept { return n.hash; }
  };
  struct node_equal {
    bool operator()(const node& a, const node& b) const noexcept { return a.hash == b.hash && a.key == b.key; }
  };
  struct lookup_hash {
    std::size_t operator()(const lookup& k) const noexcept { return k.hash; }
  };
  struct lookup_equal {
    bool operator()(const lookup& k, const node& n) const noexcept { return k.hash == n.hash && k.key == n.key; }
  };

  using map_type = boost::intrusive::unordered_set<
      node, boost::intrusive::member_hook<node, map_hook, &node::in_map>, boost::intrusive::hash<node_hash>,
      boost::intrusive::equal<node_equal>, boost::intrusive::power_2_buckets<true>,
      boost::intrusive::constant_time_size<true>>;
  using bucket_type = typename map_type::bucket_type;
  using bucket_traits = typename map_type::bucket_traits;
  using node_list = boost::intrusive::list<node, boost::intrusive::member_hook<node, drain_hook, &node::in_drain>,
                                           boost::intrusive::constant_time_size<true>>;

  static constexpr std::size_t kMaxBuckets = std::size_t{1} << 16;

  static std::size_t bucket_count_for(std::size_t capacity) noexcept {
    return capacity >= kMaxBuckets ? kMaxBuckets : std::bit_ceil(capacity < 8 ? std::size_t{8} : capacity);
  }

  explicit endpoint_store(std::size_t capacity)
      : capacity_(capacity),
        buckets_(new bucket_type[bucket_count_for(capacity)]),
        map_(bucket_traits(buckets_.get(), bucket_count_for(capacity))) {}

  static std::size_t hash_key(std::string_view key) noexcept { return detail::hash_string(key); }

  static error already_exists_error(std::string_view key) {
    return error{errc::already_exists, "endpoint_store: an endpoint for '" + std::string(key) + "' already exists"};
  }

  // Order matters: refs first (acquire), then outstanding.  Once the entry
  // is out of the map, refs can only fall; a holder that posted work and
  // then dropped its handle published the outstanding count before the
  // release decrement that we read here.
  static bool idle(const node& n) noexcept {
    return n.refs.load(std::memory_order_acquire) == 0 && n.endpoint->outstanding() == 0;
  }

  // An entry has just left the map (we own it): start its teardown, then
  // destroy it now or park it on the drain list.  No store lock held.
  void retire(node* n) noexcept {
    n->endpoint->on_evict();
    if (idle(*n)) {
      delete n;
      return;
    }
    std::lock_guard guard(drain_mu_);
    drain_.push_back(*n);
    draining_.store(drain_.size(), std::memory_order_relaxed);
  }

  // Under the exclusive lock, with the map full: the policy's first victim
  // that is not pinned (taken out of the order), or null when every entry is
  // pinned.  Pinned candidates go back into the order as fresh inserts, so a
  // connecting endpoint is not offered again by the next insert.  Cost: one
  // evict() without pins; at most size() evict()/insert() pairs with them.
  node* choose_victim() noexcept {
    if constexpr (!pinnable_endpoint<Endpoint>) {
      typename Eviction::hook* v = order_.evict();
      assert(v != nullptr && "eviction policy returned no victim from a full order");
      return static_cast<node*>(v);
    } else {
      node_list passed_over;
      node* victim = nullptr;
      for (std::size_t tries = order_.size(); tries != 0; --tries) {
        auto* n = static_cast<node*>(order_.evict());
        if (n == nullptr) break;
        // A handle is a holder about to use it (a lane's queued slices).
        if (n->refs.load(std::memory_order_relaxed) == 0 && !n->endpoint->pinned()) {
          victim = n;
          break;
        }
        passed_over.push_back(*n);
      }
      passed_over.clear_and_dispose([&](node* n) { order_.insert(*n); });
      return victim;
    }
  }

  template <class Factory>
  result<handle> insert_new(std::string_view key, Factory& factory, bool fail_if_present) {
    if (key.empty()) return fail(errc::invalid_argument, "endpoint_store: the peer NIC path (key) is empty");
    result<std::unique_ptr<Endpoint>> made = std::invoke(factory, key);
    if (!made) return fail(std::move(made).error());
    if (*made == nullptr) {
      return fail(errc::invalid_argument,
                  "endpoint_store: the factory for '" + std::string(key) + "' returned a null endpoint");
    }
    const std::size_t h = hash_key(key);
    std::unique_ptr<node> fresh;
    try {
      fresh = std::make_unique<node>(std::string(key), h, std::move(*made));
    } catch (const std::bad_alloc&) {
      return fail(errc::out_of_memory, "endpoint_store: cannot allocate the entry for '" + std::string(key) + "'");
    }

    node_list victims;
    node* existing = nullptr;
    {
      std::lock_guard guard(lock_);
      auto it = map_.find(lookup{key, h}, lookup_hash{}, lookup_equal{});
      if (it != map_.end()) {
        existing = &*it;
        if (!fail_if_present) {
          order_.touch(*existing);
          existing->refs.fetch_add(1, std::memory_order_relaxed);
        }
      } else {
        // Back under capacity when pins allowed growth past it before.
        while (map_.size() >= capacity_) {
          node* v = choose_victim();
          if (v == nullptr) break;
          map_.erase(map_.iterator_to(*v));
          victims.push_back(*v);
        }
        map_.insert_equal(*fresh);
        order_.insert(*fresh);
        if (map_.size() > capacity_) over_capacity_.store(true, std::memory_order_relaxed);
      }
    }
    victims.clear_and_dispose([&](node* v) { retire(v); });
    if (existing != nullptr) {
      fresh.reset();  // lost the race: destroyed here, outside the lock
      if (fail_if_present) return fail(already_exists_error(key));
      return handle{existing};
    }
    return handle{fresh.release()};
  }

  const std::size_t capacity_;
  mutable detail::sharded_shared_mutex lock_;
  std::unique_ptr<bucket_type[]> buckets_;
  map_type map_;
  typename Eviction::order order_;

  std::atomic<bool> over_capacity_{false};  // set under lock_ by an insert past capacity

  std::mutex drain_mu_;
  node_list drain_;
  std::atomic<std::size_t> draining_{0};
};

}  // namespace tide
