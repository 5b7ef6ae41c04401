// libFuzzer target: the handshake frame decoder.  The whole-buffer decoder
// and the incremental one fed in pieces must agree, and a decoded frame must
// re-encode to the bytes it came from.

#include <tide/net/frame.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // First byte: the piece size for the incremental decoder; a small bound so
  // that "over the bound" is reachable with short inputs.
  const std::size_t piece = 1 + data[0] % 16;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::size_t bound = 4096;

  auto whole = tide::net::decode_frame(input, bound);

  tide::net::frame_decoder dec{bound};
  std::size_t used = 0;
  while (used < input.size() && dec.current() == tide::net::frame_decoder::state::need_more) {
    const std::size_t n = std::min(piece, input.size() - used);
    const std::size_t took = dec.feed(input.data() + used, n);
    if (took > n) std::abort();
    used += took;
    if (took < n && dec.current() == tide::net::frame_decoder::state::need_more) std::abort();
  }
  if (dec.buffered() > bound) std::abort();

  using state = tide::net::frame_decoder::state;
  if (whole) {
    if (dec.current() != state::complete || used != input.size()) std::abort();
    const tide::net::frame f = dec.take();
    if (f.body != whole->body || f.type != whole->type || f.legacy != whole->legacy) std::abort();
    const std::string again =
        f.legacy ? tide::net::encode_legacy_frame(f.body) : tide::net::encode_frame(f.type, f.body);
    if (again != input) std::abort();
  } else if (dec.current() == state::complete && used == input.size()) {
    std::abort();  // the incremental decoder accepted what the whole one refused
  }
  return 0;
}
