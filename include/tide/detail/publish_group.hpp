#pragma once
// Group commit of descriptor publishes to a shared store (etcd, http).
//
// A registration changes the local descriptor and then must not return
// before the store holds a descriptor with that change (a peer that fetches
// the segment afterwards sees the buffer, as Mooncake promises).  One PUT
// carries the whole descriptor, so a PUT per caller would be a full encode
// and write each.  Instead callers that arrive while a PUT is in flight join
// one pending round; when the PUT in flight ends, one of them (the first to
// wake) runs the round's publish once, and all of them get its status.  A
// round's publish starts after every change of its members was made, so
// whatever it stores includes them.
//
// Bounds: a caller waits for at most two publishes (the one in flight when
// it came, then its own round's), however many callers there are; a failed
// store write is returned to every member of its round, so with the store
// down N waiting registrations fail after two timeouts, not N.
//
// Thread safety: commit() from any thread; publishes never overlap.  The
// round a caller joins is shared with the thread that runs it (shared_ptr),
// so a member that wakes late still reads its own round's status after a
// later round has begun.

#include <tide/result.hpp>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

namespace tide::detail {

class publish_group {
 public:
  /// Joins the pending round (opening one when none is pending) and returns
  /// the status of that round's publish(): publish is run by whichever
  /// member finds no publish in flight, once per round.  `publish` stores
  /// the descriptor as it stands when it is called.  Cost: at most two
  /// publishes of waiting, whatever the number of callers.
  template <class F>
  [[nodiscard]] status commit(F&& publish) {
    std::unique_lock lock(mu_);
    ++commits_;
    if (!pending_) pending_ = std::make_shared<round>();
    const std::shared_ptr<round> mine = pending_;
    ++mine->members;
    // Wakes when this round is done, or when nothing is in flight: then this
    // round is still the pending one (only the pending round is ever run).
    cv_.wait(lock, [&] { return mine->done || !running_; });
    if (mine->done) return mine->result;
    running_ = std::move(pending_);  // == mine; later callers open the next round
    ++rounds_;
    lock.unlock();
    status r{};
    try {
      r = std::forward<F>(publish)();
    } catch (const std::bad_alloc&) {
      r = fail(errc::out_of_memory, "publishing the descriptor: out of memory");
    } catch (...) {
      // The members must not wait forever for a round that ended by throwing.
      finish(lock, *mine, fail(errc::metadata_unavailable, "publishing the descriptor threw an exception"));
      throw;
    }
    finish(lock, *mine, std::move(r));
    return mine->result;
  }

  /// Rounds run (publishes) and commits so far: commits - rounds is what
  /// the grouping saved.
  [[nodiscard]] std::uint64_t rounds() const {
    std::lock_guard lock(mu_);
    return rounds_;
  }
  [[nodiscard]] std::uint64_t commits() const {
    std::lock_guard lock(mu_);
    return commits_;
  }
  /// Callers waiting in the pending round (not yet run): what a test waits
  /// for before it lets the publish in flight end.
  [[nodiscard]] std::size_t pending_members() const {
    std::lock_guard lock(mu_);
    return pending_ ? pending_->members : 0;
  }

 private:
  struct round {
    bool done = false;  ///< under mu_
    status result;      ///< under mu_; read once done
    std::size_t members = 0;
  };
  void finish(std::unique_lock<std::mutex>& lock, round& r, status result) {
    lock.lock();
    r.result = std::move(result);
    r.done = true;
    running_.reset();
    cv_.notify_all();  // this round's members, and the next round's first publisher
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<round> pending_;  ///< under mu_: joined by callers; null when none waits
  std::shared_ptr<round> running_;  ///< under mu_: the round whose publish is in flight
  std::uint64_t rounds_ = 0, commits_ = 0;
};

}  // namespace tide::detail
