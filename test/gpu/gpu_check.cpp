// tide-gpu-check: what tide does with real GPU memory, on a machine with an
// NVIDIA GPU and its driver (no RDMA device needed), as one table.
//
//  - classification: cuMemAlloc, cuMemAllocHost (pinned host), malloc, a
//    virtual-memory range of two mappings (PyTorch's expandable segments),
//    a range past the end of an allocation (refused);
//  - the dma-buf export of device memory (what a NIC registers);
//  - two engines on loopback over TCP moving GPU->GPU, host->GPU, GPU->host
//    (WRITE and READ), every byte checked by copying it back;
//  - bench: the copy engine beside cuMemcpyDtoHAsync/HtoDAsync on pinned
//    memory at 64 KiB, 1 MiB and 16 MiB chunks; TCP GPU->GPU beside
//    host->host at 1 MiB and 64 MiB (medians of alternating runs).
//
// Exit status: 0 all checks pass, 1 a check failed, 77 no usable CUDA driver
// (the reason is printed): a host without a GPU skips it.  tools/gpu-check
// builds, bundles and runs it.

#include <tide/engine.hpp>
#include <tide/memory/memory_kind.hpp>

#include "memory/cuda_api.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace cu = tide::memory::cuda_driver;
namespace memory = tide::memory;
using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;

