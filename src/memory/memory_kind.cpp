#include <tide/memory/memory_kind.hpp>

#include "cuda_api.hpp"

#include <tide/detail/log.hpp>

#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <unistd.h>

namespace tide::memory {

namespace {

using cuda_driver::api;
using cuda_driver::CUdeviceptr;
using cuda_driver::CUresult;
using cuda_driver::CUstream;

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// One piece of device memory: the allocation (or, for virtual-memory
// mappings, the mapping) that holds `p`.
struct device_piece {
  unsigned type = 0;
  int device = -1;
  bool managed = false;
  bool vmm = false;
  std::uint64_t base = 0;
  std::uint64_t size = 0;
};

// Errors the driver gives for an address it does not know: host memory.
bool not_cuda_memory(CUresult r) {
  return r == cuda_driver::CUDA_ERROR_INVALID_VALUE || r == cuda_driver::CUDA_ERROR_NOT_INITIALIZED ||
         r == cuda_driver::CUDA_ERROR_INVALID_CONTEXT || r == cuda_driver::CUDA_ERROR_DEINITIALIZED;
}

// Queries the piece holding `p`; nullopt-like `type` 0 when CUDA does not know it.
result<device_piece> piece_at(const api& a, std::uint64_t p) {
  device_piece d;
  if (const CUresult r = a.cuPointerGetAttribute(&d.type, cuda_driver::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
      r != cuda_driver::CUDA_SUCCESS) {
    if (not_cuda_memory(r)) return device_piece{};
    return fail(errc::memory_unsupported, "cuPointerGetAttribute(" + hex(p) + "): " + a.error_text(r));
  }
  if (d.type == cuda_driver::CU_MEMORYTYPE_HOST) return d;
  int ordinal = -1;
  (void)a.cuPointerGetAttribute(&ordinal, cuda_driver::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  d.device = ordinal;
  unsigned managed = 0;
  if (a.cuPointerGetAttribute(&managed, cuda_driver::CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == cuda_driver::CUDA_SUCCESS)
    d.managed = managed != 0;
  // cuMemAlloc'd memory can be shared with the legacy IPC calls; memory
  // built of virtual-memory mappings (cuMemMap; PyTorch's expandable
  // segments, stream-ordered pools) cannot.
  unsigned ipc = 1;
  if (a.cuPointerGetAttribute(&ipc, cuda_driver::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) == cuda_driver::CUDA_SUCCESS)
    d.vmm = ipc == 0 && !d.managed;
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (const CUresult r = a.cuMemGetAddressRange(&base, &size, p); r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::memory_unsupported, "cuMemGetAddressRange(" + hex(p) + "): " + a.error_text(r));
  d.base = base;
  d.size = size;
  return d;
}

class host_copy final : public copy_engine {
 public:
  errc to_host(void* dst, std::uint64_t src, std::size_t n) const noexcept override {
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return errc::ok;
  }
  errc from_host(std::uint64_t dst, const void* src, std::size_t n) const noexcept override {
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
    return errc::ok;
  }
  bool pin(void*, std::size_t) const noexcept override { return false; }  // nothing to pin
  void unpin(void*) const noexcept override {}
  std::string_view name() const noexcept override { return "host"; }
};

// The calling thread's own non-blocking stream on `device`'s primary
// context (made current first).  A copy on the legacy default stream would
// also wait for every kernel the application queued there (PyTorch's
// default stream) and stall a lane or an I/O thread behind unrelated GPU
// work; the GPUDirect path does not wait for them either (a caller
// synchronizes before a transfer, as with Mooncake; *_on_cuda does it).
// Destroyed with the thread.
CUresult thread_stream(const api& a, int device, CUstream& out) noexcept {
  struct streams {
    std::vector<std::pair<int, CUstream>> by_device;
    ~streams() {
      for (auto& [d, s] : by_device) (void)api::get().cuStreamDestroy(s);
    }
  };
  thread_local streams mine;
  if (CUresult r = a.use_device(device); r != cuda_driver::CUDA_SUCCESS) return r;
  for (const auto& [d, s] : mine.by_device)
    if (d == device) {
      out = s;
      return cuda_driver::CUDA_SUCCESS;
    }
  CUstream s = nullptr;
  if (CUresult r = a.cuStreamCreate(&s, cuda_driver::CU_STREAM_NON_BLOCKING); r != cuda_driver::CUDA_SUCCESS) return r;
  try {
    mine.by_device.emplace_back(device, s);
  } catch (...) {
    (void)a.cuStreamDestroy(s);
    return cuda_driver::CUDA_ERROR_OUT_OF_MEMORY;
  }
  out = s;
  return cuda_driver::CUDA_SUCCESS;
}

// Driver copies on the calling thread's stream, waited for: the caller (a
// lane, a TCP I/O thread) moves one chunk per call and needs the bytes in
// place when it returns.  From pageable memory they also work; from pinned
// staging memory they run at the copy engine's speed.
class cuda_copy final : public copy_engine {
 public:
  explicit cuda_copy(int device) : device_(device), name_("cuda:" + std::to_string(device)) {}
  errc to_host(void* dst, std::uint64_t src, std::size_t n) const noexcept override {
    const api& a = api::get();
    CUstream s = nullptr;
    CUresult r = thread_stream(a, device_, s);
    if (r == cuda_driver::CUDA_SUCCESS) r = a.cuMemcpyDtoHAsync(dst, src, n, s);
    if (r == cuda_driver::CUDA_SUCCESS) r = a.cuStreamSynchronize(s);
    return check(a, r, "cuMemcpyDtoHAsync", src, n);
  }
  errc from_host(std::uint64_t dst, const void* src, std::size_t n) const noexcept override {
    const api& a = api::get();
    CUstream s = nullptr;
    CUresult r = thread_stream(a, device_, s);
    if (r == cuda_driver::CUDA_SUCCESS) r = a.cuMemcpyHtoDAsync(dst, src, n, s);
    if (r == cuda_driver::CUDA_SUCCESS) r = a.cuStreamSynchronize(s);
    return check(a, r, "cuMemcpyHtoDAsync", dst, n);
  }
  bool pin(void* host, std::size_t n) const noexcept override {
    const api& a = api::get();
    if (a.cuMemHostRegister == nullptr || a.use_device(device_) != cuda_driver::CUDA_SUCCESS) return false;
    return a.cuMemHostRegister(host, n, cuda_driver::CU_MEMHOSTREGISTER_PORTABLE) == cuda_driver::CUDA_SUCCESS;
  }
  void unpin(void* host) const noexcept override {
    const api& a = api::get();
    if (a.cuMemHostUnregister != nullptr) (void)a.cuMemHostUnregister(host);
  }
  std::string_view name() const noexcept override { return name_; }

 private:
  errc check(const api& a, CUresult r, const char* what, std::uint64_t dev, std::size_t n) const noexcept {
    if (r == cuda_driver::CUDA_SUCCESS) return errc::ok;
    try {
      TIDE_LOG_ERROR(what << " of " << n << " bytes at " << hex(dev) << " on " << name_ << ": " << a.error_text(r));
    } catch (...) {
    }
    return errc::copy_failed;
  }
  int device_;
  std::string name_;
};

}  // namespace

const cuda_status& cuda() noexcept {
  static const cuda_status s = [] {
    const api& a = api::get();
    return cuda_status{a.usable, a.devices, a.driver_version, a.why};
  }();
  return s;
}

std::vector<std::string> cuda_pci_bus_ids() {
  std::vector<std::string> ids;
  const api& a = api::get();
  if (!a.usable || a.cuDeviceGetPCIBusId == nullptr) return ids;
  for (int i = 0; i < a.devices; ++i) {
    cuda_driver::CUdevice dev = 0;
    char bus[32] = {};
    if (a.cuDeviceGet(&dev, i) != cuda_driver::CUDA_SUCCESS ||
        a.cuDeviceGetPCIBusId(bus, sizeof bus, dev) != cuda_driver::CUDA_SUCCESS)
      bus[0] = '\0';
    ids.emplace_back(bus);
  }
  return ids;
}

std::vector<topology::gpu_info> locate_cuda_gpus(std::string_view sysfs_root) {
  std::vector<topology::gpu_info> gpus;
  const auto ids = cuda_pci_bus_ids();
  for (std::size_t i = 0; i < ids.size(); ++i)
    gpus.push_back(topology::locate_gpu(static_cast<int>(i), ids[i], sysfs_root));
  return gpus;
}

result<range_info> classify(const void* addr, std::size_t len) {
  range_info info;
  const auto start = reinterpret_cast<std::uint64_t>(addr);
  info.alloc_base = start;
  info.alloc_length = len;
  const api& a = api::get();
  if (!a.usable || len == 0) return info;
  a.ensure_context();
  auto first = piece_at(a, start);
  if (!first) return fail(first.error());
  if (first->type != cuda_driver::CU_MEMORYTYPE_DEVICE && first->type != cuda_driver::CU_MEMORYTYPE_UNIFIED) return info;
  info.kind = kind::cuda;
  info.device = first->device;
  info.managed = first->managed;
  info.vmm = first->vmm;
  info.alloc_base = first->base;
  const std::uint64_t end = start + len;
  std::uint64_t covered = first->base + first->size;
  const std::string where = "[" + hex(start) + ", +" + std::to_string(len) + ")";
  // Virtual-memory mappings report one mapping at a time: walk them while
  // they are contiguous device memory of the same device.
  while (covered < end) {
    if (!first->vmm)
      return fail(errc::memory_unsupported, where + " starts in the cuda:" + std::to_string(info.device) +
                                                " allocation [" + hex(first->base) + ", +" +
                                                std::to_string(first->size) +
                                                ") and runs past its end: register each allocation on its own");
    auto next = piece_at(a, covered);
    if (!next) return fail(next.error());
    if (next->type != cuda_driver::CU_MEMORYTYPE_DEVICE || next->base != covered)
      return fail(errc::memory_unsupported, where + " runs past the device memory mapped at [" + hex(info.alloc_base) +
                                                ", " + hex(covered) + ") into memory that is not");
    if (next->device != info.device)
      return fail(errc::memory_unsupported, where + " spans memory of cuda:" + std::to_string(info.device) +
                                                " and cuda:" + std::to_string(next->device));
    if (!next->vmm)
      return fail(errc::memory_unsupported, where + " spans two allocations: the mappings of cuda:" +
                                                std::to_string(info.device) + " end at " + hex(covered) +
                                                " and a separate allocation follows");
    if (next->size == 0)
      return fail(errc::memory_unsupported, where + ": the driver reports an empty mapping at " + hex(covered));
    covered = next->base + next->size;
  }
  info.alloc_length = covered - info.alloc_base;
  return info;
}

result<const copy_engine*> copy_engine_for(const range_info& info) {
  static const host_copy host;
  if (info.kind == kind::host) return &host;
  const api& a = api::get();
  if (!a.usable) return fail(errc::memory_unsupported, "cuda:" + std::to_string(info.device) + ": " + a.why);
  static constexpr int kMaxDevices = 64;
  static std::array<std::unique_ptr<cuda_copy>, kMaxDevices> engines;
  static std::mutex mu;
  if (info.device < 0 || info.device >= a.devices || info.device >= kMaxDevices)
    return fail(errc::memory_unsupported, "cuda:" + std::to_string(info.device) + ": this host has " +
                                              std::to_string(a.devices) + " CUDA device(s)");
  std::lock_guard lock(mu);
  auto& e = engines[static_cast<std::size_t>(info.device)];
  if (!e) e = std::make_unique<cuda_copy>(info.device);
  return e.get();
}

result<placement> place(const void* addr, std::size_t len, const topology::location& loc,
                        std::string_view location_text, bool stage_host) {
  placement p;
  p.location = std::string(location_text);
  if (loc.kind == topology::location_kind::cuda && !cuda().usable)
    return fail(errc::memory_unsupported,
                "register_memory: location " + p.location + " is GPU memory, and " + cuda().why_not);
  auto info = classify(addr, len);
  if (!info) return fail(info.error());
  p.info = *info;
  const std::string where =
      "register_memory: [" + hex(reinterpret_cast<std::uint64_t>(addr)) + ", +" + std::to_string(len) + ")";
  const std::string found = p.info.kind == kind::cuda ? "GPU memory of cuda:" + std::to_string(p.info.device)
                                                      : std::string("host memory");
  switch (loc.kind) {
    case topology::location_kind::any:
      if (p.info.kind == kind::cuda) p.location = "cuda:" + std::to_string(p.info.device);
      break;
    case topology::location_kind::cuda:
      if (p.info.kind != kind::cuda || p.info.device != loc.index)
        return fail(errc::bad_location, where + " is " + found + ", not " + p.location + " as given");
      break;
    default:
      if (p.info.kind == kind::cuda)
        return fail(errc::bad_location, where + " is " + found + ", not " + p.location +
                                            " as given: pass \"*\" or cuda:" + std::to_string(p.info.device));
      break;
  }
  if (p.info.kind != kind::host || stage_host) {
    auto e = copy_engine_for(p.info);
    if (!e) return fail(e.error());
    p.stager = *e;
  }
  return p;
}

namespace {

// The copy engine of whatever memory [addr, addr + n) is.
result<const copy_engine*> engine_at(std::uint64_t addr, std::size_t n) {
  auto info = classify(reinterpret_cast<const void*>(addr), n);
  if (!info) return fail(info.error());
  return copy_engine_for(*info);
}

}  // namespace

status copy_from_host(std::uint64_t dst, const void* src, std::size_t n) {
  auto e = engine_at(dst, n);
  if (!e) return fail(e.error());
  if ((*e)->from_host(dst, src, n) != errc::ok)
    return fail(errc::copy_failed, "copy of " + std::to_string(n) + " bytes into " + std::string((*e)->name()) +
                                       " memory at " + hex(dst) + " failed (the log has the driver's error)");
  return {};
}

status copy_to_host(void* dst, std::uint64_t src, std::size_t n) {
  auto e = engine_at(src, n);
  if (!e) return fail(e.error());
  if ((*e)->to_host(dst, src, n) != errc::ok)
    return fail(errc::copy_failed, "copy of " + std::to_string(n) + " bytes out of " + std::string((*e)->name()) +
                                       " memory at " + hex(src) + " failed (the log has the driver's error)");
  return {};
}

status synchronize_cuda_stream(std::uintptr_t stream) {
  const api& a = api::get();
  if (!a.usable) return fail(errc::memory_unsupported, a.why);
  auto* s = reinterpret_cast<cuda_driver::CUstream>(stream);
  CUresult r = a.cuStreamSynchronize(s);
  if (r == cuda_driver::CUDA_ERROR_INVALID_CONTEXT && stream == 0) {
    r = a.use_device(0);
    if (r == cuda_driver::CUDA_SUCCESS) r = a.cuStreamSynchronize(s);
  }
  if (r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::copy_failed, "cuStreamSynchronize(" + hex(stream) + "): " + a.error_text(r));
  return {};
}

device_allocation::device_allocation(device_allocation&& o) noexcept
    : ptr_(o.ptr_), size_(o.size_), device_(o.device_) {
  o.ptr_ = 0;
}

device_allocation& device_allocation::operator=(device_allocation&& o) noexcept {
  if (this != &o) {
    this->~device_allocation();
    ptr_ = o.ptr_;
    size_ = o.size_;
    device_ = o.device_;
    o.ptr_ = 0;
  }
  return *this;
}

device_allocation::~device_allocation() {
  if (ptr_ == 0) return;
  const api& a = api::get();
  if (a.use_device(device_) == cuda_driver::CUDA_SUCCESS) (void)a.cuMemFree(ptr_);
  ptr_ = 0;
}

result<device_allocation> device_allocation::allocate(int device, std::size_t n) {
  const api& a = api::get();
  if (!a.usable) return fail(errc::memory_unsupported, "cuda:" + std::to_string(device) + ": " + a.why);
  if (device < 0 || device >= a.devices)
    return fail(errc::memory_unsupported, "cuda:" + std::to_string(device) + ": this host has " +
                                              std::to_string(a.devices) + " CUDA device(s)");
  if (CUresult r = a.use_device(device); r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::memory_unsupported, "cuda:" + std::to_string(device) + ": " + a.error_text(r));
  device_allocation d;
  if (CUresult r = a.cuMemAlloc(&d.ptr_, n); r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::out_of_memory, "cuMemAlloc(" + std::to_string(n) + ") on cuda:" + std::to_string(device) +
                                         ": " + a.error_text(r));
  d.size_ = n;
  d.device_ = device;
  return d;
}

status fill_device(void* dst, unsigned char value, std::size_t n) {
  const api& a = api::get();
  if (!a.usable || a.cuMemsetD8 == nullptr) return fail(errc::memory_unsupported, a.why);
  if (CUresult r = a.cuMemsetD8(reinterpret_cast<std::uint64_t>(dst), value, n); r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::copy_failed, "cuMemsetD8: " + a.error_text(r));
  return {};
}

dmabuf& dmabuf::operator=(dmabuf&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    offset_ = o.offset_;
    o.fd_ = -1;
  }
  return *this;
}

dmabuf::~dmabuf() {
  if (fd_ >= 0) ::close(fd_);
}

result<dmabuf> dmabuf::export_range(const range_info& info, std::uint64_t addr, std::size_t len) {
  const api& a = api::get();
  if (!a.usable) return fail(errc::memory_unsupported, "dma-buf export: " + a.why);
  if (a.cuMemGetHandleForAddressRange == nullptr)
    return fail(errc::memory_unsupported, "dma-buf export: this CUDA driver has no cuMemGetHandleForAddressRange");
  // Host-page aligned, as the driver requires; the NIC then registers
  // [offset, offset + len) of it.
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t begin = addr & ~(page - 1);
  const std::uint64_t end = (addr + len + page - 1) & ~(page - 1);
  if (CUresult r = a.use_device(info.device); r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::memory_unsupported, "dma-buf export: cuda:" + std::to_string(info.device) + ": " + a.error_text(r));
  int fd = -1;
  // flags 0: the PCIe mapping flag is refused on some GPU and driver pairs.
  if (const CUresult r =
          a.cuMemGetHandleForAddressRange(&fd, begin, end - begin, cuda_driver::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
      r != cuda_driver::CUDA_SUCCESS)
    return fail(errc::memory_unsupported, "dma-buf export of [" + hex(begin) + ", +" + std::to_string(end - begin) +
                                              ") on cuda:" + std::to_string(info.device) + ": " + a.error_text(r));
  dmabuf d;
  d.fd_ = fd;
  d.offset_ = addr - begin;
  return d;
}

bool peermem_loaded() noexcept {
  for (const char* f : {"/sys/module/nvidia_peermem/version", "/sys/module/nv_peer_mem/version",
                        "/sys/kernel/mm/memory_peers/nv_mem/version"})
    if (::access(f, F_OK) == 0) return true;
  return false;
}

}  // namespace tide::memory
