#ifndef CSYSTEMD_SHIM_H
#define CSYSTEMD_SHIM_H
// sd-bus, systemd's D-Bus library (libsystemd-dev), for the Secret Service.
//
// Loaded when first needed, not linked, as libcrypto is (COpenSSL): libsystemd
// is a shared library only, and its relocations would cost every process
// start (a `keychainfs get` in a script's loop) for a bus most runs never
// open. Swift calls the CSystemd_ functions below: sd-bus's own declarations
// (types and prototypes from the header), addresses from dlsym. Only
// non-variadic calls: Swift cannot call C's variadic functions.
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

// libsystemd's symbol `name`, loading the library on first use; NULL if it
// is not installed (libsystemd0 on Debian) or lacks the symbol.
static inline void *CSystemd_symbol(const char *name) {
    void *library = dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
    return library ? dlsym(library, name) : NULL;
}

// Whether libsystemd can be loaded at all.
static inline int CSystemd_available(void) { return CSystemd_symbol("sd_bus_open_user") != NULL; }

// One wrapper per call: sd-bus's prototype, called through dlsym; -ENOSYS
// (or NULL) when libsystemd is missing.
#define CSYSTEMD_CALL(ret, fail, name, params, args) \
    static inline ret CSystemd_##name params { \
        __typeof__(&name) function = (__typeof__(&name))CSystemd_symbol(#name); \
        return function ? function args : fail; \
    }

CSYSTEMD_CALL(int, -ENOSYS, sd_bus_open_user, (sd_bus **bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_new, (sd_bus **bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_set_address, (sd_bus *bus, const char *address), (bus, address))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_set_bus_client, (sd_bus *bus, int b), (bus, b))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_start, (sd_bus *bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_set_fd, (sd_bus *bus, int input_fd, int output_fd), (bus, input_fd, output_fd))
CSYSTEMD_CALL(sd_bus *, NULL, sd_bus_unref, (sd_bus *bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_request_name, (sd_bus *bus, const char *name, uint64_t flags), (bus, name, flags))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_release_name, (sd_bus *bus, const char *name), (bus, name))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_add_fallback,
              (sd_bus *bus, sd_bus_slot **slot, const char *prefix, sd_bus_message_handler_t callback, void *userdata),
              (bus, slot, prefix, callback, userdata))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_add_object,
              (sd_bus *bus, sd_bus_slot **slot, const char *path, sd_bus_message_handler_t callback, void *userdata),
              (bus, slot, path, callback, userdata))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_add_match,
              (sd_bus *bus, sd_bus_slot **slot, const char *match, sd_bus_message_handler_t callback, void *userdata),
              (bus, slot, match, callback, userdata))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_process, (sd_bus *bus, sd_bus_message **r), (bus, r))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_get_fd, (sd_bus *bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_get_events, (sd_bus *bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_get_timeout, (sd_bus *bus, uint64_t *timeout_usec), (bus, timeout_usec))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_flush, (sd_bus *bus), (bus))
CSYSTEMD_CALL(sd_bus *, NULL, sd_bus_flush_close_unref, (sd_bus *bus), (bus))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_send, (sd_bus *bus, sd_bus_message *m, uint64_t *cookie), (bus, m, cookie))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_call,
              (sd_bus *bus, sd_bus_message *m, uint64_t usec, sd_bus_error *ret_error, sd_bus_message **reply),
              (bus, m, usec, ret_error, reply))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_get_unique_name, (sd_bus *bus, const char **unique), (bus, unique))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_set_server, (sd_bus *bus, int b, sd_id128_t server_id), (bus, b, server_id))

