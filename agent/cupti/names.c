/* names.c - kernel names users can read: demangled, without return type or parameters, short
 * enough for the ring (docs/probes.md, "CUPTI activity probe"). */
#define _GNU_SOURCE
#include "ki_cupti.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef char *(*ki_demangle_fn)(const char *mangled, char *out, size_t *len, int *status);

/* libstdc++'s __cxa_demangle: the process's own when it has one (PyTorch does), else loaded once. */
static ki_demangle_fn ki_cupti_demangler(void) {
    static ki_demangle_fn fn;
    static int looked;
    if (__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) return fn;
    void *f = dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (!f) {
        void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
        if (h) f = dlsym(h, "__cxa_demangle");
    }
    if (!f) ki_cupti_log(KI_LOG_NAME, "no __cxa_demangle (libstdc++.so.6): kernel names stay mangled");
    memcpy(&fn, &f, sizeof fn);
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    return fn;
}

/* Index of the '(' that opens the parameter list ending the name, or len when there is none. */
static size_t params_start(const char *s, size_t len) {
    size_t end = len;
    while (end > 0 && s[end - 1] == ' ') end--;
    if (end >= 6 && memcmp(s + end - 6, " const", 6) == 0) end -= 6;
    if (end == 0 || s[end - 1] != ')') return len;
    int depth = 0;
    for (size_t i = end; i-- > 0;) {
        if (s[i] == ')') depth++;
        else if (s[i] == '(' && --depth == 0) return i > 0 ? i : len; /* "(anonymous)" alone: keep */
    }
    return len;
}

/* Start of the name after a return type: just past the last space outside <> and (). */
static size_t after_return_type(const char *s, size_t len) {
    int angle = 0, paren = 0;
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '<') angle++;
        else if (c == '>' && angle > 0) angle--;
        else if (c == '(') paren++;
        else if (c == ')' && paren > 0) paren--;
        else if (c == ' ' && angle == 0 && paren == 0) start = i + 1;
    }
    return start < len ? start : 0;
}

/* Copy s into out keeping template arguments down to keep levels, deeper ones as "<...>". */
static size_t collapse(const char *s, size_t len, char *out, size_t out_size, int keep) {
    size_t n = 0;
    int depth = 0;
    for (size_t i = 0; i < len && n + 6 < out_size; i++) {
        char c = s[i];
        if (c == '<') {
            if (depth == keep) {
                memcpy(out + n, "<...>", 5);
                n += 5;
            } else if (depth < keep) {
                out[n++] = c;
            }
            depth++;
        } else if (c == '>' && depth > 0) {
            depth--;
            if (depth < keep) out[n++] = c;
        } else if (depth <= keep) {
            out[n++] = c;
        }
    }
    out[n] = '\0';
    return n;
}

size_t ki_cupti_name_short(const char *raw, char *out, size_t out_size, size_t max) {
    if (out_size < 8) return 0;
    if (max + 1 > out_size) max = out_size - 1;
    if (max < 8) max = 8;
    if (!raw) raw = "(unnamed kernel)";
    char *demangled = NULL;
    const char *s = raw;
    if (raw[0] == '_' && raw[1] == 'Z') {
        ki_demangle_fn dm = ki_cupti_demangler();
        int status = -1;
        if (dm) demangled = dm(raw, NULL, NULL, &status);
        if (demangled && status == 0) s = demangled;
    }
    size_t len = strlen(s);
    const char *clone = strstr(s, " [clone");
    if (clone) len = (size_t)(clone - s);
    len = params_start(s, len);
    size_t start = after_return_type(s, len);
    s += start;
    len -= start;
    size_t n;
    if (len <= max) {
        memcpy(out, s, len);
        out[len] = '\0';
        n = len;
    } else {
        /* Too long: nested template arguments go first, then all of them, then the tail. */
        char *tmp = malloc(len * 3 + 8); /* "<>" becomes "<...>" */
        n = 0;
        if (tmp) {
            for (int keep = 1; keep >= 0; keep--) {
                n = collapse(s, len, tmp, len * 3 + 8, keep);
                if (n <= max) break;
            }
            if (n > max) {
                memcpy(tmp + max - 3, "...", 3);
                n = max;
            }
            memcpy(out, tmp, n);
            out[n] = '\0';
            free(tmp);
        } else {
            memcpy(out, s, max - 3);
            memcpy(out + max - 3, "...", 4);
            n = max;
        }
    }
    for (size_t i = 0; i < n; i++) /* symbol names are ASCII: anything else is not a name's */
        if ((unsigned char)out[i] < 0x20 || (unsigned char)out[i] >= 0x7f) out[i] = '?';
    free(demangled);
    return n;
}
