/*
 * kernel_insight.collector._decode - the collector's per-sample decoding loops, in C.
 *
 * Two loops that cost the collector most of its CPU per sample in Python:
 *
 * - varints(buf, n): exactly n canonical protobuf varints filling buf (the agent wire
 *   format's record columns, collector/wire.py);
 * - write_request(buf): Prometheus' usual encoding of a remote_write WriteRequest scanned
 *   in one pass (collector/remote_write.py): where each TimeSeries' label bytes are, and
 *   every sample's value and timestamp as columns.
 *
 * - series_labels(buf, spans, ...): remote_write's new series parsed, made canonical, checked
 *   and fingerprinted (series_labels.c, BLAKE2b in ki_blake2b.c);
 * - SeriesIndex: remote_write series ids by the raw bytes of their label fields, so a
 *   request's known series are found without a Python step per series (lookup).
 *
 * Both check what they read and never read past the buffer; a malformed input raises
 * ValueError with a message, and write_request returns None for an encoding its scan does
 * not handle (the Python general decoder then takes the request). Neither holds a
 * reference to the buffer after it returns; both run without the GIL while they scan.
 * SeriesIndex holds the GIL throughout (its table is shared by the request threads).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "series_labels.h"

/* ---- varints ---------------------------------------------------------------------- */

/* 0, or a static message naming what is wrong. */
static const char *decode_varints(const uint8_t *buf, Py_ssize_t size, Py_ssize_t n, uint64_t *out)
{
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = 0;
        int k = 0;
        for (;;) {
            if (pos >= size)
                return "count";
            uint8_t b = buf[pos++];
            if (k == 9 && b > 1)
                return b >= 0x80 ? "long" : "overflow";
            v |= (uint64_t)(b & 0x7F) << (7 * k);
            if (b < 0x80) {
                if (k > 0 && b == 0)
                    return "noncanonical";
                break;
            }
            if (++k == 10)
                return "long";
        }
        out[i] = v;
    }
    return pos == size ? NULL : "count";
}

static PyObject *py_varints(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*n", &view, &n))
        return NULL;
    if (n < 0 || n > view.len) { /* each varint takes at least one byte */
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "expected %zd varints in %zd bytes", n, view.len);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = decode_varints(view.buf, view.len, n, (uint64_t *)PyBytes_AS_STRING(out));
    Py_END_ALLOW_THREADS
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (err == NULL)
        return out;
    Py_DECREF(out);
    if (strcmp(err, "count") == 0)
        return PyErr_Format(PyExc_ValueError, "expected %zd varints in %zd bytes", n, len);
    if (strcmp(err, "long") == 0)
        return PyErr_Format(PyExc_ValueError, "varint longer than 10 bytes");
    if (strcmp(err, "overflow") == 0)
        return PyErr_Format(PyExc_ValueError, "varint does not fit 64 bits");
    return PyErr_Format(PyExc_ValueError, "non-canonical varint");
}

/* ---- remote_write ----------------------------------------------------------------- */

enum scan { SCAN_OK = 0, SCAN_UNUSUAL = 1, SCAN_ERROR = 2, SCAN_NOMEM = 3 };

/* A varint length at buf[*pos] (< end); SCAN_ERROR when truncated or over 64 bits. */
static int read_len(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, uint64_t *value)
{
    uint64_t v = 0;
    for (int k = 0; k < 10; k++) {
        if (*pos >= end)
            return SCAN_ERROR;
        uint8_t b = buf[(*pos)++];
        if (k == 9 && b > 1)
            return SCAN_ERROR;
        v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (b < 0x80) {
            *value = v;
            return SCAN_OK;
        }
    }
    return SCAN_ERROR;
}

struct columns {
    int64_t *series; /* (label start, label end, samples) per TimeSeries */
    double *values;
    uint64_t *ts;
    Py_ssize_t nseries, nsamples, cap_series, cap_samples;
};

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = PyMem_RawRealloc(*p, (size_t)c * item);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/*
 * The scan of collector/remote_write.py's _decode_fast, sample for sample: TimeSeries
 * (field 1) only; in each, the labels (field 1) first, then samples (field 2) of at most
 * 127 bytes holding a double value (field 1, may be left out when zero) and then a varint
 * timestamp (field 2, may be left out). *msg names a malformation.
 */
