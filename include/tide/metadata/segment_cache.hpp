#pragma once
/// segment_cache<Backend>: segment names -> small ids -> cached descriptors,
/// over a metadata backend policy (Mooncake's openSegment / getSegmentDescByID).
///
/// API in brief:
///   segment_cache<policy::etcd> cache{cfg};         // owns the backend
///   cache.publish(my_desc);                         // validate, stamp, encode, put
///   segment_id id = *cache.open("10.0.0.2:16002");  // fetch + decode once; same name -> same id
///   auto d = *cache.get(id);                        // shared_ptr<const segment_desc>, no I/O
///   auto loc = *cache.find_buffer(id, addr, len);   // a miss forces one refresh, then out_of_bounds
///   loc.buffer().rkey[device_index]
///   cache.close(id);
///
/// Descriptors are immutable once published into the cache: a refresh swaps
/// in a new shared_ptr, so a reader holding the old one never sees it change.
/// Ids start at 1 (kLocalSegmentId = 0 is left for the engine's own segment),
/// are never reused for another name, and stay bound to their name after
/// close, so reopening a name gives back its old id.
///
/// Hot path: get() and find_buffer() take a shared lock.  A worker should keep
/// the shared_ptr from get() per target and test addresses with
/// find_buffer_index() (no lock, no allocation), calling find_buffer() only
/// when that misses, as the seeds' worker does.
///
/// Thread safety: every member may be called from several threads at once;
/// backend round trips happen outside the lock.
///
/// Sealing: with config.secret set, publish() seals every buffer's addr and
/// keys (wire/seal.hpp) and fetches open them; a fetched descriptor that is
/// unsealed, fails to open, or names another segment than the one asked for
/// is errc::metadata_malformed naming the field.
///
/// Incarnation and replay: every publish writes this cache's incarnation
/// (random, drawn at construction: buffer ids are unique per incarnation).
/// With a secret it also writes a stamp (UTC microseconds, strictly
/// increasing here) and the handshake address set by
/// set_handshake_address(), all bound by the header MAC; a fetch of a name
/// refuses a descriptor whose stamp is older than the newest this cache has
/// read for that name (a store writer replaying an earlier publish), as
/// metadata_malformed naming "tide_stamp".  A publisher whose clock is set
/// back across a restart is refused by readers that saw its old stamps
/// until its clock passes them.

#include <tide/metadata/backend.hpp>
#include <tide/wire/descriptors.hpp>
#include <tide/wire/seal.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tide {

using segment_id = std::uint64_t;
/// Mooncake's LOCAL_SEGMENT_ID; segment_cache never hands it out.
inline constexpr segment_id kLocalSegmentId = 0;

/// A buffer found by address, with the descriptor it belongs to kept alive.
struct buffer_location {
  std::shared_ptr<const segment_desc> segment;
  std::size_t index = 0;
  [[nodiscard]] const buffer_desc& buffer() const noexcept { return segment->buffers[index]; }
};

template <metadata_backend Backend>
class segment_cache {
 public:
  using backend_type = Backend;

  /// Constructs the backend from `config`; no I/O.
  explicit segment_cache(const metadata_config& config)
      : backend_(config), seal_(config.secret), incarnation_(draw_incarnation()) {}
  segment_cache(const segment_cache&) = delete;
  segment_cache& operator=(const segment_cache&) = delete;

  /// The backend, for calls the cache does not wrap.
  [[nodiscard]] Backend& backend() noexcept { return backend_; }

  /// Whether descriptors are sealed and authenticated (config.secret set).
  [[nodiscard]] bool sealed() const noexcept { return seal_ != nullptr; }
  /// This publisher's incarnation, written into every publish.
  [[nodiscard]] std::uint64_t incarnation() const noexcept { return incarnation_; }
  /// Where this publisher's handshake port is ("host:port"), written into
  /// every publish with a secret: readers with the secret take it from the
  /// MACed descriptor rather than from the unauthenticated rpc_meta entry.
  /// Call before the first publish.
  void set_handshake_address(std::string host_port) {
    std::lock_guard lock(publish_mu_);
    handshake_ = std::move(host_port);
  }

