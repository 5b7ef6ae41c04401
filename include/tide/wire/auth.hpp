#pragma once
/// The cluster secret and the authenticated handshake exchange, inside
/// Mooncake's framing (frame.hpp).  Crypto is OpenSSL libcrypto's; nothing
/// here is hand-written crypto.
///
/// Off by default: with no secret configured tide speaks Mooncake's wire
/// unchanged.  With one, every exchange on the handshake port (connect,
/// ready ack, metadata, notify, probe) runs on one TCP connection as:
///
///   client -> server  probe frame   {"tide_auth":"hello","v":1}
///   server -> client  probe frame   {"tide_auth":"challenge","v":1,"nonce":Ns}
///   client -> server  frame type T  {"tide_auth":"request","v":1,"nonce":Nc,"id":ID,"mac":M1,"body":B}
///   server -> client  frame type T  {"tide_auth":"reply","v":1,"mac":M2,"body":R}
///
///   Ns, Nc  16 fresh random bytes each (RAND_bytes), 32 hex digits;
///   ID      the client's identity (its segment name), bound by M1;
///   B, R    the request and reply bodies Mooncake would send, as JSON strings;
///   M1 = HMAC-SHA256(K_mac, "tide-auth-v1/request" | T | Ns | Nc | ID | B)
///   M2 = HMAC-SHA256(K_mac, "tide-auth-v1/reply"   | T | Ns | Nc | ID | R)
///   (each variable part preceded by its length as 8 little-endian bytes).
///
/// Why this shape: the server's nonce makes a captured request useless on a
/// new connection (replay), the client's nonce does the same for a captured
/// reply, the labels keep a request from being reflected as a reply, and the
/// MACs cover the type and whole bodies (an altered byte fails).  MACs are
/// compared with CRYPTO_memcmp.  Either side that fails a check gets
/// errc::auth_failed; the server answers the client with
/// {"tide_auth":"failed"} (a request whose MAC did not verify) or
/// {"tide_auth":"required"} (a request without the hello) in a frame of
/// the request's type, and serves nothing else.  These two markers are not
/// authenticated: an attacker on the path can always deny service, never
/// obtain it.  A server without a secret answers the hello as an ordinary
/// probe ({"status":"success"}), which a client with one reports as
/// auth_failed instead of waiting.
///
/// Keys: K_mac = HMAC-SHA256(secret, "tide-auth-v1/mac"),
///       K_seal = HMAC-SHA256(secret, "tide-auth-v1/seal") (seal.hpp),
///       K_desc = HMAC-SHA256(secret, "tide-auth-v1/descriptor") (the
///       descriptor MACs of seal.hpp; a key of its own, not the AES key).
/// The secret is a file of at least 32 random bytes (e.g.
/// `head -c 32 /dev/urandom > s && chmod 600 s`), used byte for byte;
/// a file readable by group or others is refused.  Only the derived keys
/// are kept in memory (the file's bytes are wiped after derivation); no key
/// or secret byte ever reaches a log line or an error detail.
///
/// Thread safety: cluster_secret is immutable after load (share it through
/// shared_ptr<const>); the free functions keep no state.

#include <tide/result.hpp>
#include <tide/wire/frame.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tide::wire {

inline constexpr std::size_t kMinSecretBytes = 32;
/// Larger files are refused: a secret is a key, not a document.
inline constexpr std::size_t kMaxSecretBytes = 4096;
inline constexpr std::size_t kAuthNonceBytes = 16;
inline constexpr std::size_t kMacBytes = 32;

/// The largest frame (type byte + body) a server with a secret reads after
/// its challenge, before anything is proven; a longer one is dropped at its
/// length field, unread.  Real requests are far smaller: a connect with 255
/// QPs is about 6 KiB, and a notify of notification::kMaxBytes (4 KiB of
/// name and message) stays under 30 KiB even when every byte is a control
/// character, escaped once in the notify and again in the request.  A client
/// refuses to send a larger one (errc::invalid_argument).
inline constexpr std::size_t kMaxAuthRequestFrame = std::size_t{64} << 10;