CSYSTEMD_CALL(sd_bus_message *, NULL, sd_bus_message_unref, (sd_bus_message *m), (m))
CSYSTEMD_CALL(sd_bus_message *, NULL, sd_bus_message_ref, (sd_bus_message *m), (m))
CSYSTEMD_CALL(const char *, NULL, sd_bus_message_get_path, (sd_bus_message *m), (m))
CSYSTEMD_CALL(const char *, NULL, sd_bus_message_get_interface, (sd_bus_message *m), (m))
CSYSTEMD_CALL(const char *, NULL, sd_bus_message_get_member, (sd_bus_message *m), (m))
CSYSTEMD_CALL(const char *, NULL, sd_bus_message_get_sender, (sd_bus_message *m), (m))
CSYSTEMD_CALL(const char *, NULL, sd_bus_message_get_signature, (sd_bus_message *m, int complete), (m, complete))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_get_type, (sd_bus_message *m, uint8_t *type), (m, type))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_read_basic, (sd_bus_message *m, char type, void *p), (m, type, p))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_read_array, (sd_bus_message *m, char type, const void **ptr, size_t *size),
              (m, type, ptr, size))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_enter_container, (sd_bus_message *m, char type, const char *contents),
              (m, type, contents))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_exit_container, (sd_bus_message *m), (m))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_peek_type, (sd_bus_message *m, char *type, const char **contents),
              (m, type, contents))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_at_end, (sd_bus_message *m, int complete), (m, complete))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_skip, (sd_bus_message *m, const char *types), (m, types))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_rewind, (sd_bus_message *m, int complete), (m, complete))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_seal, (sd_bus_message *m, uint64_t cookie, uint64_t timeout_usec),
              (m, cookie, timeout_usec))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_new_method_return, (sd_bus_message *call, sd_bus_message **m), (call, m))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_new_method_error,
              (sd_bus_message *call, sd_bus_message **m, const sd_bus_error *e), (call, m, e))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_new_signal,
              (sd_bus *bus, sd_bus_message **m, const char *path, const char *interface, const char *member),
              (bus, m, path, interface, member))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_new_method_call,
              (sd_bus *bus, sd_bus_message **m, const char *destination, const char *path, const char *interface,
               const char *member),
              (bus, m, destination, path, interface, member))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_append_basic, (sd_bus_message *m, char type, const void *p), (m, type, p))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_append_array, (sd_bus_message *m, char type, const void *ptr, size_t size),
              (m, type, ptr, size))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_open_container, (sd_bus_message *m, char type, const char *contents),
              (m, type, contents))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_close_container, (sd_bus_message *m), (m))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_message_sensitive, (sd_bus_message *m), (m))

CSYSTEMD_CALL(int, -ENOSYS, sd_bus_query_sender_creds, (sd_bus_message *m, uint64_t mask, sd_bus_creds **creds),
              (m, mask, creds))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_get_name_creds, (sd_bus *bus, const char *name, uint64_t mask, sd_bus_creds **creds),
              (bus, name, mask, creds))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_creds_get_pid, (sd_bus_creds *c, pid_t *pid), (c, pid))
CSYSTEMD_CALL(int, -ENOSYS, sd_bus_creds_get_euid, (sd_bus_creds *c, uid_t *uid), (c, uid))
CSYSTEMD_CALL(sd_bus_creds *, NULL, sd_bus_creds_unref, (sd_bus_creds *c), (c))
CSYSTEMD_CALL(sd_bus_slot *, NULL, sd_bus_slot_unref, (sd_bus_slot *slot), (slot))
// A void function: its own wrapper (the macro returns a value).
static inline void CSystemd_sd_bus_error_free(sd_bus_error *e) {
    __typeof__(&sd_bus_error_free) function = (__typeof__(&sd_bus_error_free))CSystemd_symbol("sd_bus_error_free");
    if (function) function(e);
}

// The flags and masks are macros or enums Swift imports awkwardly: kept here.
static const uint64_t CSystemd_name_replace_existing = SD_BUS_NAME_REPLACE_EXISTING;
static const uint64_t CSystemd_name_allow_replacement = SD_BUS_NAME_ALLOW_REPLACEMENT;
static const uint64_t CSystemd_name_queue = SD_BUS_NAME_QUEUE;
static const uint64_t CSystemd_creds_pid = SD_BUS_CREDS_PID;
static const uint64_t CSystemd_creds_euid = SD_BUS_CREDS_EUID;
static const uint64_t CSystemd_creds_augment = SD_BUS_CREDS_AUGMENT;
#endif