  /// Validates `local`, stamps the current time, encodes it and stores it
  /// under local.name.  Errors: errc::metadata_malformed (naming the field),
  /// the backend's (metadata_unavailable, config_invalid).  Cost: one round trip.
  [[nodiscard]] status publish(const segment_desc& local) {
    auto json = publish_json(local);
    if (!json) return fail(json.error());
    return {};
  }
  /// publish(), returning the JSON it stored.  Buffers that have not changed
  /// since the last publish keep their encoded entry and, with a secret,
  /// their sealed blob (wire::seal_cache): a publish encodes and seals only
  /// new or changed buffers, and copies the rest.
  [[nodiscard]] result<std::string> publish_json(const segment_desc& local) {
    if (auto ok = validate_segment(local); !ok) return fail(ok.error());
    // Stamped in the encode, not in a copy: a copy of the descriptor would
    // cost an allocation per buffer on every publish.
    const std::string timestamp = current_timestamp();
    result<std::string> json;
    {
      std::lock_guard lock(publish_mu_);  // the entry cache is one encoder's
      publish_marks marks{timestamp, incarnation_, {}, {}};
      if (seal_) {
        const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
        last_stamp_ = std::max(static_cast<std::uint64_t>(std::max<std::int64_t>(now, 0)), last_stamp_ + 1);
        marks.stamp = last_stamp_;
        if (!handshake_.empty()) marks.handshake = handshake_;
      }
      json = encode_segment(local, seal_.get(), &entries_, marks);
    }
    if (!json) return fail(json.error());
    if (auto put = backend_.put_segment(local.name, *json); !put) return fail(put.error());
    return json;
  }
  /// Buffers encoded (with a secret: sealed) by publishes so far; each
  /// publish encodes only the buffers that are new or changed.
  [[nodiscard]] std::uint64_t encoded_buffers() {
    std::lock_guard lock(publish_mu_);
    return entries_.misses();
  }

  /// Removes the descriptor stored under `name`.  Errors: the backend's.
  [[nodiscard]] status unpublish(std::string_view name) { return backend_.remove_segment(name); }

  /// Opens a segment by name: the cached id when it is open (no I/O), else
  /// fetches and decodes its descriptor.  Each open counts; close releases one.
  /// Errors: errc::invalid_argument (empty name), errc::segment_not_found,
  /// errc::metadata_unavailable, errc::metadata_malformed, errc::config_invalid.
  [[nodiscard]] result<segment_id> open(std::string_view name) {
    if (name.empty()) return fail(errc::invalid_argument, "segment name is empty");
    {
      std::unique_lock lock{mu_};
      if (auto it = ids_.find(name); it != ids_.end()) {
        if (auto e = open_.find(it->second); e != open_.end()) {
          ++e->second.refs;
          return it->second;
        }
      }
    }
    auto desc = fetch(name);
    if (!desc) return fail(desc.error());
    std::unique_lock lock{mu_};
    auto [it, fresh_name] = ids_.try_emplace(std::string(name), next_id_);
    if (fresh_name) ++next_id_;
    const segment_id id = it->second;
    auto [e, fresh_entry] = open_.try_emplace(id, entry{it->first, std::move(*desc), 0});
    // Another thread may have opened it meanwhile; its descriptor is as good.
    (void)fresh_entry;
    ++e->second.refs;
    return id;
  }

  /// Releases one open(); the descriptor is dropped with the last.
  /// Errors: errc::unknown_segment when `id` is not open.
  [[nodiscard]] status close(segment_id id) {
    std::unique_lock lock{mu_};
    auto e = open_.find(id);
    if (e == open_.end()) return fail(errc::unknown_segment, "segment id " + std::to_string(id) + " is not open");
    if (--e->second.refs == 0) open_.erase(e);
    return {};
  }

  /// The cached descriptor; no I/O.  Errors: errc::unknown_segment.
  [[nodiscard]] result<std::shared_ptr<const segment_desc>> get(segment_id id) const {
    std::shared_lock lock{mu_};
    auto e = open_.find(id);
    if (e == open_.end()) return fail(errc::unknown_segment, "segment id " + std::to_string(id) + " is not open");
    return e->second.desc;
  }

  /// The name `id` was opened with.  Errors: errc::unknown_segment.
  [[nodiscard]] result<std::string> name_of(segment_id id) const {
    std::shared_lock lock{mu_};
    auto e = open_.find(id);
    if (e == open_.end()) return fail(errc::unknown_segment, "segment id " + std::to_string(id) + " is not open");
    return e->second.name;
  }

  /// Re-fetches the descriptor and swaps it in.  On failure the cached one
  /// stays.  Errors: errc::unknown_segment and open()'s.  Cost: one round trip.
  [[nodiscard]] result<std::shared_ptr<const segment_desc>> refresh(segment_id id) {
    auto name = name_of(id);
    if (!name) return fail(name.error());
    auto desc = fetch(*name);
    if (!desc) return fail(desc.error());
    std::unique_lock lock{mu_};
    auto e = open_.find(id);
    if (e == open_.end()) return fail(errc::unknown_segment, "segment id " + std::to_string(id) + " was closed");
    // Two refreshes racing: the newer publish stays (stamps exist with a secret).
    if (e->second.desc->stamp && (*desc)->stamp && *e->second.desc->stamp > *(*desc)->stamp) return e->second.desc;
    e->second.desc = *desc;
    return std::move(*desc);
  }

  /// The descriptor of `name`: the open one (no I/O) unless `fresh` or it
  /// is not open, else fetched from the store (with a secret: sealed, MACed
  /// and stamp-checked as open() does) without changing what is open.
  /// Errors: open()'s.
  [[nodiscard]] result<std::shared_ptr<const segment_desc>> descriptor_of(std::string_view name, bool fresh) {
    if (!fresh)
      if (auto d = cached(name)) return d;
    return fetch(name);
  }

