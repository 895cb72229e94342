#ifndef CTSS_SHIM_H
#define CTSS_SHIM_H
// tpm2-tss, the TPM 2.0 software stack (libtss2-dev): ESAPI (libtss2-esys),
// the TCTI loader (libtss2-tctildr) and the marshalling library
// (libtss2-mu), for the device secret sealed by the TPM (issue 30).
//
// Loaded when first needed, not linked, as libcrypto and libsystemd are:
// libtss2-esys pulls in libcrypto, and their relocations would cost every
// process start (a `keychainfs get`) for a TPM used only at boot and unlock.
// Swift calls the CTSS_ functions below: tpm2-tss's own declarations
// (types and prototypes from its headers), addresses from dlsym. The
// structures of a sealed object and a session are built here, in C, where
// their unions and fixed arrays are plain to write.
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tss2/tss2_esys.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_tctildr.h>

// The symbol `name` of `library`, loading it on first use; NULL if it is
// not installed (libtss2-esys0, libtss2-tctildr0, libtss2-mu0) or lacks it.
static inline void *CTSS_symbol(const char *library, const char *name) {
    void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    return handle ? dlsym(handle, name) : NULL;
}

// Whether the stack can be loaded at all.
static inline int CTSS_available(void) {
    return CTSS_symbol("libtss2-esys.so.0", "Esys_Initialize") != NULL
        && CTSS_symbol("libtss2-tctildr.so.0", "Tss2_TctiLdr_Initialize") != NULL
        && CTSS_symbol("libtss2-mu.so.0", "Tss2_MU_TPM2B_PUBLIC_Marshal") != NULL;
}

// TSS2_BASE_RC_NOT_IMPLEMENTED in the ESAPI layer: what a call returns when
// the library is missing.
#define CTSS_MISSING ((TSS2_RC)(TSS2_ESAPI_RC_LAYER | TSS2_BASE_RC_NOT_IMPLEMENTED))

// One wrapper per call: tpm2-tss's prototype, called through dlsym.
#define CTSS_CALL(library, ret, fail, name, params, args) \
    static inline ret CTSS_##name params { \
        __typeof__(&name) function = (__typeof__(&name))CTSS_symbol(library, #name); \
        return function ? function args : fail; \
    }
#define CTSS_ESYS(name, params, args) CTSS_CALL("libtss2-esys.so.0", TSS2_RC, CTSS_MISSING, name, params, args)

CTSS_CALL("libtss2-tctildr.so.0", TSS2_RC, CTSS_MISSING, Tss2_TctiLdr_Initialize,
          (const char *nameConf, TSS2_TCTI_CONTEXT **context), (nameConf, context))
static inline void CTSS_Tss2_TctiLdr_Finalize(TSS2_TCTI_CONTEXT **context) {
    __typeof__(&Tss2_TctiLdr_Finalize) function =
        (__typeof__(&Tss2_TctiLdr_Finalize))CTSS_symbol("libtss2-tctildr.so.0", "Tss2_TctiLdr_Finalize");
    if (function) function(context);
}
CTSS_ESYS(Esys_Initialize, (ESYS_CONTEXT **context, TSS2_TCTI_CONTEXT *tcti), (context, tcti, NULL))
static inline void CTSS_Esys_Finalize(ESYS_CONTEXT **context) {
    __typeof__(&Esys_Finalize) function = (__typeof__(&Esys_Finalize))CTSS_symbol("libtss2-esys.so.0", "Esys_Finalize");
    if (function) function(context);
}
static inline void CTSS_Esys_Free(void *pointer) {
    __typeof__(&Esys_Free) function = (__typeof__(&Esys_Free))CTSS_symbol("libtss2-esys.so.0", "Esys_Free");
    if (function) function(pointer);
}
CTSS_ESYS(Esys_Startup, (ESYS_CONTEXT *context, TPM2_SU type), (context, type))
CTSS_ESYS(Esys_FlushContext, (ESYS_CONTEXT *context, ESYS_TR handle), (context, handle))
CTSS_ESYS(Esys_TR_SetAuth, (ESYS_CONTEXT *context, ESYS_TR handle, TPM2B_AUTH const *auth), (context, handle, auth))
CTSS_ESYS(Esys_TR_FromTPMPublic, (ESYS_CONTEXT *context, TPM2_HANDLE handle, ESYS_TR *object),
          (context, handle, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, object))
