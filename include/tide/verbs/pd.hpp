#pragma once
/// RAII owner of a protection domain.

#include <tide/result.hpp>
#include <tide/verbs/device.hpp>

#include <infiniband/verbs.h>

namespace tide::verbs {

/// A protection domain (ibv_pd). Move-only; deallocated in the destructor,
/// which logs (never throws) when that fails (e.g. an MR or QP still uses it).
class protection_domain {
 public:
  /// ibv_alloc_pd on `ctx`. Errors: resource_exhausted, verbs_failed (detail
  /// names the device and errno). Any thread.
  [[nodiscard]] static result<protection_domain> create(const context& ctx);

  protection_domain(protection_domain&& o) noexcept;
  protection_domain& operator=(protection_domain&& o) noexcept;
  protection_domain(const protection_domain&) = delete;
  protection_domain& operator=(const protection_domain&) = delete;
  ~protection_domain();

  [[nodiscard]] ibv_pd* native_handle() const noexcept { return pd_; }
  [[nodiscard]] ibv_context* context_handle() const noexcept { return pd_ != nullptr ? pd_->context : nullptr; }

 private:
  explicit protection_domain(ibv_pd* pd) noexcept : pd_(pd) {}
  void reset() noexcept;
  ibv_pd* pd_ = nullptr;
};

}  // namespace tide::verbs
