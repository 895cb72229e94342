#ifndef CTSS_SHIM_H
#define CTSS_SHIM_H
// tpm2-tss, the TPM 2.0 software stack (libtss2-dev): ESAPI (libtss2-esys),
// the TCTI loader (libtss2-tctildr) and the marshalling library
// (libtss2-mu), for the device secret sealed by the TPM (docs/SECURITY.md,
// "Keys sealed by the TPM").
//
// Loaded when first needed, not linked, as libcrypto and libsystemd are:
// libtss2-esys pulls in libcrypto, and their relocations would cost every
// process start (a `keychainfs get`) for a TPM used only at boot and unlock.
// Swift calls the CTSS_ functions below: tpm2-tss's own declarations
// (types and prototypes from its headers), addresses from dlsym, and
// nothing else: the objects, templates and blobs are built in Swift
// (KeychainTPM/TPMObjects.swift; docs/CONTRIBUTING.md,
// "Where a new piece goes").
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
CTSS_ESYS(Esys_TR_Close, (ESYS_CONTEXT *context, ESYS_TR *object), (context, object))
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

// Made under the owner hierarchy (its auth in a password session, as tpm2-tools does).
CTSS_ESYS(Esys_CreatePrimary, (ESYS_CONTEXT *context, TPM2B_SENSITIVE_CREATE const *sensitive,
                               TPM2B_PUBLIC const *template, TPM2B_DATA const *outside,
                               TPML_PCR_SELECTION const *pcrs, ESYS_TR *primary),
          (context, ESYS_TR_RH_OWNER, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, sensitive, template, outside, pcrs,
           primary, NULL, NULL, NULL, NULL))
// Made persistent by the owner hierarchy (its auth in a password session).
CTSS_ESYS(Esys_EvictControl, (ESYS_CONTEXT *context, ESYS_TR object, TPMI_DH_PERSISTENT handle, ESYS_TR *persistent),
          (context, ESYS_TR_RH_OWNER, object, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, handle, persistent))
CTSS_ESYS(Esys_Create, (ESYS_CONTEXT *context, ESYS_TR parent, ESYS_TR session, TPM2B_SENSITIVE_CREATE const *sensitive,
                        TPM2B_PUBLIC const *template, TPM2B_DATA const *outside, TPML_PCR_SELECTION const *pcrs,
                        TPM2B_PRIVATE **private, TPM2B_PUBLIC **public),
          (context, parent, session, ESYS_TR_NONE, ESYS_TR_NONE, sensitive, template, outside, pcrs, private, public,
           NULL, NULL, NULL))
#define CTSS_MU(name, params, args) CTSS_CALL("libtss2-mu.so.0", TSS2_RC, CTSS_MISSING, name, params, args)
CTSS_MU(Tss2_MU_TPM2B_PUBLIC_Marshal, (TPM2B_PUBLIC const *source, uint8_t *buffer, size_t size, size_t *offset),
        (source, buffer, size, offset))
CTSS_MU(Tss2_MU_TPM2B_PRIVATE_Marshal, (TPM2B_PRIVATE const *source, uint8_t *buffer, size_t size, size_t *offset),
        (source, buffer, size, offset))
CTSS_MU(Tss2_MU_TPM2B_PUBLIC_Unmarshal, (uint8_t const *buffer, size_t size, size_t *offset, TPM2B_PUBLIC *target),
        (buffer, size, offset, target))
CTSS_MU(Tss2_MU_TPM2B_PRIVATE_Unmarshal, (uint8_t const *buffer, size_t size, size_t *offset, TPM2B_PRIVATE *target),
        (buffer, size, offset, target))
#endif
