#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>

#include <tide/detail/log.hpp>
#include <tide/verbs/error.hpp>

#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <unistd.h>
#include <utility>

namespace tide::verbs {

result<protection_domain> protection_domain::create(const context& ctx) {
  errno = 0;
  ibv_pd* pd = ::ibv_alloc_pd(ctx.native_handle());
  if (pd == nullptr) return fail(verbs_error("ibv_alloc_pd", ctx.name(), errno));
  return protection_domain{pd};
}

protection_domain::protection_domain(protection_domain&& o) noexcept : pd_(std::exchange(o.pd_, nullptr)) {}

protection_domain& protection_domain::operator=(protection_domain&& o) noexcept {
  if (this != &o) {
    reset();
    pd_ = std::exchange(o.pd_, nullptr);
  }
  return *this;
}

protection_domain::~protection_domain() { reset(); }

void protection_domain::reset() noexcept {
  if (pd_ == nullptr) return;
  if (const int rc = ::ibv_dealloc_pd(pd_); rc != 0)
    TIDE_LOG_ERROR("ibv_dealloc_pd on " << device_name_of(pd_->context) << " failed: " << std::strerror(rc)
                                        << " (an MR or QP still uses it?)");
  pd_ = nullptr;
}

result<memory_region> memory_region::register_memory(const protection_domain& pd, void* addr, std::size_t length,
                                                     int access) {
  const auto dev = device_name_of(pd.context_handle());
  if (addr == nullptr) return fail(errc::invalid_argument, "ibv_reg_mr on " + std::string(dev) + ": null address");
  if (length == 0) return fail(errc::zero_length, "ibv_reg_mr on " + std::string(dev) + ": length 0");
  errno = 0;
  ibv_mr* mr = ::ibv_reg_mr(pd.native_handle(), addr, length, access);
  if (mr == nullptr) {
    const int err = errno;
    auto e = verbs_error("ibv_reg_mr(" + std::to_string(length) + " bytes)", dev, err);
    if (err == ENOMEM) {
      rlimit rl{};
      if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        e.detail += "; RLIMIT_MEMLOCK is " + std::to_string(rl.rlim_cur) + " bytes (raise ulimit -l)";
    }
    return fail(std::move(e));
  }
  return memory_region{mr};
}

result<memory_region> memory_region::register_dmabuf(const protection_domain& pd, int fd, std::uint64_t offset,
                                                     std::size_t length, std::uint64_t iova, int access) {
  const auto dev = device_name_of(pd.context_handle());
  if (length == 0) return fail(errc::zero_length, "ibv_reg_dmabuf_mr on " + std::string(dev) + ": length 0");
  errno = 0;
  ibv_mr* mr = ::ibv_reg_dmabuf_mr(pd.native_handle(), offset, length, iova, fd, access);
  if (mr == nullptr)
    return fail(verbs_error("ibv_reg_dmabuf_mr(" + std::to_string(length) + " bytes)", dev, errno));
  return memory_region{mr};
}

dmabuf_support probe_dmabuf(const protection_domain& pd) noexcept {
  // UCX's probe: an invalid fd gets EBADF from a provider that implements
  // dma-buf registration, and EOPNOTSUPP from one that does not (rxe, siw).
  errno = 0;
  ibv_mr* mr = ::ibv_reg_dmabuf_mr(pd.native_handle(), 0, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)), 0, -1,
                                   IBV_ACCESS_LOCAL_WRITE);
  const int err = errno;
  if (mr != nullptr) {  // no provider should accept fd -1; never leak it if one does
    (void)::ibv_dereg_mr(mr);
    return {true, 0};
  }
  return {err == EBADF, err};
}

memory_region::memory_region(memory_region&& o) noexcept : mr_(std::exchange(o.mr_, nullptr)) {}

memory_region& memory_region::operator=(memory_region&& o) noexcept {
  if (this != &o) {
    reset();
    mr_ = std::exchange(o.mr_, nullptr);
  }
  return *this;
}

memory_region::~memory_region() { reset(); }

void memory_region::reset() noexcept {
  if (mr_ == nullptr) return;
  if (const int rc = ::ibv_dereg_mr(mr_); rc != 0)
    TIDE_LOG_ERROR("ibv_dereg_mr on " << device_name_of(mr_->context) << " failed: " << std::strerror(rc));
  mr_ = nullptr;
}

}  // namespace tide::verbs
