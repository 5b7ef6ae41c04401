// A program a tide user writes: built against the installed tree (pkg-config)
// and against tide as a meson subproject by consumer.sh.
#include <tide/errc.hpp>
#include <tide/result.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/gid.hpp>

#include <cstdio>

int main() {
  const auto g = tide::verbs::parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01");
  if (!g || !g->is_ipv4_mapped()) return 1;
  const auto bad = tide::verbs::parse_gid("fe80::1");
  if (bad || bad.error().code != tide::errc::invalid_argument) return 2;
  const auto devices = tide::verbs::device_list::get();
  if (!devices) return 3;
  std::printf("tide consumer: gid %s, %s for a bad one, %zu RDMA device(s)\n", g->to_string().c_str(),
              std::string(tide::to_string(bad.error().code)).c_str(), devices->size());
  return 0;
}
