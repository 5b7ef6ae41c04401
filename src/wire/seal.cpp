// AES-256-GCM sealing of a buffer's addr and keys (wire/seal.hpp).

#include <tide/wire/seal.hpp>

#include "hex.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <atomic>
#include <memory>
#include <vector>

namespace tide::wire {

namespace {

constexpr std::size_t kIv = 12;
constexpr std::size_t kTag = 16;
constexpr std::size_t kMaxKeys = 1024;  // one per device; far above any host

struct ctx_deleter {
  void operator()(EVP_CIPHER_CTX* c) const noexcept { EVP_CIPHER_CTX_free(c); }
};
using cipher_ctx = std::unique_ptr<EVP_CIPHER_CTX, ctx_deleter>;

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t get_le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string associated_data(std::string_view segment, std::size_t index, const buffer_desc& b) {
  std::string ad = "tide-seal-v2";
  ad.push_back('\0');
  put_u64(ad, segment.size());
  ad.append(segment);
  ad.push_back(b.id ? 'i' : 'x');
  put_u64(ad, b.id ? *b.id : index);
  put_u64(ad, b.name.size());
  ad.append(b.name);
  put_u64(ad, b.length);
  ad.push_back(static_cast<char>(b.access));
  return ad;
}

const unsigned char* bytes(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

std::atomic<std::uint64_t> g_seals{0};

}  // namespace

std::uint64_t seals_done() noexcept { return g_seals.load(std::memory_order_relaxed); }

result<std::string> seal_buffer(const cluster_secret& s, std::string_view segment_name, std::size_t index,
                                const buffer_desc& b) {
  std::string plain;
  put_u64(plain, b.addr);
  put_u32(plain, static_cast<std::uint32_t>(b.rkey.size()));
  for (auto k : b.rkey) put_u32(plain, k);
  put_u32(plain, static_cast<std::uint32_t>(b.lkey.size()));
  for (auto k : b.lkey) put_u32(plain, k);
  const std::string ad = associated_data(segment_name, index, b);

  std::vector<std::uint8_t> out(kIv + plain.size() + kTag);
  if (::RAND_bytes(out.data(), static_cast<int>(kIv)) != 1) return fail(errc::auth_failed, "seal: RAND_bytes failed");
  cipher_ctx ctx{EVP_CIPHER_CTX_new()};
  int len = 0;
  const bool ok = ctx && EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
                  EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(kIv), nullptr) == 1 &&
                  EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, s.seal_key().data(), out.data()) == 1 &&
                  EVP_EncryptUpdate(ctx.get(), nullptr, &len, bytes(ad), static_cast<int>(ad.size())) == 1 &&
                  EVP_EncryptUpdate(ctx.get(), out.data() + kIv, &len, bytes(plain), static_cast<int>(plain.size())) == 1 &&
                  EVP_EncryptFinal_ex(ctx.get(), out.data() + kIv + len, &len) == 1 &&
                  EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTag),
                                      out.data() + kIv + plain.size()) == 1;
  if (!ok) return fail(errc::auth_failed, "seal: AES-256-GCM failed");
  g_seals.fetch_add(1, std::memory_order_relaxed);
  return to_hex(out);
}

