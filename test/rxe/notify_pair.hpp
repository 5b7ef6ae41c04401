#pragma once
// connected_pair: the two engines the notification suites (notify_test.cpp,
// notify_wait_test.cpp) send between, each with a registered buffer.
#include <doctest/doctest.h>

#include <tide/engine.hpp>

#include "rxe_helpers.hpp"

#include <cstdint>
#include <memory>

namespace tide::test {

/// Engines on `ca` and `cb`, `bytes` of src registered at a and of dst at
/// b, a's view of b's segment.  Members in the order the tests declared
/// them, so the buffers still go before the engines.
struct connected_pair {
  connected_pair(const engine_config& ca, const engine_config& cb, std::size_t bytes)
      : a(make_engine(ca)), b(make_engine(cb)), src(bytes), dst(bytes) {
    REQUIRE(a->register_memory(src.data, src.size, "cpu:0"));
    REQUIRE(b->register_memory(dst.data, dst.size, "cpu:0"));
    seg = a->open_segment(b->segment_name()).value();
    dst_id = b->buffer_id(dst.data).value();
  }
  /// One 64 B WRITE, so the endpoint is up: a notification while it connects goes over TCP.
  void connect() {
    auto warm = transfer_request::in_buffer(transfer_op::write, src.data, seg, dst_id, 0, 64);
    REQUIRE(run_one(*a, warm));
  }

  std::unique_ptr<transfer_engine<>> a, b;
  buffer src, dst;
  segment_id seg = 0;
  std::uint32_t dst_id = 0;
};

}  // namespace tide::test
