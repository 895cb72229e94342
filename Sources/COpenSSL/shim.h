#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
// OpenSSL's libcrypto, for what libsodium does not offer: HMAC-SHA-1
// (RFC 6238 one-time codes) and, for the Secret Service, the IETF DH group,
// HKDF and AES-CBC. Only the OpenSSL 3 API; deprecated calls stay hidden.
#define OPENSSL_API_COMPAT 30000
#define OPENSSL_NO_DEPRECATED
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif
