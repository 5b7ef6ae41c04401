// Cluster secret loading, key derivation and the authenticated handshake
// messages (wire/auth.hpp).  HMAC, RAND and memcmp are libcrypto's.

#include <tide/wire/auth.hpp>

#include "hex.hpp"
#include "json_util.hpp"

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace tide::wire {

namespace {

key256 derive(std::string_view secret, std::string_view label) {
  key256 out{};
  unsigned len = 0;
  ::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char*>(label.data()), label.size(), out.data(), &len);
  return out;
}

std::string octal_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

void put_part(std::string& out, std::string_view part) {
  std::uint64_t n = part.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(part);
}

std::string_view as_view(const auth_nonce& n) { return {reinterpret_cast<const char*>(n.data()), n.size()}; }

constexpr const char* kKey = "tide_auth";

}  // namespace

cluster_secret::~cluster_secret() {
  OPENSSL_cleanse(mac_key_.data(), mac_key_.size());
  OPENSSL_cleanse(seal_key_.data(), seal_key_.size());
  OPENSSL_cleanse(desc_key_.data(), desc_key_.size());
}

result<std::shared_ptr<const cluster_secret>> cluster_secret::from_bytes(std::string_view secret) {
  if (secret.size() < kMinSecretBytes)
    return fail(errc::config_invalid, "cluster secret: " + std::to_string(secret.size()) + " bytes, at least " +
                                          std::to_string(kMinSecretBytes) + " random bytes are required");
  if (secret.size() > kMaxSecretBytes)
    return fail(errc::config_invalid, "cluster secret: more than " + std::to_string(kMaxSecretBytes) + " bytes");
  std::shared_ptr<cluster_secret> s(new cluster_secret());
  s->mac_key_ = derive(secret, "tide-auth-v1/mac");
  s->seal_key_ = derive(secret, "tide-auth-v1/seal");
  s->desc_key_ = derive(secret, "tide-auth-v1/descriptor");
  return std::shared_ptr<const cluster_secret>(std::move(s));
}

result<std::shared_ptr<const cluster_secret>> cluster_secret::load(const std::string& path) {
  const std::string what = "auth_secret_file \"" + path + "\"";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return fail(errc::config_invalid, what + ": " + std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(errc::config_invalid, what + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(errc::config_invalid, what + ": not a regular file");
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    return fail(errc::config_invalid, what + ": mode " + octal_mode(st.st_mode) +
                                          " lets group or others access it; chmod 600 it");
  if (st.st_size > static_cast<off_t>(kMaxSecretBytes))
    return fail(errc::config_invalid, what + ": larger than " + std::to_string(kMaxSecretBytes) + " bytes");
  std::vector<char> buf(kMaxSecretBytes + 1);
  std::size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data() + have, buf.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      OPENSSL_cleanse(buf.data(), buf.size());
      return fail(errc::config_invalid, what + ": " + std::strerror(errno));
    }
    if (n == 0 || (have += static_cast<std::size_t>(n)) == buf.size()) break;
  }
  auto s = from_bytes(std::string_view(buf.data(), have));
  OPENSSL_cleanse(buf.data(), buf.size());
  if (!s) return fail(errc::config_invalid, what + ": " + std::to_string(have) + " bytes; at least " +
                                                std::to_string(kMinSecretBytes) + " and at most " +
                                                std::to_string(kMaxSecretBytes) + " random bytes are required");
  return s;
}