CTSS_ESYS(Esys_TRSess_SetAttributes, (ESYS_CONTEXT *context, ESYS_TR session, TPMA_SESSION flags, TPMA_SESSION mask),
          (context, session, flags, mask))
CTSS_ESYS(Esys_Load, (ESYS_CONTEXT *context, ESYS_TR parent, TPM2B_PRIVATE const *private, TPM2B_PUBLIC const *public,
                      ESYS_TR *object),
          (context, parent, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, private, public, object))
CTSS_ESYS(Esys_Unseal, (ESYS_CONTEXT *context, ESYS_TR object, ESYS_TR session, TPM2B_SENSITIVE_DATA **data),
          (context, object, session, ESYS_TR_NONE, ESYS_TR_NONE, data))
// NV_Increment and NV_Read authorized by the index itself, in `session`
// (ESYS_TR_PASSWORD for an empty auth, else an HMAC session).
CTSS_ESYS(Esys_NV_Increment, (ESYS_CONTEXT *context, ESYS_TR index, ESYS_TR session),
          (context, index, index, session, ESYS_TR_NONE, ESYS_TR_NONE))
CTSS_ESYS(Esys_NV_Read, (ESYS_CONTEXT *context, ESYS_TR index, ESYS_TR session, UINT16 size, TPM2B_MAX_NV_BUFFER **data),
          (context, index, index, session, ESYS_TR_NONE, ESYS_TR_NONE, size, 0, data))
CTSS_ESYS(Esys_NV_ReadPublic, (ESYS_CONTEXT *context, ESYS_TR index, TPM2B_NV_PUBLIC **info, TPM2B_NAME **name),
          (context, index, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, info, name))
// Defined under the owner hierarchy (its auth in a password session, as
// tpm2-tools does); `encrypting` carries the new index's auth encrypted.
CTSS_ESYS(Esys_NV_DefineSpace, (ESYS_CONTEXT *context, ESYS_TR encrypting, TPM2B_AUTH const *auth,
                                TPM2B_NV_PUBLIC const *info, ESYS_TR *index),
          (context, ESYS_TR_RH_OWNER, ESYS_TR_PASSWORD, encrypting, ESYS_TR_NONE, auth, info, index))
CTSS_ESYS(Esys_NV_UndefineSpace, (ESYS_CONTEXT *context, ESYS_TR index),
          (context, ESYS_TR_RH_OWNER, index, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE))
// The lockout hierarchy, authorized in `session` (its auth set on ESYS_TR_RH_LOCKOUT).
CTSS_ESYS(Esys_HierarchyChangeAuth, (ESYS_CONTEXT *context, ESYS_TR hierarchy, ESYS_TR session, TPM2B_AUTH const *auth),
          (context, hierarchy, session, ESYS_TR_NONE, ESYS_TR_NONE, auth))
CTSS_ESYS(Esys_DictionaryAttackParameters, (ESYS_CONTEXT *context, ESYS_TR session, UINT32 maximum, UINT32 recovery,
                                            UINT32 lockoutRecovery),
          (context, ESYS_TR_RH_LOCKOUT, session, ESYS_TR_NONE, ESYS_TR_NONE, maximum, recovery, lockoutRecovery))
CTSS_ESYS(Esys_DictionaryAttackLockReset, (ESYS_CONTEXT *context, ESYS_TR session),
          (context, ESYS_TR_RH_LOCKOUT, session, ESYS_TR_NONE, ESYS_TR_NONE))
CTSS_ESYS(Esys_TR_GetName, (ESYS_CONTEXT *context, ESYS_TR handle, TPM2B_NAME **name), (context, handle, name))
CTSS_ESYS(Esys_StartAuthSession, (ESYS_CONTEXT *context, ESYS_TR salt, TPMT_SYM_DEF const *symmetric, ESYS_TR *session),
          (context, salt, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, NULL, TPM2_SE_HMAC, symmetric,
           TPM2_ALG_SHA256, session))
CTSS_ESYS(Esys_GetCapability, (ESYS_CONTEXT *context, TPM2_CAP capability, UINT32 property, UINT32 count,
                               TPMS_CAPABILITY_DATA **data),
          (context, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, capability, property, count, NULL, data))
