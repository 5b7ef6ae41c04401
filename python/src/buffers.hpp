#pragma once
// Python buffers as tide sees them: an exporter's address and size, and the
// copies Mooncake's write_bytes_to_buffer / read_bytes_from_buffer make.
// Only C-contiguous buffers are taken: their bytes are [buf, buf + len).

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

namespace tide::py {

/// memcpy of the first `length` bytes of `data` (any C-contiguous
/// buffer-protocol object) to `addr`.  TypeError (no buffer protocol),
/// ValueError (not C-contiguous, naming its shape and strides; shorter than
/// `length`).  The caller checked that `addr` is registered memory.
void copy_into(std::uintptr_t addr, const pybind11::object& data, std::size_t length);
/// `length` bytes at `addr` as bytes.
[[nodiscard]] pybind11::bytes copy_from(std::uintptr_t addr, std::size_t length);

void init_buffers(pybind11::module_& m);

}  // namespace tide::py
