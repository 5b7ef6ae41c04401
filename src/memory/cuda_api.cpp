#include "cuda_api.hpp"

#include <tide/detail/log.hpp>

#include <array>
#include <cstdlib>
#include <dlfcn.h>
#include <mutex>
#include <string_view>

namespace tide::memory::cuda_driver {

namespace {

// cuGetProcAddress as CUDA 12 exports it (_v2: with the query result) and
// as CUDA 11.3-11.8 did; the driver keeps both for old binaries.
using get_proc_v2 = CUresult (*)(const char*, void**, int, std::uint64_t, int*);
using get_proc_v1 = CUresult (*)(const char*, void**, int, std::uint64_t);

struct loader {
  get_proc_v2 v2 = nullptr;
  get_proc_v1 v1 = nullptr;

  template <class F>
  void resolve(F& fn, const char* name) const {
    void* p = nullptr;
    int status = 0;
    const CUresult r = v2 != nullptr ? v2(name, &p, kCudaApiVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
                                     : v1(name, &p, kCudaApiVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    fn = r == CUDA_SUCCESS && status == 0 ? reinterpret_cast<F>(p) : nullptr;
  }
};

api load() {
  api a;
  const char* off = std::getenv("TIDE_CUDA");
  if (off != nullptr && std::string_view(off) == "off") {
    a.why = "TIDE_CUDA=off";
    return a;
  }
  const char* file = std::getenv("TIDE_CUDA_LIBRARY");
  if (file == nullptr || *file == '\0') file = "libcuda.so.1";
  // Never closed: the driver's threads and atexit handlers outlive any owner.
  void* lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    a.why = std::string("the CUDA driver could not be loaded: ") + (e != nullptr ? e : file);
    return a;
  }
  loader l;
  l.v2 = reinterpret_cast<get_proc_v2>(dlsym(lib, "cuGetProcAddress_v2"));
  if (l.v2 == nullptr) l.v1 = reinterpret_cast<get_proc_v1>(dlsym(lib, "cuGetProcAddress"));
  if (l.v2 == nullptr && l.v1 == nullptr) {
    a.why = std::string(file) + " has no cuGetProcAddress: the driver is older than CUDA 11.3";
    return a;
  }
  l.resolve(a.cuInit, "cuInit");
  l.resolve(a.cuDriverGetVersion, "cuDriverGetVersion");
  l.resolve(a.cuGetErrorName, "cuGetErrorName");
  l.resolve(a.cuDeviceGetCount, "cuDeviceGetCount");
  l.resolve(a.cuDeviceGet, "cuDeviceGet");
  l.resolve(a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  l.resolve(a.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
  l.resolve(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  l.resolve(a.cuCtxSetCurrent, "cuCtxSetCurrent");
  l.resolve(a.cuCtxGetCurrent, "cuCtxGetCurrent");
  l.resolve(a.cuPointerGetAttribute, "cuPointerGetAttribute");
  l.resolve(a.cuMemGetAddressRange, "cuMemGetAddressRange");
  l.resolve(a.cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
  l.resolve(a.cuMemcpyDtoH, "cuMemcpyDtoH");
  l.resolve(a.cuMemcpyHtoD, "cuMemcpyHtoD");
  l.resolve(a.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync");
  l.resolve(a.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync");
  l.resolve(a.cuStreamCreate, "cuStreamCreate");
  l.resolve(a.cuStreamSynchronize, "cuStreamSynchronize");
  l.resolve(a.cuStreamDestroy, "cuStreamDestroy");
  l.resolve(a.cuMemHostRegister, "cuMemHostRegister");
  l.resolve(a.cuMemHostUnregister, "cuMemHostUnregister");
  l.resolve(a.cuMemAlloc, "cuMemAlloc");
  l.resolve(a.cuMemFree, "cuMemFree");
  l.resolve(a.cuMemAllocHost, "cuMemAllocHost");
  l.resolve(a.cuMemFreeHost, "cuMemFreeHost");
  l.resolve(a.cuMemsetD8, "cuMemsetD8");
  l.resolve(a.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  l.resolve(a.cuMemCreate, "cuMemCreate");
  l.resolve(a.cuMemRelease, "cuMemRelease");
  l.resolve(a.cuMemAddressReserve, "cuMemAddressReserve");
  l.resolve(a.cuMemAddressFree, "cuMemAddressFree");
  l.resolve(a.cuMemMap, "cuMemMap");
  l.resolve(a.cuMemUnmap, "cuMemUnmap");
  l.resolve(a.cuMemSetAccess, "cuMemSetAccess");
  // What classification, copies and exports cannot do without.
  if (a.cuInit == nullptr || a.cuDeviceGetCount == nullptr || a.cuPointerGetAttribute == nullptr ||
      a.cuMemGetAddressRange == nullptr || a.cuMemcpyDtoHAsync == nullptr || a.cuMemcpyHtoDAsync == nullptr ||
      a.cuStreamCreate == nullptr || a.cuStreamSynchronize == nullptr || a.cuStreamDestroy == nullptr ||
      a.cuDevicePrimaryCtxRetain == nullptr || a.cuCtxSetCurrent == nullptr || a.cuDeviceGet == nullptr) {
    a.why = std::string(file) + " lacks an entry point tide needs (cuInit, cuPointerGetAttribute, cuMemcpy*Async, cuStream*...)";
    return a;
  }
  if (const CUresult r = a.cuInit(0); r != CUDA_SUCCESS) {
    a.why = "cuInit failed: " + a.error_text(r);
    return a;
  }
  if (a.cuDriverGetVersion != nullptr) (void)a.cuDriverGetVersion(&a.driver_version);
  if (const CUresult r = a.cuDeviceGetCount(&a.devices); r != CUDA_SUCCESS || a.devices == 0) {
    a.why = r != CUDA_SUCCESS ? "cuDeviceGetCount failed: " + a.error_text(r) : std::string("no CUDA device");
    return a;
  }
  a.usable = true;
  TIDE_LOG_INFO("CUDA driver " << a.driver_version / 1000 << "." << a.driver_version % 1000 / 10 << ", "
                               << a.devices << " device(s)");
  return a;
}

}  // namespace

std::string api::error_text(CUresult r) const {
  const char* name = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA error";
  return std::string(name) + " (" + std::to_string(r) + ")";
}

CUresult api::use_device(int ordinal) const noexcept {
  // Primary contexts, retained once per device and kept: the driver keeps
  // them for the process anyway, and a release here could pull one from
  // under the application.
  static constexpr int kMaxDevices = 64;
  static std::array<CUcontext, kMaxDevices> contexts{};
  static std::mutex mu;
  if (ordinal < 0 || ordinal >= kMaxDevices || ordinal >= devices) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx = nullptr;
  {
    std::lock_guard lock(mu);
    ctx = contexts[static_cast<std::size_t>(ordinal)];
    if (ctx == nullptr) {
      CUdevice dev = 0;
      if (const CUresult r = cuDeviceGet(&dev, ordinal); r != CUDA_SUCCESS) return r;
      if (const CUresult r = cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) return r;
      contexts[static_cast<std::size_t>(ordinal)] = ctx;
    }
  }
  return cuCtxSetCurrent(ctx);
}

void api::ensure_context() const noexcept {
  CUcontext current = nullptr;
  if (cuCtxGetCurrent != nullptr && cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr) return;
  (void)use_device(0);
}

const api& api::get() {
  static const api table = load();
  return table;
}

}  // namespace tide::memory::cuda_driver