static int scan_write_request(const uint8_t *buf, Py_ssize_t n, struct columns *c, const char **msg)
{
    Py_ssize_t pos = 0;
    while (pos < n) {
        if (buf[pos] != 0x0A)
            return SCAN_UNUSUAL;
        Py_ssize_t start = pos + 1;
        uint64_t length;
        if (read_len(buf, &start, n, &length) != SCAN_OK || length > (uint64_t)(n - start)) {
            *msg = "WriteRequest: field 1 runs past the end of its message";
            return SCAN_ERROR;
        }
        Py_ssize_t end = start + (Py_ssize_t)length;
        Py_ssize_t p = start;
        while (p < end && buf[p] == 0x0A) {
            Py_ssize_t q = p + 1;
            uint64_t size;
            if (read_len(buf, &q, end, &size) != SCAN_OK)
                return SCAN_UNUSUAL; /* the general decoder names the error */
            if (size > (uint64_t)(end - q))
                return SCAN_UNUSUAL;
            p = q + (Py_ssize_t)size;
        }
        Py_ssize_t labels_end = p;
        Py_ssize_t first = c->nsamples;
        while (p < end) {
            if (buf[p] != 0x12 || p + 1 >= end || buf[p + 1] >= 0x80)
                return SCAN_UNUSUAL;
            Py_ssize_t s = p + 2, e = s + buf[p + 1];
            if (e > end)
                return SCAN_UNUSUAL;
            double value = 0.0;
            Py_ssize_t ts_start = -1;
            if (s == e) {
                /* an empty Sample: value 0, timestamp 0 */
            } else if (buf[s] == 0x09 && e - s >= 9) {
                memcpy(&value, buf + s + 1, 8); /* little-endian, as on every platform we build for */
                if (e - s > 9) {
                    if (buf[s + 9] != 0x10)
                        return SCAN_UNUSUAL;
                    ts_start = s + 10;
                }
            } else if (buf[s] == 0x10) {
                ts_start = s + 1;
            } else {
                return SCAN_UNUSUAL;
            }
            uint64_t ts = 0;
            if (ts_start >= 0) {
                Py_ssize_t len = e - ts_start;
                if (len < 1 || len > 10) {
                    *msg = "Sample: malformed timestamp varint";
                    return SCAN_ERROR;
                }
                for (Py_ssize_t k = 0; k < len; k++) {
                    uint8_t b = buf[ts_start + k];
                    if ((k < len - 1) != (b >= 0x80)) {
                        *msg = "Sample: malformed timestamp varint";
                        return SCAN_ERROR;
                    }
                    ts |= (uint64_t)(b & 0x7F) << (7 * k);
                }
            }
            if (c->nsamples == c->cap_samples) {
                Py_ssize_t cap_v = c->cap_samples, cap_t = c->cap_samples;
                if (grow((void **)&c->values, &cap_v, c->nsamples + 1, sizeof(double)) < 0 ||
                    grow((void **)&c->ts, &cap_t, c->nsamples + 1, sizeof(uint64_t)) < 0)
                    return SCAN_NOMEM;
                c->cap_samples = cap_v; /* both grew to the same capacity */
            }
            c->values[c->nsamples] = value;
            c->ts[c->nsamples] = ts;
            c->nsamples++;
            p = e;
        }
        if (grow((void **)&c->series, &c->cap_series, 3 * (c->nseries + 1), sizeof(int64_t)) < 0)
            return SCAN_NOMEM;
        c->series[3 * c->nseries] = start;
        c->series[3 * c->nseries + 1] = labels_end;
        c->series[3 * c->nseries + 2] = c->nsamples - first;
        c->nseries++;
        pos = end;
    }
    return SCAN_OK;
}

static PyObject *py_write_request(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    struct columns c = {0};
    const char *msg = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan_write_request(view.buf, view.len, &c, &msg);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc == SCAN_OK) {
        /* y# turns a NULL pointer into None: an empty request has empty columns, not none. */
        static const char empty[1] = {0};
        result = Py_BuildValue("(y#y#y#)", c.series ? (const char *)c.series : empty,
                               (Py_ssize_t)(c.nseries * 3 * sizeof(int64_t)),
                               c.values ? (const char *)c.values : empty, (Py_ssize_t)(c.nsamples * sizeof(double)),
                               c.ts ? (const char *)c.ts : empty, (Py_ssize_t)(c.nsamples * sizeof(uint64_t)));
    } else if (rc == SCAN_UNUSUAL) {
        result = Py_NewRef(Py_None);
    } else if (rc == SCAN_ERROR) {
        PyErr_SetString(PyExc_ValueError, msg);
    } else {
        PyErr_NoMemory();
    }
    PyMem_RawFree(c.series);
    PyMem_RawFree(c.values);
    PyMem_RawFree(c.ts);
    return result;
}

/* ---- SeriesIndex ------------------------------------------------------------------ */