  /// The buffer of segment `id` that holds all of [addr, addr + length).  A
  /// miss in the cached descriptor forces one refresh (the peer may have
  /// registered memory since), then fails.  Errors: errc::zero_length,
  /// errc::unknown_segment, errc::out_of_bounds, and refresh()'s.
  [[nodiscard]] result<buffer_location> find_buffer(segment_id id, std::uint64_t addr, std::uint64_t length) {
    if (length == 0) return fail(errc::zero_length, "find_buffer with length 0");
    auto desc = get(id);
    if (!desc) return fail(desc.error());
    if (auto i = find_buffer_index(**desc, addr, length)) return buffer_location{std::move(*desc), *i};
    auto fresh = refresh(id);
    if (!fresh) return fail(fresh.error());
    if (auto i = find_buffer_index(**fresh, addr, length)) return buffer_location{std::move(*fresh), *i};
    return fail(errc::out_of_bounds, "[" + std::to_string(addr) + ", +" + std::to_string(length) +
                                         ") is outside every buffer of segment " + (*fresh)->name +
                                         " (after a refresh)");
  }

  /// The descriptor of `name` if it is open now; no I/O ever (the lookup a
  /// request from the network may trigger: it must not make this process
  /// dial a host that request named).  Errors: errc::segment_not_found.
  [[nodiscard]] result<std::shared_ptr<const segment_desc>> cached(std::string_view name) const {
    std::shared_lock lock{mu_};
    if (auto it = ids_.find(name); it != ids_.end())
      if (auto e = open_.find(it->second); e != open_.end()) return e->second.desc;
    return fail(errc::segment_not_found, "segment " + std::string(name) + " is not open here");
  }

  /// Segments open now.
  [[nodiscard]] std::size_t open_count() const {
    std::shared_lock lock{mu_};
    return open_.size();
  }

 private:
  struct entry {
    std::string name;
    std::shared_ptr<const segment_desc> desc;
    std::size_t refs = 0;
  };

  result<std::shared_ptr<const segment_desc>> fetch(std::string_view name) {
    auto json = backend_.get_segment(name);
    if (!json) return fail(json.error());
    auto desc = decode_segment(*json, seal_.get());
    if (!desc) return fail(desc.error().code, "segment " + std::string(name) + ": " + desc.error().detail);
    // Sealed blobs are bound to the descriptor's own name; this binds that
    // name to the one asked for (a copy of B's descriptor stored under A's key).
    if (seal_ && desc->name != name)
      return fail(errc::metadata_malformed, "segment " + std::string(name) + ": name: the descriptor is \"" +
                                                desc->name + "\"'s");
    if (seal_)
      if (auto ok = accept_stamp(name, *desc); !ok) return fail(ok.error());
    return std::make_shared<const segment_desc>(std::move(*desc));
  }

  // With a secret: a descriptor older than the newest read for `name` is a
  // replay of an earlier publish (its MACs verify: the publisher wrote it).
  // One without a stamp after one with is refused too (a downgrade).
  status accept_stamp(std::string_view name, const segment_desc& d) {
    std::lock_guard lock(stamps_mu_);
    auto it = stamps_.find(name);
    const std::uint64_t seen = it != stamps_.end() ? it->second : 0;
    if (d.stamp ? *d.stamp < seen : seen != 0)
      return fail(errc::metadata_malformed,
                  "segment " + std::string(name) + ": tide_stamp: " + (d.stamp ? std::to_string(*d.stamp) : "missing") +
                      ", older than the descriptor already read (" + std::to_string(seen) +
                      "): a replay of an earlier publish, refused");
    if (d.stamp && *d.stamp > seen) {
      if (it != stamps_.end()) {
        it->second = *d.stamp;
      } else {
        stamps_.emplace(std::string(name), *d.stamp);
      }
    }
    return {};
  }

  static std::uint64_t draw_incarnation() {
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
  }

  mutable std::shared_mutex mu_;
  Backend backend_;
  std::shared_ptr<const wire::cluster_secret> seal_;
  const std::uint64_t incarnation_;
  std::mutex publish_mu_;
  wire::seal_cache entries_;  ///< under publish_mu_
  std::string handshake_;     ///< under publish_mu_
  std::uint64_t last_stamp_ = 0;  ///< under publish_mu_
  std::mutex stamps_mu_;
  /// Newest stamp read per name (with a secret), kept after close: a replay
  /// must not pass once the segment is reopened.  One entry per name read.
  std::map<std::string, std::uint64_t, std::less<>> stamps_;
  std::map<std::string, segment_id, std::less<>> ids_;  // every name ever opened
  std::unordered_map<segment_id, entry> open_;
  segment_id next_id_ = 1;
};

}  // namespace tide
