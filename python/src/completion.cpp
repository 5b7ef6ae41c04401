#include "completion.hpp"

#include "errors.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tide::py {

completion_queue::completion_queue() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) raise(error{errc::resource_exhausted, std::string("eventfd: ") + std::strerror(errno)});
}

completion_queue::~completion_queue() { ::close(fd_); }

void completion_queue::batch_final(batch_id b) noexcept {
  try {
    std::lock_guard lock(mu_);
    ready_.push_back(b);
  } catch (...) {
    // No memory for the id: the waiter's own timeout still ends its wait.
    return;
  }
  const std::uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the loop is woken anyway.
  [[maybe_unused]] const auto n = ::write(fd_, &one, sizeof one);
}

std::vector<batch_id> completion_queue::drain() {
  std::uint64_t count;
  [[maybe_unused]] const auto n = ::read(fd_, &count, sizeof count);
  std::lock_guard lock(mu_);
  return std::exchange(ready_, {});
}

}  // namespace tide::py
