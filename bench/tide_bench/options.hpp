#pragma once
/// tide-bench's command line: the flags of Mooncake's transfer_engine_bench,
/// read as gflags reads them, plus tide's own (--policy, --json, ...).
///
/// Syntax (gflags'): --name=value, --name value, -name=value; a bool flag is
/// --name, --noname or --name=true|false|yes|no|t|f|y|n|1|0; "--" ends the
/// flags.  gflags' own --flagfile=FILE (one flag per line, '#' comments,
/// nested), --undefok=a,b (those unknown flags are ignored),
/// --fromenv=a,b / --tryfromenv=a,b (values from FLAGS_a) and --helpshort /
/// --helpfull work too.  Sizes also take K, M, G (binary) and --duration a
/// fraction of a second.
///
/// Mooncake's metadata forms: P2PHANDSHAKE, etcd://h:p[,h:p], a bare
/// h:p[,h:p] (etcd, as Mooncake reads it), etcds://... (etcd over TLS),
/// http://h:p/path.  Mooncake's --buffer_size below block x batch x threads
/// is raised to that, with a warning, as Mooncake does.  --use_vram takes
/// GPU memory (on a host without a CUDA driver the run fails, saying why);
/// the TENT backend is refused with the reason.
///
/// Parsing never exits or throws: a bad flag comes back as
/// errc::invalid_argument with a one-line reason naming it.

#include <tide/result.hpp>

#include <cstdint>
#include <set>
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
  /// P2PHANDSHAKE, etcd://..., etcds://... or http://... (a bare h:p is
  /// stored as etcd://h:p).  Mooncake's default is a lab's etcd address;
  /// tide's is P2PHANDSHAKE, which needs nothing else running.
  std::string metadata_server = "P2PHANDSHAKE";
  /// "" = the engine's choice (this host's first non-loopback IPv4 address;
  /// Mooncake's default is the host name).
  std::string local_server_name;
  std::string segment_id;                 ///< the target's segment name (initiator only)
  std::vector<std::string> device_names;  ///< --device_name a,b (default: every device)
  std::string nic_priority_matrix;        ///< a file holding the NIC priority matrix (JSON)
  /// GPU memory (cuMemAlloc on --gpu_id) instead of host memory, as
  /// Mooncake's --use_vram; --init_mem fills it first (Mooncake's default).
  bool use_vram = false;
  int gpu_id = 0;
  bool init_mem = true;
  /// Every device the engine finds, RDMA and TCP (--device_name and
  /// --protocol are then not used, as in Mooncake).
  bool auto_discovery = false;
  std::string protocol = "rdma";          ///< rdma (RDMA only) or tcp (TCP only), as Mooncake's --protocol
  bench_operation operation = bench_operation::read;
  std::uint64_t buffer_size = 1ull << 30;
  std::uint32_t batch_size = 128;
  std::uint64_t block_size = 65536;
  double duration_s = 10;
  std::uint32_t threads = 12;
  report_unit unit;
  unsigned report_precision = 2;          ///< decimals of the throughput in the result line
  std::string policy = "default";
  std::string json_path;                  ///< empty: no JSON report
  std::string auth_secret_file;           ///< cluster secret (engine_config::auth_secret_file)
  std::uint16_t metrics_port = 0;         ///< serve GET /metrics on 127.0.0.1 while running; 0 = off
  bool progress = true;                   ///< a progress line on stderr each second
  bool help = false;
  bool list_policies = false;
  bool print_config = false;              ///< print the engine's configuration and its sources, then exit
  /// The flags given (by name, after --flagfile and --fromenv): the engine
  /// settings they map to count as set by the program.
  std::set<std::string, std::less<>> given;
  /// Flags taken but changed or unused, one line each (main prints them).
  std::vector<std::string> warnings;
};

/// Parses argv[1..argc).  Errors: invalid_argument naming the flag and why.
[[nodiscard]] result<bench_options> parse_options(int argc, const char* const* argv,
                                                  const std::vector<std::string>& policy_names);

/// Parses "65536", "64K", "64KiB", "1M", "1G" (binary multiples).
[[nodiscard]] result<std::uint64_t> parse_size(std::string_view text);

/// The metadata server as the engine takes it: a bare "h:p[,h:p]" becomes
/// "etcd://h:p[,h:p]".  Errors: invalid_argument for a form tide does not
/// speak (https://, redis://, ...), with the reason.
[[nodiscard]] result<std::string> normalize_metadata_server(std::string_view text);

/// The usage text, listing the policy sets that were compiled in.
[[nodiscard]] std::string usage(const std::vector<std::string>& policy_names);

}  // namespace tide::bench
