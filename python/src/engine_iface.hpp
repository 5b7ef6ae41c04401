#pragma once
// tide::py::engine_iface — one engine whatever its policy set, so the
// binding is written once (engine.cpp) and each policy set costs only its
// instantiation (policy_sets_*.cpp).  Not API: the Python module's own.

#include <tide/engine.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tide::py {

/// An address as Python passes it (an int) in the pointer type the engine takes.
inline void* as_pointer(std::uintptr_t addr) noexcept {
  return reinterpret_cast<void*>(addr);  // NOLINT(performance-no-int-to-ptr)
}

/// The calls the binding makes, forwarded to transfer_engine<P>.  Every
/// member may be called from any thread (the engine's own rule) and none
/// touches Python: the binding calls them with the GIL released.
class engine_iface {
 public:
  virtual ~engine_iface() = default;
  [[nodiscard]] virtual const std::string& segment_name() const noexcept = 0;
  [[nodiscard]] virtual std::uint16_t handshake_port() const noexcept = 0;
  [[nodiscard]] virtual status register_memory(void* addr, std::size_t len, std::string_view location,
                                               buffer_access access) = 0;
  [[nodiscard]] virtual status unregister_memory(void* addr, in_flight mode) = 0;
  [[nodiscard]] virtual result<std::uint32_t> buffer_id(const void* addr) const = 0;
  [[nodiscard]] virtual status register_memory_batch(std::span<const buffer_entry> buffers,
                                                     std::string_view location) = 0;
  [[nodiscard]] virtual status unregister_memory_batch(std::span<void* const> addrs) = 0;
  [[nodiscard]] virtual status flush_metadata() = 0;
  [[nodiscard]] virtual result<segment_id> open_segment(std::string_view name) = 0;
  [[nodiscard]] virtual status close_segment(segment_id id, in_flight mode) = 0;
  [[nodiscard]] virtual result<std::shared_ptr<const segment_desc>> segment_descriptor(segment_id id) const = 0;
  [[nodiscard]] virtual result<batch_id> allocate_batch(std::size_t capacity) noexcept = 0;
  [[nodiscard]] virtual status free_batch(batch_id b) noexcept = 0;
  [[nodiscard]] virtual status submit(batch_id b, std::span<const transfer_request> requests) noexcept = 0;
  [[nodiscard]] virtual status submit(batch_id b, std::span<const transfer_request> requests,
                                      const notification& n) noexcept = 0;
  [[nodiscard]] virtual result<transfer_status> status_of(batch_id b, std::size_t task) noexcept = 0;
  [[nodiscard]] virtual result<transfer_status> batch_status(batch_id b) noexcept = 0;
  [[nodiscard]] virtual status wait(batch_id b, std::chrono::milliseconds timeout) noexcept = 0;
  [[nodiscard]] virtual status cancel(batch_id b) noexcept = 0;
  [[nodiscard]] virtual status watch_batch(batch_id b, batch_listener* listener) noexcept = 0;
  [[nodiscard]] virtual status send_notify(segment_id target, std::string_view msg, std::string_view sender) = 0;
  [[nodiscard]] virtual std::vector<notify_desc> take_notifies(std::chrono::milliseconds wait) = 0;
  [[nodiscard]] virtual status probe(std::string_view segment, std::chrono::milliseconds timeout) = 0;
  [[nodiscard]] virtual engine_stats stats() const = 0;
  [[nodiscard]] virtual notify_stats notification_stats() const = 0;
  [[nodiscard]] virtual notify_outbox_stats outbox_stats() const noexcept = 0;
  [[nodiscard]] virtual result<transfer_telemetry> task_telemetry(batch_id b, std::size_t task) noexcept = 0;
  [[nodiscard]] virtual result<transfer_telemetry> batch_telemetry(batch_id b) noexcept = 0;
  [[nodiscard]] virtual std::string metrics_text() const = 0;
  [[nodiscard]] virtual net::handshake_server_stats handshake_stats() const noexcept = 0;
  [[nodiscard]] virtual std::uint16_t tcp_port() const noexcept = 0;
  [[nodiscard]] virtual tcp::stats tcp_stats() const noexcept = 0;
  /// The name of local device `index` (transfer_status::failed_local_device).
  [[nodiscard]] virtual std::string device_name(std::uint16_t index) const = 0;
};

template <class P>
class engine_model final : public engine_iface {
 public:
  explicit engine_model(std::unique_ptr<transfer_engine<P>> e) : e_(std::move(e)) {}

