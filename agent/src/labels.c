/* labels.c - the configuration's instance labels as a LABELS section (ki_labels.h). */
#include "ki_labels.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ki_varint.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static const char *const RESERVED[] = KI_RESERVED_LABELS;

static int bad(char *err, size_t errlen, const char *what, const char *item, size_t len) {
    snprintf(err, errlen, "labels: %s in \"%.*s\"", what, (int)(len > 80 ? 80 : len), item);
    return -EINVAL;
}

static int name_ok(const char *s, size_t n) {
    if (n == 0 || (n >= 2 && s[0] == '_' && s[1] == '_')) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return 0;
    }
    return 1;
}

static int parse(struct ki_labels *l, const char *text, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    uint8_t body[KI_LABELS_SECTION_MAX];
    size_t blen = 0;
    const char *names[KI_LABELS_MAX];
    size_t name_lens[KI_LABELS_MAX];
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        p = *end ? end + 1 : end;
        if (a == b) continue; /* "a=b,,c=d" or a trailing comma */
        const char *eq = memchr(a, '=', (size_t)(b - a));
        if (!eq) return bad(err, errlen, "expected name=value", a, (size_t)(b - a));
        size_t nlen = (size_t)(eq - a), vlen = (size_t)(b - eq - 1);
        if (!name_ok(a, nlen))
            return bad(err, errlen, "invalid label name (expected [a-zA-Z_][a-zA-Z0-9_]*, not __-prefixed)", a, nlen);
        for (size_t i = 0; i < sizeof RESERVED / sizeof RESERVED[0]; i++)
            if (strlen(RESERVED[i]) == nlen && memcmp(RESERVED[i], a, nlen) == 0)
                return bad(err, errlen, "label set by the collector itself", a, nlen);
        if (vlen == 0 || vlen > KI_LABEL_VALUE_MAX || memchr(eq + 1, '\n', vlen) || memchr(eq + 1, '\r', vlen))
            return bad(err, errlen, "the value must be 1-" STR(KI_LABEL_VALUE_MAX) " bytes on one line", a, (size_t)(b - a));
        for (unsigned i = 0; i < l->n; i++)
            if (name_lens[i] == nlen && memcmp(names[i], a, nlen) == 0)
                return bad(err, errlen, "label given twice", a, nlen);
        if (l->n == KI_LABELS_MAX) return bad(err, errlen, "more than " STR(KI_LABELS_MAX) " labels", text, strlen(text));
        names[l->n] = a;
        name_lens[l->n] = nlen;
        l->n++;
        blen += ki_varint_put(body + blen, nlen);
        memcpy(body + blen, a, nlen);
        blen += nlen;
        blen += ki_varint_put(body + blen, vlen);
        memcpy(body + blen, eq + 1, vlen);
        blen += vlen;
    }
    if (!l->n) return 0;
    uint8_t *s = l->section;
    size_t off = 0;
    s[off++] = KI_SECTION_LABELS;
    uint8_t count[10];
    size_t clen = ki_varint_put(count, l->n);
    off += ki_varint_put(s + off, clen + blen);
    memcpy(s + off, count, clen);
    off += clen;
    memcpy(s + off, body, blen);
    l->len = off + blen;
    return 0;
}

int ki_labels_parse(struct ki_labels *l, const char *text, char *err, size_t errlen) {
    int rc = parse(l, text, err, errlen);
    if (rc < 0) memset(l, 0, sizeof *l); /* refused: nothing set, no section */
    return rc;
}

size_t ki_labels_section(const struct ki_labels *l, uint8_t *out, size_t cap) {
    if (!l->n || cap < l->len) return 0;
    memcpy(out, l->section, l->len);
    return l->len;
}
