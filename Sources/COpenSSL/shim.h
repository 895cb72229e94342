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
#include <openssl/evp.h>
#include <openssl/hmac.h>

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
#endif
