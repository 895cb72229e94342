#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
// OpenSSL's libcrypto, for what libsodium does not offer: HMAC-SHA-1
// (RFC 6238 one-time codes) and, for the Secret Service, the big-number,
// HKDF and AES-CBC calls its DH transfer sessions make (the logic is
// Swift's, TransferSession.swift). Only the OpenSSL 3 API; deprecated calls
// stay hidden.
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

// One wrapper per libcrypto function the Secret Service's transfer
// sessions use (TransferSession.swift does the DH exchange, HKDF and
// AES-CBC with them): its declaration, its address from dlsym, and `fail`
// when libcrypto cannot be loaded.
#define COPENSSL_CALL(ret, fail, name, params, args) \
    static inline ret COpenSSL_##name params { \
        __typeof__(&name) function = (__typeof__(&name))COpenSSL_symbol(#name); \
        return function ? function args : fail; \
    }

COPENSSL_CALL(BN_CTX *, NULL, BN_CTX_new, (void), ())
COPENSSL_CALL(BIGNUM *, NULL, BN_new, (void), ())
COPENSSL_CALL(BIGNUM *, NULL, BN_bin2bn, (const unsigned char *s, int len, BIGNUM *ret), (s, len, ret))
COPENSSL_CALL(int, -1, BN_bn2bin, (const BIGNUM *a, unsigned char *to), (a, to))
COPENSSL_CALL(int, -1, BN_bn2binpad, (const BIGNUM *a, unsigned char *to, int tolen), (a, to, tolen))
COPENSSL_CALL(int, 0, BN_set_word, (BIGNUM *a, BN_ULONG w), (a, w))
COPENSSL_CALL(int, 0, BN_sub_word, (BIGNUM *a, BN_ULONG w), (a, w))
COPENSSL_CALL(int, 0, BN_cmp, (const BIGNUM *a, const BIGNUM *b), (a, b))
COPENSSL_CALL(int, 0, BN_num_bits, (const BIGNUM *a), (a))
COPENSSL_CALL(int, 0, BN_mod_exp, (BIGNUM *r, const BIGNUM *a, const BIGNUM *p, const BIGNUM *m, BN_CTX *ctx),
              (r, a, p, m, ctx))
COPENSSL_CALL(EVP_PKEY_CTX *, NULL, EVP_PKEY_CTX_new_id, (int id, ENGINE *e), (id, e))
COPENSSL_CALL(int, 0, EVP_PKEY_derive_init, (EVP_PKEY_CTX *ctx), (ctx))
COPENSSL_CALL(int, 0, EVP_PKEY_CTX_set_hkdf_md, (EVP_PKEY_CTX *ctx, const EVP_MD *md), (ctx, md))
COPENSSL_CALL(int, 0, EVP_PKEY_CTX_set1_hkdf_key, (EVP_PKEY_CTX *ctx, const unsigned char *key, int keylen),
              (ctx, key, keylen))
COPENSSL_CALL(int, 0, EVP_PKEY_derive, (EVP_PKEY_CTX *ctx, unsigned char *key, size_t *keylen), (ctx, key, keylen))
COPENSSL_CALL(const EVP_MD *, NULL, EVP_sha256, (void), ())
COPENSSL_CALL(EVP_CIPHER_CTX *, NULL, EVP_CIPHER_CTX_new, (void), ())
COPENSSL_CALL(int, 0, EVP_CipherInit_ex, (EVP_CIPHER_CTX *ctx, const EVP_CIPHER *type, ENGINE *impl,
              const unsigned char *key, const unsigned char *iv, int enc), (ctx, type, impl, key, iv, enc))
COPENSSL_CALL(int, 0, EVP_CipherUpdate, (EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl, const unsigned char *in,
              int inl), (ctx, out, outl, in, inl))
COPENSSL_CALL(int, 0, EVP_CipherFinal_ex, (EVP_CIPHER_CTX *ctx, unsigned char *outm, int *outl), (ctx, outm, outl))
COPENSSL_CALL(const EVP_CIPHER *, NULL, EVP_aes_128_cbc, (void), ())
// Before tpm2-tss first uses libcrypto (TrustedPlatformModule.swift says why).
COPENSSL_CALL(int, 0, OPENSSL_init_crypto, (uint64_t opts, const OPENSSL_INIT_SETTINGS *settings), (opts, settings))

// The frees return nothing: nothing to do without libcrypto.
#define COPENSSL_VOID(name, params, args) \
    static inline void COpenSSL_##name params { \
        __typeof__(&name) function = (__typeof__(&name))COpenSSL_symbol(#name); \
        if (function) function args; \
    }
COPENSSL_VOID(BN_CTX_free, (BN_CTX *c), (c))
COPENSSL_VOID(BN_clear_free, (BIGNUM *a), (a))
COPENSSL_VOID(EVP_PKEY_CTX_free, (EVP_PKEY_CTX *ctx), (ctx))
COPENSSL_VOID(EVP_CIPHER_CTX_free, (EVP_CIPHER_CTX *ctx), (ctx))

// EVP_PKEY_HKDF (NID_hkdf), a macro of a macro.
static inline int COpenSSL_hkdf_id(void) { return EVP_PKEY_HKDF; }

#endif
