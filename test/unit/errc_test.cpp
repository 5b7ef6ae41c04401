#include <tide/errc.hpp>
#include <tide/result.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>

TEST_CASE("every code has a distinct name and a description") {
  std::set<std::string_view> names;
  int checked = 0;
  for (int v = 0; v < 500; ++v) {
    const auto e = static_cast<tide::errc>(v);
    if (tide::to_string(e) == "unknown") continue;
    CHECK(names.insert(tide::to_string(e)).second);
    CHECK_FALSE(tide::describe(e).empty());
    ++checked;
  }
  CHECK(checked > 40);
}

TEST_CASE("codes are grouped by blast radius") {
  CHECK(tide::group_of(tide::errc::ok) == tide::errc_group::none);
  CHECK(tide::group_of(tide::errc::zero_length) == tide::errc_group::local);
  CHECK(tide::group_of(tide::errc::remote_access_error) == tide::errc_group::endpoint);
  CHECK(tide::group_of(tide::errc::port_down) == tide::errc_group::device);
  CHECK(tide::group_of(tide::errc::metadata_malformed) == tide::errc_group::metadata);
}

TEST_CASE("errc converts to std::error_code") {
  std::error_code ec = tide::errc::batch_busy;
  CHECK(ec.category().name() == std::string("tide"));
  CHECK(ec.message() == "the batch still has unfinished tasks");
}

TEST_CASE("result carries the code and the detail") {
  auto f = []() -> tide::result<int> { return tide::fail(tide::errc::metadata_malformed, "buffers[1].rkey: expected 2 keys"); };
  auto r = f();
  REQUIRE_FALSE(r);
  CHECK(r.error() == tide::errc::metadata_malformed);
  CHECK(r.error().message() == "metadata_malformed: buffers[1].rkey: expected 2 keys");
  CHECK(tide::error{tide::errc::zero_length}.message() == "zero_length: a transfer or registration of zero bytes");
}
