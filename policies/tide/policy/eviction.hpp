#pragma once
/// The eviction-policy concept: how tide::endpoint_store orders its entries
/// and which one it gives up when it is full.
///
/// A policy orders entries only.  The store owns the key map, the endpoint
/// objects, their lifetime and the drain list of evicted endpoints; the
/// policy never allocates, never frees and never sees a key.
///
/// Shape of a policy P (see fifo.hpp, sieve.hpp, lru.hpp; the archetype is
/// test/archetypes/archetypes.hpp):
///
///   struct P {
///     static constexpr std::string_view kName = "...";
///     struct hook  { ... };   // per-entry state; the store's node derives
///                             // from it (so it must be a non-final class)
///     class  order { ... };   // per-store state over hooks
///   };
///
/// `order` members (all noexcept, none allocates):
///   void  insert(hook& h)  Requires: h is not in any order.  Effects: h
///                          becomes an entry.  Called with exclusive access.
///   void  erase(hook& h)   Requires: h is an entry.  Effects: h is removed
///                          (explicit delete).  Exclusive access.
///   hook* evict()          Effects: chooses the victim, removes it from
///                          the order and returns it; nullptr when empty.
///                          Exclusive access.
///   void  touch(hook& h)   A hit on entry h.  Called under the store's
///                          *shared* lock: it may run concurrently with
///                          other touch() calls on the same order (never
///                          with insert/erase/evict), so it must be
///                          thread-safe on its own (FIFO: nothing; SIEVE: a
///                          relaxed atomic bit; LRU: its own short lock).
///   size_t size() const    Number of entries.
///
/// Complexity: insert/erase/touch O(1); evict amortised O(1).

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace tide {

/// P names itself and declares its per-entry hook and per-store order.
template <class P>
concept eviction_policy_shape = requires {
  { P::kName } -> std::convertible_to<std::string_view>;
  typename P::hook;
  typename P::order;
} && std::is_class_v<typename P::hook> && !std::is_final_v<typename P::hook> &&
    std::default_initializable<typename P::hook> && std::default_initializable<typename P::order>;

/// P's order offers insert/erase/touch/evict/size, each noexcept, with the
/// documented signatures.
template <class P>
concept eviction_policy_ops =
    eviction_policy_shape<P> &&
    requires(typename P::order& o, const typename P::order& co, typename P::hook& h) {
      { o.insert(h) } noexcept -> std::same_as<void>;
      { o.erase(h) } noexcept -> std::same_as<void>;
      { o.touch(h) } noexcept -> std::same_as<void>;
      { o.evict() } noexcept -> std::same_as<typename P::hook*>;
      { co.size() } noexcept -> std::same_as<std::size_t>;
    };

/// An eviction policy for tide::endpoint_store (see the top of this file).
/// Shipped: policy::fifo, policy::sieve, policy::mooncake_sieve, policy::lru.
template <class P>
concept eviction_policy = eviction_policy_ops<P>;

}  // namespace tide
