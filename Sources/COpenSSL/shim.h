#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
// OpenSSL's libcrypto, for what libsodium does not offer: HMAC-SHA-1
// (RFC 6238 one-time codes) and, for the Secret Service, the IETF DH group,
// HKDF and AES-CBC. Only the OpenSSL 3 API; deprecated calls stay hidden.
//
// Loaded when first needed, not linked: libcrypto's relocations cost 0.7 ms
// at the start of every process (perf stat, docs/BENCHMARKS.md), and most
// runs of keychainfs (`get` in a script's loop) never use it. Swift calls
// through the declarations below (types from the headers, addresses from dlsym).
#define OPENSSL_API_COMPAT 30000
#define OPENSSL_NO_DEPRECATED
#include <dlfcn.h>
#include <stddef.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>

// libcrypto's symbol `name`, loading the library on first use; NULL if it
// is not installed (libssl3 on Debian) or lacks the symbol.
static inline void *COpenSSL_symbol(const char *name) {
    // dlopen of a loaded library only counts a reference: cheap after the first.
    void *library = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    return library ? dlsym(library, name) : NULL;
}

typedef const EVP_MD *(*COpenSSL_digest_function)(void);
typedef unsigned char *(*COpenSSL_hmac_function)(const EVP_MD *, const void *, int, const unsigned char *, size_t,
                                                 unsigned char *, unsigned int *);

// HMAC(3) with the digest named by its libcrypto function (EVP_sha1, EVP_sha256,
// EVP_sha512); 0 on success, -1 when libcrypto cannot be loaded or fails.
static inline int COpenSSL_hmac(const char *digest_function, const void *key, int key_length,
                                const unsigned char *data, size_t data_length,
                                unsigned char *mac, unsigned int *mac_length) {
    COpenSSL_digest_function digest = (COpenSSL_digest_function)COpenSSL_symbol(digest_function);
    COpenSSL_hmac_function hmac = (COpenSSL_hmac_function)COpenSSL_symbol("HMAC");
    if (!digest || !hmac) return -1;
    return hmac(digest(), key, key_length, data, data_length, mac, mac_length) ? 0 : -1;
}

// The libcrypto function `name`, typed as its declaration says; NULL when missing.
#define COPENSSL_FUNCTION(name) ((__typeof__(&name))COpenSSL_symbol(#name))

