#pragma once
/// tide::default_policies and the policy-set check.
///
/// A user names a policy set by deriving from the defaults and overriding
/// what they want (the traits pattern of moodycamel::ConcurrentQueue):
///
///   struct my_policies : tide::default_policies {
///     using eviction = tide::policy::fifo;
///     using idle     = tide::policy::cq_event;
///   };
///
/// Templates that take a policy set start with
///   static_assert(tide::check_policy_set<P>());
/// which fails with a message naming the member to change; the concept
/// tide::policy_set<P> says the same as a bool.

#include <tide/metadata/backend.hpp>
#include <tide/policy/busy_poll.hpp>
#include <tide/policy/cq_event.hpp>
#include <tide/policy/eviction.hpp>
#include <tide/policy/fifo.hpp>
#include <tide/policy/hybrid.hpp>
#include <tide/policy/idle.hpp>
#include <tide/policy/load_aware.hpp>
#include <tide/policy/lru.hpp>
#include <tide/policy/mix_hash.hpp>
#include <tide/policy/mooncake_hash.hpp>
#include <tide/policy/mooncake_random.hpp>
#include <tide/policy/p2p.hpp>
#include <tide/policy/path.hpp>
#include <tide/policy/peer_path_hash.hpp>
#include <tide/policy/round_robin.hpp>
#include <tide/policy/shard_hash.hpp>
#include <tide/policy/sieve.hpp>
#include <tide/policy/spin_event.hpp>

namespace tide {

/// The defaults, one per axis.  Derive and override; each member below says
/// when to change it.
struct default_policies {
  /// Which endpoint to drop when a context reaches its endpoint limit.
  /// SIEVE: hits cost one bit and move nothing, and on skewed (Zipf) peer
  /// popularity it misses least.  fifo: when peers are used round robin;
  /// lru: for comparison; mooncake_sieve: to behave exactly like Mooncake.
  using eviction = policy::sieve;

  /// Which worker shard serves a slice.  mooncake_hash: Mooncake's
  /// placement, any shard count, and perfectly even over the sequential
  /// segment and device ids that openSegment hands out (bench/micro (c)).
  /// mix_hash when ids are sparse or adversarial (avalanching, no division,
  /// power-of-two counts); peer_path_hash when one peer NIC is reached
  /// through several segment ids.
  using shard_hash = policy::mooncake_hash;

  /// What a transfer worker does with nothing to do.  spin_event: spin
  /// 200 us after the last work, then sleep until a completion or a submit,
  /// so small requests see a spinning worker and long transfers leave the
  /// CPU free (on Soft-RoCE, 1.1-1.7x hybrid's 1 MiB rate at half its CPU
  /// per GB; docs/performance.md); it spins only while the host has a CPU
  /// free for it, so a busy host costs a wake-up, not a time slice.
  /// hybrid is Mooncake's (spin 100 ms, then sleep up to 1 s or until
  /// woken; a completion does not wake it); cq_event when every cycle
  /// counts more than a wake-up per small request; busy_poll for dedicated
  /// cores on real NICs.
  using idle = policy::spin_event;

  /// Where segment descriptors live.  p2p needs no server: a peer's
  /// descriptor is fetched from its handshake port.  etcd when a deployment
  /// outgrows one box (or shares an etcd with Mooncake peers); http for
  /// Mooncake's metadata server protocol; in_process for tests.
  using metadata = policy::p2p;

