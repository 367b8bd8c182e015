/*
 * xlfs plugin ABI v1.2 -- the C statement of sdk/PLUGIN-ABI.md.
 *
 * One source builds as a core WebAssembly module (clang --target=wasm32,
 * -nostdlib -Wl,--no-entry -Wl,--export-dynamic) and as a native shared
 * library (cc -shared -fPIC). Host functions are called through the
 * xlfs_*() inline wrappers below, which take the `const xlfs_host *` the
 * plugin received in xlfs_describe / xlfs_init: on WebAssembly they call
 * the imports of module "xlfs" (the host pointer is 0 and ignored), natively
 * they call through the vtable. Messages are encoded as sdk/ABI.md says;
 * the framing is in sdk/PLUGIN-ABI.md.
 *
 * A plugin defines every function listed under "Exports" and the version
 * marker XLFS_ABI_VERSION_MARKER (v1.0: a translator). A policy module
 * (v1.1, PLUGIN-ABI.md section 11) uses XLFS_ABI_VERSION_MARKER_1_1 instead
 * and defines, besides, every function of one or both groups under
 * "Policy exports". A plugin that defines xlfs_dump and/or
 * xlfs_reconfigure ("Dump and reconfigure exports", v1.2) uses
 * XLFS_ABI_VERSION_MARKER_1_2 (which also allows the policy exports).
 *
 * Panics and exceptions (PLUGIN-ABI.md section 8): nothing may unwind out
 * of an export. A C++ plugin declares its exports noexcept or catches
 * everything at the boundary (catch (...) { return XLFS_HANDLER_FAILED; });
 * an exception that escapes an export aborts the whole process ("Rust
 * cannot catch foreign exceptions", or std::terminate), whatever the host
 * does. XLFS_HANDLER_FAILED is the way
 * to report a failure: the host treats it as a crashed instance (that
 * fop fails with EIO, the instance is made again, the mount stays up).
 */
#ifndef XLFS_PLUGIN_H
#define XLFS_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XLFS_ABI_MAJOR 1
#define XLFS_ABI_MINOR 4

/* Defines the version marker export, xlfs_abi_version_1_0 (or, for a
 * module with policy exports, xlfs_abi_version_1_1; with dump or
 * reconfigure exports, xlfs_abi_version_1_2; passing fops or replies on
 * "as they came", xlfs_abi_version_1_3; declaring a placement after the
 * descriptor's options, xlfs_abi_version_1_4). Use one, once. */
#if defined(__wasm__)
#define XLFS_EXPORT __attribute__((visibility("default"), used))
#else
#define XLFS_EXPORT __attribute__((visibility("default")))
#endif
#ifdef __cplusplus
#define XLFS_EXTERN_C extern "C"
#else
#define XLFS_EXTERN_C
#endif
#define XLFS_ABI_VERSION_MARKER XLFS_EXTERN_C XLFS_EXPORT void xlfs_abi_version_1_0(void) {}
#define XLFS_ABI_VERSION_MARKER_1_1 XLFS_EXTERN_C XLFS_EXPORT void xlfs_abi_version_1_1(void) {}
#define XLFS_ABI_VERSION_MARKER_1_2 XLFS_EXTERN_C XLFS_EXPORT void xlfs_abi_version_1_2(void) {}
#define XLFS_ABI_VERSION_MARKER_1_3 XLFS_EXTERN_C XLFS_EXPORT void xlfs_abi_version_1_3(void) {}
#define XLFS_ABI_VERSION_MARKER_1_4 XLFS_EXTERN_C XLFS_EXPORT void xlfs_abi_version_1_4(void) {}

/* Descriptor placement byte (v1.4, after the options; leave it out for top):
 * where a volume's generated client graph puts the plugin. */
#define XLFS_PLACEMENT_TOP 0u
#define XLFS_PLACEMENT_CLUSTER 1u

