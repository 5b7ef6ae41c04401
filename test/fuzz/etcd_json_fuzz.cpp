// libFuzzer target: the decoders of etcd's gateway replies and base64.

#include "../../src/metadata/etcd_codec.hpp"

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)tide::detail::parse_etcd_range(text);
  (void)tide::detail::parse_etcd_deleted(text);
  (void)tide::detail::parse_etcd_put(text);
  auto raw = tide::detail::base64_decode(text);
  if (raw && tide::detail::base64_encode(*raw) != text) std::abort();
  if (*tide::detail::base64_decode(tide::detail::base64_encode(text)) != text) std::abort();
  return 0;
}