status open_buffer(const cluster_secret& s, std::string_view segment_name, std::size_t index, std::string_view sealed,
                   buffer_desc& b) {
  const std::string field = "buffers[" + std::to_string(index) + "].sealed";
  auto bad = [&](std::string why) { return fail(errc::metadata_malformed, field + ": " + std::move(why)); };
  if (sealed.size() % 2 != 0 || sealed.size() < 2 * (kIv + kTag + 8 + 4 + 4)) return bad("too short or odd length");
  if (sealed.size() > 2 * (kIv + kTag + 16 + 8 * kMaxKeys)) return bad("too long");
  std::vector<std::uint8_t> raw(sealed.size() / 2);
  if (!from_hex(sealed, raw)) return bad("not hex");
  const std::size_t n = raw.size() - kIv - kTag;
  std::vector<unsigned char> plain(n);
  const std::string ad = associated_data(segment_name, index, b);
  cipher_ctx ctx{EVP_CIPHER_CTX_new()};
  int len = 0;
  const bool ok = ctx && EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
                  EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(kIv), nullptr) == 1 &&
                  EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, s.seal_key().data(), raw.data()) == 1 &&
                  EVP_DecryptUpdate(ctx.get(), nullptr, &len, bytes(ad), static_cast<int>(ad.size())) == 1 &&
                  EVP_DecryptUpdate(ctx.get(), plain.data(), &len, raw.data() + kIv, static_cast<int>(n)) == 1 &&
                  EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTag),
                                      raw.data() + kIv + n) == 1 &&
                  EVP_DecryptFinal_ex(ctx.get(), plain.data() + len, &len) > 0;
  if (!ok) return bad("authentication failed (tampered, or sealed under another secret)");
  std::size_t at = 0;
  auto take = [&](int width, std::uint64_t& v) {
    if (at + static_cast<std::size_t>(width) > n) return false;
    v = get_le(plain.data() + at, width);
    at += static_cast<std::size_t>(width);
    return true;
  };
  std::uint64_t addr = 0, count = 0, k = 0;
  std::vector<std::uint32_t> keys[2];
  if (!take(8, addr)) return bad("truncated plaintext");
  for (auto& list : keys) {
    if (!take(4, count) || count > kMaxKeys) return bad("bad key count");
    for (std::uint64_t i = 0; i < count; ++i) {
      if (!take(4, k)) return bad("truncated key list");
      list.push_back(static_cast<std::uint32_t>(k));
    }
  }
  if (at != n) return bad("trailing plaintext");
  b.addr = addr;
  b.rkey = std::move(keys[0]);
  b.lkey = std::move(keys[1]);
  return {};
}

std::array<std::uint8_t, 32> descriptor_mac(const cluster_secret& s, std::string_view section,
                                            std::string_view segment_name, std::string_view timestamp,
                                            std::string_view canonical) {
  std::string msg = "tide-desc-v1";
  msg.push_back('\0');
  for (std::string_view part : {section, segment_name, timestamp, canonical}) {
    put_u64(msg, part.size());
    msg.append(part);
  }
  std::array<std::uint8_t, 32> out{};
  unsigned len = 0;
  ::HMAC(EVP_sha256(), s.descriptor_key().data(), static_cast<int>(s.descriptor_key().size()), bytes(msg), msg.size(),
         out.data(), &len);
  return out;
}

bool verify_descriptor_mac(const cluster_secret& s, std::string_view section, std::string_view segment_name,
                           std::string_view timestamp, std::string_view canonical, std::string_view mac) {
  std::array<std::uint8_t, 32> got{};
  if (!from_hex(mac, got)) return false;
  const auto want = descriptor_mac(s, section, segment_name, timestamp, canonical);
  return ::CRYPTO_memcmp(want.data(), got.data(), want.size()) == 0;
}

void seal_cache::begin(const cluster_secret* s, std::string_view segment_name) {
  if (s != secret_ || segment_name != segment_) {
    by_key_.clear();
    secret_ = s;
    segment_ = std::string(segment_name);
  }
  ++gen_;
  used_ = 0;
}

const seal_cache::entry* seal_cache::find(std::size_t index, const buffer_desc& b) {
  auto it = by_key_.find(key_of(index, b));
  if (it == by_key_.end() || it->second.buffer != b) return nullptr;
  slot& sl = it->second;
  if (sl.used_in != gen_) ++used_;
  sl.used_in = gen_;
  return &sl.e;
}

const seal_cache::entry& seal_cache::store(std::size_t index, const buffer_desc& b, entry e) {
  ++misses_;
  slot& sl = by_key_[key_of(index, b)];
  if (sl.used_in != gen_) ++used_;
  sl.buffer = b;
  sl.e = std::move(e);
  sl.used_in = gen_;
  return sl.e;
}

void seal_cache::sweep() {
  if (used_ == by_key_.size()) return;
  std::erase_if(by_key_, [this](const auto& kv) { return kv.second.used_in != gen_; });
  used_ = by_key_.size();
}

}  // namespace tide::wire
