// tide-tcp-zerocopy: does MSG_ZEROCOPY pay for the TCP transport's sends?
// One TCP connection (loopback by default, or --host on a veth), a sender
// writing --total bytes in sends of each size, plain send() against
// send(MSG_ZEROCOPY) with SO_ZEROCOPY (completions reaped from the error
// queue before a buffer is reused, as the transport would have to before an
// op is final), alternating and repeated; the receiver reads into one
// buffer.  Prints GB/s and CPU seconds per GB (the whole process) per row.
//
//   tide-tcp-zerocopy [--host 127.0.0.1] [--sizes 65536,1048576,67108864] [--total 2G] [--repeats 3]
#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

namespace {

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tide-tcp-zerocopy: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

struct result {
  double gbps = 0;
  double cpu_s_per_gb = 0;
  bool copied = false;  ///< the kernel reported it copied anyway (SO_EE_CODE_ZEROCOPY_COPIED)
};

// Reaps zerocopy completions; returns how many sends they cover.
std::uint32_t reap(int fd, bool block, bool& copied) {
  std::uint32_t done = 0;
  for (;;) {
    char control[128];
    msghdr msg{};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (block) {
      pollfd p{fd, POLLERR, 0};
      (void)::poll(&p, 1, 1000);
    }
    if (::recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
      if (errno == EAGAIN || errno == EINTR) return done;
      die("recvmsg(MSG_ERRQUEUE)");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (!((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
            (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)))
        continue;
      auto* e = reinterpret_cast<sock_extended_err*>(CMSG_DATA(c));
      if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
      done += e->ee_data - e->ee_info + 1;
      if ((e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) != 0) copied = true;
    }
    block = false;
  }
}

result run(const char* host, std::size_t size, std::size_t total, bool zerocopy) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, host, &a.sin_addr);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 1) != 0) die("listen");
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread receiver([&] {
    const int c = ::accept(lfd, nullptr, nullptr);
    std::vector<char> buf(std::min<std::size_t>(size, std::size_t{64} << 20));
    std::size_t got = 0;
    while (got < total) {
      const ssize_t k = ::read(c, buf.data(), buf.size());
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    ::close(c);
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (zerocopy && ::setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0) die("SO_ZEROCOPY");
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  // Two buffers, as a pipeline of two ops would have.
  std::vector<std::vector<char>> bufs(2, std::vector<char>(size, 'x'));
  result r;
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t sent = 0;
  std::uint32_t issued = 0, completed = 0;
  for (std::size_t n = 0; sent < total; ++n) {
    auto& b = bufs[n % 2];
    // A buffer is reused only once the kernel is done with it.
    while (zerocopy && issued - completed >= 2) completed += reap(fd, true, r.copied);
    std::size_t off = 0;
    while (off < size) {
      const ssize_t k = ::send(fd, b.data() + off, size - off, zerocopy ? MSG_ZEROCOPY : 0);
      if (k < 0) {
        if (errno == ENOBUFS && zerocopy) {  // the optmem limit: wait for completions
          completed += reap(fd, true, r.copied);
          continue;
        }
        die("send");
      }
      off += static_cast<std::size_t>(k);
      if (zerocopy) ++issued;
    }
    sent += size;
  }
  while (zerocopy && completed < issued) completed += reap(fd, true, r.copied);
  ::shutdown(fd, SHUT_WR);
  receiver.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  ::close(fd);
  ::close(lfd);
  r.gbps = static_cast<double>(sent) / secs / 1e9;
  r.cpu_s_per_gb = cpu / (static_cast<double>(sent) / 1e9);
  return r;
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  std::size_t v = std::strtoull(s.c_str(), &end, 10);
  if (*end == 'K') v <<= 10;
  else if (*end == 'M') v <<= 20;
  else if (*end == 'G') v <<= 30;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  std::vector<std::size_t> sizes = {65536, 1 << 20, 64 << 20};
  std::size_t total = std::size_t{2} << 30;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tide-tcp-zerocopy: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--host") host = next();
    else if (a == "--total") total = parse_size(next());
    else if (a == "--repeats") repeats = std::atoi(next().c_str());
    else if (a == "--sizes") {
      sizes.clear();
      std::string list = next();
      for (std::size_t p = 0; p <= list.size();) {
        const std::size_t q = std::min(list.find(',', p), list.size());
        sizes.push_back(parse_size(list.substr(p, q - p)));
        p = q + 1;
      }
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: tide-tcp-zerocopy [--host IP] [--sizes 64K,1M,64M] [--total 2G] [--repeats 3]\n");
      return 0;
    } else {
      std::fprintf(stderr, "tide-tcp-zerocopy: unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (repeats < 1 || total == 0) {
    std::fprintf(stderr, "tide-tcp-zerocopy: --repeats and --total must be > 0\n");
    return 2;
  }
  std::printf("%-10s %12s %12s %8s %14s %14s %s\n", "send size", "plain GB/s", "zcopy GB/s", "zc/plain",
              "plain cpu s/GB", "zcopy cpu s/GB", "note");
  for (const std::size_t size : sizes) {
    std::vector<double> p, z, pc, zc, ratio;
    bool copied = false;
    for (int k = 0; k < repeats; ++k) {
      const result a = run(host.c_str(), size, total, false);
      const result b = run(host.c_str(), size, total, true);
      p.push_back(a.gbps);
      z.push_back(b.gbps);
      pc.push_back(a.cpu_s_per_gb);
      zc.push_back(b.cpu_s_per_gb);
      ratio.push_back(b.gbps / a.gbps);
      copied |= b.copied;
    }
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("%-10zu %12.2f %12.2f %8.2f %14.3f %14.3f %s\n", size, med(p), med(z), med(ratio), med(pc), med(zc),
                copied ? "kernel copied (loopback/veth: no zero copy)" : "");
  }
  std::printf("(%zu bytes per run, median of %d alternating runs)\n", total, repeats);
  return 0;
}
