#pragma once
/// tide-bench's command line: the flags of Mooncake's transfer_engine_bench
/// (gflags syntax: --name=value, --name value, --flag, --noflag), plus
/// --policy and --json.  Parsing never exits or throws: a bad flag comes
/// back as errc::invalid_argument with a one-line reason.

#include <tide/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::bench {

enum class bench_mode { initiator, target };
enum class bench_operation { read, write };

struct report_unit {
  std::string name = "GB";     ///< as given: GB, GiB, Gb, MB, MiB, Mb, KB, KiB, Kb
  double bytes_per_unit = 1e9; ///< Gb counts bits: 1e9 / 8 bytes
};

struct bench_options {
  bench_mode mode = bench_mode::initiator;
  std::string metadata_server = "P2PHANDSHAKE";
  std::string local_server_name = "127.0.0.1";
  std::string segment_id;                 ///< the target's segment name (initiator only)
  std::vector<std::string> device_names;  ///< --device_name a,b
  std::string protocol = "rdma";          ///< rdma (RDMA only) or tcp (TCP only), as Mooncake's --protocol
  bench_operation operation = bench_operation::read;
  std::uint64_t buffer_size = 1ull << 30;
  std::uint32_t batch_size = 128;
  std::uint64_t block_size = 65536;
  double duration_s = 10;
  std::uint32_t threads = 12;
  report_unit unit;
  std::string policy = "default";
  std::string json_path;                  ///< empty: no JSON report
  std::string auth_secret_file;           ///< cluster secret (engine_config::auth_secret_file)
  std::uint16_t metrics_port = 0;         ///< serve GET /metrics on 127.0.0.1 while running; 0 = off
  bool progress = true;                   ///< a progress line on stderr each second
  bool help = false;
};

/// Parses argv[1..argc).  Errors: invalid_argument naming the flag and why.
[[nodiscard]] result<bench_options> parse_options(int argc, const char* const* argv,
                                                  const std::vector<std::string>& policy_names);

/// Parses "65536", "64K", "64KiB", "1M", "1G" (binary multiples).
[[nodiscard]] result<std::uint64_t> parse_size(std::string_view text);

/// The usage text, listing the policy sets that were compiled in.
[[nodiscard]] std::string usage(const std::vector<std::string>& policy_names);

}  // namespace tide::bench
