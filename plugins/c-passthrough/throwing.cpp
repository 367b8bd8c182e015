/*
 * throwing.cpp: a C++ plugin that breaks the native panic contract on
 * purpose (sdk/PLUGIN-ABI.md section 8): its xlfs_describe throws a C++
 * exception out of an `extern "C"` export instead of catching it at the
 * boundary. No host can catch that: the process that loads it aborts
 * ("Rust cannot catch foreign exceptions", or std::terminate). runtime/tests/native_panics.rs builds it with g++
 * and checks that `xlfs volfile check` dies by SIGABRT, naming the
 * exception, while the test process is unaffected.
 *
 * A real C++ plugin declares its exports noexcept, or wraps each body in
 * try { ... } catch (...) { return XLFS_HANDLER_FAILED; }.
 *
 *     g++ -shared -fPIC -O2 -Wall -Wextra -Werror -I sdk/include \
 *         -o libxlfs_cxx_throwing.so plugins/c-passthrough/throwing.cpp
 */
#include <cstdlib>
#include <stdexcept>

#include "xlfs_plugin.h"

XLFS_ABI_VERSION_MARKER

XLFS_EXPORT uint8_t *xlfs_alloc(uint32_t size) {
    return static_cast<uint8_t *>(std::malloc(size ? size : 1));
}

XLFS_EXPORT void xlfs_free(uint8_t *ptr, uint32_t) {
    std::free(ptr);
}

/* The contract broken: an exception leaves an extern "C" export. */
XLFS_EXPORT int32_t xlfs_describe(const xlfs_host *) {
    throw std::runtime_error("xlfs test plugin: C++ exception out of xlfs_describe");
}

/* The rest is never reached (describe is the first export called). */
XLFS_EXPORT xlfs_inst xlfs_init(const xlfs_host *, const uint8_t *, uint32_t) {
    return 0;
}

XLFS_EXPORT int32_t xlfs_on_fop(xlfs_inst, uint64_t, const uint8_t *, uint32_t, uint32_t) {
    return XLFS_HANDLER_FAILED;
}

XLFS_EXPORT int32_t xlfs_on_reply(xlfs_inst, uint64_t, uint64_t, const uint8_t *, uint32_t, uint32_t) {
    return XLFS_HANDLER_FAILED;
}

XLFS_EXPORT int32_t xlfs_on_timer(xlfs_inst, uint64_t) {
    return XLFS_HANDLER_FAILED;
}

XLFS_EXPORT int32_t xlfs_on_event(xlfs_inst, int32_t, const uint8_t *, uint32_t) {
    return XLFS_HANDLER_FAILED;
}

XLFS_EXPORT void xlfs_fini(xlfs_inst) {}
