#pragma once
/// tide::policy::in_process — a metadata backend that keeps descriptors in a
/// process-wide map.  For tests and single-process setups: every engine in
/// the process sees what any other put.  Keys follow Mooncake's scheme
/// (segment_key(cluster_id, name)), so cluster_id separates namespaces.
/// The connection string is ignored.  Thread-safe; no I/O.

#include <tide/metadata/backend.hpp>

#include <string>
#include <string_view>

namespace tide::policy {

class in_process {
 public:
  static constexpr std::string_view kName = "in_process";

  explicit in_process(const metadata_config& config);

  /// Errors: errc::segment_not_found.
  [[nodiscard]] result<std::string> get_segment(std::string_view name);
  [[nodiscard]] status put_segment(std::string_view name, std::string_view json);
  /// Errors: errc::segment_not_found when nothing was stored.
  [[nodiscard]] status remove_segment(std::string_view name);

 private:
  std::string cluster_id_;
};

static_assert(metadata_backend<in_process>);

}  // namespace tide::policy
