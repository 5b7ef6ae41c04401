// Memory kinds on Soft-RoCE: rxe has no dma-buf registration, and the
// probe (an invalid fd: EBADF where a provider implements it) says so
// without registering anything; host memory registers as before.  GPU
// memory itself needs a GPU: tools/gpu-check.

#include "devices_under_test.hpp"

#include <tide/verbs/device.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>

#include <doctest/doctest.h>

#include <cerrno>
#include <vector>

TEST_CASE("the dma-buf probe reports rxe as unsupported (EOPNOTSUPP), and host memory still registers") {
  for (const auto& name : tide::test::devices_under_test()) {
    CAPTURE(name);
    auto ctx = tide::verbs::context::open(name);
    REQUIRE(ctx);
    auto pd = tide::verbs::protection_domain::create(*ctx);
    REQUIRE(pd);
    const auto probe = tide::verbs::probe_dmabuf(*pd);
    CHECK_FALSE(probe.supported);
    CHECK(probe.error == EOPNOTSUPP);
    std::vector<char> buf(1 << 20);
    CHECK(tide::verbs::memory_region::register_memory(*pd, buf.data(), buf.size()));
    // A registration by dma-buf fails with the provider's reason, named.
    auto mr = tide::verbs::memory_region::register_dmabuf(*pd, -1, 0, 4096, 0);
    REQUIRE_FALSE(mr);
    CHECK(mr.error().detail.find("ibv_reg_dmabuf_mr") != std::string::npos);
  }
}