namespace {

int failures = 0;

void row(const std::string& check, bool ok, const std::string& detail) {
  if (!ok) ++failures;
  std::printf("| %-52s | %-4s | %s |\n", check.c_str(), ok ? "ok" : "FAIL", detail.c_str());
  std::fflush(stdout);
}

void info_row(const std::string& what, const std::string& value) {
  std::printf("| %-52s | %-4s | %s |\n", what.c_str(), "", value.c_str());
}

std::string gbps(double bytes, double seconds) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB/s", bytes / seconds / 1e9);
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string classify_text(const void* p, std::size_t n) {
  auto c = memory::classify(p, n);
  if (!c) return "error: " + c.error().detail;
  std::string s = std::string(memory::to_string(c->kind));
  if (c->kind == memory::kind::cuda) s += ":" + std::to_string(c->device);
  if (c->vmm) s += " (vmm)";
  return s;
}

struct device_buffer {
  const cu::api& a;
  cu::CUdeviceptr p = 0;
  std::size_t n = 0;
  device_buffer(const cu::api& api, std::size_t bytes) : a(api), n(bytes) {
    if (a.cuMemAlloc(&p, n) != cu::CUDA_SUCCESS) p = 0;
  }
  ~device_buffer() {
    if (p != 0) (void)a.cuMemFree(p);
  }
  [[nodiscard]] void* ptr() const { return reinterpret_cast<void*>(p); }
};

struct pinned_buffer {
  const cu::api& a;
  void* p = nullptr;
  pinned_buffer(const cu::api& api, std::size_t bytes) : a(api) {
    if (a.cuMemAllocHost(&p, bytes) != cu::CUDA_SUCCESS) p = nullptr;
  }
  ~pinned_buffer() {
    if (p != nullptr) (void)a.cuMemFreeHost(p);
  }
};

// Two physical chunks mapped back to back in one reserved range, as
// PyTorch's expandable segments grow.
struct vmm_range {
  const cu::api& a;
  cu::CUdeviceptr base = 0;
  std::size_t chunk = 0;
  cu::CUmemGenericAllocationHandle h[2] = {0, 0};
  std::string error;
  explicit vmm_range(const cu::api& api) : a(api) {
    if (a.cuMemCreate == nullptr || a.cuMemMap == nullptr) {
      error = "the driver has no cuMemCreate/cuMemMap";
      return;
    }
    cu::CUmemAllocationProp prop{};
    prop.type = cu::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {cu::CU_MEM_LOCATION_TYPE_DEVICE, 0};
    std::size_t gran = 0;
    if (auto r = a.cuMemGetAllocationGranularity(&gran, &prop, cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM); r != 0) {
      error = "cuMemGetAllocationGranularity: " + a.error_text(r);
      return;
    }
    chunk = std::max<std::size_t>(gran, std::size_t{20} << 20) / gran * gran;
    if (auto r = a.cuMemAddressReserve(&base, 2 * chunk, 0, 0, 0); r != 0) {
      error = "cuMemAddressReserve: " + a.error_text(r);
      base = 0;
      return;
    }
    for (int i = 0; i < 2; ++i) {
      if (auto r = a.cuMemCreate(&h[i], chunk, &prop, 0); r != 0) {
        error = "cuMemCreate: " + a.error_text(r);
        return;
      }
      if (auto r = a.cuMemMap(base + i * chunk, chunk, 0, h[i], 0); r != 0) {
        error = "cuMemMap: " + a.error_text(r);
        return;
      }
    }
    cu::CUmemAccessDesc acc{{cu::CU_MEM_LOCATION_TYPE_DEVICE, 0}, cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (auto r = a.cuMemSetAccess(base, 2 * chunk, &acc, 1); r != 0) error = "cuMemSetAccess: " + a.error_text(r);
  }
  ~vmm_range() {
    if (base == 0) return;
    (void)a.cuMemUnmap(base, 2 * chunk);
    for (auto x : h)
      if (x != 0) (void)a.cuMemRelease(x);
    (void)a.cuMemAddressFree(base, 2 * chunk);
  }
};

void fill(std::vector<unsigned char>& v, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  for (auto& c : v) c = static_cast<unsigned char>(g() >> 17);
}

tide::engine_config tcp_config() {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.bind_host = "127.0.0.1";
  c.transports = "tcp";
  c.transfer_timeout = 60s;
  c.tcp_io_threads = 4;
  return c;
}

// Runs `reqs` as one batch; true when every task completed.
bool run(tide::transfer_engine<>& e, const std::vector<transfer_request>& reqs) {
  auto b = e.allocate_batch(reqs.size());
  if (!b) return false;
  bool ok = static_cast<bool>(e.submit(*b, reqs)) && static_cast<bool>(e.wait(*b, 120s));
  if (ok) {
    auto st = e.batch_status(*b);
    ok = st && st->state == tide::transfer_state::completed;
  }
  (void)e.free_batch(*b);
  return ok;
}

void classification(const cu::api& a) {
  device_buffer d(a, 8 << 20);
  pinned_buffer h(a, 1 << 20);
  std::vector<char> heap(1 << 20);
  row("classify cuMemAlloc (8 MiB)", d.p != 0 && classify_text(d.ptr(), d.n) == "cuda:0", classify_text(d.ptr(), d.n));
  row("classify an offset inside it (PyTorch caching allocator)",
      classify_text(reinterpret_cast<char*>(d.ptr()) + 4096, 1 << 20) == "cuda:0",
      classify_text(reinterpret_cast<char*>(d.ptr()) + 4096, 1 << 20));
  row("classify cuMemAllocHost (pinned host)", h.p != nullptr && classify_text(h.p, 1 << 20) == "host",
      classify_text(h.p, 1 << 20));
  row("classify malloc", classify_text(heap.data(), heap.size()) == "host", classify_text(heap.data(), heap.size()));
  auto past = memory::classify(reinterpret_cast<char*>(d.ptr()) + (4 << 20), 8 << 20);
  row("a range past the allocation's end is refused",
      !past && past.error().code == tide::errc::memory_unsupported, past ? "accepted" : past.error().detail);
  vmm_range v(a);
  if (!v.error.empty()) {
    row("classify a virtual-memory range of two mappings", false, v.error);
  } else {
    const std::string c = classify_text(reinterpret_cast<void*>(v.base), 2 * v.chunk);
    row("classify a virtual-memory range of two mappings (2 x " + std::to_string(v.chunk >> 20) + " MiB)",
        c == "cuda:0 (vmm)", c);
    auto info = memory::classify(reinterpret_cast<void*>(v.base), 2 * v.chunk);
    if (info) {
      auto x = memory::dmabuf::export_range(*info, v.base, 2 * v.chunk);
      row("dma-buf export of the virtual-memory range", static_cast<bool>(x),
          x ? "fd " + std::to_string(x->fd()) : x.error().detail);
    }
  }
  auto info = memory::classify(d.ptr(), d.n);
  if (info) {
    auto x = memory::dmabuf::export_range(*info, d.p + 4096, 1 << 20);
    row("dma-buf export of cuMemAlloc memory (1 MiB at +4 KiB)", static_cast<bool>(x),
        x ? "fd " + std::to_string(x->fd()) + ", offset " + std::to_string(x->offset()) : x.error().detail);
  }
}

void transfers(const cu::api& a) {
  constexpr std::size_t kN = 24 << 20;
  auto ea = tide::transfer_engine<>::create(tcp_config());
  auto eb = tide::transfer_engine<>::create(tcp_config());
  if (!ea || !eb) {
    row("two TCP engines on loopback", false, (!ea ? ea.error() : eb.error()).message());
    return;
  }
  device_buffer ga(a, kN), gb(a, kN);
  std::vector<unsigned char> ha(kN), hb(kN), want(kN), got(kN);
  auto reg = [&](tide::transfer_engine<>& e, void* p, std::size_t n) {
    auto r = e.register_memory(p, n);
    if (!r) row("register_memory", false, r.error().message());
    return static_cast<bool>(r);
  };
  if (!reg(**ea, ga.ptr(), kN) || !reg(**ea, ha.data(), kN) || !reg(**eb, gb.ptr(), kN) || !reg(**eb, hb.data(), kN))
    return;
  auto seg = (*ea)->open_segment((*eb)->segment_name());
  if (!seg) return row("open_segment", false, seg.error().message());
  auto desc = (*ea)->segment_descriptor(*seg);
  bool named = desc && (*desc)->buffers.size() == 2 && (*desc)->buffers[0].name == "cuda:0" &&
               (*desc)->buffers[1].name == "*";
  row("published locations: GPU buffer cuda:0, host buffer *", named,
      desc ? (*desc)->buffers[0].name + ", " + (*desc)->buffers[1].name : desc.error().message());

  std::uint64_t seed = 1;
  // Each case: the source is set, one request moves kN - 13 bytes at +13,
  // the destination is copied to `got` and compared.
  auto check = [&](const std::string& name, transfer_op op, void* local, bool local_gpu, void* remote, bool remote_gpu) {
    fill(want, ++seed);
    void* src = op == transfer_op::write ? local : remote;
    void* dst = op == transfer_op::write ? remote : local;
    const bool src_gpu = op == transfer_op::write ? local_gpu : remote_gpu;
    const bool dst_gpu = op == transfer_op::write ? remote_gpu : local_gpu;
    if (src_gpu) (void)a.cuMemcpyHtoD(reinterpret_cast<cu::CUdeviceptr>(src), want.data(), kN);
    else std::memcpy(src, want.data(), kN);
    if (dst_gpu) (void)a.cuMemsetD8(reinterpret_cast<cu::CUdeviceptr>(dst), 0, kN);
    else std::memset(dst, 0, kN);
    const std::size_t off = 13, n = kN - 13;
    auto req = transfer_request::at_address(op, static_cast<char*>(local) + off, *seg,
                                            reinterpret_cast<std::uint64_t>(remote) + off, n);
    const bool done = run(**ea, {req});
    if (dst_gpu) (void)a.cuMemcpyDtoH(got.data(), reinterpret_cast<cu::CUdeviceptr>(dst), kN);
    else std::memcpy(got.data(), dst, kN);
    const bool same = std::memcmp(got.data() + off, want.data() + off, n) == 0 && got[off - 1] == 0;
    row(name + " over TCP, " + std::to_string(n) + " B", done && same,
        !done ? "the transfer failed" : same ? "every byte checked" : "bytes differ");
  };
  check("WRITE GPU -> GPU", transfer_op::write, ga.ptr(), true, gb.ptr(), true);
  check("WRITE host -> GPU", transfer_op::write, ha.data(), false, gb.ptr(), true);
  check("WRITE GPU -> host", transfer_op::write, ga.ptr(), true, hb.data(), false);
  check("READ GPU <- GPU", transfer_op::read, ga.ptr(), true, gb.ptr(), true);
  check("READ host <- GPU", transfer_op::read, ha.data(), false, gb.ptr(), true);
  check("READ GPU <- host", transfer_op::read, ga.ptr(), true, hb.data(), false);
  const auto ta = (*ea)->tcp_stats(), tb = (*eb)->tcp_stats();
  info_row("bytes staged (initiator, server)", std::to_string(ta.bytes_staged) + ", " + std::to_string(tb.bytes_staged));
}

void bench_copy(const cu::api& a) {
  constexpr std::size_t kTotal = std::size_t{256} << 20;
  device_buffer d(a, kTotal);
  pinned_buffer h(a, kTotal);
  if (d.p == 0 || h.p == nullptr) return row("bench: buffers", false, "allocation failed");
  memory::range_info info;
  info.kind = memory::kind::cuda;
  info.device = 0;
  auto eng = memory::copy_engine_for(info);
  if (!eng) return row("bench: copy engine", false, eng.error().detail);
  cu::CUstream s = nullptr;
  (void)a.use_device(0);
  (void)a.cuStreamCreate(&s, 0);
  for (const std::size_t chunk : {std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
    for (const bool d2h : {true, false}) {
      std::vector<double> ceiling, ours;
      for (int rep = 0; rep < 3; ++rep) {
        ceiling.push_back(seconds_of([&] {
          for (std::size_t o = 0; o < kTotal; o += chunk) {
            auto* hp = static_cast<char*>(h.p) + o;
            if (d2h) (void)a.cuMemcpyDtoHAsync(hp, d.p + o, chunk, s);
            else (void)a.cuMemcpyHtoDAsync(d.p + o, hp, chunk, s);
          }
          (void)a.cuStreamSynchronize(s);
        }));
        ours.push_back(seconds_of([&] {
          for (std::size_t o = 0; o < kTotal; o += chunk) {
            auto* hp = static_cast<char*>(h.p) + o;
            if (d2h) (void)(*eng)->to_host(hp, d.p + o, chunk);
            else (void)(*eng)->from_host(d.p + o, hp, chunk);
          }
        }));
      }
      const double c = median(ceiling), o = median(ours);
      char ratio[64];
      std::snprintf(ratio, sizeof ratio, "%.2fx (goal >= 0.8x)", c / o);
      info_row(std::string("bench: copy engine ") + (d2h ? "D2H " : "H2D ") + std::to_string(chunk >> 10) +
                   " KiB chunks vs cuMemcpy*Async",
               gbps(kTotal, o) + " vs " + gbps(kTotal, c) + " = " + ratio);
    }
  }
  (void)a.cuStreamDestroy(s);
}

void bench_tcp(const cu::api& a) {
  constexpr std::size_t kTotal = std::size_t{256} << 20;
  auto ea = tide::transfer_engine<>::create(tcp_config());
  auto eb = tide::transfer_engine<>::create(tcp_config());
  if (!ea || !eb) return row("bench: engines", false, "create failed");
  device_buffer ga(a, kTotal), gb(a, kTotal);
  std::vector<unsigned char> ha(kTotal, 1), hb(kTotal);
  if (!(*ea)->register_memory(ga.ptr(), kTotal) || !(*ea)->register_memory(ha.data(), kTotal) ||
      !(*eb)->register_memory(gb.ptr(), kTotal) || !(*eb)->register_memory(hb.data(), kTotal))
    return row("bench: register", false, "register_memory failed");
  auto seg = (*ea)->open_segment((*eb)->segment_name());
  if (!seg) return row("bench: open_segment", false, seg.error().message());
  for (const std::size_t size : {std::size_t{1} << 20, std::size_t{64} << 20}) {
    auto batch = [&](void* src, void* dst) {
      std::vector<transfer_request> reqs;
      for (std::size_t o = 0; o < kTotal; o += size)
        reqs.push_back(transfer_request::at_address(transfer_op::write, static_cast<char*>(src) + o, *seg,
                                                    reinterpret_cast<std::uint64_t>(dst) + o, size));
      return reqs;
    };
    const auto gpu = batch(ga.ptr(), gb.ptr()), host = batch(ha.data(), hb.data());
    std::vector<double> tg, th;
    (void)run(**ea, host);  // connections up
    for (int rep = 0; rep < 3; ++rep) {
      th.push_back(seconds_of([&] { (void)run(**ea, host); }));
      tg.push_back(seconds_of([&] { (void)run(**ea, gpu); }));
    }
    const double g = median(tg), h = median(th);
    char ratio[64];
    std::snprintf(ratio, sizeof ratio, "%.2fx (goal >= 0.8x)", h / g);
    info_row("bench: TCP WRITE GPU->GPU vs host->host, " + std::to_string(size >> 20) + " MiB requests",
             gbps(kTotal, g) + " vs " + gbps(kTotal, h) + " = " + ratio);
  }
}

}  // namespace

int main() {
  const cu::api& a = cu::api::get();
  if (!a.usable) {
    std::printf("tide-gpu-check: skipped: %s\n", a.why.c_str());
    return 77;
  }
  (void)a.use_device(0);
  int dmabuf = -1, gdr = -1;
  cu::CUdevice dev = 0;
  (void)a.cuDeviceGet(&dev, 0);
  (void)a.cuDeviceGetAttribute(&dmabuf, cu::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev);
  (void)a.cuDeviceGetAttribute(&gdr, cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, dev);
  char bus[32] = "?";
  if (a.cuDeviceGetPCIBusId != nullptr) (void)a.cuDeviceGetPCIBusId(bus, sizeof bus, dev);
  std::printf("| %-52s | %-4s | %s |\n|%s|%s|%s|\n", "check", "", "result", std::string(54, '-').c_str(),
              std::string(6, '-').c_str(), std::string(40, '-').c_str());
  info_row("CUDA driver", std::to_string(a.driver_version) + ", " + std::to_string(a.devices) +
                              " device(s); device 0 at " + bus);
  info_row("device 0: DMA_BUF_SUPPORTED, GPU_DIRECT_RDMA_SUPPORTED",
           std::to_string(dmabuf) + ", " + std::to_string(gdr));
  info_row("nvidia_peermem loaded", memory::peermem_loaded() ? "yes" : "no");
  classification(a);
  transfers(a);
  bench_copy(a);
  bench_tcp(a);
  std::printf("\n%s: %d check(s) failed\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