CTSS_ESYS(Esys_Clear, (ESYS_CONTEXT *context), (context, ESYS_TR_RH_PLATFORM, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE))

// The storage primary key: an ECC P-256 restricted decryption key under the
// owner hierarchy, made again from the same template whenever it is needed
// (the TPM derives it from its storage seed: the same key on this TPM,
// another on any other, and none after TPM2_Clear). NODA: it has no auth.
static inline TSS2_RC CTSS_create_primary(ESYS_CONTEXT *context, ESYS_TR *primary) {
    TPM2B_SENSITIVE_CREATE sensitive = {0};
    TPM2B_PUBLIC template = {0};
    template.publicArea.type = TPM2_ALG_ECC;
    template.publicArea.nameAlg = TPM2_ALG_SHA256;
    template.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT
        | TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_RESTRICTED
        | TPMA_OBJECT_DECRYPT | TPMA_OBJECT_NODA;
    template.publicArea.parameters.eccDetail.symmetric.algorithm = TPM2_ALG_AES;
    template.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 128;
    template.publicArea.parameters.eccDetail.symmetric.mode.aes = TPM2_ALG_CFB;
    template.publicArea.parameters.eccDetail.scheme.scheme = TPM2_ALG_NULL;
    template.publicArea.parameters.eccDetail.curveID = TPM2_ECC_NIST_P256;
    template.publicArea.parameters.eccDetail.kdf.scheme = TPM2_ALG_NULL;
    TPM2B_DATA outside = {0};
    TPML_PCR_SELECTION pcrs = {0};
    __typeof__(&Esys_CreatePrimary) function =
        (__typeof__(&Esys_CreatePrimary))CTSS_symbol("libtss2-esys.so.0", "Esys_CreatePrimary");
    if (!function) return CTSS_MISSING;
    return function(context, ESYS_TR_RH_OWNER, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE,
                    &sensitive, &template, &outside, &pcrs, primary, NULL, NULL, NULL, NULL);
}

// Seals `data` (at most 128 bytes) under `primary` as a keyed-hash object
// whose use needs `auth` (at most 32 bytes). Unless `noDA`, every wrong auth
// counts against the TPM's dictionary-attack lockout, and a TPM in lockout
// refuses the object altogether (so an object with an empty auth, which no
// one can guess wrong, is made NODA: usable during a lockout). The object's public
// and private parts, marshalled one after the other, go to `blob`
// (`*length` bytes of `capacity`).
static inline TSS2_RC CTSS_seal(ESYS_CONTEXT *context, ESYS_TR primary, ESYS_TR session,
                                const uint8_t *data, size_t dataLength, const uint8_t *auth, size_t authLength,
                                int noDA, uint8_t *blob, size_t capacity, size_t *length) {
    TPM2B_SENSITIVE_CREATE sensitive = {0};
    if (dataLength > sizeof sensitive.sensitive.data.buffer || authLength > sizeof sensitive.sensitive.userAuth.buffer)
        return TSS2_ESYS_RC_BAD_VALUE;
    sensitive.sensitive.data.size = (UINT16)dataLength;
    memcpy(sensitive.sensitive.data.buffer, data, dataLength);
    sensitive.sensitive.userAuth.size = (UINT16)authLength;
    memcpy(sensitive.sensitive.userAuth.buffer, auth, authLength);
    TPM2B_PUBLIC template = {0};
    template.publicArea.type = TPM2_ALG_KEYEDHASH;
    template.publicArea.nameAlg = TPM2_ALG_SHA256;
    template.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_USERWITHAUTH
        | (noDA ? TPMA_OBJECT_NODA : 0);
    template.publicArea.parameters.keyedHashDetail.scheme.scheme = TPM2_ALG_NULL;
    TPM2B_DATA outside = {0};
    TPML_PCR_SELECTION pcrs = {0};
    TPM2B_PRIVATE *private = NULL;
    TPM2B_PUBLIC *public = NULL;
    __typeof__(&Esys_Create) create = (__typeof__(&Esys_Create))CTSS_symbol("libtss2-esys.so.0", "Esys_Create");
    __typeof__(&Tss2_MU_TPM2B_PUBLIC_Marshal) marshalPublic =
        (__typeof__(&Tss2_MU_TPM2B_PUBLIC_Marshal))CTSS_symbol("libtss2-mu.so.0", "Tss2_MU_TPM2B_PUBLIC_Marshal");
    __typeof__(&Tss2_MU_TPM2B_PRIVATE_Marshal) marshalPrivate =
        (__typeof__(&Tss2_MU_TPM2B_PRIVATE_Marshal))CTSS_symbol("libtss2-mu.so.0", "Tss2_MU_TPM2B_PRIVATE_Marshal");
    if (!create || !marshalPublic || !marshalPrivate) return CTSS_MISSING;
    TSS2_RC rc = create(context, primary, session, ESYS_TR_NONE, ESYS_TR_NONE, &sensitive, &template, &outside, &pcrs,
                        &private, &public, NULL, NULL, NULL);
    // The secret and its auth, as they were handed over, are not kept.
    memset(&sensitive, 0, sizeof sensitive);
    if (rc != TSS2_RC_SUCCESS) return rc;
    size_t offset = 0;
    rc = marshalPublic(public, blob, capacity, &offset);
    if (rc == TSS2_RC_SUCCESS) rc = marshalPrivate(private, blob, capacity, &offset);
    *length = offset;
    CTSS_Esys_Free(private);
    CTSS_Esys_Free(public);
    return rc;
}

