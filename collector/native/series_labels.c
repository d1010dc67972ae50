/*
 * series_labels(buf, spans, max_labels, max_name_bytes, max_value_bytes, utf8_names): per
 * (start, end) int64 pair of spans, the label fields buf[start:end] of one TimeSeries as
 * (labels, fingerprint, metric name), or None.
 *
 * labels is the tuple collector/rows.py's canonical_labels makes of them (sorted by name,
 * empty values left out), fingerprint its series_fingerprint (BLAKE2b-64 of name 0xFF value
 * 0xFE ..., little-endian) and name the __name__ value. None stands for anything this does
 * not take: an encoding other than Prometheus' (a Label of field 1 then field 2), more labels
 * than it holds, and every series the Python checks refuse (bad UTF-8, a repeated or empty
 * name, no metric name, a limit or a name rule broken). The caller runs the Python path on
 * those, which returns the same labels or raises the error a sender reads, so what this
 * accepts is exactly what the Python path accepts, and nothing it refuses needs a message.
 */
#include "series_labels.h"

#include <stdint.h>
#include <string.h>

#include "ki_blake2b.h"

/* Labels one series may have here; more go the Python way. */
#define MAX_PARSED 128

typedef struct {
    const uint8_t *name, *value;
    Py_ssize_t name_len, value_len;
} Label;

typedef struct {
    Py_ssize_t max_labels, max_name_bytes, max_value_bytes;
    int utf8_names;
} Limits;

/* A varint at *pos (before end) into *v; 0 when truncated or longer than 10 bytes. */
static int read_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, uint64_t *v)
{
    uint64_t out = 0;
    for (int k = 0; k < 10; k++) {
        if (*pos >= end)
            return 0;
        uint8_t b = buf[(*pos)++];
        out |= (uint64_t)(b & 0x7F) << (7 * k);
        if (b < 0x80) {
            *v = out;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field of tag `tag` at *pos: its bytes; 0 when the tag differs or it is cut short. */
static int read_bytes(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, uint8_t tag, const uint8_t **p,
                      Py_ssize_t *n)
{
    if (*pos >= end || buf[*pos] != tag)
        return 0;
    Py_ssize_t at = *pos + 1;
    uint64_t len;
    if (!read_varint(buf, &at, end, &len) || len > (uint64_t)(end - at))
        return 0;
    *p = buf + at;
    *n = (Py_ssize_t)len;
    *pos = at + (Py_ssize_t)len;
    return 1;
}

/* Valid UTF-8 as Python's strict decoder takes it (no overlongs, no surrogates, <= U+10FFFF). */
static int valid_utf8(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i - 1 < need)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += need + 1;
    }
    return 1;
}

static int bytes_cmp(const uint8_t *a, Py_ssize_t an, const uint8_t *b, Py_ssize_t bn)
{
    int c = memcmp(a, b, (size_t)(an < bn ? an : bn));
    return c ? c : (an > bn) - (an < bn);
}

static int is_name(const Label *l)
{
    return l->name_len == 8 && memcmp(l->name, "__name__", 8) == 0;
}

/* rows.py's _METRIC_NAME_RE ([a-zA-Z_:][a-zA-Z0-9_:]*), or, colon false, _LABEL_NAME_RE. */
static int classic(const uint8_t *s, Py_ssize_t n, int colon)
{
    if (n == 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

/* The series' labels sorted by name with the empty values left out (into kept, *nkept); 0 when
 * the Python path must take it. */
static int canonical(const uint8_t *buf, Py_ssize_t start, Py_ssize_t end, const Limits *lim, Label *kept,
                     Py_ssize_t *nkept)
{
    Label all[MAX_PARSED];
    Py_ssize_t n = 0, pos = start;
    while (pos < end) {
        const uint8_t *body;
        Py_ssize_t body_len;
        if (n == MAX_PARSED || !read_bytes(buf, &pos, end, 0x0A, &body, &body_len))
            return 0;
        Py_ssize_t p = 0;
        Label *l = &all[n++];
        if (!read_bytes(body, &p, body_len, 0x0A, &l->name, &l->name_len))
            return 0; /* no name field first: rare encodings and empty names, the Python way */
        l->value = (const uint8_t *)"";
        l->value_len = 0;
        if (p < body_len && !read_bytes(body, &p, body_len, 0x12, &l->value, &l->value_len))
            return 0;
        if (p != body_len)
            return 0;
        if (!valid_utf8(l->name, l->name_len) || !valid_utf8(l->value, l->value_len))
            return 0;
    }
    /* Insertion sort by name (a series has tens of labels, mostly in order already). */
    for (Py_ssize_t i = 1; i < n; i++) {
        Label x = all[i];
        Py_ssize_t j = i;
        while (j > 0 && bytes_cmp(all[j - 1].name, all[j - 1].name_len, x.name, x.name_len) > 0) {
            all[j] = all[j - 1];
            j--;
        }
        all[j] = x;
    }
    int has_name = 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && bytes_cmp(all[i - 1].name, all[i - 1].name_len, all[i].name, all[i].name_len) == 0)
            return 0; /* a repeated name */
        if (all[i].value_len == 0)
            continue;
        const Label *l = &all[i];
        int metric = is_name(l);
        has_name |= metric;
        if (l->name_len == 0)
            return 0; /* an empty name with a value */
        if (lim->max_name_bytes && l->name_len > lim->max_name_bytes)
            return 0;
        if (metric ? (lim->max_name_bytes && l->value_len > lim->max_name_bytes)
                   : (lim->max_value_bytes && l->value_len > lim->max_value_bytes))
            return 0;
        if (!lim->utf8_names && !(metric ? classic(l->value, l->value_len, 1) : classic(l->name, l->name_len, 0)))
            return 0;
        kept[k++] = *l;
    }
    if (!has_name || (lim->max_labels && k > lim->max_labels))
        return 0;
    *nkept = k;
    return 1;
}

/* series_fingerprint of kept into *fp; 0 when out of memory. */
static int fingerprint(const Label *kept, Py_ssize_t n, uint8_t *scratch, size_t cap, uint64_t *fp)
{
    size_t len = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        len += (size_t)kept[i].name_len + (size_t)kept[i].value_len + 2;
    uint8_t *msg = len <= cap ? scratch : PyMem_RawMalloc(len);
    if (msg == NULL)
        return 0;
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(msg + at, kept[i].name, (size_t)kept[i].name_len);
        at += (size_t)kept[i].name_len;
        msg[at++] = 0xFF;
        memcpy(msg + at, kept[i].value, (size_t)kept[i].value_len);
        at += (size_t)kept[i].value_len;
        msg[at++] = 0xFE;
    }
    uint8_t digest[8];
    ki_blake2b_hash(digest, sizeof(digest), msg, len);
    if (msg != scratch)
        PyMem_RawFree(msg);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | digest[i];
    *fp = v;
    return 1;
}

