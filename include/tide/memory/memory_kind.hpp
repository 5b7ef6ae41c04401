#pragma once
/// Memory kinds: where a registered buffer's bytes live (host memory, or a
/// CUDA device's), how a range is classified, and the copy engine that
/// moves bytes between a kind's memory and host memory where a transport
/// cannot touch that memory itself (staging).
///
/// CUDA support loads the driver (libcuda.so.1) at run time: a host without
/// one classifies everything as host memory and refuses `cuda:N`
/// registrations with errc::memory_unsupported.  TIDE_CUDA=off never loads
/// it; TIDE_CUDA_LIBRARY names a driver file outside the loader's path.
///
/// A later kind (ROCm, ...) joins as another `kind` value with its own
/// classification branch and copy engine; the transports see only
/// `copy_engine`.

#include <tide/errc.hpp>
#include <tide/result.hpp>
#include <tide/topology/gpu.hpp>
#include <tide/topology/location.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::memory {

enum class kind : std::uint8_t { host, cuda };

[[nodiscard]] constexpr std::string_view to_string(kind k) noexcept { return k == kind::cuda ? "cuda" : "host"; }

/// What classify() found.
struct range_info {
  memory::kind kind = memory::kind::host;
  int device = -1;  ///< the CUDA device ordinal (cuda), -1 (host)
  /// The allocations the range lies in, as one range: the cuMemAlloc
  /// allocation, or for virtual-memory mappings (cuMemMap, PyTorch's
  /// expandable segments) the contiguous mappings it covers.  Host: the
  /// range itself.
  std::uint64_t alloc_base = 0;
  std::uint64_t alloc_length = 0;
  bool managed = false;  ///< CUDA managed (unified) memory
  bool vmm = false;      ///< built of virtual-memory mappings
};

/// Classifies [addr, addr + len).  Host memory (malloc'd, mmap'd, or
/// pinned with cudaHostAlloc / cudaHostRegister) is kind::host; device
/// memory is kind::cuda with its device.  Errors: memory_unsupported when
/// the range starts in device memory but ends outside it, spans two
/// separate allocations (cuMemAlloc'd back to back), or spans memory of two
/// devices; the detail names the allocations.  Any thread; a few driver
/// calls per allocation touched.
[[nodiscard]] result<range_info> classify(const void* addr, std::size_t len);

/// Whether the CUDA driver is loaded and has a device; when not, why (the
/// dlopen error, cuInit's, "TIDE_CUDA=off"...).  Loads it on first use.
struct cuda_status {
  bool usable = false;
  int devices = 0;
  int driver_version = 0;  ///< e.g. 13000 for 13.0
  std::string why_not;
};
[[nodiscard]] const cuda_status& cuda() noexcept;

/// The PCI bus id of each CUDA device, by ordinal ("0000:3b:00.0"); empty
/// without a usable driver.  What topology::locate_gpu places on the PCI tree.
[[nodiscard]] std::vector<std::string> cuda_pci_bus_ids();
/// Each CUDA device placed on the PCI tree under `sysfs_root`: what the
/// priority matrix's "cuda:N" keys are built from.  Empty without a driver.
[[nodiscard]] std::vector<topology::gpu_info> locate_cuda_gpus(std::string_view sysfs_root = "/sys");

/// Moves bytes between one kind's memory and host memory.  The transports
/// call it from their I/O threads, one chunk at a time; each call returns
/// when the bytes are in place (so "final means final": no copy of a task
/// runs after the task completes).  Thread safe; engines come from
/// copy_engine_for() and live as long as the process.
class copy_engine {
 public:
  /// Copies `n` bytes at `src` (this engine's kind) to host memory `dst`.
  /// Errors: copy_failed (logged with the driver's error).
  [[nodiscard]] virtual errc to_host(void* dst, std::uint64_t src, std::size_t n) const noexcept = 0;
  /// Copies `n` bytes of host memory `src` to `dst` (this engine's kind).
  [[nodiscard]] virtual errc from_host(std::uint64_t dst, const void* src, std::size_t n) const noexcept = 0;
  /// Page-locks host staging memory so copies run at the DMA engine's
  /// speed (cuMemHostRegister): true when it did, and unpin() undoes it.
  /// False: nothing was pinned (the host engine; a refusal), copies still work.
  [[nodiscard]] virtual bool pin(void* host, std::size_t n) const noexcept = 0;
  virtual void unpin(void* host) const noexcept = 0;
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;

 protected:
  copy_engine() = default;
  ~copy_engine() = default;
};

