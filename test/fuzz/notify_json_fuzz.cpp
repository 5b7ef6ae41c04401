// libFuzzer target: decode_notify and validate_json, with a round trip.

#include <tide/metadata/descriptors.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool json_ok = tide::validate_json(text).has_value();
  auto n = tide::decode_notify(text);
  if (!n) {
    if (n.error().code != tide::errc::metadata_malformed) std::abort();
    return 0;
  }
  if (!json_ok) std::abort();  // decoded what is not even JSON
  auto again = tide::decode_notify(tide::encode_notify(*n));
  if (!again || !(*again == *n)) std::abort();
  return 0;
}