  /// Which (local NIC, peer NIC) rail carries each work request.
  /// load_aware: scored by bytes in flight over measured bandwidth and NUMA
  /// tier, large requests split across NICs so they finish together.
  /// round_robin when the NICs are equal and equally loaded; mooncake_random
  /// to behave like Mooncake classic (one random preferred NIC per request).
  /// Rail health (pause, cooldown, retry elsewhere) applies under each.
  using path = policy::load_aware;
};

namespace detail {

template <class P>
consteval bool eviction_present() {
  return requires { typename P::eviction; };
}
template <class P>
consteval bool eviction_shaped() {
  if constexpr (eviction_present<P>()) return eviction_policy_shape<typename P::eviction>;
  return false;
}
template <class P>
consteval bool eviction_ok() {
  if constexpr (eviction_present<P>()) return eviction_policy<typename P::eviction>;
  return false;
}
template <class P>
consteval bool shard_hash_present() {
  return requires { typename P::shard_hash; };
}
template <class P>
consteval bool shard_hash_ok() {
  if constexpr (shard_hash_present<P>()) return shard_hash_policy<typename P::shard_hash>;
  return false;
}
template <class P>
consteval bool idle_present() {
  return requires { typename P::idle; };
}
template <class P>
consteval bool idle_ok() {
  if constexpr (idle_present<P>()) return idle_strategy<typename P::idle>;
  return false;
}
template <class P>
consteval bool path_present() {
  return requires { typename P::path; };
}
template <class P>
consteval bool path_shaped() {
  if constexpr (path_present<P>()) return path_policy_shape<typename P::path>;
  return false;
}
template <class P>
consteval bool path_ok() {
  if constexpr (path_present<P>()) return path_policy<typename P::path>;
  return false;
}
// metadata is checked when present: every set derived from default_policies
// has it, and transfer_engine falls back to policy::p2p for one that does not.
template <class P>
consteval bool metadata_ok() {
  if constexpr (requires { typename P::metadata; }) return metadata_backend<typename P::metadata>;
  return true;
}

}  // namespace detail

/// True when every member of P models its axis's concept.
template <class P>
concept policy_set = detail::eviction_ok<P>() && detail::shard_hash_ok<P>() && detail::idle_ok<P>() &&
                     detail::metadata_ok<P>() && detail::path_ok<P>();

/// Fails to compile, with a message saying what to change, unless P is a
/// policy set; returns true otherwise.  Use: static_assert(check_policy_set<P>());
template <class P>
consteval bool check_policy_set() {
  static_assert(detail::eviction_present<P>(),
                "policy set: no `eviction` member; derive from tide::default_policies or add "
                "`using eviction = tide::policy::sieve;` (or fifo, lru, mooncake_sieve)");
  static_assert(!detail::eviction_present<P>() || detail::eviction_shaped<P>(),
                "policy set: `eviction` must name kName, a non-final `hook` class and an `order` "
                "class (see <tide/policy/eviction.hpp>), e.g. tide::policy::sieve");
  static_assert(!detail::eviction_shaped<P>() || detail::eviction_ok<P>(),
                "policy set: `eviction::order` must offer insert(hook&), erase(hook&), touch(hook&) "
                "(all noexcept, returning void), hook* evict() noexcept and size() const noexcept");
  static_assert(detail::shard_hash_present<P>(),
                "policy set: no `shard_hash` member; derive from tide::default_policies or add "
                "`using shard_hash = tide::policy::mix_hash;` (or mooncake_hash, peer_path_hash)");
  static_assert(!detail::shard_hash_present<P>() || detail::shard_hash_ok<P>(),
                "policy set: `shard_hash` must offer kName, kNeedsPowerOfTwo and `static std::size_t "
                "shard(const tide::shard_key&, std::size_t) noexcept` (see <tide/policy/shard_hash.hpp>)");
  static_assert(detail::idle_present<P>(),
                "policy set: no `idle` member; derive from tide::default_policies or add "
                "`using idle = tide::policy::spin_event;` (or hybrid, busy_poll, cq_event)");
  static_assert(!detail::idle_present<P>() || detail::idle_ok<P>(),
                "policy set: `idle` must offer kName, config, static result<I> create(config), "
                "attach/detach, noexcept on_work(), on_empty(repass), wake(), and "
                "`static constexpr bool wakes_on_completion` (see <tide/policy/idle.hpp>)");
  static_assert(detail::metadata_ok<P>(),
                "policy set: `metadata` must be a metadata backend: constructible from "
                "tide::metadata_config, with kName, get_segment, put_segment, remove_segment "
                "(see <tide/metadata/backend.hpp>), e.g. tide::policy::p2p");
  static_assert(detail::path_present<P>(),
                "policy set: no `path` member; derive from tide::default_policies or add "
                "`using path = tide::policy::load_aware;` (or round_robin, mooncake_random)");
  static_assert(!detail::path_present<P>() || detail::path_shaped<P>(),
                "policy set: `path` must name kName (see <tide/policy/path.hpp>), e.g. tide::policy::load_aware");
  static_assert(!detail::path_shaped<P>() || detail::path_ok<P>(),
                "policy set: `path` must be default constructible and offer `void assign(const tide::path_query&, "
                "std::span<const std::uint32_t>, std::span<tide::path_choice>) noexcept` (see <tide/policy/path.hpp>)");
  return true;
}

static_assert(check_policy_set<default_policies>());

}  // namespace tide
