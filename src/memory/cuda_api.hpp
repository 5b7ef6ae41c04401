#pragma once
// The few CUDA driver-API entry points tide calls, declared here (not API).
//
// Why our own declarations: tide loads libcuda.so.1 at run time, so one
// build serves hosts with and without a GPU, and Debian's main archive has
// no CUDA headers to build against.  The values below are the driver API's
// (cuda.h, stable across releases since CUDA 11.7); every function is
// resolved with cuGetProcAddress for API version kCudaApiVersion, which
// picks the versioned symbol (cuMemGetAddressRange_v2, ...) that matches
// these signatures.
//
// Threads: cuda_api::get() once loads and initializes the driver (thread
// safe, a function-local static); the table is immutable afterwards and
// its functions are the driver's own, callable from any thread.

#include <cstddef>
#include <cstdint>
#include <string>

namespace tide::memory::cuda_driver {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = std::uint64_t;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUmemGenericAllocationHandle = std::uint64_t;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;

// CUpointer_attribute
inline constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
inline constexpr int CU_POINTER_ATTRIBUTE_IS_MANAGED = 8;
inline constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
inline constexpr int CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11;
inline constexpr int CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12;
inline constexpr int CU_POINTER_ATTRIBUTE_MAPPED = 13;

// CUmemorytype
inline constexpr unsigned CU_MEMORYTYPE_HOST = 1;
inline constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;
inline constexpr unsigned CU_MEMORYTYPE_UNIFIED = 4;

// CUdevice_attribute
inline constexpr int CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116;
inline constexpr int CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124;

// CUmemRangeHandleType, cuMemHostRegister flags, cuGetProcAddress flags
inline constexpr int CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1;
inline constexpr unsigned CU_MEMHOSTREGISTER_PORTABLE = 1;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
inline constexpr std::uint64_t CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1;

// Virtual memory management (cuMemCreate and friends): what tools/gpu-check
// needs to make an allocation as PyTorch's expandable segments do.
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 1;
inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 1;
inline constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0;
struct CUmemLocation {
  int type;
  int id;
};
struct CUmemAllocationProp {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
};

/// The driver API version the entry points are resolved for (12.0): the
/// signatures below are that version's.
inline constexpr int kCudaApiVersion = 12000;

/// The driver's entry points.  Null members: the driver lacks that symbol
/// (an older driver); callers check the ones they need.
struct api {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, std::size_t*, CUdeviceptr) = nullptr;
  CUresult (*cuMemGetHandleForAddressRange)(void*, CUdeviceptr, std::size_t, int, unsigned long long) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, std::size_t) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, std::size_t) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, std::size_t, CUstream) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuMemHostRegister)(void*, std::size_t, unsigned) = nullptr;
  CUresult (*cuMemHostUnregister)(void*) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, std::size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemAllocHost)(void**, std::size_t) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, std::size_t) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(std::size_t*, const CUmemAllocationProp*, int) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, std::size_t, const CUmemAllocationProp*,
                          unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) = nullptr;

  /// True when libcuda.so.1 loaded, cuInit(0) succeeded and a device is
  /// there; otherwise `why` says which step failed.
  bool usable = false;
  std::string why;
  int driver_version = 0;  ///< e.g. 13000
  int devices = 0;

  /// "CUDA_ERROR_INVALID_VALUE (1)": for error details.
  [[nodiscard]] std::string error_text(CUresult r) const;
  /// Makes device `ordinal`'s primary context current on this thread (the
  /// copies and exports of its memory need one, and another device's would
  /// be wrong).  Contexts are retained once per device, never released.
  [[nodiscard]] CUresult use_device(int ordinal) const noexcept;
  /// Makes device 0's primary context current when the thread has none, as
  /// the runtime does on first use: pointer queries need a context (any one
  /// resolves a unified address), and without one device memory would read
  /// as unknown, i.e. host memory.
  void ensure_context() const noexcept;

  /// The process's table: loaded on first use.  Environment:
  /// TIDE_CUDA_LIBRARY names another driver library file (a driver
  /// installed outside the loader's path); TIDE_CUDA=off never loads one.
  [[nodiscard]] static const api& get();
};

}  // namespace tide::memory::cuda_driver
