#pragma once
// Forwarding header: the JSON helpers live with the codecs in src/wire/.
#include "../wire/json_util.hpp"