/*
 * An open-addressing hash table from byte strings (a TimeSeries' label fields, as sent) to
 * dense ids 0, 1, 2... in the order they were added. Keys live in one arena; a slot holds
 * the key's hash and id (-1: empty). Nothing is ever removed: the Python owner drops the
 * whole index when it grows past its bound.
 *
 * add_spans adds a request's new keys at once without publishing them: get and lookup (the
 * request threads' reads, without the owner's lock) see an id only once publish() says its
 * entries are complete; rollback() forgets the unpublished ones should those entries fail.
 */
typedef struct {
    PyObject_HEAD
    uint64_t *slot_hash;
    int32_t *slot_id;
    Py_ssize_t nslots; /* a power of two, at least twice the ids */
    Py_ssize_t *key_off;
    Py_ssize_t *key_len;
    Py_ssize_t nids, cap_ids;
    Py_ssize_t visible; /* ids below it are published: get and lookup see no others */
    char *arena;
    Py_ssize_t arena_len, arena_cap;
} SeriesIndex;

static uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 29;
    return h;
}

/* A bytes object of n int32s, *ids its storage; NULL with the error set. */
static PyObject *int32_bytes(Py_ssize_t n, int32_t **ids)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (out != NULL)
        *ids = (int32_t *)PyBytes_AS_STRING(out);
    return out;
}

/* The id of key, or -1; *slot is where it is or would go. */
static int32_t index_find(const SeriesIndex *ix, const uint8_t *key, Py_ssize_t n, uint64_t h, Py_ssize_t *slot)
{
    Py_ssize_t mask = ix->nslots - 1;
    Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)mask);
    for (;;) {
        int32_t id = ix->slot_id[i];
        if (id < 0) {
            *slot = i;
            return -1;
        }
        if (ix->slot_hash[i] == h && ix->key_len[id] == n && memcmp(ix->arena + ix->key_off[id], key, (size_t)n) == 0) {
            *slot = i;
            return id;
        }
        i = (i + 1) & mask;
    }
}

/* The slot table rebuilt with nslots slots, holding the ids below limit only. */
static int index_rebuild(SeriesIndex *ix, Py_ssize_t nslots, Py_ssize_t limit)
{
    uint64_t *hashes = PyMem_RawCalloc((size_t)nslots, sizeof(uint64_t));
    int32_t *ids = PyMem_RawMalloc((size_t)nslots * sizeof(int32_t));
    if (hashes == NULL || ids == NULL) {
        PyMem_RawFree(hashes);
        PyMem_RawFree(ids);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nslots; i++)
        ids[i] = -1;
    for (Py_ssize_t i = 0; i < ix->nslots; i++) {
        if (ix->slot_id[i] < 0 || ix->slot_id[i] >= limit)
            continue;
        Py_ssize_t j = (Py_ssize_t)(ix->slot_hash[i] & (uint64_t)(nslots - 1));
        while (ids[j] >= 0)
            j = (j + 1) & (nslots - 1);
        ids[j] = ix->slot_id[i];
        hashes[j] = ix->slot_hash[i];
    }
    PyMem_RawFree(ix->slot_hash);
    PyMem_RawFree(ix->slot_id);
    ix->slot_hash = hashes;
    ix->slot_id = ids;
    ix->nslots = nslots;
    return 0;
}

static int index_resize(SeriesIndex *ix, Py_ssize_t nslots)
{
    return index_rebuild(ix, nslots, ix->nids);
}

static PyObject *index_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (!_PyArg_NoPositional("SeriesIndex", args) || !_PyArg_NoKeywords("SeriesIndex", kwds))
        return NULL;
    SeriesIndex *ix = (SeriesIndex *)type->tp_alloc(type, 0);
    if (ix == NULL)
        return NULL;
    ix->nslots = 0;
    if (index_resize(ix, 1024) < 0) {
        Py_DECREF(ix);
        return PyErr_NoMemory();
    }
    return (PyObject *)ix;
}

