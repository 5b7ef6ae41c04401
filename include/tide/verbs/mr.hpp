#pragma once
/// RAII owner of a registered memory region.

#include <tide/result.hpp>
#include <tide/verbs/pd.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace tide::verbs {

/// The access flags a transfer buffer needs: local write plus remote
/// read/write (no REMOTE_ATOMIC).  rdma/segment.hpp's mr_access() narrows
/// them per buffer.
inline constexpr int kDefaultAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

/// A registered memory region (ibv_mr). Move-only; deregistered in the
/// destructor, which logs (never throws) on failure. The memory itself is the
/// caller's and must outlive the region.
class memory_region {
 public:
  /// ibv_reg_mr(pd, addr, length, access): pins and registers [addr, addr+length).
  /// Errors: invalid_argument (null addr), zero_length, resource_exhausted
  /// (ENOMEM: often the memlock limit; the detail says so), permission_denied,
  /// verbs_failed. Any thread; cost grows with length (pages are pinned).
  [[nodiscard]] static result<memory_region> register_memory(const protection_domain& pd, void* addr,
                                                             std::size_t length, int access = kDefaultAccess);

  /// ibv_reg_dmabuf_mr: registers [offset, offset+length) of the dma-buf
  /// `fd` (GPU memory exported by its driver), addressed by the peer as
  /// [iova, iova+length).  Errors: verbs_failed with errno (EOPNOTSUPP: the
  /// provider has no dma-buf support), resource_exhausted.  Any thread.
  [[nodiscard]] static result<memory_region> register_dmabuf(const protection_domain& pd, int fd,
                                                             std::uint64_t offset, std::size_t length,
                                                             std::uint64_t iova, int access = kDefaultAccess);

  memory_region(memory_region&& o) noexcept;
  memory_region& operator=(memory_region&& o) noexcept;
  memory_region(const memory_region&) = delete;
  memory_region& operator=(const memory_region&) = delete;
  ~memory_region();

  [[nodiscard]] ibv_mr* native_handle() const noexcept { return mr_; }
  [[nodiscard]] std::uint32_t lkey() const noexcept { return mr_->lkey; }
  [[nodiscard]] std::uint32_t rkey() const noexcept { return mr_->rkey; }
  [[nodiscard]] void* addr() const noexcept { return mr_->addr; }
  [[nodiscard]] std::size_t length() const noexcept { return mr_->length; }
  /// True when [p, p+len) lies inside the region (len 0 is never inside).
  [[nodiscard]] bool contains(const void* p, std::size_t len) const noexcept {
    const auto b = reinterpret_cast<std::uintptr_t>(mr_->addr);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return len != 0 && a >= b && len <= mr_->length && a - b <= mr_->length - len;
  }

 private:
  explicit memory_region(ibv_mr* mr) noexcept : mr_(mr) {}
  void reset() noexcept;
  ibv_mr* mr_ = nullptr;
};

/// Whether a device registers dma-bufs, and the errno its probe gave.
struct dmabuf_support {
  bool supported = false;
  int error = 0;  ///< EBADF when supported; EOPNOTSUPP (rxe, siw), ENOSYS... when not
};
/// Probes with an invalid fd (nothing is registered): cheap, once per device.
[[nodiscard]] dmabuf_support probe_dmabuf(const protection_domain& pd) noexcept;

}  // namespace tide::verbs