result<auth_nonce> fresh_nonce() {
  auth_nonce n{};
  if (::RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    return fail(errc::auth_failed, "RAND_bytes failed: no randomness for a nonce");
  return n;
}

std::array<std::uint8_t, kMacBytes> auth_mac(const cluster_secret& s, auth_direction dir, message_type type,
                                             const auth_nonce& server_nonce, const auth_nonce& client_nonce,
                                             std::string_view identity, std::string_view body) {
  std::string msg;
  msg.reserve(64 + identity.size() + body.size());
  msg.append(dir == auth_direction::request ? "tide-auth-v1/request" : "tide-auth-v1/reply");
  msg.push_back('\0');
  msg.push_back(static_cast<char>(type));
  put_part(msg, as_view(server_nonce));
  put_part(msg, as_view(client_nonce));
  put_part(msg, identity);
  put_part(msg, body);
  std::array<std::uint8_t, kMacBytes> out{};
  unsigned len = 0;
  ::HMAC(EVP_sha256(), s.mac_key().data(), static_cast<int>(s.mac_key().size()),
         reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

namespace {

std::string finish(nlohmann::json& j) {
  // Bodies are tide's (or Mooncake's) JSON text; replace rather than throw on
  // bad UTF-8: the MAC, computed over the original bytes, then fails.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

std::string encode_auth_hello() { return R"({"tide_auth":"hello","v":1})" "\n"; }

std::string encode_auth_challenge(const auth_nonce& server_nonce) {
  nlohmann::json j{{kKey, "challenge"}, {"v", 1}, {"nonce", to_hex(server_nonce)}};
  return finish(j);
}

std::string encode_auth_request(const cluster_secret& s, message_type type, const auth_nonce& server_nonce,
                                const auth_nonce& client_nonce, std::string_view identity, std::string_view body) {
  const auto mac = auth_mac(s, auth_direction::request, type, server_nonce, client_nonce, identity, body);
  nlohmann::json j{{kKey, "request"}, {"v", 1}, {"nonce", to_hex(client_nonce)}, {"id", std::string(identity)},
                   {"mac", to_hex(mac)}, {"body", std::string(body)}};
  return finish(j);
}

std::string encode_auth_reply(const cluster_secret& s, message_type type, const auth_nonce& server_nonce,
                              const auth_nonce& client_nonce, std::string_view identity, std::string_view body) {
  const auto mac = auth_mac(s, auth_direction::reply, type, server_nonce, client_nonce, identity, body);
  nlohmann::json j{{kKey, "reply"}, {"v", 1}, {"mac", to_hex(mac)}, {"body", std::string(body)}};
  return finish(j);
}

std::string encode_auth_refusal(std::string_view kind) {
  nlohmann::json j{{kKey, std::string(kind)}, {"v", 1}};
  return finish(j);
}

bool is_auth_message(std::string_view body) noexcept {
  while (!body.empty() && (body.front() == ' ' || body.front() == '\n' || body.front() == '\t' || body.front() == '\r'))
    body.remove_prefix(1);
  // nlohmann writes keys sorted, so "tide_auth" is not always first.
  return body.starts_with('{') && body.find("\"tide_auth\":") != std::string_view::npos;
}

namespace {

// Reads an auth message without building a DOM: a request after the
// challenge comes from anyone, and is decoded on the server's only I/O
// thread before its MAC is checked.  An auth message is one flat object of
// strings and numbers, so the first nested value ends the parse at once
// (a flat {"x":[0,0,...]} costs no more than its first bracket), and the
// only strings kept are the handful of fields below.
class auth_sax {
 public:
  using json = nlohmann::json;

  struct field {
    std::string value;
    bool seen = false;       // the key appeared (a second time is refused)
    bool is_string = false;  // with a string value
  };

  // Why the parse stopped, or "" when the parser did not say.
  std::string error;
  field kind, nonce, mac, body, identity, version;
  std::optional<std::uint64_t> v;

  bool null() { return scalar(); }
  bool boolean(bool) { return scalar(); }
  bool number_integer(json::number_integer_t) { return scalar(); }
  bool number_unsigned(json::number_unsigned_t n) {
    if (!scalar()) return false;
    if (current_ == &version) v = n;
    return true;
  }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar(); }
  bool binary(json::binary_t&) { return scalar(); }
  bool string(json::string_t& s) {
    if (!scalar()) return false;
    if (current_ != nullptr) {
      current_->value = std::move(s);
      current_->is_string = true;
    }
    return true;
  }
  bool start_object(std::size_t) {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    return nested("an object");
  }
  bool end_object() {
    depth_ = 0;
    return true;
  }
  bool start_array(std::size_t) { return depth_ == 0 ? stop("not a JSON object") : nested("an array"); }
  bool end_array() { return true; }  // never reached: every array is refused at its start
  bool key(json::string_t& k) {
    key_ = std::move(k);
    current_ = field_of(key_);
    if (current_ != nullptr) {
      if (current_->seen) return stop("duplicate \"" + key_ + "\"");
      current_->seen = true;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return stop("not a JSON object");
  }

 private:
  bool scalar() { return depth_ == 1 || stop("not a JSON object"); }
  bool nested(const char* what) {
    return stop("\"" + key_.substr(0, 32) + "\": " + what + "; an auth message holds only strings and numbers");
  }
  bool stop(std::string why) {
    if (error.empty()) error = std::move(why);
    return false;
  }
  field* field_of(std::string_view k) {
    if (k == kKey) return &kind;
    if (k == "nonce") return &nonce;
    if (k == "mac") return &mac;
    if (k == "body") return &body;
    if (k == "id") return &identity;
    if (k == "v") return &version;
    return nullptr;
  }

  int depth_ = 0;
  std::string key_;
  field* current_ = nullptr;
};

}  // namespace

result<auth_message> decode_auth_message(std::string_view body) {
  // Before the parse: this runs on the server's I/O thread for input from
  // anyone, and nlohmann spends ~0.6 s and 80 MB on 1 MiB of "[[[[".
  if (detail::json_depth(body, detail::kMaxJsonDepth) < 0)
    return fail(errc::auth_failed, "auth message: nested deeper than " + std::to_string(detail::kMaxJsonDepth) +
                                       " levels");
  auth_sax sax;
  const bool parsed = nlohmann::json::sax_parse(body, &sax);
  if (!sax.error.empty()) return fail(errc::auth_failed, "auth message: " + sax.error);
  if (!parsed) return fail(errc::auth_failed, "auth message: not a JSON object");
  if (!sax.kind.is_string) return fail(errc::auth_failed, "auth message: no \"tide_auth\" kind");
  if (sax.v != std::optional<std::uint64_t>(1))
    return fail(errc::auth_failed, "auth message: unsupported version (tide speaks \"v\":1)");
  auth_message m;
  m.kind = std::move(sax.kind.value);
  const bool has_nonce = m.kind == "challenge" || m.kind == "request";
  const bool has_mac = m.kind == "request" || m.kind == "reply";
  if (!has_mac && !has_nonce && m.kind != "hello" && m.kind != "failed" && m.kind != "required")
    return fail(errc::auth_failed, "auth message: unknown kind \"" + m.kind.substr(0, 32) + "\"");
  if (has_nonce && (!sax.nonce.is_string || !from_hex(sax.nonce.value, m.nonce)))
    return fail(errc::auth_failed, "auth message: nonce: expected 32 hex digits");
  if (has_mac) {
    if (!sax.mac.is_string || !from_hex(sax.mac.value, m.mac))
      return fail(errc::auth_failed, "auth message: mac: expected 64 hex digits");
    if (!sax.body.is_string) return fail(errc::auth_failed, "auth message: body: expected a string");
    m.body = std::move(sax.body.value);
  }
  if (m.kind == "request") {
    if (!sax.identity.is_string) return fail(errc::auth_failed, "auth message: id: expected a string");
    m.identity = std::move(sax.identity.value);
  }
  return m;
}

bool verify_auth_mac(const cluster_secret& s, auth_direction dir, message_type type, const auth_nonce& server_nonce,
                     const auth_nonce& client_nonce, std::string_view identity, const auth_message& m) {
  const auto want = auth_mac(s, dir, type, server_nonce, client_nonce, identity, m.body);
  return ::CRYPTO_memcmp(want.data(), m.mac.data(), want.size()) == 0;
}

}  // namespace tide::wire