/* wind flag: the frame ends with this call (its result goes straight up). */
#define XLFS_WIND_TAIL 1u
/* wind flag (v1.3): the frame's own fop as it arrived, as its caller; the
 * message must be empty (len 0): the host reuses what it decoded. An
 * unwind with an empty message inside xlfs_on_reply answers with the
 * result being delivered, as it came (PLUGIN-ABI.md section 5). */
#define XLFS_WIND_AS_IS 2u
/* The buffer handle meaning "none". */
#define XLFS_NO_BUF 0u
/* xlfs_on_event's `from` for an event from the graph. */
#define XLFS_FROM_GRAPH (-1)
/* xlfs_on_event results. */
#define XLFS_EVENT_PASS 1
#define XLFS_EVENT_STOP 0
/* Handler results: done, or failed (the host treats it as a crash). */
#define XLFS_HANDLER_OK 0
#define XLFS_HANDLER_FAILED (-1)
/* Descriptor max_children meaning "no limit". */
#define XLFS_UNLIMITED_CHILDREN 0xFFFFFFFFu

/* log levels */
#define XLFS_LOG_ERROR 1u
#define XLFS_LOG_WARN 2u
#define XLFS_LOG_INFO 3u
#define XLFS_LOG_DEBUG 4u
#define XLFS_LOG_TRACE 5u

/* The guest's instance token, returned by xlfs_init (0 = failure). */
typedef uintptr_t xlfs_inst;

/*
 * The native host: function pointers, each taking `ctx` first. Passed to
 * xlfs_describe and xlfs_init; valid until xlfs_fini returns. Fields are
 * only appended by minor versions: check `size` before using a field newer
 * than v1.0. On WebAssembly the host passes a null pointer instead.
 */
typedef struct xlfs_host {
    uint32_t size;
    uint16_t major;
    uint16_t minor;
    void *ctx;
    int64_t (*wind)(void *ctx, uint64_t frame, uint32_t child, uint32_t flags, const uint8_t *msg, uint32_t len,
                    uint32_t payload);
    int32_t (*unwind)(void *ctx, uint64_t frame, const uint8_t *msg, uint32_t len, uint32_t payload);
    int64_t (*timer_set)(void *ctx, uint64_t delay_ms);
    int32_t (*timer_cancel)(void *ctx, uint64_t timer);
    int32_t (*inode_ctx_get)(void *ctx, const uint8_t *gfid16, uint64_t *out);
    int32_t (*inode_ctx_set)(void *ctx, const uint8_t *gfid16, uint64_t value);
    int32_t (*inode_ctx_del)(void *ctx, const uint8_t *gfid16);
    int32_t (*fd_ctx_get)(void *ctx, uint64_t fd, uint64_t *out);
    int32_t (*fd_ctx_set)(void *ctx, uint64_t fd, uint64_t value);
    int32_t (*fd_ctx_del)(void *ctx, uint64_t fd);
    void (*log)(void *ctx, uint32_t level, const uint8_t *msg, uint32_t len);
    uint64_t (*now_ns)(void *ctx);
    int64_t (*buf_len)(void *ctx, uint32_t buf);
    int64_t (*buf_read)(void *ctx, uint32_t buf, uint64_t offset, uint8_t *dst, uint32_t len);
    int64_t (*buf_new)(void *ctx, const uint8_t *src, uint32_t len);
    int64_t (*buf_slice)(void *ctx, uint32_t buf, uint64_t offset, uint64_t len);
    int32_t (*buf_free)(void *ctx, uint32_t buf);
    int32_t (*declare)(void *ctx, const uint8_t *msg, uint32_t len);
} xlfs_host;

/* ---- Exports: the plugin defines these (see PLUGIN-ABI.md section 3). ---- */

