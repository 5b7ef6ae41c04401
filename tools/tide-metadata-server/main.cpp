// tide-metadata-server: Mooncake's HTTP metadata protocol, keys in memory.
//
//   tide-metadata-server [--host 0.0.0.0] [--port 8080] [--path /metadata]
//
// Prints "listening on <host>:<port><path>" on stdout once it accepts
// connections (with --port 0, the port the kernel chose), then serves until
// SIGINT or SIGTERM.

#include <tide/metadata/http_metadata_server.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--host ADDR] [--port N] [--path /metadata]\n", argv0);
  return 2;
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
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  server->stop();
  return 0;
}
