// tide-notify-latency: what a transfer-bound notification costs (issue 18).
// One process, two engines (initiator on the second device, target on the
// first), one WRITE request per batch, three rows per size, alternated
// iteration by iteration so they share the machine's noise:
//   completion    submit -> the initiator's wait() returns
//   notification  submit(…, notification) -> the target's take_notifies() has it
//                 (tide peers: a SEND on QP 0 after the data, notify_rdma_credits)
//   notif. (tcp)  the same from a second initiator with notify_rdma_credits = 0:
//                 Mooncake's notify message on the handshake port after completion
//   tcp notify    send_notify() alone -> the target's take_notifies() has it
//   +after done   for the two notification rows: the target has it minus the
//                 task's completion stamp (task_telemetry), i.e. what the
//                 message adds after the data; the rows above also carry the
//                 target's polling loop slowing a 2-vCPU VM's completions
// The target reads with take_notifies(100ms), which sleeps until one arrives,
// on a thread of its own that loops on it as a serving process's reader
// does (--reader thread, the default; "has it" is that thread's stamp), or
// on the initiator's thread right after its submit (--reader caller: the
// reader starts waiting as the message leaves, as this bench did before
// 2026-12-06).
// Prints median, p90 and p99 in microseconds; measures, never asserts.
//
// --wait-on-lane off turns the target's notify_wait_on_lane off.
//
// Usage: tide-notify-latency [--iters N] [--sizes 4096,1048576] [--reader thread|caller]
//                            [--wait-on-lane on|off] [DEV_TARGET DEV_INITIATOR]
// (devices default to $RXE_VM_DEVICES, e.g. "rxe0 rxe1").  Needs RDMA devices.

#include <tide/engine.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

double us(clock_type::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct row {
  std::vector<double> v;
  double at(double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
  }
};

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "tide-notify-latency: %s\n", why.c_str());
  std::exit(1);
}