// The Secret Service's dh-ietf1024-sha256-aes128-cbc-pkcs7 (as libsecret
// and gnome-keyring do it): Diffie-Hellman in RFC 2409's second Oakley
// group (1024-bit MODP, generator 2). From our private exponent (`private_key`,
// random bytes) and the peer's public key (big-endian, unpadded or padded),
// writes our public key (big-endian, unpadded, at most 128 bytes, length
// in `public_length`) and the 16-byte AES key: HKDF-SHA256 (RFC 5869) of
// the shared secret padded to 128 bytes, no salt, no info. Intermediate
// secrets are cleared. 0 on success; -1 when libcrypto is missing or a
// step fails, -2 when the peer's key is not in [2, p-2].
static inline int COpenSSL_dh_ietf1024(const unsigned char *peer, size_t peer_length,
                                       const unsigned char *private_key, size_t private_length,
                                       unsigned char public_key[128], size_t *public_length,
                                       unsigned char aes_key[16]) {
    static const char prime_hex[] =
        "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
        "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
        "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF";
    __typeof__(&BN_CTX_new) ctx_new = COPENSSL_FUNCTION(BN_CTX_new);
    __typeof__(&BN_CTX_free) ctx_free = COPENSSL_FUNCTION(BN_CTX_free);
    __typeof__(&BN_new) bn_new = COPENSSL_FUNCTION(BN_new);
    __typeof__(&BN_clear_free) bn_clear_free = COPENSSL_FUNCTION(BN_clear_free);
    __typeof__(&BN_hex2bn) hex2bn = COPENSSL_FUNCTION(BN_hex2bn);
    __typeof__(&BN_bin2bn) bin2bn = COPENSSL_FUNCTION(BN_bin2bn);
    __typeof__(&BN_bn2bin) bn2bin = COPENSSL_FUNCTION(BN_bn2bin);
    __typeof__(&BN_bn2binpad) bn2binpad = COPENSSL_FUNCTION(BN_bn2binpad);
    __typeof__(&BN_set_word) set_word = COPENSSL_FUNCTION(BN_set_word);
    __typeof__(&BN_sub_word) sub_word = COPENSSL_FUNCTION(BN_sub_word);
    __typeof__(&BN_cmp) cmp = COPENSSL_FUNCTION(BN_cmp);
    __typeof__(&BN_mod_exp) mod_exp = COPENSSL_FUNCTION(BN_mod_exp);
    __typeof__(&BN_num_bits) num_bits = COPENSSL_FUNCTION(BN_num_bits);
    __typeof__(&EVP_PKEY_CTX_new_id) pkey_ctx_new = COPENSSL_FUNCTION(EVP_PKEY_CTX_new_id);
    __typeof__(&EVP_PKEY_CTX_free) pkey_ctx_free = COPENSSL_FUNCTION(EVP_PKEY_CTX_free);
    __typeof__(&EVP_PKEY_derive_init) derive_init = COPENSSL_FUNCTION(EVP_PKEY_derive_init);
    __typeof__(&EVP_PKEY_CTX_set_hkdf_md) set_md = COPENSSL_FUNCTION(EVP_PKEY_CTX_set_hkdf_md);
    __typeof__(&EVP_PKEY_CTX_set1_hkdf_key) set_key = COPENSSL_FUNCTION(EVP_PKEY_CTX_set1_hkdf_key);
    __typeof__(&EVP_PKEY_derive) derive = COPENSSL_FUNCTION(EVP_PKEY_derive);
    __typeof__(&EVP_sha256) sha256 = COPENSSL_FUNCTION(EVP_sha256);
    __typeof__(&OPENSSL_cleanse) cleanse = COPENSSL_FUNCTION(OPENSSL_cleanse);
    if (!ctx_new || !ctx_free || !bn_new || !bn_clear_free || !hex2bn || !bin2bn || !bn2bin || !bn2binpad || !set_word
        || !sub_word || !cmp || !mod_exp || !num_bits || !pkey_ctx_new || !pkey_ctx_free || !derive_init || !set_md
        || !set_key || !derive || !sha256 || !cleanse) return -1;
    int status = -1;
    unsigned char shared[128];
    BN_CTX *ctx = ctx_new();
    BIGNUM *p = NULL, *g = bn_new(), *x = NULL, *y = bn_new(), *peer_key = NULL, *limit = NULL, *secret = bn_new();
    EVP_PKEY_CTX *kdf = NULL;
    if (!ctx || !g || !y || !secret || !hex2bn(&p, prime_hex) || !hex2bn(&limit, prime_hex) || !set_word(g, 2)) goto done;
    x = bin2bn(private_key, (int)private_length, NULL);
    peer_key = bin2bn(peer, (int)peer_length, NULL);
    if (!x || !peer_key || !sub_word(limit, 1)) goto done;
    // A peer key of 0, 1 or p-1 (or more) would make the secret known.
    if (num_bits(peer_key) < 2 || cmp(peer_key, limit) >= 0) { status = -2; goto done; }
    if (!mod_exp(y, g, x, p, ctx) || !mod_exp(secret, peer_key, x, p, ctx)) goto done;
    int length = bn2bin(y, public_key);
    if (length <= 0 || bn2binpad(secret, shared, sizeof shared) != (int)sizeof shared) goto done;
    *public_length = (size_t)length;
    size_t key_length = 16;
    kdf = pkey_ctx_new(EVP_PKEY_HKDF, NULL);
    if (!kdf || derive_init(kdf) <= 0 || set_md(kdf, sha256()) <= 0 || set_key(kdf, shared, sizeof shared) <= 0
        || derive(kdf, aes_key, &key_length) <= 0 || key_length != 16) goto done;
    status = 0;
done:
    cleanse(shared, sizeof shared);
    if (kdf) pkey_ctx_free(kdf);
    bn_clear_free(x);
    bn_clear_free(secret);
    bn_clear_free(p);
    bn_clear_free(g);
    bn_clear_free(y);
    bn_clear_free(peer_key);
    bn_clear_free(limit);
    if (ctx) ctx_free(ctx);
    return status;
}

// AES-128-CBC with PKCS#7 padding: encrypts (`encrypt` 1) or decrypts
// `input` into `output`, which has room for `input_length` + 16 bytes;
// the length written goes to `output_length`. 0 on success, -1 on a
// failure (a wrong key or tampered data fails the padding check).
static inline int COpenSSL_aes128_cbc(int encrypt, const unsigned char key[16], const unsigned char iv[16],
                                      const unsigned char *input, size_t input_length,
                                      unsigned char *output, size_t *output_length) {
    __typeof__(&EVP_CIPHER_CTX_new) ctx_new = COPENSSL_FUNCTION(EVP_CIPHER_CTX_new);
    __typeof__(&EVP_CIPHER_CTX_free) ctx_free = COPENSSL_FUNCTION(EVP_CIPHER_CTX_free);
    __typeof__(&EVP_CipherInit_ex) init = COPENSSL_FUNCTION(EVP_CipherInit_ex);
    __typeof__(&EVP_CipherUpdate) update = COPENSSL_FUNCTION(EVP_CipherUpdate);
    __typeof__(&EVP_CipherFinal_ex) final = COPENSSL_FUNCTION(EVP_CipherFinal_ex);
    __typeof__(&EVP_aes_128_cbc) aes = COPENSSL_FUNCTION(EVP_aes_128_cbc);
    if (!ctx_new || !ctx_free || !init || !update || !final || !aes || input_length > (size_t)INT32_MAX - 16) return -1;
    EVP_CIPHER_CTX *ctx = ctx_new();
    if (!ctx) return -1;
    int written = 0, last = 0, status = -1;
    if (init(ctx, aes(), NULL, key, iv, encrypt) > 0 && update(ctx, output, &written, input, (int)input_length) > 0
        && final(ctx, output + written, &last) > 0) {
        *output_length = (size_t)written + (size_t)last;
        status = 0;
    }
    ctx_free(ctx);  // clears the key schedule
    return status;
}
#endif