/* Memory for the host to write messages into (WebAssembly); null on failure. */
XLFS_EXPORT uint8_t *xlfs_alloc(uint32_t size);
XLFS_EXPORT void xlfs_free(uint8_t *ptr, uint32_t size);
/* Calls xlfs_declare() once with the descriptor; 0, or negative. */
XLFS_EXPORT int32_t xlfs_describe(const xlfs_host *host);
/* Options: an encoded Dict of Str values. Returns a token, 0 on failure. */
XLFS_EXPORT xlfs_inst xlfs_init(const xlfs_host *host, const uint8_t *opts, uint32_t len);
/* A fop message (u32 ctx_len, CallCtx, Request); WRITE data as `payload`. */
XLFS_EXPORT int32_t xlfs_on_fop(xlfs_inst inst, uint64_t frame, const uint8_t *msg, uint32_t len, uint32_t payload);
/* An encoded Result of call `call` wound from `frame`; READ data as `payload`. */
XLFS_EXPORT int32_t xlfs_on_reply(xlfs_inst inst, uint64_t frame, uint64_t call, const uint8_t *msg, uint32_t len,
                                  uint32_t payload);
XLFS_EXPORT int32_t xlfs_on_timer(xlfs_inst inst, uint64_t timer);
/* An encoded Event from child `from` (or XLFS_FROM_GRAPH); XLFS_EVENT_PASS/STOP. */
XLFS_EXPORT int32_t xlfs_on_event(xlfs_inst inst, int32_t from, const uint8_t *msg, uint32_t len);
XLFS_EXPORT void xlfs_fini(xlfs_inst inst);

/* ---- Policy exports (v1.1, PLUGIN-ABI.md section 11) --------------------
 * Optional; a module provides a policy when it defines every function of
 * its group. The host calls them synchronously, one at a time; they must
 * return quickly. -1 (XLFS_HANDLER_FAILED) is a failure: the built-in
 * default decides instead. */

/* Read-ahead. A new stream for an fd: its id (> 0) or a negative errno. */
XLFS_EXPORT int64_t xlfs_ra_open(xlfs_inst inst, uint64_t page_size, uint32_t page_count);
/* A read of the stream: write the advice (encoding below) to out (cap bytes,
 * at least XLFS_MAX_ADVICE) and return its length, or a negative errno. */
XLFS_EXPORT int32_t xlfs_ra_read(xlfs_inst inst, uint64_t stream, uint64_t offset, uint64_t size, uint64_t at_ns,
                                 uint8_t *out, uint32_t cap);
/* The translator emptied the stream's cache (maybe with a new geometry). */
XLFS_EXPORT int32_t xlfs_ra_reset(xlfs_inst inst, uint64_t stream, uint64_t page_size, uint32_t page_count);
/* The fd is released; the stream id is not used again. */
XLFS_EXPORT int32_t xlfs_ra_close(xlfs_inst inst, uint64_t stream);

/* Lock contention. The counts wanted: XLFS_LOCK_WANTS_* bits. */
XLFS_EXPORT int32_t xlfs_lock_interest(xlfs_inst inst);
/* A decision after lock event `event` (1..8, PLUGIN-ABI.md section 11) given
 * the encoded view (XLFS_LOCK_VIEW_LEN bytes or more): XLFS_LOCK_KEEP,
 * XLFS_LOCK_RELEASE_NOW, or n >= 2: release within n - 1 milliseconds. */
XLFS_EXPORT int64_t xlfs_lock_decide(xlfs_inst inst, uint32_t event, const uint8_t *view, uint32_t len);

/* ---- Dump and reconfigure exports (v1.2, PLUGIN-ABI.md section 12) ------
 * Each optional; the host probes for it. */

/* The instance's own state (counters, settings) for `xlfs status --dump`:
 * an encoded Dict (sdk/ABI.md section 3) of Str values written to out.
 * Returns the encoding's length; a length above cap means nothing was
 * written and the host calls again with at least that much room (up to
 * XLFS_MAX_DUMP). XLFS_HANDLER_FAILED is a crash; another negative errno
 * means nothing to report. */
XLFS_EXPORT int32_t xlfs_dump(xlfs_inst inst, uint8_t *out, uint32_t cap);
/* New options for the running instance on a volfile reload, already
 * validated against the declarations, encoded as xlfs_init gets them.
 * 0: applied (all of them); XLFS_RECONFIGURE_UNSUPPORTED: cannot, the host
 * makes a new instance with them instead; another negative errno: refused
 * (log why at error level first, naming the option), the old options stay;
 * XLFS_HANDLER_FAILED is a crash (the old options stay too). */
