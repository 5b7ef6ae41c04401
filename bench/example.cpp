// The README's example: register -> open_segment -> submit -> wait.
// Two engines in one process (one per NIC), 1 MiB written and read back.
//   tide-example [local-nic [peer-nic]]     (default: the first device twice)
#include <tide/engine.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  tide::engine_config cfg;                      // p2p metadata: no server to run
  cfg.local_server_name = "127.0.0.1";
  if (argc > 1) cfg.devices = {argv[1]};
  auto target = tide::transfer_engine<>::create(cfg);
  if (argc > 2) cfg.devices = {argv[2]};
  auto initiator = tide::transfer_engine<>::create(cfg);
  if (!target || !initiator) {
    std::fprintf(stderr, "init: %s\n", (!target ? target.error() : initiator.error()).message().c_str());
    return 1;
  }
  constexpr std::size_t kLen = 1 << 20;
  std::vector<char> src(kLen, 'x'), dst(kLen, 0);

  // 1. register memory on both sides (published as buffer descriptors)
  if (!(*target)->register_memory(dst.data(), kLen, "cpu:0") ||
      !(*initiator)->register_memory(src.data(), kLen, "cpu:0"))
    return 1;
  // 2. open the peer's segment by name ("host:port" in p2p mode)
  auto seg = (*initiator)->open_segment((*target)->segment_name());
  if (!seg) return std::fprintf(stderr, "open_segment: %s\n", seg.error().message().c_str()), 1;
  // 3. submit a WRITE into buffer 0 of the segment, at offset 0 (bounds-checked)
  auto batch = (*initiator)->allocate_batch(1).value();
  auto req = tide::transfer_request::in_buffer(tide::transfer_op::write, src.data(), *seg, 0, 0, kLen);
  if (auto s = (*initiator)->submit(batch, {&req, 1}); !s)
    return std::fprintf(stderr, "submit: %s\n", s.error().message().c_str()), 1;
  // 4. wait (polls up to wait_spin, then sleeps), read the status, free the batch
  auto w = (*initiator)->wait(batch, 10s);
  auto st = (*initiator)->status_of(batch, 0).value();
  (void)(*initiator)->free_batch(batch);
  std::printf("%s: %s, %llu bytes, data %s\n", w ? "done" : w.error().message().c_str(),
              std::string(tide::to_string(st.state)).c_str(), static_cast<unsigned long long>(st.transferred_bytes),
              std::memcmp(src.data(), dst.data(), kLen) == 0 ? "verified" : "DIFFERS");
  return st.state == tide::transfer_state::completed ? 0 : 1;
}