/* (labels, fingerprint, name) of kept; NULL with an exception set. */
static PyObject *series_tuple(const Label *kept, Py_ssize_t n, uint8_t *scratch, size_t cap)
{
    PyObject *labels = PyTuple_New(n), *metric = NULL;
    if (labels == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyUnicode_DecodeUTF8((const char *)kept[i].name, kept[i].name_len, "strict");
        if (k != NULL)
            PyUnicode_InternInPlace(&k); /* label names repeat across series: one object each */
        PyObject *v = PyUnicode_DecodeUTF8((const char *)kept[i].value, kept[i].value_len, "strict");
        PyObject *pair = (k && v) ? PyTuple_Pack(2, k, v) : NULL;
        if (pair != NULL && is_name(&kept[i]))
            metric = v;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (pair == NULL) {
            Py_DECREF(labels);
            return NULL;
        }
        PyTuple_SET_ITEM(labels, i, pair);
    }
    uint64_t hash;
    if (!fingerprint(kept, n, scratch, cap, &hash)) {
        Py_DECREF(labels);
        return PyErr_NoMemory();
    }
    PyObject *fp = PyLong_FromUnsignedLongLong(hash);
    if (fp == NULL || metric == NULL) {
        Py_XDECREF(fp);
        Py_DECREF(labels);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(3, labels, fp, metric);
    Py_DECREF(labels);
    Py_DECREF(fp);
    return out;
}

PyObject *ki_series_labels_parse(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer buf, spans;
    Limits lim;
    if (!PyArg_ParseTuple(args, "y*y*nnnp:series_labels", &buf, &spans, &lim.max_labels, &lim.max_name_bytes,
                          &lim.max_value_bytes, &lim.utf8_names))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = ki_spans_count(&spans, 2, KI_SPANS_PAIRS);
    if (n < 0)
        goto done;
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    uint8_t scratch[4096];
    Label kept[MAX_PARSED];
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t se[2];
        if (ki_span_at(&spans, 2, i, buf.len, KI_SPAN_OUTSIDE, se) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t nkept = 0;
        PyObject *item;
        if (canonical(buf.buf, (Py_ssize_t)se[0], (Py_ssize_t)se[1], &lim, kept, &nkept)) {
            item = series_tuple(kept, nkept, scratch, sizeof(scratch));
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        } else
            item = Py_NewRef(Py_None);
        PyList_SET_ITEM(out, i, item);
    }
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&spans);
    return out;
}

Py_ssize_t ki_spans_count(const Py_buffer *spans, Py_ssize_t width, const char *bad_size)
{
    Py_ssize_t size = width * (Py_ssize_t)sizeof(int64_t);
    if (spans->len % size != 0) {
        PyErr_SetString(PyExc_ValueError, bad_size);
        return -1;
    }
    return spans->len / size;
}

int ki_span_at(const Py_buffer *spans, Py_ssize_t width, Py_ssize_t k, Py_ssize_t buf_len, const char *outside,
               int64_t se[2])
{
    memcpy(se, (const char *)spans->buf + k * width * (Py_ssize_t)sizeof(int64_t), 2 * sizeof(int64_t));
    if (se[0] < 0 || se[1] < se[0] || se[1] > buf_len) {
        PyErr_SetString(PyExc_ValueError, outside);
        return -1;
    }
    return 0;
}