XLFS_EXPORT int32_t xlfs_reconfigure(xlfs_inst inst, const uint8_t *opts, uint32_t len);
#define XLFS_MAX_DUMP (1u << 20)
#define XLFS_RECONFIGURE_UNSUPPORTED (-95) /* -EOPNOTSUPP */

/* Advice: u8 reset (0/1); u32 n, n x (u64 offset, u64 len) to prefetch;
 * u32 m, m x (u64 offset, u64 len) to drop; little-endian. */
#define XLFS_MAX_ADVICE_RANGES 64u
#define XLFS_MAX_ADVICE (1u + 2u * (4u + XLFS_MAX_ADVICE_RANGES * 16u))
/* View: gfid[16], u8 held, u8 contended, u32 local_open_fds, u32
 * brick_open_fds, u32 inodelk_count, u32 in_flight, u64 txns, u64 held_ms. */
#define XLFS_LOCK_VIEW_LEN 50u
#define XLFS_LOCK_WANTS_INODELK_COUNT 1
#define XLFS_LOCK_WANTS_OPEN_FD_COUNT 2
#define XLFS_LOCK_KEEP 0
#define XLFS_LOCK_RELEASE_NOW 1

/* ---- Host functions (PLUGIN-ABI.md section 5). ---- */

#if defined(__wasm__)
#define XLFS_IMPORT(name) __attribute__((import_module("xlfs"), import_name(#name)))
XLFS_IMPORT(wind) int64_t xlfs__wind(uint64_t, uint32_t, uint32_t, const uint8_t *, uint32_t, uint32_t);
XLFS_IMPORT(unwind) int32_t xlfs__unwind(uint64_t, const uint8_t *, uint32_t, uint32_t);
XLFS_IMPORT(timer_set) int64_t xlfs__timer_set(uint64_t);
XLFS_IMPORT(timer_cancel) int32_t xlfs__timer_cancel(uint64_t);
XLFS_IMPORT(inode_ctx_get) int32_t xlfs__inode_ctx_get(const uint8_t *, uint64_t *);
XLFS_IMPORT(inode_ctx_set) int32_t xlfs__inode_ctx_set(const uint8_t *, uint64_t);
XLFS_IMPORT(inode_ctx_del) int32_t xlfs__inode_ctx_del(const uint8_t *);
XLFS_IMPORT(fd_ctx_get) int32_t xlfs__fd_ctx_get(uint64_t, uint64_t *);
XLFS_IMPORT(fd_ctx_set) int32_t xlfs__fd_ctx_set(uint64_t, uint64_t);
XLFS_IMPORT(fd_ctx_del) int32_t xlfs__fd_ctx_del(uint64_t);
XLFS_IMPORT(log) void xlfs__log(uint32_t, const uint8_t *, uint32_t);
XLFS_IMPORT(now_ns) uint64_t xlfs__now_ns(void);
XLFS_IMPORT(buf_len) int64_t xlfs__buf_len(uint32_t);
XLFS_IMPORT(buf_read) int64_t xlfs__buf_read(uint32_t, uint64_t, uint8_t *, uint32_t);
XLFS_IMPORT(buf_new) int64_t xlfs__buf_new(const uint8_t *, uint32_t);
XLFS_IMPORT(buf_slice) int64_t xlfs__buf_slice(uint32_t, uint64_t, uint64_t);
XLFS_IMPORT(buf_free) int32_t xlfs__buf_free(uint32_t);
XLFS_IMPORT(declare) int32_t xlfs__declare(const uint8_t *, uint32_t);
#define XLFS_CALL(h, name, ...) ((void)(h), xlfs__##name(__VA_ARGS__))
#define XLFS_CALL0(h, name) ((void)(h), xlfs__##name())
#else
#define XLFS_CALL(h, name, ...) ((h)->name((h)->ctx, __VA_ARGS__))
#define XLFS_CALL0(h, name) ((h)->name((h)->ctx))
#endif

