// libFuzzer target: decode_segment.  Whatever decodes must validate and
// survive encode -> decode unchanged.

#include <tide/metadata/descriptors.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = tide::decode_segment(text);
  if (!d) {
    if (d.error().code != tide::errc::metadata_malformed || d.error().detail.empty()) std::abort();
    return 0;
  }
  if (!tide::validate_segment(*d)) std::abort();
  auto again = tide::decode_segment(tide::encode_segment(*d));
  if (!again || !(*again == *d)) std::abort();
  for (const auto& b : d->buffers) {
    auto i = tide::find_buffer_index(*d, b.addr, b.length);
    if (!i || d->buffers[*i].addr > b.addr) std::abort();
  }
  return 0;
}