using auth_nonce = std::array<std::uint8_t, kAuthNonceBytes>;
using key256 = std::array<std::uint8_t, 32>;

/// The keys derived from the cluster secret.
class cluster_secret {
 public:
  /// Reads the secret file.  Errors: errc::config_invalid naming the file and
  /// why (missing, not a regular file, mode readable by group/others -- the
  /// detail shows the mode in octal --, fewer than 32 or more than 4096 bytes).
  [[nodiscard]] static result<std::shared_ptr<const cluster_secret>> load(const std::string& path);
  /// From bytes in memory (tests, embedders).  Errors: config_invalid (size).
  [[nodiscard]] static result<std::shared_ptr<const cluster_secret>> from_bytes(std::string_view secret);

  cluster_secret(const cluster_secret&) = delete;
  cluster_secret& operator=(const cluster_secret&) = delete;
  ~cluster_secret();  ///< wipes the keys (OPENSSL_cleanse)

  [[nodiscard]] const key256& mac_key() const noexcept { return mac_key_; }
  [[nodiscard]] const key256& seal_key() const noexcept { return seal_key_; }
  [[nodiscard]] const key256& descriptor_key() const noexcept { return desc_key_; }

 private:
  cluster_secret() = default;
  key256 mac_key_{};
  key256 seal_key_{};
  key256 desc_key_{};
};

/// 16 bytes from RAND_bytes.  Errors: errc::auth_failed when the RNG fails.
[[nodiscard]] result<auth_nonce> fresh_nonce();

/// Which side computes a MAC (the label above).
enum class auth_direction : std::uint8_t { request, reply };

/// M1 / M2 above, 32 raw bytes.
[[nodiscard]] std::array<std::uint8_t, kMacBytes> auth_mac(const cluster_secret& s, auth_direction dir,
                                                          message_type type, const auth_nonce& server_nonce,
                                                          const auth_nonce& client_nonce, std::string_view identity,
                                                          std::string_view body);

/// What one authenticated message carries.
struct auth_message {
  std::string kind;     ///< "hello", "challenge", "request", "reply", "failed", "required"
  auth_nonce nonce{};   ///< challenge: Ns; request: Nc
  std::string identity; ///< request only
  std::array<std::uint8_t, kMacBytes> mac{};  ///< request, reply
  std::string body;     ///< request, reply
};

/// The encoders write compact JSON ending in '\n'.
[[nodiscard]] std::string encode_auth_hello();
[[nodiscard]] std::string encode_auth_challenge(const auth_nonce& server_nonce);
[[nodiscard]] std::string encode_auth_request(const cluster_secret& s, message_type type,
                                              const auth_nonce& server_nonce, const auth_nonce& client_nonce,
                                              std::string_view identity, std::string_view body);
[[nodiscard]] std::string encode_auth_reply(const cluster_secret& s, message_type type,
                                            const auth_nonce& server_nonce, const auth_nonce& client_nonce,
                                            std::string_view identity, std::string_view body);
/// "failed" or "required".
[[nodiscard]] std::string encode_auth_refusal(std::string_view kind);

/// Whether `body` may be a tide_auth message: a JSON object with a
/// "tide_auth" key somewhere (O(size); decode_auth_message decides).
[[nodiscard]] bool is_auth_message(std::string_view body) noexcept;
/// Parses any of the messages above without building a DOM: an auth
/// message is one flat object of strings and numbers, and the first nested
/// value ends the parse (so a request from a stranger costs at most one
/// pass over its bytes).  Errors: errc::auth_failed naming the field (never
/// echoing a MAC): a nested value, a duplicate key, a missing or mistyped
/// field.
[[nodiscard]] result<auth_message> decode_auth_message(std::string_view body);

/// Constant-time check of `m.mac` (CRYPTO_memcmp) against the MAC of
/// `m.body` under the given context.
[[nodiscard]] bool verify_auth_mac(const cluster_secret& s, auth_direction dir, message_type type,
                                   const auth_nonce& server_nonce, const auth_nonce& client_nonce,
                                   std::string_view identity, const auth_message& m);

}  // namespace tide::wire