// Loads a sealed object's blob (as CTSS_seal made it) under `primary`.
static inline TSS2_RC CTSS_load(ESYS_CONTEXT *context, ESYS_TR primary, const uint8_t *blob, size_t length,
                                ESYS_TR *object) {
    TPM2B_PUBLIC public = {0};
    TPM2B_PRIVATE private = {0};
    __typeof__(&Tss2_MU_TPM2B_PUBLIC_Unmarshal) unmarshalPublic =
        (__typeof__(&Tss2_MU_TPM2B_PUBLIC_Unmarshal))CTSS_symbol("libtss2-mu.so.0", "Tss2_MU_TPM2B_PUBLIC_Unmarshal");
    __typeof__(&Tss2_MU_TPM2B_PRIVATE_Unmarshal) unmarshalPrivate =
        (__typeof__(&Tss2_MU_TPM2B_PRIVATE_Unmarshal))CTSS_symbol("libtss2-mu.so.0", "Tss2_MU_TPM2B_PRIVATE_Unmarshal");
    if (!unmarshalPublic || !unmarshalPrivate) return CTSS_MISSING;
    size_t offset = 0;
    TSS2_RC rc = unmarshalPublic(blob, length, &offset, &public);
    if (rc == TSS2_RC_SUCCESS) rc = unmarshalPrivate(blob, length, &offset, &private);
    if (rc != TSS2_RC_SUCCESS) return rc;
    if (offset != length) return TSS2_MU_RC_BAD_SIZE;
    return CTSS_Esys_Load(context, primary, &private, &public, object);
}

// A TPM2B_AUTH of `length` bytes (at most 64).
static inline TSS2_RC CTSS_set_auth(ESYS_CONTEXT *context, ESYS_TR handle, const uint8_t *auth, size_t length) {
    TPM2B_AUTH value = {0};
    if (length > sizeof value.buffer) return TSS2_ESYS_RC_BAD_VALUE;
    value.size = (UINT16)length;
    memcpy(value.buffer, auth, length);
    TSS2_RC rc = CTSS_Esys_TR_SetAuth(context, handle, &value);
    memset(&value, 0, sizeof value);
    return rc;
}

// The 8-byte big-endian value of an NV read, as a number.
static inline uint64_t CTSS_counter_value(const TPM2B_MAX_NV_BUFFER *data) {
    uint64_t value = 0;
    for (UINT16 i = 0; i < data->size && i < 8; i++) value = (value << 8) | data->buffer[i];
    return value;
}

// One tagged property of a TPM2_CAP_TPM_PROPERTIES answer (0 when absent).
static inline uint32_t CTSS_property(const TPMS_CAPABILITY_DATA *data, TPM2_PT property) {
    for (UINT32 i = 0; i < data->data.tpmProperties.count; i++) {
        if (data->data.tpmProperties.tpmProperty[i].property == property) return data->data.tpmProperties.tpmProperty[i].value;
    }
    return 0;
}
#endif
