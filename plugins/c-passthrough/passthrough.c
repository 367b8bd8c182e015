/*
 * c-passthrough: a translator in C against sdk/include/xlfs_plugin.h.
 * Every fop is passed to child 0 with a tail wind (its result goes
 * straight back up), events from the child are passed on.
 *
 * Build it as a shared library for `type plugin/dylib`:
 *     cc -shared -fPIC -O2 -Wall -Wextra -Werror -I sdk/include \
 *        -o libxlfs_c_passthrough.so plugins/c-passthrough/passthrough.c
 * (runtime/tests/plugin_examples.rs does this). The message bytes a fop
 * arrives with have the same framing `wind` takes (PLUGIN-ABI.md section
 * 4), so they are passed on unchanged, without decoding them.
 */
#include <stdlib.h>
#include <string.h>

#include "xlfs_plugin.h"

XLFS_ABI_VERSION_MARKER

/* One instance per graph node. */
struct inst {
    const xlfs_host *host;
};

XLFS_EXPORT uint8_t *xlfs_alloc(uint32_t size) {
    return malloc(size ? size : 1);
}

XLFS_EXPORT void xlfs_free(uint8_t *ptr, uint32_t size) {
    (void)size;
    free(ptr);
}

/* Little-endian writers for the descriptor (sdk/ABI.md section 2). */
static uint8_t *put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put_str(uint8_t *p, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    p = put_u32(p, n);
    memcpy(p, s, n);
    return p + n;
}

XLFS_EXPORT int32_t xlfs_describe(const xlfs_host *host) {
    uint8_t msg[256];
    uint8_t *p = msg;
    p = put_str(p, "c-passthrough");
    p = put_str(p, "passes every fop to its child (written in C)");
    p = put_u32(p, 1);          /* min_children */
    p = put_u32(p, 1);          /* max_children */
    p = put_u32(p, 2);          /* fop mask: two words, every fop (the host keeps the known codes) */
    p = put_u64(p, ~(uint64_t)0);
    p = put_u64(p, ~(uint64_t)0);
    p = put_u64(p, 0);          /* events: none enter (child events pass on by default) */
    p = put_u32(p, 0);          /* no options */
    return xlfs_declare(host, msg, (uint32_t)(p - msg)) < 0 ? -1 : 0;
}

XLFS_EXPORT xlfs_inst xlfs_init(const xlfs_host *host, const uint8_t *opts, uint32_t len) {
    (void)opts;
    (void)len;
    struct inst *in = malloc(sizeof *in);
    if (!in) return 0;
    in->host = host;
    return (xlfs_inst)in;
}

XLFS_EXPORT int32_t xlfs_on_fop(xlfs_inst inst, uint64_t frame, const uint8_t *msg, uint32_t len, uint32_t payload) {
    const xlfs_host *h = ((struct inst *)inst)->host;
    int64_t call = xlfs_wind(h, frame, 0, XLFS_WIND_TAIL, msg, len, payload);
    /* The WRITE data handle stays ours after the wind (the host shares its bytes). */
    if (payload != XLFS_NO_BUF) xlfs_buf_free(h, payload);
    if (call < 0) {
        /* A refused wind already failed the frame with EIO (PLUGIN-ABI.md section 5). */
        static const char why[] = "c-passthrough: wind refused";
        xlfs_log(h, XLFS_LOG_WARN, (const uint8_t *)why, sizeof why - 1);
    }
    return XLFS_HANDLER_OK;
}

XLFS_EXPORT int32_t xlfs_on_reply(xlfs_inst inst, uint64_t frame, uint64_t call, const uint8_t *msg, uint32_t len,
                                  uint32_t payload) {
    /* Tail winds never come back; answer anything else as it came. */
    (void)call;
    return xlfs_unwind(((struct inst *)inst)->host, frame, msg, len, payload) < 0 ? XLFS_HANDLER_FAILED
                                                                                  : XLFS_HANDLER_OK;
}

XLFS_EXPORT int32_t xlfs_on_timer(xlfs_inst inst, uint64_t timer) {
    (void)inst;
    (void)timer;
    return XLFS_HANDLER_OK;
}

XLFS_EXPORT int32_t xlfs_on_event(xlfs_inst inst, int32_t from, const uint8_t *msg, uint32_t len) {
    (void)inst;
    (void)msg;
    (void)len;
    return from == XLFS_FROM_GRAPH ? XLFS_EVENT_STOP : XLFS_EVENT_PASS;
}

XLFS_EXPORT void xlfs_fini(xlfs_inst inst) {
    free((void *)inst);
}
