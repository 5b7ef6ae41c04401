#pragma once
/// Forwarding header: the descriptors and their JSON codecs live in the wire
/// layer (tide/wire/descriptors.hpp), below both metadata/ and net/.

#include <tide/wire/descriptors.hpp>