static void index_dealloc(SeriesIndex *ix)
{
    PyMem_RawFree(ix->slot_hash);
    PyMem_RawFree(ix->slot_id);
    PyMem_RawFree(ix->key_off);
    PyMem_RawFree(ix->key_len);
    PyMem_RawFree(ix->arena);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static Py_ssize_t index_len(SeriesIndex *ix)
{
    return ix->nids;
}

static PyObject *index_get(SeriesIndex *ix, PyObject *arg)
{
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t slot;
    int32_t id = index_find(ix, key.buf, key.len, hash_bytes(key.buf, key.len), &slot);
    PyBuffer_Release(&key);
    return PyLong_FromLong(id < ix->visible ? id : -1);
}

static PyObject *index_add(SeriesIndex *ix, PyObject *arg)
{
    Py_buffer key;
    if (ix->visible != ix->nids) {
        PyErr_SetString(PyExc_RuntimeError, "SeriesIndex.add with unpublished ids (publish or rollback first)");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t h = hash_bytes(key.buf, key.len);
    Py_ssize_t slot;
    int32_t id = index_find(ix, key.buf, key.len, h, &slot);
    if (id >= 0) {
        PyBuffer_Release(&key);
        return PyLong_FromLong(id);
    }
    if (ix->nids >= INT32_MAX - 1) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_OverflowError, "SeriesIndex is full");
        return NULL;
    }
    Py_ssize_t cap_off = ix->cap_ids, cap_len = ix->cap_ids;
    if (grow((void **)&ix->key_off, &cap_off, ix->nids + 1, sizeof(Py_ssize_t)) < 0 ||
        grow((void **)&ix->key_len, &cap_len, ix->nids + 1, sizeof(Py_ssize_t)) < 0 ||
        grow((void **)&ix->arena, &ix->arena_cap, ix->arena_len + key.len, 1) < 0) {
        PyBuffer_Release(&key);
        return PyErr_NoMemory();
    }
    ix->cap_ids = cap_off < cap_len ? cap_off : cap_len;
    if (2 * (ix->nids + 1) > ix->nslots) {
        if (index_resize(ix, 2 * ix->nslots) < 0) {
            PyBuffer_Release(&key);
            return PyErr_NoMemory();
        }
        index_find(ix, key.buf, key.len, h, &slot);
    }
    id = (int32_t)ix->nids++;
    ix->key_off[id] = ix->arena_len;
    ix->key_len[id] = key.len;
    memcpy(ix->arena + ix->arena_len, key.buf, (size_t)key.len);
    ix->arena_len += key.len;
    ix->slot_id[slot] = id;
    ix->slot_hash[slot] = h;
    ix->visible = ix->nids;
    PyBuffer_Release(&key);
    return PyLong_FromLong(id);
}

/* add_spans(buf, spans): per int64 (start, end) pair, the id of buf[start:end], added (unpublished)
 * when new: a key twice in spans gets one id, new ids follow the order of first appearance.
 * Everything it may need is allocated and checked first, so it adds all the new keys or none. */
static PyObject *index_add_spans(SeriesIndex *ix, PyObject *args)
{
    Py_buffer buf, spans;
    if (!PyArg_ParseTuple(args, "y*y*:add_spans", &buf, &spans))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = ki_spans_count(&spans, 2, KI_SPANS_PAIRS);
    if (n < 0)
        goto done;
    Py_ssize_t bytes = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t t[2];
        if (ki_span_at(&spans, 2, k, buf.len, KI_SPAN_OUTSIDE, t) < 0)
            goto done;
        bytes += (Py_ssize_t)(t[1] - t[0]);
    }
    if (n > INT32_MAX - 1 - ix->nids) {
        PyErr_SetString(PyExc_OverflowError, "SeriesIndex is full");
        goto done;
    }
    Py_ssize_t cap_off = ix->cap_ids, cap_len = ix->cap_ids, nslots = ix->nslots;
    while (2 * (ix->nids + n) > nslots)
        nslots *= 2;
    if (grow((void **)&ix->key_off, &cap_off, ix->nids + n, sizeof(Py_ssize_t)) < 0 ||
        grow((void **)&ix->key_len, &cap_len, ix->nids + n, sizeof(Py_ssize_t)) < 0 ||
        grow((void **)&ix->arena, &ix->arena_cap, ix->arena_len + bytes, 1) < 0 ||
        (nslots != ix->nslots && index_resize(ix, nslots) < 0)) {
        ix->cap_ids = cap_off < cap_len ? cap_off : cap_len;
        PyErr_NoMemory();
        goto done;
    }
    ix->cap_ids = cap_off < cap_len ? cap_off : cap_len;
    int32_t *ids;
    out = int32_bytes(n, &ids);
    if (out == NULL)
        goto done;
    const uint8_t *b = buf.buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t t[2];
        memcpy(t, (const char *)spans.buf + k * 2 * (Py_ssize_t)sizeof(int64_t), sizeof(t)); /* checked above */
        const uint8_t *key = b + t[0];
        Py_ssize_t len = (Py_ssize_t)(t[1] - t[0]);
        uint64_t h = hash_bytes(key, len);
        Py_ssize_t slot;
        int32_t id = index_find(ix, key, len, h, &slot);
        if (id < 0) {
            id = (int32_t)ix->nids++;
            ix->key_off[id] = ix->arena_len;
            ix->key_len[id] = len;
            memcpy(ix->arena + ix->arena_len, key, (size_t)len);
            ix->arena_len += len;
            ix->slot_id[slot] = id;
            ix->slot_hash[slot] = h;
        }
        ids[k] = id;
    }
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&spans);
    return out;
}

