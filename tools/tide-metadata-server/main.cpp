// tide-metadata-server: Mooncake's HTTP metadata protocol, keys in memory.
//
//   tide-metadata-server [--host 0.0.0.0] [--port 8080] [--path /metadata]
//                        [--token-file F] [--max-keys N] [--max-value-bytes N]
//                        [--max-total-bytes N] [--max-connections N]
//                        [--request-timeout-ms N]
//
// With --token-file, PUT and DELETE need "Authorization: Bearer <token>"
// (the file's first line); GET stays open for Mooncake peers.  The bounds'
// defaults are http_metadata_server_config's.
//
// Prints "listening on <host>:<port><path>" on stdout once it accepts
// connections (with --port 0, the port the kernel chose), then serves until
// SIGINT or SIGTERM.

#include <tide/metadata/http_metadata_server.hpp>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace {

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--host ADDR] [--port N] [--path /metadata] [--token-file FILE]\n"
               "          [--max-keys N] [--max-value-bytes N] [--max-total-bytes N] [--max-connections N]\n"
               "          [--request-timeout-ms N]\n",
               argv0);
  return 2;
}

// A positive decimal count, else nullopt.
std::optional<std::size_t> count(const std::string& s) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || v == 0) return std::nullopt;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  tide::http_metadata_server_config cfg;
  cfg.host = "0.0.0.0";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      usage(argv[0]);
      return 0;
    }
    if (i + 1 >= argc) return usage(argv[0]);
    const std::string value = argv[++i];
    if (arg == "--host") {
      cfg.host = value;
    } else if (arg == "--port") {
      char* end = nullptr;
      const long port = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || port < 0 || port > 65535) {
        std::fprintf(stderr, "bad port: %s\n", value.c_str());
        return 2;
      }
      cfg.port = static_cast<std::uint16_t>(port);
    } else if (arg == "--path") {
      cfg.path = value;
    } else if (arg == "--token-file") {
      cfg.token_file = value;
    } else if (arg == "--max-keys" || arg == "--max-value-bytes" || arg == "--max-total-bytes" ||
               arg == "--max-connections" || arg == "--request-timeout-ms") {
      const auto n = count(value);
      if (!n) {
        std::fprintf(stderr, "%s: expected a positive integer, got \"%s\"\n", arg.c_str(), value.c_str());
        return 2;
      }
      if (arg == "--max-keys") cfg.max_keys = *n;
      if (arg == "--max-value-bytes") cfg.max_value_bytes = *n;
      if (arg == "--max-total-bytes") cfg.max_total_bytes = *n;
      if (arg == "--max-connections") cfg.max_connections = *n;
      if (arg == "--request-timeout-ms") cfg.request_timeout = std::chrono::milliseconds(*n);
    } else {
      return usage(argv[0]);
    }
  }

  // Block the signals before any thread starts so that only sigwait sees them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto server = tide::http_metadata_server::start(cfg);
  if (!server) {
    std::fprintf(stderr, "tide-metadata-server: %s\n", server.error().message().c_str());
    return 1;
  }
  std::printf("listening on %s:%u%s\n", cfg.host.c_str(), static_cast<unsigned>(server->port()), cfg.path.c_str());
  if (cfg.token_file.empty()) std::printf("no --token-file: anyone who reaches this port may PUT and DELETE\n");
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  server->stop();
  return 0;
}