/// The copy engine of a range classified as `info`: memcpy for host memory
/// (what the staging switch uses), the CUDA device's for device memory.
/// Errors: memory_unsupported (a CUDA range with no usable driver).
[[nodiscard]] result<const copy_engine*> copy_engine_for(const range_info& info);

/// Copies host bytes to `dst` / `dst` bytes to host memory, whatever kind
/// of memory `dst` / `src` is (classify(), then its copy engine): what
/// Mooncake's writeBytesToBuffer / readBytesFromBuffer do on GPU buffers.
/// Errors: as classify() and copy_engine_for(); copy_failed.
[[nodiscard]] status copy_from_host(std::uint64_t dst, const void* src, std::size_t n);
[[nodiscard]] status copy_to_host(void* dst, std::uint64_t src, std::size_t n);

/// Waits for the work queued so far on CUDA stream `stream` (a CUstream;
/// 0: the legacy default stream of the calling thread's current context,
/// or of device 0's primary context when none is current).  Errors:
/// memory_unsupported (no driver), copy_failed (the driver's error).
[[nodiscard]] status synchronize_cuda_stream(std::uintptr_t stream);

/// Device memory a tool allocates itself (tide-bench --use_vram): cuMemAlloc
/// on a device, freed with the object.  Errors: memory_unsupported (no
/// driver, no such device), out_of_memory (the driver's error named).
class device_allocation {
 public:
  device_allocation() = default;
  device_allocation(device_allocation&& o) noexcept;
  device_allocation& operator=(device_allocation&& o) noexcept;
  device_allocation(const device_allocation&) = delete;
  device_allocation& operator=(const device_allocation&) = delete;
  ~device_allocation();
  [[nodiscard]] static result<device_allocation> allocate(int device, std::size_t n);
  [[nodiscard]] void* data() const noexcept { return reinterpret_cast<void*>(ptr_); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::uint64_t ptr_ = 0;
  std::size_t size_ = 0;
  int device_ = -1;
};

/// cuMemsetD8 of device memory (tide-bench --init_mem).  Errors: as above.
[[nodiscard]] status fill_device(void* dst, unsigned char value, std::size_t n);

/// Where a buffer being registered lives, as the engine records it.
struct placement {
  range_info info;
  /// The location it is published with: the caller's, or for `*` on
  /// device memory `cuda:N` (what Mooncake's peers key NIC choice by).
  std::string location;
  /// The copy engine transports stage through (TCP always for device
  /// memory); null for host memory unless `stage_host` asked for it.
  const copy_engine* stager = nullptr;
};

/// Resolves a registration's location against the memory: `*` classifies;
/// `cuda:N` must be device N's memory; `cpu:N` / `segments:` must be host
/// memory.  `stage_host`: host memory goes through the host copy engine too
/// (the staging switch, engine_config::stage_host_memory).  Errors:
/// memory_unsupported (`cuda:N`, or a `*` range that classify() refuses,
/// where no CUDA driver is usable: the detail says why), bad_location (the
/// tag contradicts the memory, naming both).
[[nodiscard]] result<placement> place(const void* addr, std::size_t len, const topology::location& loc,
                                      std::string_view location_text, bool stage_host);

/// A dma-buf file descriptor exported for GPU memory (closed with the
/// object); `offset` is where the requested range starts inside it.
class dmabuf {
 public:
  dmabuf() = default;
  dmabuf(dmabuf&& o) noexcept : fd_(o.fd_), offset_(o.offset_) { o.fd_ = -1; }
  dmabuf& operator=(dmabuf&& o) noexcept;
  dmabuf(const dmabuf&) = delete;
  dmabuf& operator=(const dmabuf&) = delete;
  ~dmabuf();
  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }

  /// Exports the page-aligned range around [addr, addr + len) of device
  /// memory (cuMemGetHandleForAddressRange; not the whole allocation, so
  /// that virtual-memory mappings export too).  One export serves every NIC.
  /// Errors: memory_unsupported with the driver's error.
  [[nodiscard]] static result<dmabuf> export_range(const range_info& info, std::uint64_t addr, std::size_t len);

 private:
  int fd_ = -1;
  std::uint64_t offset_ = 0;
};

/// Whether a GPUDirect peer-memory module (nvidia_peermem, or the older
/// nv_peer_mem) is loaded: then ibv_reg_mr takes device pointers.
[[nodiscard]] bool peermem_loaded() noexcept;

}  // namespace tide::memory