static PyObject *index_publish(SeriesIndex *ix, PyObject *Py_UNUSED(arg))
{
    ix->visible = ix->nids;
    Py_RETURN_NONE;
}

static PyObject *index_rollback(SeriesIndex *ix, PyObject *Py_UNUSED(arg))
{
    if (ix->visible == ix->nids)
        Py_RETURN_NONE;
    if (index_rebuild(ix, ix->nslots, ix->visible) < 0)
        return PyErr_NoMemory();
    ix->nids = ix->visible;
    ix->arena_len = ix->nids ? ix->key_off[ix->nids - 1] + ix->key_len[ix->nids - 1] : 0;
    Py_RETURN_NONE;
}

/* lookup(buf, series): per (label start, label end, samples) int64 triple of write_request's
 * series column, the id of buf[start:end] as int32, or -1 when it is not in the index. */
static PyObject *index_lookup(SeriesIndex *ix, PyObject *args)
{
    Py_buffer buf, series;
    if (!PyArg_ParseTuple(args, "y*y*:lookup", &buf, &series))
        return NULL;
    PyObject *out = NULL;
    int32_t *ids = NULL;
    const uint8_t *b = buf.buf;
    Py_ssize_t n = ki_spans_count(&series, 3, "series must hold int64 (start, end, samples) triples");
    if (n < 0 || (out = int32_bytes(n, &ids)) == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t t[2];
        if (ki_span_at(&series, 3, k, buf.len, "series triple outside the buffer", t) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t slot;
        int32_t id = index_find(ix, b + t[0], (Py_ssize_t)(t[1] - t[0]), hash_bytes(b + t[0], (Py_ssize_t)(t[1] - t[0])), &slot);
        ids[k] = id < ix->visible ? id : -1;
    }
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&series);
    return out;
}

static PyMethodDef index_methods[] = {
    {"get", (PyCFunction)index_get, METH_O, "get(key) -> int: the id of key, or -1."},
    {"add", (PyCFunction)index_add, METH_O, "add(key) -> int: the id of key, the next one when it is new."},
    {"lookup", (PyCFunction)index_lookup, METH_VARARGS,
     "lookup(buf, series) -> bytes: int32 ids of each triple's buf[start:end] (-1: unknown)."},
    {"add_spans", (PyCFunction)index_add_spans, METH_VARARGS,
     "add_spans(buf, spans) -> bytes: int32 ids of each int64 (start, end) pair's buf[start:end], "
     "new ones added unpublished (all or none), in order of first appearance."},
    {"publish", (PyCFunction)index_publish, METH_NOARGS, "publish(): get and lookup see every id added."},
    {"rollback", (PyCFunction)index_rollback, METH_NOARGS, "rollback(): forget the ids added since the last publish."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods index_as_sequence = {.sq_length = (lenfunc)index_len};

static PyTypeObject SeriesIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kernel_insight.collector._decode.SeriesIndex",
    .tp_basicsize = sizeof(SeriesIndex),
    .tp_dealloc = (destructor)index_dealloc,
    .tp_as_sequence = &index_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SeriesIndex(): dense ids of byte strings (remote_write label fields), added once each.",
    .tp_methods = index_methods,
    .tp_new = index_new,
};

static PyMethodDef methods[] = {
    {"varints", py_varints, METH_VARARGS,
     "varints(buf, n) -> bytes: exactly n canonical varints filling buf, as little-endian uint64s."},
    {"write_request", py_write_request, METH_O,
     "write_request(buf) -> (series, values, ts) | None: a WriteRequest in Prometheus' usual encoding, "
     "as int64 (label start, label end, samples) triples per TimeSeries, float64 values and uint64 "
     "timestamps; None for an encoding the scan does not handle."},
    {"series_labels", ki_series_labels_parse, METH_VARARGS,
     "series_labels(buf, spans, max_labels, max_name_bytes, max_value_bytes, utf8_names) -> list: per "
     "int64 (start, end) pair, the TimeSeries label fields buf[start:end] as (canonical labels, "
     "fingerprint, metric name), or None where the Python path must take them (collector/native/series_labels.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kernel_insight.collector._decode",
    "The collector's per-sample decoding loops in C (collector/native/decodemodule.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__decode(void)
{
    if (PyType_Ready(&SeriesIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "SeriesIndex", (PyObject *)&SeriesIndexType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