  const std::string& segment_name() const noexcept override { return e_->segment_name(); }
  std::uint16_t handshake_port() const noexcept override { return e_->handshake_port(); }
  status register_memory(void* addr, std::size_t len, std::string_view location, buffer_access access) override {
    return e_->register_memory(addr, len, location, access);
  }
  status unregister_memory(void* addr, in_flight mode) override { return e_->unregister_memory(addr, mode); }
  result<std::uint32_t> buffer_id(const void* addr) const override { return e_->buffer_id(addr); }
  status register_memory_batch(std::span<const buffer_entry> buffers, std::string_view location) override {
    return e_->register_memory_batch(buffers, location);
  }
  status unregister_memory_batch(std::span<void* const> addrs) override { return e_->unregister_memory_batch(addrs); }
  status flush_metadata() override { return e_->flush_metadata(); }
  result<segment_id> open_segment(std::string_view name) override { return e_->open_segment(name); }
  status close_segment(segment_id id, in_flight mode) override { return e_->close_segment(id, mode); }
  result<std::shared_ptr<const segment_desc>> segment_descriptor(segment_id id) const override {
    return e_->segment_descriptor(id);
  }
  result<batch_id> allocate_batch(std::size_t capacity) noexcept override { return e_->allocate_batch(capacity); }
  status free_batch(batch_id b) noexcept override { return e_->free_batch(b); }
  status submit(batch_id b, std::span<const transfer_request> requests) noexcept override {
    return e_->submit(b, requests);
  }
  status submit(batch_id b, std::span<const transfer_request> requests, const notification& n) noexcept override {
    return e_->submit(b, requests, n);
  }
  result<transfer_status> status_of(batch_id b, std::size_t task) noexcept override { return e_->status_of(b, task); }
  result<transfer_status> batch_status(batch_id b) noexcept override { return e_->batch_status(b); }
  status wait(batch_id b, std::chrono::milliseconds timeout) noexcept override { return e_->wait(b, timeout); }
  status cancel(batch_id b) noexcept override { return e_->cancel(b); }
  status watch_batch(batch_id b, batch_listener* listener) noexcept override { return e_->watch_batch(b, listener); }
  status send_notify(segment_id target, std::string_view msg, std::string_view sender) override {
    return e_->send_notify(target, msg, sender);
  }
  std::vector<notify_desc> take_notifies(std::chrono::milliseconds wait) override { return e_->take_notifies(wait); }
  status probe(std::string_view segment, std::chrono::milliseconds timeout) override {
    return e_->probe(segment, timeout);
  }
  engine_stats stats() const override { return e_->stats(); }
  notify_stats notification_stats() const override { return e_->notification_stats(); }
  notify_outbox_stats outbox_stats() const noexcept override { return e_->outbox_stats(); }
  result<transfer_telemetry> task_telemetry(batch_id b, std::size_t task) noexcept override {
    return e_->task_telemetry(b, task);
  }
  result<transfer_telemetry> batch_telemetry(batch_id b) noexcept override { return e_->batch_telemetry(b); }
  std::string metrics_text() const override { return e_->metrics_text(); }
  net::handshake_server_stats handshake_stats() const noexcept override { return e_->handshake_stats(); }
  std::uint16_t tcp_port() const noexcept override { return e_->tcp_port(); }
  tcp::stats tcp_stats() const noexcept override { return e_->tcp_stats(); }
  std::string device_name(std::uint16_t index) const override {
    auto& t = e_->transport();
    return index < t.context_count() ? t.context(index).name() : std::string();
  }

 private:
  std::unique_ptr<transfer_engine<P>> e_;
};

/// Which metadata backend an engine is built with (a policy, so a type).
enum class metadata_kind { p2p, etcd, http };

/// The backend engine_config::metadata names: etcd:// and etcds:// etcd,
/// http:// and https:// http, anything else (P2PHANDSHAKE, "") p2p.
[[nodiscard]] inline metadata_kind metadata_kind_of(std::string_view metadata) noexcept {
  if (metadata.starts_with("etcd://") || metadata.starts_with("etcds://")) return metadata_kind::etcd;
  if (metadata.starts_with("http://") || metadata.starts_with("https://")) return metadata_kind::http;
  return metadata_kind::p2p;
}

using engine_factory = result<std::unique_ptr<engine_iface>> (*)(engine_config);

template <class P>
result<std::unique_ptr<engine_iface>> make_engine(engine_config cfg) {
  auto e = transfer_engine<P>::create(std::move(cfg));
  if (!e) return fail(e.error());
  return std::unique_ptr<engine_iface>(new engine_model<P>(std::move(*e)));
}

/// A policy set the module is built with, by the name Python selects it with
/// (tide-bench's --policy names).
struct policy_set {
  std::string name;
  std::string description;  ///< "eviction / shard hash / idle / path"
  engine_factory p2p = nullptr;
  engine_factory etcd = nullptr;  ///< nullptr: this set is built with p2p metadata only
  engine_factory http = nullptr;
  /// The factory for backend k (nullptr: not built with it).
  [[nodiscard]] engine_factory factory(metadata_kind k) const noexcept {
    return k == metadata_kind::etcd ? etcd : k == metadata_kind::http ? http : p2p;
  }
};

template <class P>
std::string describe() {
  return std::string(P::eviction::kName) + " / " + std::string(P::shard_hash::kName) + " / " +
         std::string(P::idle::kName) + " / " + std::string(P::path::kName);
}

template <class P>
policy_set p2p_only(const char* name) {
  return {name, describe<P>(), &make_engine<P>, nullptr, nullptr};
}

/// Every compiled set, "default" first (policy_sets_*.cpp).
[[nodiscard]] const std::vector<policy_set>& policy_sets();
void add_default_sets(std::vector<policy_set>& out);
void add_idle_sets(std::vector<policy_set>& out);
void add_other_sets(std::vector<policy_set>& out);

}  // namespace tide::py
