#pragma once
// The RDMA devices the rxe suites run on: $TIDE_TEST_DEVICES or $RXE_VM_DEVICES
// ("rxe0 rxe1"), else every device found; one device is listed twice (loopback), so
// callers can always take [0] and [1].

#include <tide/verbs/device.hpp>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace tide::test {

inline std::vector<std::string> devices_under_test() {
  std::vector<std::string> out;
  for (const char* var : {"TIDE_TEST_DEVICES", "RXE_VM_DEVICES"}) {
    if (const char* s = std::getenv(var); s != nullptr && *s != '\0') {
      std::istringstream in(s);
      for (std::string d; in >> d;) out.push_back(d);
      break;
    }
  }
  if (out.empty()) {
    if (auto list = verbs::device_list::get()) out = list->names();
  }
  if (out.size() == 1) out.push_back(out[0]);
  return out;
}

}  // namespace tide::test
