#pragma once
/// rdma::detail::setup_pool — the connector's threads (not API).  A job is
/// a connection setup that blocks its thread on the network: a handshake to
/// a dead or hung peer holds it for up to the connect plus receive timeout
/// (5 s + 30 s by default).  A fixed pool of two let two such peers hold up
/// every other handshake of the context (review turn 3, finding 6), so the
/// pool grows: whenever the jobs waiting outnumber the threads that will
/// take one (idle, or started and not yet waiting), post() starts one more,
/// up to kMaxThreads.  Counting only idle threads was not enough: a burst of
/// posts (a lane's pass connecting to eight new peers) arrives before the
/// one idle thread wakes, and every post saw it "idle" and queued behind
/// the first job (review 1ab3d99, finding 4).  Threads start on the first
/// job (an engine that never connects has none) and stay until join().  std::thread only: this
/// header is part of <tide/engine.hpp>, which keeps Boost.Asio out of its
/// users' translation units.
///
/// Threads: post() from any thread; join() from the owner, once.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tide::rdma::detail {

class setup_pool {
 public:
  using job = std::function<void()>;
  static constexpr std::size_t kMaxThreads = 32;

  setup_pool() = default;
  setup_pool(const setup_pool&) = delete;
  setup_pool& operator=(const setup_pool&) = delete;
  ~setup_pool() { join(); }

  /// Queues `j` (it must not throw) and starts a thread for it when every
  /// thread that could take it already has a job waiting for it.  False
  /// after join() (`j` is dropped).  Throws what std::thread and the queue
  /// throw when no thread runs the job; it is not queued then.
  bool post(job j) {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    jobs_.push_back(std::move(j));
    // Each queued job needs a thread of its own that is free for it: an
    // idle one (woken below) or one starting (it takes a job before it
    // ever waits).
    if (jobs_.size() > idle_ + starting_ && threads_.size() < kMaxThreads) {
      try {
        threads_.emplace_back([this] { work(); });
        ++starting_;
        return true;
      } catch (...) {
        if (threads_.empty()) {
          jobs_.pop_back();
          throw;
        }
        // A busy thread takes it when it is done.
      }
    }
    cv_.notify_one();
    return true;
  }

  /// Threads waiting for a job, and threads started (tests).
  [[nodiscard]] std::size_t idle_threads() const {
    std::lock_guard lock(mu_);
    return idle_;
  }
  [[nodiscard]] std::size_t threads() const {
    std::lock_guard lock(mu_);
    return threads_.size();
  }

  /// Refuses new jobs, lets the threads finish the queued ones and joins
  /// them.  Idempotent.
  void join() noexcept {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    // post() adds no thread once stopping_ is set: threads_ is stable here.
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void work() noexcept {
    std::unique_lock lock(mu_);
    --starting_;
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left
      job j = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      j();
      j = nullptr;  // what the job captured goes before the next wait
      lock.lock();
    }
  }

  mutable std::mutex mu_;  ///< guards everything below
  std::condition_variable cv_;
  std::deque<job> jobs_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;  ///< threads waiting for a job
  std::size_t starting_ = 0;  ///< threads started that have not yet taken the mutex
  bool stopping_ = false;
};

}  // namespace tide::rdma::detail
