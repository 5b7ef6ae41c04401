// Memory kinds without a GPU: host memory classifies as host whatever the
// driver, `cuda:N` is refused with the reason when no driver loads (and is
// checked against the memory when one does), and the host copy engine and
// placement do what the staging switch relies on.  tools/gpu-check covers
// the CUDA branches on a machine with a GPU.

#include <tide/memory/memory_kind.hpp>

#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

using tide::errc;
namespace memory = tide::memory;

namespace {

tide::topology::location parse(const char* text) {
  auto l = tide::topology::location::parse(text);
  REQUIRE(l);
  return *l;
}

}  // namespace

TEST_CASE("host memory is host memory whether or not a CUDA driver is loaded: heap, stack, mmap") {
  std::vector<char> heap(1 << 20);
  char stack[4096];
  void* mapped = ::mmap(nullptr, 1 << 21, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mapped != MAP_FAILED);
  for (auto [p, n] : {std::pair<void*, std::size_t>{heap.data(), heap.size()}, {stack, sizeof stack}, {mapped, 1 << 21}}) {
    auto info = memory::classify(p, n);
    REQUIRE(info);
    CHECK(info->kind == memory::kind::host);
    CHECK(info->device == -1);
    CHECK(info->alloc_base == reinterpret_cast<std::uint64_t>(p));
    CHECK(info->alloc_length == n);
  }
  ::munmap(mapped, 1 << 21);
}

TEST_CASE("the CUDA status says why the driver is not usable, or how many devices it has") {
  const auto& s = memory::cuda();
  if (s.usable) {
    CHECK(s.devices > 0);
    CHECK(s.driver_version > 0);
    CHECK(s.why_not.empty());
  } else {
    CHECK(s.devices == 0);
    CHECK_FALSE(s.why_not.empty());
    MESSAGE("no CUDA here: " << s.why_not);
  }
}

TEST_CASE("placement: '*' on host memory stays '*', staged only with the switch; cpu:N is taken") {
  std::vector<char> buf(65536);
  auto p = memory::place(buf.data(), buf.size(), parse("*"), "*", false);
  REQUIRE(p);
  CHECK(p->location == "*");
  CHECK(p->info.kind == memory::kind::host);
  CHECK(p->stager == nullptr);
  auto staged = memory::place(buf.data(), buf.size(), parse("*"), "*", true);
  REQUIRE(staged);
  REQUIRE(staged->stager != nullptr);
  CHECK(staged->stager->name() == "host");
  auto cpu = memory::place(buf.data(), buf.size(), parse("cpu:0"), "cpu:0", false);
  REQUIRE(cpu);
  CHECK(cpu->location == "cpu:0");
}

TEST_CASE("placement: cuda:N on host memory is refused, naming why (no driver) or what the memory is") {
  std::vector<char> buf(65536);
  auto p = memory::place(buf.data(), buf.size(), parse("cuda:0"), "cuda:0", false);
  REQUIRE_FALSE(p);
  if (!memory::cuda().usable) {
    CHECK(p.error().code == errc::memory_unsupported);
    CHECK(p.error().detail.find("cuda:0") != std::string::npos);
    CHECK(p.error().detail.find(memory::cuda().why_not) != std::string::npos);
  } else {
    CHECK(p.error().code == errc::bad_location);
    CHECK(p.error().detail.find("is host memory, not cuda:0") != std::string::npos);
  }
}

TEST_CASE("copy engines: the host one moves bytes both ways and pins nothing; a CUDA one needs a driver and a device") {
  memory::range_info host;
  auto e = memory::copy_engine_for(host);
  REQUIRE(e);
  const memory::copy_engine& h = **e;
  CHECK(h.name() == "host");
  std::vector<unsigned char> a(1000), b(1000), c(1000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 7);
  CHECK(h.to_host(b.data(), reinterpret_cast<std::uint64_t>(a.data()), a.size()) == errc::ok);
  CHECK(h.from_host(reinterpret_cast<std::uint64_t>(c.data()), b.data(), b.size()) == errc::ok);
  CHECK(std::memcmp(a.data(), c.data(), a.size()) == 0);
  CHECK_FALSE(h.pin(b.data(), b.size()));

  memory::range_info gpu;
  gpu.kind = memory::kind::cuda;
  gpu.device = 4096;  // no host has it
  auto g = memory::copy_engine_for(gpu);
  REQUIRE_FALSE(g);
  CHECK(g.error().code == errc::memory_unsupported);
  CHECK(g.error().detail.find("cuda:4096") != std::string::npos);
}

TEST_CASE("a dma-buf export needs a driver") {
  if (memory::cuda().usable) return;  // tools/gpu-check exports real GPU memory
  memory::range_info gpu;
  gpu.kind = memory::kind::cuda;
  gpu.device = 0;
  auto d = memory::dmabuf::export_range(gpu, 0x10000, 4096);
  REQUIRE_FALSE(d);
  CHECK(d.error().code == errc::memory_unsupported);
  CHECK(d.error().detail.find("dma-buf export") != std::string::npos);
}