std::vector<std::size_t> parse_sizes(const std::string& s) {
  std::vector<std::size_t> out;
  std::istringstream in(s);
  for (std::string w; std::getline(in, w, ',');) out.push_back(std::stoull(w));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t iters = 300;
  std::vector<std::size_t> sizes{4096, 1u << 20};
  bool reader_thread = true;
  bool wait_on_lane = true;  // the target's engine_config::notify_wait_on_lane
  std::vector<std::string> devs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::stoull(argv[++i]);
    else if (a == "--sizes" && i + 1 < argc) sizes = parse_sizes(argv[++i]);
    else if (a == "--reader" && i + 1 < argc) reader_thread = std::string(argv[++i]) != "caller";
    else if (a == "--wait-on-lane" && i + 1 < argc) wait_on_lane = std::string(argv[++i]) != "off";
    else if (a == "-h" || a == "--help") {
      std::printf("usage: tide-notify-latency [--iters N] [--sizes 4096,1048576] [--reader thread|caller] "
                  "[--wait-on-lane on|off] [DEV_TARGET DEV_INITIATOR]\n");
      return 0;
    } else devs.push_back(a);
  }
  if (devs.empty())
    if (const char* e = std::getenv("RXE_VM_DEVICES")) {
      std::istringstream in(e);
      for (std::string d; in >> d;) devs.push_back(d);
    }
  if (devs.empty()) {
    std::printf("no devices given and no RXE_VM_DEVICES: skipped\n");
    return 77;
  }
  if (devs.size() == 1) devs.push_back(devs[0]);
  if (iters == 0 || sizes.empty()) die("--iters and --sizes must be non-empty");

  auto make = [&](const std::string& dev, std::uint32_t rdma_credits = 8) {
    tide::engine_config c;
    c.notify_wait_on_lane = wait_on_lane;
    c.local_server_name = "127.0.0.1";
    c.devices = {dev};
    c.notify_rdma_credits = rdma_credits;
    auto e = tide::transfer_engine<>::create(c);
    if (!e) die("create on " + dev + ": " + e.error().message());
    return std::move(*e);
  };
  auto target = make(devs[0]);
  auto init = make(devs[1]);
  auto init_tcp = make(devs[1], 0);
  const std::size_t cap = *std::max_element(sizes.begin(), sizes.end());
  std::vector<unsigned char> src(cap, 0x5a), dst(cap, 0);
  if (auto r = init->register_memory(src.data(), cap, "cpu:0"); !r) die(r.error().message());
  if (auto r = init_tcp->register_memory(src.data(), cap, "cpu:0"); !r) die(r.error().message());
  if (auto r = target->register_memory(dst.data(), cap, "cpu:0"); !r) die(r.error().message());
  auto seg = init->open_segment(target->segment_name());
  if (!seg) die(seg.error().message());
  auto seg_tcp = init_tcp->open_segment(target->segment_name());
  if (!seg_tcp) die(seg_tcp.error().message());
  const auto dst_id = target->buffer_id(dst.data()).value();

  // The reader thread's hand-over: the stamp of the last take_notifies
  // that returned a message.
  std::mutex arrived_mu;
  std::condition_variable arrived_cv;
  std::optional<clock_type::time_point> arrived;
  std::atomic<bool> quit{false};
  std::thread reader;
  if (reader_thread)
    reader = std::thread([&] {
      while (!quit.load(std::memory_order_relaxed)) {
        if (target->take_notifies(100ms).empty()) continue;
        const auto t = clock_type::now();
        std::lock_guard lock(arrived_mu);
        arrived = t;
        arrived_cv.notify_one();
      }
    });
  // When the target had the notification.
  auto await_notification = [&]() -> clock_type::time_point {
    const auto until = clock_type::now() + 30s;
    if (reader_thread) {
      std::unique_lock lock(arrived_mu);
      if (!arrived_cv.wait_until(lock, until, [&] { return arrived.has_value(); }))
        die("a notification did not arrive in 30 s");
      const auto t = *arrived;
      arrived.reset();
      return t;
    }
    for (;;) {
      // A blocking read: a yield loop would take a vCPU from rxe's threads in a small VM.
      if (!target->take_notifies(100ms).empty()) return clock_type::now();
      if (clock_type::now() > until) die("a notification did not arrive in 30 s");
    }
  };

  std::printf("devices: target %s, initiator %s; %zu iterations per row, one WRITE per batch, alternated; "
              "the target reads on %s, notify_wait_on_lane %s\n",
              devs[0].c_str(), devs[1].c_str(), iters, reader_thread ? "a thread of its own" : "the initiator's thread",
              wait_on_lane ? "on" : "off");
  std::printf("%-9s %-13s %10s %10s %10s\n", "size", "row", "p50 us", "p90 us", "p99 us");
  for (const std::size_t size : sizes) {
    row plain, notified, notified_tcp, tcp, after, after_tcp;
    const auto r = tide::transfer_request::in_buffer(tide::transfer_op::write, src.data(), *seg, dst_id, 0, size);
    const auto r_tcp = tide::transfer_request::in_buffer(tide::transfer_op::write, src.data(), *seg_tcp, dst_id, 0, size);
    for (std::size_t i = 0; i < iters + 10; ++i) {  // the first 10 warm up (connect, caches)
      const bool keep = i >= 10;
      {
        auto b = init->allocate_batch(1).value();
        const auto t0 = clock_type::now();
        if (auto s = init->submit(b, {&r, 1}); !s) die(s.error().message());
        if (auto w = init->wait(b, 30s); !w) die(w.error().message());
        if (keep) plain.v.push_back(us(clock_type::now() - t0));
        (void)init->free_batch(b);
      }
      {
        auto b = init->allocate_batch(1).value();
        const auto t0 = clock_type::now();
        if (auto s = init->submit(b, {&r, 1}, tide::notification{"", "n"}); !s) die(s.error().message());
        const auto t1 = await_notification();
        if (keep) notified.v.push_back(us(t1 - t0));
        if (auto w = init->wait(b, 30s); !w) die(w.error().message());
        if (keep) after.v.push_back(us(t1 - init->task_telemetry(b, 0).value().completion));
        (void)init->free_batch(b);
      }
      {
        auto b = init_tcp->allocate_batch(1).value();
        const auto t0 = clock_type::now();
        if (auto s = init_tcp->submit(b, {&r_tcp, 1}, tide::notification{"", "n"}); !s) die(s.error().message());
        const auto t1 = await_notification();
        if (keep) notified_tcp.v.push_back(us(t1 - t0));
        if (auto w = init_tcp->wait(b, 30s); !w) die(w.error().message());
        if (keep) after_tcp.v.push_back(us(t1 - init_tcp->task_telemetry(b, 0).value().completion));
        (void)init_tcp->free_batch(b);
      }
      {
        const auto t0 = clock_type::now();
        if (auto s = init->send_notify(*seg, "t"); !s) die(s.error().message());
        const auto t1 = await_notification();
        if (keep) tcp.v.push_back(us(t1 - t0));
      }
    }
    const std::string label = size >= (1u << 20) ? std::to_string(size >> 20) + " MiB" : std::to_string(size >> 10) + " KiB";
    for (auto [name, rw] : {std::pair{"completion", &plain}, std::pair{"notification", &notified},
                             std::pair{"notif. (tcp)", &notified_tcp}, std::pair{"tcp notify", &tcp},
                             std::pair{"+after done", &after}, std::pair{"+after (tcp)", &after_tcp}})
      std::printf("%-9s %-13s %10.1f %10.1f %10.1f\n", label.c_str(), name, rw->at(0.5), rw->at(0.9), rw->at(0.99));
  }
  quit.store(true, std::memory_order_relaxed);
  if (reader.joinable()) reader.join();
  for (auto* e : {init.get(), init_tcp.get()}) {
    const auto out = e->outbox_stats();
    std::printf("outbox (%s): %llu sent (%llu rdma, of them %llu with the data; %llu tcp), %llu dropped, %llu refused, "
                "%llu errors\n",
                e == init.get() ? "notification" : "notif. (tcp)", static_cast<unsigned long long>(out.sent),
                static_cast<unsigned long long>(out.sent_rdma), static_cast<unsigned long long>(out.sent_with_data),
                static_cast<unsigned long long>(out.sent_tcp),
                static_cast<unsigned long long>(out.dropped_failed), static_cast<unsigned long long>(out.refused),
                static_cast<unsigned long long>(out.send_errors));
  }
  return 0;
}
