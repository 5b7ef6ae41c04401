#pragma once
/// The idle-strategy concept: what a transfer worker does when a pass over
/// its queues and completion queues found nothing to do.
///
/// The worker protocol (the data path follows it exactly):
///
///   auto idle = Idle::create(Idle::config{...});   // setup; result<Idle>
///   idle->attach(cq, channel);    // every CQ this worker polls, with the
///                                 // completion channel it was created
///                                 // with (cq_event requires one; the
///                                 // others ignore both arguments)
///   while (running) {
///     if (pass()) { idle->on_work(); continue; }  // pass(): post queued
///                                 // slices, poll the CQs; true if it
///                                 // posted or reaped anything
///     idle->on_empty([&]() noexcept { return pass(); });
///   }
///   idle->detach(cq);             // before ibv_destroy_cq (cq_event acks
///                                 // the events it still holds)
///
///   // producer, any thread: publish the work (queue push, any memory
///   // order, e.g. a mutex unlock), then
///   idle->wake();
///
/// Members of a strategy I (all but create/attach are noexcept):
///   static constexpr std::string_view kName;
///   static constexpr bool wakes_on_completion;
///       true when on_empty() returns as soon as a completion lands on an
///       attached CQ (cq_event); a worker with completions outstanding may
///       then hand its wait to the strategy.  false when a sleep can outlast
///       a completion (hybrid) or there is no sleep (busy_poll): such a
///       worker keeps polling while it has work outstanding.
///   struct config;                          default-constructible tunables
///   static result<I> create(const config&)  errc::config_invalid for a bad
///       tunable; errc::resource_exhausted when an fd cannot be made.
///       I is movable until a thread starts using it.
///   status attach(ibv_cq*, ibv_comp_channel*)   worker thread, before the loop
///   void detach(ibv_cq*) noexcept           worker thread, after the loop
///   void on_work() noexcept                 worker thread; O(1), no syscall
///   template <class F> void on_empty(F&& repass) noexcept
///       worker thread.  May return at once (spin), or sleep until wake(),
///       a completion event on an attached CQ, or the strategy's cap.
///       Calls repass() at most once, after it has announced that it may
///       sleep and armed the CQs, and does not sleep if repass() returns
///       true; repass must be noexcept.  Spurious returns are allowed: the
///       worker simply runs another pass.
///   void wake() noexcept                    any thread; when no worker
///       sleeps it costs one relaxed load (plus a compiler barrier);
///       otherwise one futex wake / eventfd write.
///
/// Why wake() needs no fence: a worker about to sleep sets its flag and then
/// runs membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which makes every
/// running thread of the process execute a full barrier (the asymmetric
/// Dekker pattern of liburcu and folly): either the producer's load sees the
/// flag, or the worker's repass() sees the producer's work.  Where the
/// kernel refuses membarrier (old kernel, seccomp), each sleep is capped at
/// 1 ms instead, so a missed wake-up costs at most 1 ms; the strategies'
/// exact_wakeups() reports which mode is in force.

#include <tide/result.hpp>

#include <concepts>
#include <type_traits>
#include <string_view>

struct ibv_cq;
struct ibv_comp_channel;

namespace tide {
namespace detail {
/// Stands for the worker's repass callable in the concept check.
struct repass_archetype {
  bool operator()() noexcept;
};
}  // namespace detail

/// An idle strategy (see the top of this file).
/// Shipped: policy::busy_poll, policy::hybrid, policy::cq_event.
template <class I>
concept idle_strategy =
    requires {
      { I::kName } -> std::convertible_to<std::string_view>;
      { I::wakes_on_completion } -> std::convertible_to<bool>;
      typename I::config;
      typename std::bool_constant<I::wakes_on_completion>;  // a constant expression
    } && std::move_constructible<I> && std::default_initializable<typename I::config> &&
    requires(I& i, const typename I::config& c, ibv_cq* cq, ibv_comp_channel* ch, detail::repass_archetype& f) {
      { I::create(c) } -> std::same_as<result<I>>;
      { i.attach(cq, ch) } -> std::same_as<status>;
      { i.detach(cq) } noexcept -> std::same_as<void>;
      { i.on_work() } noexcept -> std::same_as<void>;
      { i.on_empty(f) } noexcept -> std::same_as<void>;
      { i.wake() } noexcept -> std::same_as<void>;
    };

}  // namespace tide
