#pragma once
// tide._tide.CompletionQueue: how asyncio learns that a batch is final
// without a thread per await.  The engine's lane that retires a watched
// batch's last task pushes its id here and writes the eventfd; the event
// loop, woken by add_reader, reads the eventfd and then drains the ids
// (read first, drain second: no wake-up is lost, nothing needs arming).

#include <tide/transfer.hpp>

#include <mutex>
#include <vector>

namespace tide::py {

/// Owned by shared_ptr: the Python object, and the engine's core while the
/// queue watches a batch (core.hpp, watch_table: a lane never calls a freed
/// queue).  batch_final runs on lane threads and never touches Python;
/// drain() runs on the loop's thread with the GIL.
class completion_queue final : public batch_listener {
 public:
  completion_queue();
  ~completion_queue();
  completion_queue(const completion_queue&) = delete;
  completion_queue& operator=(const completion_queue&) = delete;

  void batch_final(batch_id b) noexcept override;
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// Clears the eventfd, then returns (and forgets) the ids pushed so far.
  [[nodiscard]] std::vector<batch_id> drain();

 private:
  int fd_;
  std::mutex mu_;
  std::vector<batch_id> ready_;
};

}  // namespace tide::py
