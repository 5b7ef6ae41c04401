// libFuzzer target: decode_handshake, with a round trip on success.

#include <tide/metadata/descriptors.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto h = tide::decode_handshake(text);
  if (!h) {
    if (h.error().code != tide::errc::metadata_malformed) std::abort();
    return 0;
  }
  auto again = tide::decode_handshake(tide::encode_handshake(*h));
  if (!again || !(*again == *h)) std::abort();
  return 0;
}