/* Winds a fop message to child `child` for `frame` (0: detached); the call id, or -errno. */
static inline int64_t xlfs_wind(const xlfs_host *h, uint64_t frame, uint32_t child, uint32_t flags, const uint8_t *msg,
                                uint32_t len, uint32_t payload) {
    return XLFS_CALL(h, wind, frame, child, flags, msg, len, payload);
}
/* Answers `frame` with an encoded Result; 0 or -errno. */
static inline int32_t xlfs_unwind(const xlfs_host *h, uint64_t frame, const uint8_t *msg, uint32_t len,
                                  uint32_t payload) {
    return XLFS_CALL(h, unwind, frame, msg, len, payload);
}
static inline int64_t xlfs_timer_set(const xlfs_host *h, uint64_t delay_ms) {
    return XLFS_CALL(h, timer_set, delay_ms);
}
static inline int32_t xlfs_timer_cancel(const xlfs_host *h, uint64_t timer) {
    return XLFS_CALL(h, timer_cancel, timer);
}
/* 1 and *out set, 0 if no value, or -errno. */
static inline int32_t xlfs_inode_ctx_get(const xlfs_host *h, const uint8_t gfid[16], uint64_t *out) {
    return XLFS_CALL(h, inode_ctx_get, gfid, out);
}
static inline int32_t xlfs_inode_ctx_set(const xlfs_host *h, const uint8_t gfid[16], uint64_t value) {
    return XLFS_CALL(h, inode_ctx_set, gfid, value);
}
static inline int32_t xlfs_inode_ctx_del(const xlfs_host *h, const uint8_t gfid[16]) {
    return XLFS_CALL(h, inode_ctx_del, gfid);
}
static inline int32_t xlfs_fd_ctx_get(const xlfs_host *h, uint64_t fd, uint64_t *out) {
    return XLFS_CALL(h, fd_ctx_get, fd, out);
}
static inline int32_t xlfs_fd_ctx_set(const xlfs_host *h, uint64_t fd, uint64_t value) {
    return XLFS_CALL(h, fd_ctx_set, fd, value);
}
static inline int32_t xlfs_fd_ctx_del(const xlfs_host *h, uint64_t fd) {
    return XLFS_CALL(h, fd_ctx_del, fd);
}
static inline void xlfs_log(const xlfs_host *h, uint32_t level, const uint8_t *msg, uint32_t len) {
    XLFS_CALL(h, log, level, msg, len);
}
static inline uint64_t xlfs_now_ns(const xlfs_host *h) {
    return XLFS_CALL0(h, now_ns);
}
static inline int64_t xlfs_buf_len(const xlfs_host *h, uint32_t buf) {
    return XLFS_CALL(h, buf_len, buf);
}
/* Copies up to `len` bytes from `offset` into `dst`; how many, or -errno. */
static inline int64_t xlfs_buf_read(const xlfs_host *h, uint32_t buf, uint64_t offset, uint8_t *dst, uint32_t len) {
    return XLFS_CALL(h, buf_read, buf, offset, dst, len);
}
static inline int64_t xlfs_buf_new(const xlfs_host *h, const uint8_t *src, uint32_t len) {
    return XLFS_CALL(h, buf_new, src, len);
}
/* A new handle on a sub-range, sharing the bytes (no copy). */
static inline int64_t xlfs_buf_slice(const xlfs_host *h, uint32_t buf, uint64_t offset, uint64_t len) {
    return XLFS_CALL(h, buf_slice, buf, offset, len);
}
static inline int32_t xlfs_buf_free(const xlfs_host *h, uint32_t buf) {
    return XLFS_CALL(h, buf_free, buf);
}
/* Only during xlfs_describe: hands the descriptor (PLUGIN-ABI.md section 6) over. */
static inline int32_t xlfs_declare(const xlfs_host *h, const uint8_t *msg, uint32_t len) {
    return XLFS_CALL(h, declare, msg, len);
}

#ifdef __cplusplus
}
#endif

#endif /* XLFS_PLUGIN_H */
